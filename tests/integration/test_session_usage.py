"""Each call in a session reports what IT used, not the session so far (issue 14).

Through a real daemon over gRPC: the process backend with its sandbox's cgroup
(the daemon's figures) and without one (the session supervisor's, read from
outside the interpreter), and the docker backend. Fresh-sandbox usage is in
test_metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import CallStatus, Client, ToolResult

pytestmark = pytest.mark.timeout(180)

BURN_CPU = (
    "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass"
)
# Freed at its end: the session's next call must not find it still resident.
HOLD_110_MB = "data = b'x' * (110 * 2**20)\nprint(len(data))\ndel data"
QUIET = "print('hi')"
# Uses 0.3 s of CPU, then waits to be stopped: obeying the interrupt (SPIN) or
# deaf to it (STUBBORN: its timeout ends in a reset of the interpreter).
SPIN = (
    "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n"
    "    pass\ntime.sleep(120)"
)
STUBBORN = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + SPIN
MIB = 2**20


def _usage(result: ToolResult) -> tuple[float, int]:
    assert result.usage is not None, result
    assert result.usage.wall_s == pytest.approx(result.duration_s)
    assert result.usage.output_bytes == result.output_bytes
    return result.usage.cpu_s, result.usage.memory_peak_bytes


def _assert_per_call(client: Client, *, timeout: float = 30) -> None:
    """CPU and memory of one call, then of the small call after it: each its own."""
    with client.session() as s:
        burn = s.call("execute_python_code", {"code": BURN_CPU}, tool_timeout_s=timeout)
        after_burn = s.call("execute_python_code", {"code": QUIET}, tool_timeout_s=timeout)
        hold = s.call("execute_python_code", {"code": HOLD_110_MB}, tool_timeout_s=timeout)
        after_hold = s.call("execute_python_code", {"code": QUIET}, tool_timeout_s=timeout)
    for result in (burn, after_burn, hold, after_hold):
        assert result.status is CallStatus.SUCCESS, result
    burn_cpu, _ = _usage(burn)
    quiet_cpu, _ = _usage(after_burn)
    _, hold_peak = _usage(hold)
    _, quiet_peak = _usage(after_hold)
    assert burn_cpu > 0.4, burn.usage
    assert quiet_cpu < 0.2, after_burn.usage  # not the session's 0.5 s so far
    assert hold_peak > 100 * MIB, hold.usage
    # Not the session's peak: the 110 MB were freed before this call began.
    assert 0 < quiet_peak < 60 * MIB, after_hold.usage


@pytest.fixture(params=[True, False], ids=["cgroup", "supervisor"])
def process_daemon(
    request: pytest.FixtureRequest,
    start_daemon: Callable[..., RunningDaemon],
    tmp_path: Path,
) -> Iterator[RunningDaemon]:
    """`tooljail serve` (process backend) whose sandboxes have a cgroup (where the
    host lets the daemon make one) or none: then the supervisor's figures stand."""
    config = tmp_path / "tooljail.toml"
    config.write_text(
        f"pool_size = 1\n[sandbox]\nuse_cgroups = {str(request.param).lower()}\n"
        "[sessions]\ninterrupt_grace_s = 1.0\n"
    )
    daemon = start_daemon("--config", str(config))
    if request.param and "no writable cgroup tree" in daemon.log():
        daemon.stop()
        pytest.skip("the daemon cannot make its sandboxes cgroups here")
    yield daemon
    daemon.stop()


@pytest.mark.isolation
def test_a_session_call_reports_its_own_cpu_and_memory(process_daemon: RunningDaemon) -> None:
    with Client(process_daemon.target) as client:
        _assert_per_call(client)


@pytest.mark.isolation
def test_interrupted_and_reset_session_calls_report_usage_up_to_their_end(
    process_daemon: RunningDaemon,
) -> None:
    with Client(process_daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": BURN_CPU}, tool_timeout_s=30)  # the session's
        interrupted = s.call("execute_python_code", {"code": SPIN}, tool_timeout_s=4)
        reset = s.call("execute_python_code", {"code": STUBBORN}, tool_timeout_s=4)
        after = s.call("execute_python_code", {"code": QUIET}, tool_timeout_s=30)
    assert interrupted.status is CallStatus.TIMEOUT, interrupted
    assert not interrupted.session_reset, interrupted
    assert reset.status is CallStatus.TIMEOUT, reset
    assert reset.session_reset, reset
    assert after.status is CallStatus.SUCCESS and not after.session_reset, after
    # Each used 0.3 s before it was stopped: counted up to its end, and only its
    # own (not the session's 0.5 s before it); the next call's is its own again.
    for stopped in (interrupted, reset):
        cpu, peak = _usage(stopped)
        assert 0.25 < cpu < 0.7, stopped.usage
        assert peak > 0, stopped.usage
    assert _usage(after)[0] < 0.2, after.usage


def test_a_workspace_tool_in_a_session_reports_usage(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(pool_size=1, isolation="none", sandbox={"use_cgroups": False})
    with Client(served.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": BURN_CPU}, tool_timeout_s=30)
        wrote = s.call("write_file", {"path": "a.txt", "content": "hello"})
    assert wrote.status is CallStatus.SUCCESS, wrote
    cpu, peak = _usage(wrote)
    assert cpu < 0.2 and peak > 0, wrote.usage  # the supervisor's own, for this operation


@pytest.fixture
def docker_daemon(start_daemon: Callable[..., RunningDaemon]) -> Iterator[RunningDaemon]:
    from tests.conftest import docker_problem

    problem = docker_problem()
    if problem is not None:
        pytest.skip(problem)
    daemon = start_daemon("--backend", "docker")
    yield daemon
    daemon.stop()


@pytest.mark.docker
def test_a_docker_session_call_reports_its_own_cpu_and_memory(
    docker_daemon: RunningDaemon, tmp_path: Path
) -> None:
    with Client(docker_daemon.target) as client:
        _assert_per_call(client, timeout=60)
