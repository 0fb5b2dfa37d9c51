"""Sessions' bounds, expiry and journal, through a real daemon over gRPC (process backend).

What every backend must do in a session is in tests/conformance/test_sessions.py;
here is what the daemon around them does: how many sessions, for how long, and
what a call learns about a session that died with the daemon.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import (
    CallStatus,
    Client,
    InvalidRequestError,
    OverloadedError,
    SessionEndedError,
    SessionState,
)

pytestmark = pytest.mark.timeout(180)


def _sandbox_processes(state_dir: object) -> list[psutil.Process]:
    """Live processes whose command line names the daemon's state directory (runners)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(state_dir) in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_session_lost_in_a_kill_9_says_so_after_the_restart(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    first = start_daemon()
    with Client(first.target) as client:
        s = client.session()
        s.call("execute_python_code", {"code": "x = 1"})
        session_id = s.id
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    # Nothing of it runs on: its sandboxes went with the daemon.
    deadline = time.monotonic() + 10
    while _sandbox_processes(first.state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p.pid for p in _sandbox_processes(first.state_dir)]
    second = start_daemon("--state-dir", str(first.state_dir))
    with Client(second.target) as client:
        with pytest.raises(SessionEndedError) as ended:
            client.call("execute_python_code", {"code": "print(x)"}, session_id=session_id)
        assert ended.value.reason == "daemon_restart"
        text = str(ended.value)
        assert "restarted" in text and "gone" in text
        closed = client.close_session(session_id)
        assert closed.state is SessionState.CLOSED and closed.end_reason == "daemon_restart"


def test_a_thousand_sessions_meet_the_bound_quickly_and_leave_nothing(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(env={"TOOLJAIL_SESSIONS__MAX_SESSIONS_PER_CLIENT": "6"})
    proc = psutil.Process(daemon.pid)
    with Client(daemon.target) as client:
        client.call("execute_python_code", {"code": "1"})
        before = proc.memory_info().rss
        opened, refused = [], []
        started = time.monotonic()
        for _ in range(1000):
            try:
                opened.append(client.session())
            except OverloadedError as exc:
                refused.append(exc)
        elapsed = time.monotonic() - started
        assert len(opened) == 6 and len(refused) == 994
        assert refused[0].retry_after_s >= 1
        assert elapsed < 30, f"1000 attempts took {elapsed:.1f}s"
        assert len(client.list_sessions()) == 6
        for s in opened:
            s.close()
        assert client.list_sessions() == []
        runners = _sandbox_processes(daemon.state_dir)
        after = proc.memory_info().rss
    # The pool's warm sandboxes stay; the sessions' are gone.
    assert len(runners) <= 2 * 4, [p.cmdline() for p in runners]
    assert after - before < 32 * 2**20, f"the daemon grew by {(after - before) >> 20} MiB"


def test_idle_sessions_expire_and_say_why(serve: Callable[..., ServedDaemon]) -> None:
    served = serve()
    with Client(served.target) as client:
        s = client.session(idle_ttl_s=1)
        assert s.call("execute_python_code", {"code": "print(1)"}).ok
        time.sleep(2.5)
        with pytest.raises(SessionEndedError) as ended:
            s.call("execute_python_code", {"code": "print(2)"})
        assert ended.value.reason == "idle_ttl"


def test_a_session_ends_at_its_lifetime_even_while_busy(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    with Client(served.target) as client:
        s = client.session(max_lifetime_s=2)
        result = s.call(
            "execute_python_code", {"code": "import time; time.sleep(30)"}, tool_timeout_s=20
        )
        assert result.status in (CallStatus.CANCELLED, CallStatus.ERROR), result
        assert result.session_reset
        assert "max" in result.message.lower() or "lifetime" in result.message.lower()
        with pytest.raises(SessionEndedError) as ended:
            s.call("execute_python_code", {"code": "1"})
        assert ended.value.reason == "max_lifetime"


def test_options_may_lower_the_bounds_never_raise_them(serve: Callable[..., ServedDaemon]) -> None:
    served = serve()
    with Client(served.target) as client:
        with pytest.raises(InvalidRequestError, match="idle_ttl_s"):
            client.session(idle_ttl_s=10**9)
        with pytest.raises(InvalidRequestError, match="memory_bytes"):
            client.session(memory_bytes=2**50)
        with client.session(workspace_bytes=4 * 2**20, idle_ttl_s=30) as s:
            info = next(i for i in client.list_sessions() if i.session_id == s.id)
            assert info.workspace_bytes == 4 * 2**20 and info.idle_ttl_s == 30
            full = s.call("write_file", {"path": "big.txt", "content": "x" * (5 * 2**20)})
            assert full.status is CallStatus.ERROR, full
            assert "quota" in full.to_model_text().lower() or "full" in full.to_model_text().lower()


def test_a_session_queue_is_bounded(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(sessions={"max_queued_calls": 1})
    import threading

    with Client(served.target) as client, client.session() as s:
        blockers = [
            threading.Thread(
                target=s.call,
                args=("execute_python_code", {"code": "import time; time.sleep(1.5)"}),
            )
            for _ in range(2)
        ]
        for t in blockers:
            t.start()
            time.sleep(0.3)
        with pytest.raises(OverloadedError, match="turn"):
            s.call("execute_python_code", {"code": "1"})
        for t in blockers:
            t.join(30)
        assert s.call("execute_python_code", {"code": "print(1)"}).ok


def test_code_that_kills_its_supervisor_ends_its_session_and_says_so(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    with Client(served.target) as client:
        s = client.session()
        s.call("execute_python_code", {"code": "x = 1"})
        result = s.call("execute_python_code", {"code": "import os; os.kill(os.getppid(), 9)"})
        assert result.status is CallStatus.ERROR, result
        assert result.session_reset
        assert "ended" in result.message and "create a new session" in result.message
        with pytest.raises(SessionEndedError) as ended:
            s.call("execute_python_code", {"code": "print(x)"})
        assert ended.value.reason == "sandbox_died"
        assert s.id not in [i.session_id for i in client.list_sessions()]
        served.assert_serving()


def test_a_session_whose_supervisor_cannot_answer_is_given_up_in_bounded_time(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(sessions={"interrupt_grace_s": 0.5, "reset_timeout_s": 1.5})
    with Client(served.target) as client:
        s = client.session()
        freeze = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nwhile True: pass"
        started = time.monotonic()
        result = s.call("execute_python_code", {"code": freeze}, tool_timeout_s=1)
        took = time.monotonic() - started
        assert result.status is CallStatus.TIMEOUT, result
        assert result.session_reset
        assert took < 10, f"took {took:.1f}s"
        with pytest.raises(SessionEndedError) as ended:
            s.call("execute_python_code", {"code": "1"})
        assert ended.value.reason == "sandbox_died"
        served.assert_serving()


_FLOOD = (
    "import subprocess, sys\n"
    "flood = 'import os\\nwhile True: os.write(1, b\"x\" * 65536)'\n"
    "subprocess.Popen([sys.executable, '-c', flood])\n"
    "print('flooding')\n"
)


def test_output_between_calls_costs_the_daemon_nothing(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    """A kept process writing flat out between calls: none of it reaches the
    daemon (it cost ~0.18 core per session when it did), the daemon answers
    at once meanwhile, and the next call's output is its own."""
    daemon = start_daemon()
    proc = psutil.Process(daemon.pid)
    with (
        Client(daemon.target) as client,
        client.session(keep_processes=True) as s,
        grpc.insecure_channel(daemon.target) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        assert _stdout_of(s.call("execute_python_code", {"code": _FLOOD})) == "flooding\n"
        time.sleep(0.5)
        before, started = proc.cpu_times(), time.monotonic()
        rss_before = proc.memory_info().rss
        slowest = 0.0
        while time.monotonic() - started < 3:
            asked = time.monotonic()
            health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            slowest = max(slowest, time.monotonic() - asked)
            time.sleep(0.2)
        after, elapsed = proc.cpu_times(), time.monotonic() - started
        cores = (after.user + after.system - before.user - before.system) / elapsed
        print(f"daemon CPU while a kept process floods between calls: {cores:.3f} core")
        assert cores < 0.06, f"the daemon spent {cores:.2f} core while the session was idle"
        assert slowest < 0.5, f"GetDaemonInfo took {slowest:.2f}s"
        assert proc.memory_info().rss - rss_before < 16 * 2**20
        later = s.call("execute_python_code", {"code": "print('mine')"})
        assert _stdout_of(later) == "mine\n", later
        left = later.data["left_running"]
        assert left["dropped_output_bytes"] > 0 and left["processes"] == 1, later
        # Read and dropped at 64 KiB a second at most (the default), not flat out.
        assert left["dropped_output_bytes"] < 16 * 65536, later


def test_a_rate_of_zero_reads_nothing_between_calls(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(sessions={"idle_output_bytes_per_s": 0})
    with Client(served.target) as client, client.session(keep_processes=True) as s:
        s.call("execute_python_code", {"code": _FLOOD})
        time.sleep(1)
        later = s.call("execute_python_code", {"code": "print('mine')"})
        assert _stdout_of(later) == "mine\n", later
        # One read of the call's pipe, then its writer waits on a full pipe.
        assert 0 < later.data["left_running"]["dropped_output_bytes"] <= 2**20, later


def _stdout_of(result: object) -> str:
    data = getattr(result, "data", None)
    assert isinstance(data, dict), result
    return str(data["stdout"])
