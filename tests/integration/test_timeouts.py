"""Timeouts, detached calls, cancellation and shutdown: the caller always gets a
result that tells the truth about effects, and nothing of a stopped call lives on."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import RunningDaemon, ServedDaemon, wait_finished
from tooljail import (
    BadTimeoutError,
    CallNotFoundError,
    CallState,
    CallStatus,
    Client,
    Effect,
    Output,
    ToolResult,
)
from tooljail.testing import wait_for

# These tests watch for markers a tool's leftovers would write on the host, so the
# sandbox must be able to write there: no namespaces (the security tests cover the
# namespaced sandbox, where nothing of a call can reach the host at all).
NO_NAMESPACES = {"TOOLJAIL_ISOLATION": "none"}
NO_CGROUPS = {**NO_NAMESPACES, "TOOLJAIL_SANDBOX__USE_CGROUPS": "false"}

# Both ways of killing a sandbox's whole tree: the per-sandbox cgroup (when the
# host lets the daemon make one, as here as root), and the runner's subreaper
# sweep (every other host).
BACKENDS = [
    pytest.param(NO_NAMESPACES, id="cgroup"),
    pytest.param(NO_CGROUPS, id="subreaper"),
]


def spawn_escapees(marker_dir: Path, delay_s: float) -> str:
    """Code that starts two processes outside its session, each of which would
    write a marker file after `delay_s`, and prints their pids."""
    return f"""
import os, subprocess, time
# Proof that this sandbox can write the marker directory: without it the
# markers' absence below would prove nothing.
open('{marker_dir}/writable', 'w').write('x')
# A new session via subprocess, through a shell.
p = subprocess.Popen(
    ['sh', '-c', 'sleep {delay_s}; touch {marker_dir}/from-shell'], start_new_session=True
)
print(p.pid, flush=True)
# A classic daemon: double fork and setsid.
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        time.sleep({delay_s})
        open('{marker_dir}/from-daemon', 'w').write('x')
        os._exit(0)
    os.write(w, str(pid).encode())
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode(), flush=True)
"""


def alive(pid: int) -> bool:
    """The process runs (a zombie waiting for its reaper does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def wait_state(client: Client, call_id: str, state: CallState, timeout: float = 10.0) -> None:
    def reached() -> bool:
        try:
            return client.get_call(call_id).state is state
        except CallNotFoundError:  # not admitted yet
            return False

    wait_for(reached, timeout, interval=0.02, what=f"call {call_id} to reach {state}")


# ------------------------------------------------------------------ timeouts


@pytest.mark.parametrize("env", BACKENDS)
def test_a_call_that_loops_forever_times_out_and_leaves_no_process(
    start_daemon: Callable[..., RunningDaemon], host_dir: Path, env: dict[str, str]
) -> None:
    daemon = start_daemon(env=env)
    delay = 4.0
    code = spawn_escapees(host_dir, delay) + "while True:\n    pass\n"
    with Client(daemon.target) as client:
        start = time.monotonic()
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=2)
        elapsed = time.monotonic() - start
    assert 1.8 <= elapsed < 6, elapsed
    assert result.status is CallStatus.TIMEOUT, result
    assert result.effect is Effect.UNKNOWN
    assert not result.still_running
    assert "may still take effect" in result.message
    assert result.error is not None
    assert result.error.type == "Timeout"
    pids = [int(p) for p in result.data["stdout"].split()]
    assert len(pids) == 2
    # By the time the caller hears "timeout", the whole tree is dead.
    assert [pid for pid in pids if alive(pid)] == []
    assert live_processes_mentioning(str(host_dir)) == []
    # ...and what it had planned never happens.
    time.sleep(max(0.0, start + delay + 1.5 - time.monotonic()))
    assert sorted(p.name for p in host_dir.iterdir()) == ["writable"]
    daemon.assert_serving()


@pytest.mark.parametrize("env", BACKENDS)
def test_a_daemonized_grandchild_dies_when_its_call_succeeds(
    start_daemon: Callable[..., RunningDaemon], host_dir: Path, env: dict[str, str]
) -> None:
    daemon = start_daemon(env=env)
    delay = 2.5
    code = spawn_escapees(host_dir, delay) + "print('done')\n"
    with Client(daemon.target) as client:
        start = time.monotonic()
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=30)
    assert result.status is CallStatus.SUCCESS, result
    assert time.monotonic() - start < delay, "the call waited for its grandchildren"
    *pids, last = result.data["stdout"].split()
    assert last == "done"
    assert [pid for pid in map(int, pids) if alive(pid)] == []
    assert live_processes_mentioning(str(host_dir)) == []
    time.sleep(max(0.0, start + delay + 1.5 - time.monotonic()))
    assert sorted(p.name for p in host_dir.iterdir()) == ["writable"]


@pytest.mark.parametrize("timeout", [0.001, 0.5, 1000.5, 5000])
def test_a_timeout_out_of_bounds_is_refused(daemon: RunningDaemon, timeout: float) -> None:
    with Client(daemon.target) as client, pytest.raises(BadTimeoutError) as info:
        client.call("execute_python_code", {"code": "print(1)"}, tool_timeout_s=timeout)
    assert "1 to 1000" in str(info.value)


def test_timeouts_at_the_bounds_are_accepted(daemon: RunningDaemon) -> None:
    with Client(daemon.target) as client:
        for timeout in (1, 1000):
            result = client.call(
                "execute_python_code", {"code": "print(1)"}, tool_timeout_s=timeout
            )
            assert result.ok, result


# ------------------------------------------------------------------ kill_after_s

SLOW_TOOLS = '''
import time
from tooljail import tool


@tool(timeout_s=1, kill_after_s=8)
def slow_write(path: str, seconds: float = 3.0) -> str:
    """Sleeps, then writes a file."""
    time.sleep(seconds)
    open(path, "w").write("done")
    return "wrote " + path


@tool(timeout_s=1, kill_after_s=2)
def doomed_write(path: str, seconds: float = 30.0) -> str:
    """Sleeps past its kill_after_s, then would write a file."""
    time.sleep(seconds)
    open(path, "w").write("done")
    return "wrote " + path
'''


@pytest.fixture
def slow_daemon(serve: Callable[..., ServedDaemon], tmp_path: Path) -> ServedDaemon:
    """An in-process daemon serving SLOW_TOOLS, without namespaces (see NO_NAMESPACES)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "slow.py").write_text(SLOW_TOOLS)
    daemon = serve(tools_dirs=[tools], isolation="none")
    with Client(daemon.target) as client:
        assert client.diagnostics() == []
        by_name = {t.name: t for t in client.list_tools()}
    assert by_name["slow_write"].kill_after_s == 8
    return daemon


def test_a_call_past_its_timeout_runs_on_detached_until_it_ends(
    slow_daemon: ServedDaemon, host_dir: Path
) -> None:
    target = host_dir / "out.txt"
    call_id = "detached-" + uuid.uuid4().hex
    with Client(slow_daemon.target) as client:
        start = time.monotonic()
        result = client.call("slow_write", {"path": str(target)}, call_id=call_id)
        elapsed = time.monotonic() - start
        assert 0.8 <= elapsed < 2.9, elapsed
        assert result.status is CallStatus.TIMEOUT, result
        assert result.still_running
        assert result.effect is Effect.UNKNOWN
        assert "may still take effect" in result.message
        assert not target.exists()
        running = client.get_call(call_id)
        assert running.state is CallState.RUNNING
        info = wait_finished(client, call_id)
    assert info.state is CallState.SUCCEEDED, info
    assert info.result is not None
    assert info.result.status is CallStatus.SUCCESS
    assert info.result.data == f"wrote {target}"
    assert not info.result.still_running
    assert info.result.effect is Effect.APPLIED
    assert target.read_text() == "done"


def test_a_detached_call_is_killed_at_kill_after_s(
    slow_daemon: ServedDaemon, host_dir: Path
) -> None:
    target = host_dir / "never.txt"
    call_id = "doomed-" + uuid.uuid4().hex
    seconds = 4.0  # past kill_after_s=2: the write would come at 4 s
    with Client(slow_daemon.target) as client:
        start = time.monotonic()
        result = client.call(
            "doomed_write", {"path": str(target), "seconds": seconds}, call_id=call_id
        )
        assert result.status is CallStatus.TIMEOUT
        assert result.still_running
        info = wait_finished(client, call_id)
        ended = time.monotonic() - start
    assert info.state is CallState.TIMED_OUT, info
    assert ended < seconds, ended
    assert info.result is not None
    assert info.result.status is CallStatus.TIMEOUT
    assert info.result.effect is Effect.UNKNOWN
    assert not info.result.still_running
    time.sleep(max(0.0, start + seconds + 1.0 - time.monotonic()))
    assert not target.exists()


def test_cancelling_a_detached_call_stops_it(slow_daemon: ServedDaemon, host_dir: Path) -> None:
    target = host_dir / "cancelled.txt"
    call_id = "detached-cancel-" + uuid.uuid4().hex
    seconds = 3.0
    with Client(slow_daemon.target) as client:
        start = time.monotonic()
        result = client.call(
            "slow_write", {"path": str(target), "seconds": seconds}, call_id=call_id
        )
        assert result.still_running
        assert client.cancel(call_id) is CallState.CANCELLED
        info = client.get_call(call_id)
    assert info.state is CallState.CANCELLED
    assert info.result is not None
    assert info.result.status is CallStatus.CANCELLED
    assert info.result.effect is Effect.UNKNOWN
    time.sleep(max(0.0, start + seconds + 1.0 - time.monotonic()))
    assert not target.exists()


# ------------------------------------------------------------------ cancel


def test_cancel_stops_a_running_call_and_its_caller_hears_so(daemon: RunningDaemon) -> None:
    call_id = "cancel-me-" + uuid.uuid4().hex
    code = "import time\nprint('working', flush=True)\ntime.sleep(60)\nprint('finished')\n"
    first_output = threading.Event()
    items: list[Output | ToolResult] = []
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            with Client(daemon.target) as client:
                for item in client.stream("execute_python_code", {"code": code}, call_id=call_id):
                    items.append(item)
                    first_output.set()
        except BaseException as e:
            errors.append(e)
            first_output.set()

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert first_output.wait(10)
        with Client(daemon.target) as client:
            start = time.monotonic()
            assert client.cancel(call_id) is CallState.CANCELLED
            thread.join(10)
            assert not thread.is_alive()
            assert time.monotonic() - start < 5
            info = client.get_call(call_id)
            with pytest.raises(CallNotFoundError):
                client.cancel("no-such-call-" + uuid.uuid4().hex)
    finally:
        thread.join(30)
    assert errors == []
    result = items[-1]
    assert isinstance(result, ToolResult)
    assert result.status is CallStatus.CANCELLED
    assert result.effect is Effect.UNKNOWN
    assert result.data["stdout"] == "working\n"
    assert info.state is CallState.CANCELLED
    assert info.result is not None
    assert info.result.status is CallStatus.CANCELLED
    daemon.assert_serving()


# ------------------------------------------------------------------ shutdown


def test_sigterm_lets_short_calls_finish_and_stops_the_rest(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(env={"TOOLJAIL_SHUTDOWN_GRACE_S": "2"})
    codes = {
        "short": "import time\ntime.sleep(1)\nprint('finished')\n",
        "long": "import time\ntime.sleep(30)\nprint('finished')\n",
    }
    ids = {name: f"{name}-{uuid.uuid4().hex}" for name in codes}
    results: dict[str, ToolResult | BaseException] = {}

    def call(name: str) -> None:
        try:
            with Client(daemon.target) as client:
                results[name] = client.call(
                    "execute_python_code", {"code": codes[name]}, call_id=ids[name]
                )
        except BaseException as e:
            results[name] = e

    threads = [threading.Thread(target=call, args=(name,)) for name in codes]
    for t in threads:
        t.start()
    try:
        with Client(daemon.target) as client:
            for call_id in ids.values():
                wait_state(client, call_id, CallState.RUNNING)
        start = time.monotonic()
        exit_code = daemon.stop(timeout=20)
        stopped_in = time.monotonic() - start
    finally:
        for t in threads:
            t.join(20)
    assert exit_code == 0, daemon.log()
    assert stopped_in < 10, stopped_in
    short, long = results["short"], results["long"]
    assert isinstance(short, ToolResult), short
    assert short.status is CallStatus.SUCCESS
    assert short.data["stdout"] == "finished\n"
    assert isinstance(long, ToolResult), long
    assert long.status is CallStatus.CANCELLED
    assert long.effect is Effect.UNKNOWN
    assert long.data["stdout"] == ""
