"""Timeouts and cancel: the caller hears "may still take effect", and nothing of the
call is left running: no process, and (docker) no container."""

from __future__ import annotations

import time

import pytest

from tests.conformance.conftest import Backend, assert_gone, containers_of_token
from tests.security.conftest import (
    BackgroundCall,
    SecurityDaemon,
    live_processes_mentioning,
    run_code,
    wait_until,
)
from tooljail import CallState, CallStatus, Client, Effect

pytestmark = pytest.mark.timeout(120)


def _lingering(token: str) -> str:
    """Code that starts a detached child carrying `token`, says so, and never ends."""
    return f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {token!r}],
                 start_new_session=True)
print('started', flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_timeout_says_effect_unknown_and_leaves_nothing(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    call = BackgroundCall(daemon, _lingering(token), timeout=3)
    call.wait_for("started")
    assert wait_until(lambda: bool(live_processes_mentioning(token)), 5)
    containers = containers_of_token(backend, token)
    assert bool(containers) is (backend.name == "docker"), containers
    result = call.join(30)
    assert result.status is CallStatus.TIMEOUT, result
    assert result.effect is Effect.UNKNOWN
    assert not result.still_running
    assert "may still take effect" in result.message
    assert result.data["stdout"] == "started\n"
    assert_gone(backend, token, containers)
    daemon.assert_serving()


def test_a_cancelled_call_is_cancelled_and_leaves_nothing(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    call = BackgroundCall(daemon, _lingering(token), timeout=60)
    call.wait_for("started")
    assert wait_until(lambda: bool(live_processes_mentioning(token)), 5)
    containers = containers_of_token(backend, token)
    started = time.monotonic()
    with Client(daemon.target) as client:
        state = client.cancel(call.call_id)
    assert state is CallState.CANCELLED
    result = call.join(30)
    assert time.monotonic() - started < 10
    assert result.status is CallStatus.CANCELLED, result
    assert result.effect is Effect.UNKNOWN
    assert_gone(backend, token, containers)
    daemon.assert_serving()


def test_a_call_that_ends_leaves_no_process_behind(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    """A successful call's detached child is killed with its sandbox too."""
    code = f"""
import subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {token!r}],
                 start_new_session=True)
print('done')
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    assert_gone(backend, token, set())
