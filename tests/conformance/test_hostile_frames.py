"""The hostile-sandbox attacks of tests/security/test_hostile_sandbox.py that every
backend must meet the same way: forged frames of the wrong shape, and a forged
sealed result while a child lives on (docker's keeper is pid 1 and its results
are sealed too)."""

from __future__ import annotations

import json

import pytest

from tests.conformance.conftest import Backend, assert_gone, containers_of_token
from tests.security.conftest import BackgroundCall, SecurityDaemon, run_code
from tests.security.test_hostile_sandbox import WRITE_FRAMES, assert_protocol_error, flood_code

pytestmark = pytest.mark.timeout(180)


def test_forged_yields_end_the_call_with_a_protocol_error(daemon: SecurityDaemon) -> None:
    result = run_code(daemon, flood_code(b'\n{"t":"yield","v":1}\n', 100_000), timeout=120)
    assert_protocol_error(result, "cannot yield")
    daemon.assert_serving()


def test_a_forged_result_of_the_wrong_shape_kills_the_sandbox(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    frame = {"t": "result", "ok": "yes", "exit_code": 0}
    code = (
        WRITE_FRAMES
        + f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print('started', flush=True)
time.sleep(1)
write(b'\\n' + {json.dumps(frame).encode()!r} + b'\\n')
time.sleep(60)
"""
    )
    call = BackgroundCall(daemon, code, timeout=90)
    call.wait_for("started")
    containers = containers_of_token(backend, token)
    result = call.join(60)
    assert_protocol_error(result, "boolean ok")
    assert_gone(backend, token, containers, timeout=5)
    daemon.assert_serving()


def test_a_forged_sealed_result_leaves_no_process_running(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    sealed = {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
    sealed["sealed"] = True
    code = (
        WRITE_FRAMES
        + f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 stdin=subprocess.DEVNULL, start_new_session=True)
print('started', flush=True)
time.sleep(1)
write(b'\\n' + {json.dumps(sealed).encode()!r} + b'\\n')
os.closerange(0, 3)
time.sleep(60)
"""
    )
    call = BackgroundCall(daemon, code, timeout=90)
    call.wait_for("started")
    containers = containers_of_token(backend, token)
    assert bool(containers) is (backend.name == "docker"), containers
    result = call.join(60)
    assert result.ok, result
    assert_gone(backend, token, containers, timeout=2)
    daemon.assert_serving()
