"""The first thing a new user does: start the daemon, make one call."""

from __future__ import annotations

from tests.conftest import RunningDaemon
from tooljail import CallStatus, Client, Effect


def test_execute_python_code_over_the_default_unix_socket_setup(daemon: RunningDaemon) -> None:
    with Client(daemon.target) as client:
        result = client.call("execute_python_code", {"code": "print(6 * 7)"})
    assert result.status is CallStatus.SUCCESS
    assert result.effect is Effect.APPLIED
    assert result.data == {"stdout": "42\n", "stderr": "", "exit_code": 0}
    assert result.call_id
