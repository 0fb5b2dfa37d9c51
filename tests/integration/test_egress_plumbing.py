"""The sandbox's side of egress: its own directory at /run/tooljail, the relay, no other way out.

Each test plays the host proxy with a FAKE gate (`FakeGate`): it listens on the
sandbox's `egress_dir/proxy.sock` as the daemon's gate would, takes each
passed descriptor (SCM_RIGHTS) and answers what it reads on it with
"HTTP/1.1 200 OK ... hello". Code inside the sandbox reaches it with the
environment `egress_env` gives (urllib, requests, curl, unchanged); everything
else (DNS, UDP, a direct TCP or IPv6 connect, another sandbox's directory)
fails. Both backends: the process backend through the zygote and through a
bubblewrap per sandbox, the docker backend (marked: skips without an engine).

The sandboxes come from the daemon's own backends (`open_sandboxes`, as the
daemon assembles them) with an `[egress]` section set; the daemon's policy,
proxy and wiring of calls are other modules' (and their tests').
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tooljail.types import StreamKind
from tooljaild.app.start import open_sandboxes
from tooljaild.egress.dirs import EgressDirs
from tooljaild.egress.env import CA_BUNDLE, INSIDE_DIR, RELAY_PORT, egress_env
from tooljaild.sandbox.backends import BACKENDS, Sandboxes
from tooljaild.sandbox.base import RunOutcome, RunRequest, Sandbox, Termination
from tooljaild.sandbox.process import ProcessSandbox
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits

pytestmark = [pytest.mark.timeout(120)]


class _EgressSettings(Settings):
    """Settings with an `[egress]` section: the backends only ask whether there is one."""

    egress: Any = None


class _Policy:
    """An egress policy holding no secret (what `egress_env` reads of one)."""

    secrets: tuple[Any, ...] = ()


ENV = egress_env(_Policy(), None)


class FakeGate:
    """Plays the daemon's gate for one sandbox: answers every passed connection."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "proxy.sock"
        self.requests: list[bytes] = []
        self.fds_per_message: list[int] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Through a descriptor of the directory: a test's path is too long for
        # sun_path (108 bytes), the descriptor's is not.
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            self._sock.bind(f"/proc/self/fd/{dir_fd}/proxy.sock")
        finally:
            os.close(dir_fd)
        os.chmod(self.path, 0o666)  # as the real gate: the directory is the secret
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                relay, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(relay,), daemon=True).start()

    def _relay(self, relay: socket.socket) -> None:
        with relay:
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(relay, 1, 4)
                except OSError:
                    return
                if not msg:
                    return
                self.fds_per_message.append(len(fds))
                for fd in fds:
                    threading.Thread(target=self._answer, args=(fd,), daemon=True).start()

    def _answer(self, fd: int) -> None:
        with socket.socket(fileno=fd) as conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests.append(data)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                b"Connection: close\r\n\r\nhello"
            )

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)


async def run(
    box: Sandbox, code: str, *, egress: bool = True, env: dict[str, str] | None = None
) -> tuple[RunOutcome, str, str]:
    out: dict[StreamKind, bytearray] = {
        StreamKind.STDOUT: bytearray(),
        StreamKind.STDERR: bytearray(),
    }

    def sink(kind: StreamKind, data: bytes) -> None:
        out[kind] += data

    request = RunRequest(
        kind="code",
        payload={"code": code},
        limits=Limits(cpu_s=30),
        env=ENV if env is None else env,
        egress=egress,
    )
    outcome = await box.run(request, sink)
    return outcome, out[StreamKind.STDOUT].decode(), out[StreamKind.STDERR].decode()


async def probe(box: Sandbox, code: str, **kw: Any) -> dict[str, Any]:
    """Run `code` (which prints one JSON line last); what it printed."""
    outcome, stdout, stderr = await run(box, code, **kw)
    assert outcome.termination is Termination.RETURNED, (outcome, stdout, stderr)
    seen: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return seen


GET_URLLIB = """
import json, urllib.request
body = urllib.request.urlopen("http://api.example.com/news?q=1", timeout=10).read().decode()
print(json.dumps({"urllib": body}))
"""

GET_REQUESTS = """
import json
try:
    import requests
except ImportError:  # not in every sandbox's interpreter
    print(json.dumps({"requests": None}))
else:
    print(json.dumps({"requests": requests.get("http://api.example.com/r", timeout=10).text}))
"""

GET_CURL = """
import json, subprocess
done = subprocess.run(["curl", "-sS", "--max-time", "10", "http://api.example.com/c"],
                      capture_output=True, text=True)
print(json.dumps({"curl": done.stdout, "err": done.stderr}))
"""

WALLS = r"""
import errno, json, os, socket

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc)) if exc.errno else type(exc).__name__

def tcp(host, port, family=socket.AF_INET):
    def go():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect((host, port))
    return go

def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"\x00" * 12, ("8.8.8.8", 53))

def write_inside():
    with open(INSIDE + "/x", "w") as f:
        f.write("x")

INSIDE = "/run/tooljail"
print(json.dumps({
    "inside": sorted(os.listdir(INSIDE)) if os.path.isdir(INSIDE) else None,
    "view": attempt(lambda: os.listdir("/.tooljail-egress")),
    "other": attempt(lambda: open("/.tooljail-egress/" + OTHER + "/proxy.sock", "rb")),
    "other_dir": attempt(lambda: os.listdir("/.tooljail-egress/" + OTHER)),
    "other_connect": attempt(lambda: socket.socket(socket.AF_UNIX).connect(
        "/.tooljail-egress/" + OTHER + "/proxy.sock")),
    "view_mode": oct(os.stat("/.tooljail-egress").st_mode)
        if os.path.lexists("/.tooljail-egress") else None,
    "write_inside": attempt(write_inside),
    "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
    "udp": attempt(udp),
    "tcp": attempt(tcp("1.1.1.1", 80)),
    "tcp6": attempt(tcp("2606:4700:4700::1111", 80, socket.AF_INET6)),
    "loop6": attempt(tcp("::1", 3128, socket.AF_INET6)),
    "relay": attempt(tcp("127.0.0.1", 3128)),
    "env_proxy": os.environ.get("HTTPS_PROXY"),
}))
"""


def walls(other: str) -> str:
    return f"OTHER = {other!r}\n" + WALLS


Maker = Callable[..., Awaitable[Sandbox]]


async def _sandboxes(tmp_path: Path, *, egress: bool, kind: str, **settings: Any) -> Sandboxes:
    state = tmp_path / f"state-{kind}-{'egress' if egress else 'none'}"
    if settings.get("isolation"):
        state = state.with_name(f"{state.name}-{settings['isolation']}")
    config = _EgressSettings(
        state_dir=state,
        backend=kind,
        egress={"allow": []} if egress else None,
        **settings,
    )
    sandboxes = await open_sandboxes(
        config, state_dir=state, daemon_id="egress-test", table={kind: BACKENDS[kind]}
    )
    return sandboxes


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Maker]:
    """Make started sandboxes: make(kind="process", egress=True, zygote=True)."""
    opened: list[Sandboxes] = []
    boxes: list[Sandbox] = []
    tables: dict[tuple[str, bool, bool, str], Sandboxes] = {}

    async def make_one(
        kind: str = "process", egress: bool = True, zygote: bool = True, isolation: str = ""
    ) -> Sandbox:
        key = (kind, egress, zygote, isolation)
        if key not in tables:
            extra: dict[str, Any] = {"isolation": isolation} if isolation else {}
            if kind == "process":
                extra["sandbox"] = {"zygote": zygote}
            tables[key] = sandboxes = await _sandboxes(tmp_path, egress=egress, kind=kind, **extra)
            opened.append(sandboxes)
            backend = sandboxes[kind]
            await sandboxes.warm([backend.profile(sandboxes.settings, None, ())])
        sandboxes = tables[key]
        box = sandboxes.factory(sandboxes[kind].profile(sandboxes.settings, None, ()))()
        boxes.append(box)
        await box.start()
        return box

    yield make_one
    for box in boxes:
        await box.close()
    for sandboxes in opened:
        await sandboxes.close()


def _zygote_used(box: Sandbox) -> bool:
    return isinstance(box, ProcessSandbox) and box._forked


# ---------------------------------------------------------------------- process


@pytest.mark.isolation
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "bwrap"])
async def test_a_sandbox_reaches_the_gate_through_its_relay(make: Maker, zygote: bool) -> None:
    box = await make(zygote=zygote)
    assert _zygote_used(box) is zygote
    assert box.egress_dir is not None
    gate = FakeGate(box.egress_dir)
    try:
        code = GET_URLLIB + GET_REQUESTS + GET_CURL
        outcome, stdout, stderr = await run(box, code)
        assert outcome.termination is Termination.RETURNED, (outcome, stdout, stderr)
        lines = [json.loads(line) for line in stdout.strip().splitlines()]
        assert lines[0] == {"urllib": "hello"}
        assert lines[1]["requests"] in ("hello", None)
        assert lines[2]["curl"] == "hello", lines[2]
        # Each connection came as one message with one descriptor, and the
        # proxy read the client's own request (an absolute URI) through it.
        assert gate.fds_per_message == [1] * (3 if lines[1]["requests"] else 2)
        assert any(b"GET http://api.example.com/news?q=1 HTTP/1.1" in r for r in gate.requests)
    finally:
        gate.close()


@pytest.mark.isolation
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "bwrap"])
async def test_nothing_else_leaves_an_egress_sandbox(make: Maker, zygote: bool) -> None:
    """DNS, UDP, a direct TCP or IPv6 connect fail; /run/tooljail is its own,
    read-only; no other sandbox's directory can be listed or opened."""
    box, other = await make(zygote=zygote), await make(zygote=zygote)
    assert box.egress_dir is not None and other.egress_dir is not None
    gates = [FakeGate(box.egress_dir), FakeGate(other.egress_dir)]
    try:
        seen = await probe(box, walls(other.egress_dir.name))
    finally:
        for gate in gates:
            gate.close()
    assert seen["inside"] == ["proxy.sock"]
    assert seen["view"] in ("ENOENT", "EACCES"), seen
    assert seen["other"] in ("ENOENT", "EACCES"), seen
    assert seen["other_dir"] in ("ENOENT", "EACCES"), seen
    assert seen["other_connect"] in ("ENOENT", "EACCES"), seen
    # The zygote's view of every sandbox's directory is covered by an empty,
    # unreadable tmpfs (it cannot be unmounted: see runner/_zygote.py).
    assert seen["view_mode"] == ("0o40000" if zygote else None), seen
    assert seen["write_inside"] in ("EROFS", "EACCES"), seen
    assert seen["dns"] != "ok" and seen["udp"] != "ok", seen
    assert seen["tcp"] in ("ENETUNREACH", "EHOSTUNREACH"), seen
    assert seen["tcp6"] in ("ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL"), seen
    assert seen["loop6"] != "ok", seen  # the relay listens on IPv4 loopback only
    assert seen["relay"] == "ok", seen
    assert seen["env_proxy"] == f"http://127.0.0.1:{RELAY_PORT}"


@pytest.mark.isolation
async def test_the_relay_closes_connections_when_there_is_no_gate(make: Maker) -> None:
    """No proxy.sock (the call has no egress policy): a connection gets nothing."""
    box = await make()
    code = """
import json, urllib.request
try:
    urllib.request.urlopen("http://api.example.com/", timeout=10).read()
    print(json.dumps({"got": "through"}))
except Exception as exc:
    print(json.dumps({"got": type(exc).__name__}))
"""
    seen = await probe(box, code)
    assert seen["got"] != "through"


@pytest.mark.isolation
async def test_no_egress_section_changes_nothing(make: Maker, tmp_path: Path) -> None:
    """Without [egress]: no directory on the host, nothing at /run/tooljail, no relay."""
    box = await make(egress=False)
    assert box.egress_dir is None
    seen = await probe(box, walls("0" * 32), egress=False, env={})
    assert seen["inside"] is None
    assert seen["relay"] in ("ECONNREFUSED", "ENETUNREACH"), seen
    assert seen["tcp"] in ("ENETUNREACH", "EHOSTUNREACH"), seen
    assert seen["dns"] != "ok" and seen["udp"] != "ok", seen
    assert seen["env_proxy"] is None
    assert not (tmp_path / "state-process-none" / "egress").exists()


@pytest.mark.isolation
async def test_the_directory_is_the_sandboxs_own_and_goes_with_it(
    make: Maker, tmp_path: Path
) -> None:
    root = tmp_path / "state-process-egress" / "egress" / "sandboxes"
    bundle = root.parent / "ca-bundle.pem"
    first = await make()
    bundle.write_text("-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n")
    bundle.chmod(0o644)
    box = await make()
    assert stat.S_IMODE(root.stat().st_mode) == 0o711
    assert box.egress_dir is not None and box.egress_dir.parent == root
    assert stat.S_IMODE(box.egress_dir.stat().st_mode) == 0o755
    assert len(box.egress_dir.name) == 32
    seen = await probe(box, f"import json\nprint(json.dumps({{'ca': open({CA_BUNDLE!r}).read()}}))")
    assert seen["ca"] == bundle.read_text()
    directory = box.egress_dir
    await box.close()
    assert not directory.exists()
    assert first.egress_dir is not None and first.egress_dir.exists()
    assert INSIDE_DIR == "/run/tooljail"


@pytest.mark.isolation
async def test_a_session_keeps_its_relay_across_calls(make: Maker) -> None:
    box = await make()
    assert isinstance(box, ProcessSandbox) and box.egress_dir is not None
    gate = FakeGate(box.egress_dir)
    session = await SessionSandbox.open(
        box, keep_processes=False, quota_bytes=0, limits=Limits(), timeout_s=20, env=ENV
    )
    try:
        for i in range(3):
            out = bytearray()

            def sink(kind: StreamKind, data: bytes, out: bytearray = out) -> None:
                out.extend(data)

            request = RunRequest(kind="code", payload={"code": GET_URLLIB}, limits=Limits())
            end = await session.begin(request, sink)
            assert end.outcome.termination is Termination.RETURNED, (end, out)
            assert json.loads(bytes(out)) == {"urllib": "hello"}, i
            # The relay's thread is the runner's: no call is told of it.
            assert not end.left, end.left
        assert len(gate.requests) == 3
    finally:
        await session.close()
        gate.close()


KILL_RELAY = """
import gc, json, socket
listening = [o for o in gc.get_objects() if isinstance(o, socket.socket)
             and o.fileno() >= 0 and o.family == socket.AF_INET
             and o.getsockname() == ("127.0.0.1", 3128)]
for sock in listening:
    sock.shutdown(socket.SHUT_RDWR)  # wakes its accept(): the relay ends
import time
time.sleep(0.2)
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=2).close()
    print(json.dumps({"killed": len(listening), "after": "ok"}))
except OSError as exc:
    print(json.dumps({"killed": len(listening), "after": type(exc).__name__}))
"""


@pytest.mark.isolation
async def test_a_session_whose_code_ends_the_relay_gets_it_back_next_call(make: Maker) -> None:
    """Ending the relay cuts only the session's own access, until its next call."""
    box = await make()
    assert box.egress_dir is not None
    gate = FakeGate(box.egress_dir)
    session = await SessionSandbox.open(
        box, keep_processes=False, quota_bytes=0, limits=Limits(), timeout_s=20, env=ENV
    )
    try:
        seen = []
        for code in (KILL_RELAY, GET_URLLIB):
            out = bytearray()

            def sink(kind: StreamKind, data: bytes, out: bytearray = out) -> None:
                out.extend(data)

            request = RunRequest(kind="code", payload={"code": code}, limits=Limits())
            end = await session.begin(request, sink)
            assert end.outcome.termination is Termination.RETURNED, (end, out)
            seen.append(json.loads(bytes(out)))
        assert seen[0] == {"killed": 1, "after": "ConnectionRefusedError"}
        assert seen[1] == {"urllib": "hello"}
    finally:
        await session.close()
        gate.close()


@pytest.mark.isolation
async def test_no_directory_without_namespaces(make: Maker) -> None:
    """Without namespaces a sandbox shares the host's network and loopback:
    it gets no egress directory (the relay's port would be every sandbox's)."""
    box = await make(isolation="none")
    assert box.egress_dir is None


# ---------------------------------------------------------------------- docker


@pytest.mark.docker
async def test_a_container_reaches_the_gate_and_nothing_else(make: Maker) -> None:
    box, walled, other = (
        await make(kind="docker"),
        await make(kind="docker"),
        await make(kind="docker"),
    )
    assert box.egress_dir and walled.egress_dir and other.egress_dir
    gates = [FakeGate(d) for d in (box.egress_dir, walled.egress_dir, other.egress_dir)]
    try:
        seen = await probe(box, GET_URLLIB)
        assert seen == {"urllib": "hello"}
        assert gates[0].fds_per_message == [1]
        seen = await probe(walled, walls(other.egress_dir.name))
    finally:
        for gate in gates:
            gate.close()
    assert seen["inside"] == ["proxy.sock"]
    assert seen["view"] == seen["other"] == seen["other_connect"] == "ENOENT", seen
    assert seen["write_inside"] in ("EROFS", "EACCES"), seen
    assert seen["dns"] != "ok" and seen["udp"] != "ok", seen
    assert seen["tcp"] in ("ENETUNREACH", "EHOSTUNREACH"), seen
    assert seen["tcp6"] in ("ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL"), seen
    assert seen["relay"] == "ok", seen
    directory = box.egress_dir
    await box.close()
    assert not directory.exists()


@pytest.mark.docker
async def test_a_container_without_egress_has_no_directory(make: Maker) -> None:
    box = await make(kind="docker", egress=False)
    assert box.egress_dir is None
    seen = await probe(box, walls("0" * 32), egress=False, env={})
    assert seen["inside"] is None
    assert seen["relay"] in ("ECONNREFUSED", "ENETUNREACH"), seen


def test_egress_dirs_remove_only_their_own(tmp_path: Path) -> None:
    dirs = EgressDirs(tmp_path / "egress" / "sandboxes")
    made = dirs.new()
    outside = tmp_path / "keep"
    outside.mkdir()
    dirs.remove(outside)
    assert outside.exists()
    dirs.remove(made)
    assert not made.exists()
    assert dirs.sweep() == 0


def test_egress_env_points_every_client_at_the_relay() -> None:
    class Secret:
        name = "NEWS_API_KEY"
        placeholder = "tooljail-secret-" + "ab" * 16

    class Policy:
        secrets = (Secret(),)

    class Packages:
        index_url = "https://pypi.internal/simple"
        extra_index_urls = ["https://a.example/simple", "https://b.example/simple"]

    env = egress_env(Policy(), Packages())
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT"):
        assert env[name] == "/run/tooljail/ca.pem"
    assert env["NODE_EXTRA_CA_CERTS"] == "/run/tooljail/ca.pem"
    assert env["NEWS_API_KEY"] == Secret.placeholder
    assert env["PIP_INDEX_URL"] == "https://pypi.internal/simple"
    assert env["PIP_EXTRA_INDEX_URL"] == "https://a.example/simple https://b.example/simple"
    assert "PIP_INDEX_URL" not in egress_env(_Policy(), None)
