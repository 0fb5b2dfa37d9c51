"""Limits end a call with their own typed reason, never with a hang, on every backend."""

from __future__ import annotations

import pytest

from tests.security.conftest import SecurityDaemon, report, run_code
from tooljail import CallStatus, Client, Effect

pytestmark = pytest.mark.timeout(120)

MiB = 2**20


def test_memory_past_the_sandbox_limit_is_out_of_memory_not_a_hang(daemon: SecurityDaemon) -> None:
    """`hog` runs in a 160 MiB sandbox (its own profile, so its own pool)."""
    with Client(daemon.target) as client:
        small = client.call("hog", {"mib": 32}, tool_timeout_s=60)
        big = client.call("hog", {"mib": 320}, tool_timeout_s=60)
    assert small.ok and small.data == "fit", small
    assert big.status is CallStatus.ERROR, big
    assert big.error is not None and big.error.type == "OutOfMemory", big.error
    assert "memory" in big.message
    assert big.duration_s < 30
    daemon.assert_serving()


def test_endless_output_stops_at_the_output_limit(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        result = client.call("shout", {}, tool_timeout_s=60)
    assert result.status is CallStatus.ERROR, result
    assert result.effect is Effect.UNKNOWN
    assert result.error is not None and result.error.type == "OutputLimit", result.error
    assert result.output_bytes > 4 * MiB
    assert result.duration_s < 30


def test_cpu_seconds_past_the_limit_end_as_cpu_limit(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        result = client.call("spin", {"seconds": 20}, tool_timeout_s=60)
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None and result.error.type == "CpuLimit", result.error
    assert result.duration_s < 15


def test_the_sandbox_gets_at_most_its_cpu_cores(daemon: SecurityDaemon) -> None:
    """Two busy processes for 1.5 s of wall time get about 1.5 CPU seconds together
    (limits.cpus = 1), not the 3 that two free cores would give them."""
    code = """
import json, multiprocessing, os, time

def burn():
    end = time.time() + 1.5
    while time.time() < end:
        pass

if __name__ == '__main__':
    start = time.time()
    procs = [multiprocessing.Process(target=burn) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    t = os.times()
    print('REPORT ' + json.dumps({'cpu': t.children_user + t.children_system,
                                  'wall': time.time() - start}))
"""
    result = run_code(daemon, code, timeout=60)
    assert result.ok, result
    got = report(result)
    assert got["cpu"] <= 1.35 * got["wall"] * 1.0, f"more than one core's worth: {got}"
