"""Session timeouts, tightened (issue 24, item 6): at the deadline the call's
processes die at once, an interpreter that ignores SIGINT is reset at once,
and only one that can take the KeyboardInterrupt gets the grace."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client

NO_NAMESPACES = {"isolation": "none"}


@pytest.mark.parametrize(
    "deaf",
    [
        "signal.signal(signal.SIGINT, signal.SIG_IGN)",
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})",
    ],
    ids=["ignored", "blocked"],
)
def test_code_that_ignores_sigint_does_not_act_in_the_grace(
    serve: Callable[..., ServedDaemon], tmp_path: Path, deaf: str
) -> None:
    """The issue's repro: SIG_IGN, sleep 1.6 s under timeout=1, then write a
    file (and the same with SIGINT blocked)."""
    served = serve(**NO_NAMESPACES)
    marker = tmp_path / "marker"
    tmp_path.chmod(0o777)
    code = (
        f"import signal, time\n{deaf}\ntime.sleep(1.6)\nopen({str(marker)!r}, 'w').write('acted')\n"
    )
    with Client(served.target) as client:
        s = client.session()
        s.call("execute_python_code", {"code": "kept = 1"})
        started = time.monotonic()
        result = s.call("execute_python_code", {"code": code}, tool_timeout_s=1)
        took = time.monotonic() - started
        assert result.status is CallStatus.TIMEOUT, result
        assert result.session_reset, result  # reset at once: its variables are gone
        assert took < 1.5, f"the reset waited for the grace ({took:.2f}s)"
        time.sleep(1.0)  # past when the code would have written
        assert not marker.exists(), "code that ignored SIGINT acted after its deadline"
        after = s.call("execute_python_code", {"code": "print('kept' in globals())"})
        assert after.data["stdout"] == "False\n", after
        s.close()


def test_a_call_that_takes_the_interrupt_keeps_its_grace_and_session(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    """KeyboardInterrupt honoured: its cleanup runs in the grace, the variables
    stay; the process it started dies at the deadline, not after the grace
    (before, it lived through the grace and wrote its marker in it)."""
    served = serve(**NO_NAMESPACES)
    tmp_path.chmod(0o777)
    cleaned, child_marker = tmp_path / "cleaned", tmp_path / "child"
    code = (
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sh', '-c', 'sleep 1.3; touch {child_marker}'])\n"
        "print(p.pid, flush=True)\n"
        "try:\n"
        "    time.sleep(30)\n"
        "except KeyboardInterrupt:\n"
        "    time.sleep(0.8)\n"  # a cleanup that takes a while: inside the grace
        f"    open({str(cleaned)!r}, 'w').write('x')\n"
        "    raise\n"
    )
    with Client(served.target) as client:
        s = client.session()
        s.call("execute_python_code", {"code": "kept = 41"})
        result = s.call("execute_python_code", {"code": code}, tool_timeout_s=1)
        assert result.status is CallStatus.TIMEOUT, result
        assert not result.session_reset, result
        assert cleaned.exists(), "the KeyboardInterrupt's cleanup did not get its grace"
        pid = int(result.data["stdout"].split()[0])
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        time.sleep(0.5)
        assert not child_marker.exists(), "the call's process ran on past the deadline"
        after = s.call("execute_python_code", {"code": "print(kept + 1)"})
        assert after.data["stdout"] == "42\n", after
        s.close()
