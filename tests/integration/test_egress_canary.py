"""Canary: a secret used in 1,000 requests appears nowhere but at the server it is for.

The secret is 32 random bytes as hex (64 characters), held by a `tooljail serve`
subprocess (log level DEBUG, its output captured, /metrics on) for
api.example.com, the world's HTTPS server. How the 1,000 uses are made, honestly:
20 units of 50 requests each. A unit is ONE call that loops 50 HTTPS requests
(keep-alive through `requests.Session`, so the proxy intercepts 50 requests on
a few TLS connections, not 50 handshakes) carrying the placeholder in turn in a
header, the query string and basic auth; the proxy swaps each for the value. 10
units are one-off execute_python_code calls, 10 are calls in 2 sessions (5
each). The world's server checks it got the value 1,000 times.

Then the value is looked for (exact bytes, and any 16-hex-character piece of it)
in: the daemon's whole state directory (the journal file and its WAL, the artifact
store), the daemon's log, the /metrics text, every result (as returned and as
GetCall reads it back), and, from inside a sandbox after it made its requests,
as the sandbox's own uid: its environment (os.environ, /proc/*/environ,
/proc/*/cmdline), the files it can write (/tmp, the workspace, /run, /dev/shm,
/var/tmp) and every readable mapping of /proc/*/mem. The sandbox is never given
the value: it gets sha256 digests of the value's 16-character windows (64 bits
each: not to be brute-forced) and reports how many 16-character windows of the
hex runs it read match them (every 16th offset, so a fragment of 31 or more
characters of the value is found). As a control, it counts its
placeholder's windows the same way: those must be found (in its environment and
memory), or the search proves nothing.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import secrets
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tests.egress_world import (
    Request,
    World,
    lib_prelude,
    short_dir,
    trust_prelude,
    vendor_client_libs,
)
from tooljail import Client, ToolResult

LIBS: list[Path] = []
"""Where the daemon's sandboxes find requests (set by the fixture)."""

UNITS = 20
PER_UNIT = 50

REQUESTS = r"""
import json, os, requests
key = os.environ["CANARY_KEY"]
echoes = []
with requests.Session() as s:
    for i in range(N):
        url = "https://api.example.com/echo"
        if i % 3 == 0:
            r = s.get(url, headers={"Authorization": "Bearer " + key}, timeout=15)
        elif i % 3 == 1:
            r = s.get(url, params={"api_key": key}, timeout=15)
        else:
            r = s.get(url, auth=("canary", key), timeout=15)
        assert r.status_code == 200, (r.status_code, r.text[:300])
        echoes.append(r.json())
# What the API sent back (scrubbed by the proxy) goes into the result and its output.
print(json.dumps(echoes))
"""

SCAN = r"""
import hashlib, re
WINDOW = 16
HEX = re.compile(rb"[0-9a-fA-F]{16,}")
placeholder = os.environ["CANARY_KEY"].rsplit("-", 1)[-1]
own = {hashlib.sha256(placeholder[i:i + WINDOW].encode()).hexdigest()
       for i in range(len(placeholder) - WINDOW + 1)}

SECRET_WINDOWS = set(SECRET_WINDOWS)

def hits(data, wanted):
    # Windows every 16 characters only: a run holding 31 or more consecutive
    # characters of the secret holds one of them whole (the digests cover
    # every offset of the secret), at a sixteenth of the hashing.
    found = 0
    for m in HEX.finditer(data):
        run = m.group().lower()
        for i in range(0, len(run) - WINDOW + 1, WINDOW):
            if hashlib.sha256(run[i:i + WINDOW]).hexdigest() in wanted:
                found += 1
    return found

def both(data):
    return [hits(data, SECRET_WINDOWS), hits(data, own)]

report = {"env": both("\n".join(f"{k}={v}" for k, v in os.environ.items()).encode())}
pids = [p for p in os.listdir("/proc") if p.isdigit()]
environ = [0, 0]
memory = [0, 0]
mem_bytes = 0
mem_pids = []
for pid in pids:
    for name in ("environ", "cmdline"):
        try:
            got = both(open(f"/proc/{pid}/{name}", "rb").read())
        except OSError:
            continue
        environ = [a + b for a, b in zip(environ, got)]
    try:
        # The sandbox's own processes: those of its uid (what it could reach).
        uid = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status")
                   if line.startswith("Uid:"))
        if uid != os.getuid():
            continue
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        continue
    read_any = False
    with mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start > 1 << 30:
                continue
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            if not data:
                continue
            read_any = True
            mem_bytes += len(data)
            got = both(data)
            memory = [a + b for a, b in zip(memory, got)]
    if read_any:
        mem_pids.append(int(pid))
files = [0, 0]
files_read = 0
roots = ["/tmp", "/var/tmp", "/dev/shm", "/run", os.getcwd(), os.path.expanduser("~")]
for root in dict.fromkeys(roots):
    for d, _, names in os.walk(root):
        for n in names:
            try:
                with open(os.path.join(d, n), "rb") as f:
                    data = f.read(64 << 20)
            except OSError:
                continue
            files_read += 1
            files = [a + b for a, b in zip(files, both(data))]
report.update(proc_environ=environ, memory=memory, mem_bytes=mem_bytes, mem_pids=mem_pids,
              self_pid=os.getpid(), files=files, files_read=files_read)
print("SCAN " + json.dumps(report))
"""


def windows(value: str, size: int = 16) -> set[str]:
    return {
        hashlib.sha256(value[i : i + size].encode()).hexdigest()
        for i in range(len(value) - size + 1)
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def canary_daemon(egress_world: World) -> Iterator[tuple[str, Path, int, str]]:
    """(target, base dir, metrics port, the secret's value)."""
    value = secrets.token_hex(32)
    stack = contextlib.ExitStack()
    base = stack.enter_context(short_dir("tj-canary-"))
    metrics = free_port()
    config = egress_world.write_config(
        base / "tooljail.toml",
        allow=["api.example.com"],
        index_url=None,
        secrets={"CANARY_KEY": (value, ["api.example.com"])},
        secrets_file=base / "secrets.toml",
        log_level="DEBUG",
        metrics_listen=f"127.0.0.1:{metrics}",
    )
    tools = base / "tools"  # no tools: a directory sandboxes see, for the client libs
    tools.mkdir(mode=0o755)
    LIBS[:] = [vendor_client_libs(tools / "_libs")]
    process, target, base = spawn_daemon(base, "--config", str(config), "--tools-dir", str(tools))
    try:
        wait_serving(target, process, base / "daemon.log")
        yield target, base, metrics, value
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        stack.close()


def _unit(egress_world: World, scan_windows: set[str] | None) -> str:
    libs = lib_prelude(LIBS[0])
    code = libs + trust_prelude(egress_world) + f"N = {PER_UNIT}\n" + REQUESTS
    if scan_windows is not None:
        code += f"SECRET_WINDOWS = {sorted(scan_windows)!r}\n" + SCAN
    return code


def _scan(result: ToolResult) -> dict[str, object]:
    data = result.data if isinstance(result.data, dict) else {}
    lines = [line for line in data.get("stdout", "").splitlines() if line.startswith("SCAN ")]
    assert lines, (result.status, result.error, data.get("stderr"))
    report: dict[str, object] = json.loads(lines[-1].removeprefix("SCAN "))
    return report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_secret_used_1000_times_appears_nowhere(
    egress_world: World, canary_daemon: tuple[str, Path, int, str]
) -> None:
    target, base, metrics_port, value = canary_daemon
    secret_windows = windows(value)
    mark = egress_world.mark()
    results: list[ToolResult] = []
    scans: list[dict[str, object]] = []
    with Client(target) as client:
        for unit in range(UNITS // 2):
            scan = unit == UNITS // 2 - 1
            results.append(
                client.call(
                    "execute_python_code",
                    {"code": _unit(egress_world, secret_windows if scan else None)},
                    egress=["api.example.com"],
                    secrets=["CANARY_KEY"],
                    tool_timeout_s=120,
                )
            )
            if scan:
                scans.append(_scan(results[-1]))
        for _ in range(2):
            with client.session(egress=["api.example.com"], secrets=["CANARY_KEY"]) as session:
                for call in range(UNITS // 4):
                    scan = call == UNITS // 4 - 1
                    results.append(
                        session.call(
                            "execute_python_code",
                            {"code": _unit(egress_world, secret_windows if scan else None)},
                            tool_timeout_s=120,
                        )
                    )
                    if scan:
                        scans.append(_scan(results[-1]))
        for result in results:
            assert result.ok, (result.status, result.error, (result.data or {}).get("stderr"))
        stored = [client.get_call(r.call_id) for r in results]

    # The world's server got the value every time, never the placeholder.
    got = [r for r in egress_world.since(mark).requests if r.path.startswith("/echo")]
    assert len(got) == UNITS * PER_UNIT
    assert all(value.encode() in r.raw() or _basic_has(r, value) for r in got)

    needle = value.encode()

    def nowhere(blob: bytes, where: str) -> None:
        assert needle not in blob, f"the secret is in {where}"
        low = blob.lower()
        for i in range(0, len(value) - 16 + 1, 8):
            assert value[i : i + 16].encode() not in low, f"a piece of the secret is in {where}"

    for result in results:
        nowhere(json.dumps(result.model_dump(mode="json")).encode(), f"result {result.call_id}")
    for info in stored:
        nowhere(repr(info).encode(), f"GetCall {info}")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        nowhere(r.read(), "/metrics")
    nowhere((base / "daemon.log").read_bytes(), "the daemon's log")
    state = base / "state"
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name.startswith("journal") for p in files), files
    for path in files:
        nowhere(path.read_bytes(), str(path))

    for scan in scans:
        # The control: the placeholder was found where it lives, so the search works.
        assert scan["env"] == [0, scan["env"][1]] and scan["env"][1] > 0, scan  # type: ignore[index]
        assert scan["memory"][1] > 0, scan  # type: ignore[index]
        assert scan["self_pid"] in scan["mem_pids"], scan  # type: ignore[operator]
        assert scan["mem_bytes"] > 1 << 20, scan  # type: ignore[operator]
        for where in ("env", "proc_environ", "memory", "files"):
            assert scan[where][0] == 0, (where, scan)  # type: ignore[index]


def _basic_has(request: Request, value: str) -> bool:
    header = request.header("Authorization") or ""
    if not header.startswith("Basic "):
        return False
    return base64.b64decode(header.removeprefix("Basic ")).decode() == f"canary:{value}"
