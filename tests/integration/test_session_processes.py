"""Background processes of a session, through a real daemon over gRPC.

The SDK (`session.processes`), the model-facing tools (`start_process`,
`read_process_output`, ...) and the raw RPCs: a server started in the
background and its log read calls later, a follow dropped and re-attached
with no byte lost or repeated, stdin, signals, the session's limits, its end
and its reset, another client's session and process, bad input, and the
daemon's memory while a process prints fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

import tooljail.testing
from tests.conftest import ServedDaemon
from tooljail import (
    AsyncClient,
    Client,
    InvalidArgumentsError,
    InvalidPathError,
    InvalidRequestError,
    PermissionDeniedError,
    Processes,
    ProcessLimitError,
    ProcessNotFoundError,
    SessionNotFoundError,
)
from tooljail.types import ProcessState, StreamKind
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

pytestmark = pytest.mark.timeout(180)


def _wait_until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _get_in_session(session: Any, port: int, path: str) -> int:
    """GET http://127.0.0.1:port/path from inside the session; the status."""
    code = (
        "import urllib.request, urllib.error, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)\n"
        "        print(r.status); break\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code); break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
    )
    result = session.call("execute_python_code", {"code": code})
    assert result.ok, result
    return int(result.data["stdout"].strip() or 0)


def test_a_model_starts_a_server_and_reads_its_log_three_calls_later(
    served: ServedDaemon,
) -> None:
    with Client(served.target) as client, client.session() as s:
        started = s.call(
            "start_process",
            {"command": "python3 -u -m http.server 8765 --bind 127.0.0.1", "name": "web"},
        )
        assert started.ok, started
        process_id = started.data["process_id"]
        assert process_id.startswith("p-") and len(process_id) == 14
        assert _get_in_session(s, 8765, "/hello-from-the-test") == 404
        s.call("execute_python_code", {"code": "x = 1"})  # another call between
        listed = s.call("list_processes", {})
        assert [p["process_id"] for p in listed.data["processes"]] == [process_id]
        assert listed.data["processes"][0]["state"] == "running"
        log = ""
        offset = 0

        def got_log() -> bool:
            nonlocal log, offset
            read = s.call("read_process_output", {"process_id": process_id, "offset": offset})
            assert read.ok, read
            log += read.data["output"]
            offset = read.data["next_offset"]
            assert read.data["running"] is True and read.data["exit_code"] is None
            return "GET /hello-from-the-test" in log

        _wait_until(got_log)  # the access log is on stderr: it is included
        stopped = s.call("stop_process", {"process_id": process_id})
        assert stopped.ok and stopped.data["state"] == "exited", stopped
        after = s.processes.list()[0]
        assert after.state is ProcessState.EXITED and after.signal == signal.SIGTERM


def test_process_tools_without_a_session_are_refused(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        for tool, args in (
            ("start_process", {"command": "true"}),
            ("list_processes", {}),
            ("read_process_output", {"process_id": "p-000000000000"}),
        ):
            with pytest.raises(tooljail.SessionRequiredError, match="works on a session"):
                client.call(tool, args)


def test_a_dropped_follow_reattaches_from_its_offset_with_no_gap(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        p = s.processes.start(
            "for i in $(seq 1 3000); do echo out $i; echo err $i >&2; "
            "[ $((i % 500)) = 0 ] && sleep 0.05; done"
        )
        got = bytearray()
        offset = 0
        follow = s.processes.follow(p.process_id)
        for chunk in follow:
            assert chunk.offset == offset
            got += chunk.data
            offset = chunk.next_offset
            if len(got) > 5000:
                break
        follow.close()  # the stream drops mid-way
        for chunk in s.processes.follow(p.process_id, offset):
            assert chunk.offset == offset
            got += chunk.data
            offset = chunk.next_offset
        whole = s.processes.read(p.process_id, 0)
        assert bytes(got) == whole.data
        assert got.count(b"\n") == 6000
        assert {c.stream for c in whole.chunks} == {StreamKind.STDOUT, StreamKind.STDERR}
        errors = s.processes.read(p.process_id, 0, stream="stderr")
        assert errors.data.count(b"err ") == 3000 and b"out " not in errors.data
        assert whole.process is not None and whole.process.exit_code == 0


def test_stdin_to_cat_and_a_signal_to_a_process_that_traps_it(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        cat = s.processes.start(argv=["cat"])
        s.processes.write(cat.process_id, b"hello ")
        s.processes.write(cat.process_id, "world\n", eof=True)
        ended = s.processes.wait(cat.process_id, 10)
        assert ended.state is ProcessState.EXITED and ended.exit_code == 0
        assert s.processes.read(cat.process_id).data == b"hello world\n"
        with pytest.raises(InvalidRequestError, match="no more input"):
            s.processes.write(cat.process_id, b"more")
        trap = s.processes.start(
            "trap 'echo got USR1; exit 7' USR1; echo ready; while :; do sleep 0.1; done"
        )
        _wait_until(lambda: b"ready" in s.processes.read(trap.process_id).data)
        s.processes.signal(trap.process_id, signal.SIGUSR1)
        ended = s.processes.wait(trap.process_id, 10)
        assert ended.exit_code == 7
        assert b"got USR1" in s.processes.read(trap.process_id).data
        # stop: TERM ignored, KILL after the grace
        stubborn = s.processes.start("trap '' TERM; echo ready; while :; do sleep 0.1; done")
        _wait_until(lambda: b"ready" in s.processes.read(stubborn.process_id).data)
        began = time.monotonic()
        stopped = s.processes.stop(stubborn.process_id, grace_s=0.5)
        assert stopped.signal == signal.SIGKILL and time.monotonic() - began < 5


def test_limits_max_processes_and_the_pids_limit(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(sessions={"max_processes": 4})
    with Client(served.target) as client, client.session() as s:
        for _ in range(4):
            s.processes.start("sleep 60")
        with pytest.raises(ProcessLimitError, match="max_processes"):
            s.processes.start("sleep 60")
    served = serve(sessions={"max_processes": 64})
    with Client(served.target) as client, client.session(pids=32) as s:
        started, refused = [], []
        for _ in range(50):
            try:
                started.append(s.processes.start(argv=["sleep", "60"]))
            except ProcessLimitError as e:
                refused.append(str(e))
        assert started and refused, (len(started), refused)
        assert "pids limit" in refused[0]
        # stopping one makes room again, and the session is still usable
        s.processes.stop(started[0].process_id)
        s.processes.start(argv=["true"])
        assert s.call("execute_python_code", {"code": "print(1)"}).ok


def _host_sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return [p for p in found if p.pid != psutil.Process().pid]


def test_a_session_closed_with_processes_running_leaves_nothing(served: ServedDaemon) -> None:
    marker = "300.4711"  # an argument no other process on the host has
    with Client(served.target) as client:
        s = client.session()
        ids = [
            s.processes.start(f"sleep {marker}").process_id,
            s.processes.start(f"sh -c 'sleep {marker}; true' & wait").process_id,
        ]
        _wait_until(lambda: len(_host_sleepers(marker)) >= 2)
        s.close()
        _wait_until(lambda: not _host_sleepers(marker), 15)
        with pytest.raises((SessionNotFoundError, tooljail.SessionEndedError)):
            s.processes.list()
        assert ids


def test_a_reset_lists_the_processes_it_ended(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        p = s.processes.start("sleep 300", name="sleeper")
        result = s.call(
            "execute_python_code",
            {
                "code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "time.sleep(30)"
            },
            tool_timeout_s=1,
        )
        assert result.session_reset, result
        assert [e.process_id for e in result.processes_ended] == [p.process_id]
        assert result.processes_ended[0].state is ProcessState.KILLED
        assert "sleeper" in result.message
        assert s.processes.list()[0].state is ProcessState.KILLED


TOKENS = {
    "agent-a": "token-of-a",
    "agent-b": "token-of-b",
    "no-procs": "token-of-no-procs",
    "procs-only": "token-of-procs-only",
}
POLICIES = {
    "no-procs": 'tools = ["execute_python_code"]\n',
    "procs-only": 'tools = ["start_process", "read_process_output", "list_processes"]\n',
}


@pytest.fixture
def authed(tmp_path: Path) -> Iterator[str]:
    """A daemon with tokens: two identities that may do anything, two with policies."""
    path = tmp_path / "tokens.toml"
    path.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            + POLICIES.get(name, "")
            for name, token in TOKENS.items()
        )
    )
    path.chmod(0o600)
    with tooljail.testing.daemon(auth={"tokens_file": str(path)}) as target:
        yield target


@pytest.fixture
def two_clients(authed: str) -> Iterator[tuple[Client, Client]]:
    a = Client(authed, token=TOKENS["agent-a"], retries=0)
    b = Client(authed, token=TOKENS["agent-b"], retries=0)
    with a, b:
        yield a, b


def test_an_identitys_tool_policy_holds_at_the_process_rpcs(authed: str) -> None:
    with (
        Client(authed, token=TOKENS["no-procs"], retries=0) as c,
        c.session() as s,
        pytest.raises(PermissionDeniedError, match="'start_process'"),
    ):
        s.processes.start("true")
    # tools that work on a session from the daemon are reason enough to open one
    with Client(authed, token=TOKENS["procs-only"], retries=0) as c, c.session() as s:
        p = s.call("start_process", {"command": "echo hi"})
        assert p.ok, p
        assert s.processes.wait(p.data["process_id"], 10).exit_code == 0
        assert s.processes.read(p.data["process_id"]).data == b"hi\n"
        with pytest.raises(PermissionDeniedError, match="'stop_process'"):
            s.processes.stop(p.data["process_id"])


def test_another_clients_session_and_process_are_not_found(
    two_clients: tuple[Client, Client],
) -> None:
    a, b = two_clients
    with a.session() as sa, b.session() as sb:
        p = sa.processes.start("sleep 60")
        never = "p-" + "0" * 12
        # another client's session: not found, as a session id never known
        with pytest.raises(SessionNotFoundError) as theirs:
            Processes(b, sa.id).list()
        with pytest.raises(SessionNotFoundError) as unknown:
            Processes(b, "0" * 32).list()
        assert str(theirs.value).replace(sa.id, "X") == str(unknown.value).replace("0" * 32, "X")
        # a process of another session (and client) in one's own: as an unknown id
        with pytest.raises(ProcessNotFoundError) as other:
            sb.processes.read(p.process_id)
        with pytest.raises(ProcessNotFoundError) as none:
            sb.processes.read(never)
        assert str(other.value).replace(p.process_id, "X") == str(none.value).replace(never, "X")
        with pytest.raises(ProcessNotFoundError):
            sb.processes.signal(p.process_id, signal.SIGKILL)
        assert sa.processes.list()[0].running


def test_bad_input_is_refused_clearly(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        p = s.processes.start("echo hi")
        channel = grpc.insecure_channel(served.target)
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as negative:
            list(
                stub.ReadProcessOutput(
                    pb.ReadProcessOutputRequest(session_id=s.id, process_id=p.process_id, offset=-1)
                )
            )
        assert negative.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "negative" in (negative.value.details() or "")
        with pytest.raises(grpc.RpcError) as both:
            stub.StartProcess(pb.StartProcessRequest(session_id=s.id, command="ls", argv=["ls"]))
        assert both.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        channel.close()
        with pytest.raises(InvalidPathError):
            s.processes.start("ls", cwd="../..")
        with pytest.raises(InvalidPathError, match="'nope' is not a directory in the workspace"):
            s.processes.start("ls", cwd="nope")
        with pytest.raises(InvalidRequestError, match="No such file"):
            s.processes.start(argv=["/no/such/program"])
        with pytest.raises(InvalidRequestError, match="'='"):
            s.processes.start("ls", env={"A=B": "1"})
        with pytest.raises(InvalidRequestError, match="exactly one"):
            s.processes.start()
        # past the end: empty at once
        s.processes.wait(p.process_id, 10)
        page = s.processes.read(p.process_id, 10_000)
        assert page.data == b"" and page.next_offset == 10_000
        with pytest.raises(InvalidArgumentsError, match="not a signal name"):
            s.call("stop_process", {"process_id": p.process_id, "signal": "NOPE"})


def test_a_process_printing_50_mb_fast_keeps_the_daemon_small(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    daemon = psutil.Process()  # the daemon serves in this process
    with Client(served.target) as client, client.session() as s:
        before = daemon.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], daemon.memory_info().rss)
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            p = s.processes.start("head -c 52428800 /dev/zero | tr '\\0' x")
            began = time.monotonic()
            while s.processes.wait(p.process_id, 0.2).running:
                assert time.monotonic() - began < 120
                asked = time.monotonic()
                s.processes.list()  # the daemon's loop answers meanwhile
                assert time.monotonic() - asked < 1.0
            info = s.processes.wait(p.process_id, 0)
        finally:
            stop.set()
            watcher.join()
        assert info.exit_code == 0
        assert info.output_bytes == 50 * 1024 * 1024
        growth = peak[0] - before
        assert growth < 25 * 1024 * 1024, growth
        tail = s.processes.read(p.process_id, info.output_bytes - 10)
        assert tail.data == b"x" * 10
        # the part before the ring is read back from the spill
        head = s.processes.read(p.process_id, 0, limit=100)
        assert head.data == b"x" * 100 and head.skipped == 0
        assert info.output_artifact_id


def _cli(*args: str, target: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "TOOLJAIL_TARGET": target}
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args], capture_output=True, timeout=60, env=env
    )


def test_the_command_line_ps_logs_follow_and_kill(served: ServedDaemon) -> None:
    t = served.target
    with Client(t) as client, client.session() as s:
        p = s.processes.start(
            "i=0; while :; do i=$((i+1)); echo line $i; sleep 0.05; done", name="ticker"
        )
        _wait_until(lambda: b"line 3\n" in s.processes.read(p.process_id).data)
        ps = _cli("sessions", "ps", s.id, target=t)
        assert ps.returncode == 0, ps.stderr
        assert p.process_id in ps.stdout.decode() and "ticker: " in ps.stdout.decode()
        listed = json.loads(_cli("sessions", "ps", s.id, "--json", target=t).stdout)
        assert listed[0]["state"] == "running"
        logs = _cli("sessions", "logs", s.id, p.process_id, target=t)
        assert logs.returncode == 0 and logs.stdout.startswith(b"line 1\nline 2\n")
        # -f prints as it comes; Ctrl-C ends it cleanly, saying where to go on
        env = {**os.environ, "TOOLJAIL_TARGET": t}
        follow = subprocess.Popen(
            [sys.executable, "-m", "tooljaild", "sessions", "logs", "-f", s.id, p.process_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert follow.stdout is not None
        seen = b""
        while seen.count(b"\n") < 5:
            seen += follow.stdout.read1(4096)
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=20)
        assert follow.returncode == 0, err
        seen += out
        assert seen.startswith(b"line 1\n") and b"Traceback" not in err
        offset = int(err.decode().split("stopped following at offset ")[1].split()[0])
        assert offset == len(seen)
        rest = _cli("sessions", "logs", s.id, p.process_id, "--offset", str(offset), target=t)
        assert (seen + rest.stdout).startswith(s.processes.read(p.process_id, 0).data[:200])
        # TERM, not INT: bash defers SIGINT while it waits for a child and goes on
        # when that child exits by itself (a race with the loop's `sleep`).
        killed = _cli("sessions", "kill", s.id, p.process_id, "--signal", "TERM", target=t)
        assert killed.returncode == 0, killed.stderr
        assert s.processes.wait(p.process_id, 10).signal == signal.SIGTERM
        unknown = _cli("sessions", "kill", s.id, "p-" + "0" * 12, target=t)
        assert unknown.returncode == 2 and b"no process" in unknown.stderr


async def test_the_async_sdk(served: ServedDaemon) -> None:
    async with AsyncClient(served.target) as client, client.session() as s:
        p = await s.processes.start(argv=["sh", "-c", "echo one; echo two; read x; echo $x"])
        got = b""
        follow = s.processes.follow(p.process_id)
        async for chunk in follow:
            got += chunk.data
            if b"two" in got:
                break
        await follow.aclose()
        await s.processes.write(p.process_id, b"three\n")
        ended = await s.processes.wait(p.process_id, 10)
        assert ended.exit_code == 0
        page = await s.processes.read(p.process_id, len(got))
        assert got + page.data == b"one\ntwo\nthree\n"
        assert [i.process_id for i in await s.processes.list()] == [p.process_id]


@pytest.mark.docker
def test_the_main_path_on_docker(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(backend="docker")
    in_a_container = "import os\nprint(os.path.exists('/.dockerenv'))"
    with Client(served.target) as client, client.session() as s:
        assert s.call("execute_python_code", {"code": in_a_container}).data["stdout"] == "True\n"
        started = s.call("start_process", {"command": "echo ready; cat"})
        assert started.ok, started
        process_id = started.data["process_id"]
        s.processes.write(process_id, b"hello\n", eof=True)
        assert s.processes.wait(process_id, 20).exit_code == 0
        read = s.call("read_process_output", {"process_id": process_id})
        assert read.data["output"] == "ready\nhello\n" and read.data["exit_code"] == 0
        sleeper = s.processes.start("sleep 300")
        assert s.processes.stop(sleeper.process_id, grace_s=1).signal == signal.SIGTERM
        kept = s.processes.start("sleep 300")
        result = s.call(
            "execute_python_code",
            {
                "code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "time.sleep(30)"
            },
            tool_timeout_s=1,
        )
        assert [p.process_id for p in result.processes_ended] == [kept.process_id]


def test_output_the_artifact_store_refuses_is_skipped_and_said(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(
        sessions={"process_output_ring_bytes": 64 * 1024},
        artifacts={"max_artifact_bytes": 256 * 1024},
    )
    with Client(served.target) as client, client.session() as s:
        p = s.processes.start("head -c 1048576 /dev/zero | tr '\\0' y")
        info = s.processes.wait(p.process_id, 30)
        assert info.output_bytes == 1024 * 1024 and info.ring_start == 1024 * 1024 - 64 * 1024
        assert info.output_artifact_id  # what the store took: the first 256 KiB
        head = s.processes.read(p.process_id, 0, limit=1000)
        assert head.data == b"y" * 1000 and head.skipped == 0
        gap = s.processes.read(p.process_id, 300 * 1024, limit=10)
        assert gap.skipped == info.ring_start - 300 * 1024
        assert gap.chunks[0].offset == info.ring_start and gap.data == b"y" * 10
        assert client.get_artifact(info.output_artifact_id) == b"y" * 256 * 1024


def test_the_read_tool_never_splits_a_character(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        started = s.call(
            "start_process", {"command": "printf 'h\\303\\251\\342\\202\\254%.0s' $(seq 50)"}
        )
        process_id = started.data["process_id"]
        text, offset, running = "", 0, True
        while running or offset < s.processes.list()[0].output_bytes:
            read = s.call(
                "read_process_output", {"process_id": process_id, "offset": offset, "limit": 4}
            )
            text += read.data["output"]
            offset, running = read.data["next_offset"], read.data["running"]
        assert text == "hé€" * 50
