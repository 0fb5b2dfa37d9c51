"""How a call ends: the result is the last word.

When the tool's code returns, whatever it started is killed before the caller
hears the result (in a zygote sandbox the worker does this itself, then says
"sealed"), and output written before the end is in the result. These hold
whichever way the end is reached: the sealed one, or the keeper's sweep when the
worker cannot seal (another thread still runs).
"""

from __future__ import annotations

import contextlib
import uuid

import psutil
import pytest

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client, Effect
from tooljail.testing import wait_for


def _processes_mentioning(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(token in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def _assert_none_left(token: str) -> None:
    # The result came after the kill; give the kernel a moment to reap.
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not _processes_mentioning(token), 5, interval=0.05)
    assert _processes_mentioning(token) == []


@pytest.mark.isolation
def test_output_of_a_child_left_running_is_kept_and_the_child_is_gone(
    served: ServedDaemon,
) -> None:
    token = "child-" + uuid.uuid4().hex
    code = f"""
import os, subprocess, sys
r, w = os.pipe()
child_code = (
    'import os, sys, time; print("from the child", flush=True); '
    'os.write(int(sys.argv[1]), b"x"); time.sleep(60)'
)
child = subprocess.Popen([sys.executable, '-c', child_code, str(w), {token!r}], pass_fds=(w,))
os.read(r, 1)  # the child has printed
print("from the tool")
"""
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=30)
    assert result.status is CallStatus.SUCCESS, result
    assert result.effect is Effect.APPLIED
    assert result.data["stdout"].splitlines() == ["from the child", "from the tool"]
    _assert_none_left(token)
    served.assert_serving()


@pytest.mark.isolation
def test_a_thread_still_running_at_the_end_ends_with_the_call(served: ServedDaemon) -> None:
    token = "thread-" + uuid.uuid4().hex
    # A non-daemon thread that never stops, and a child it would keep company.
    code = f"""
import subprocess, sys, threading, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}])
def forever():
    while True:
        time.sleep(0.01)
threading.Thread(target=forever).start()
print("returned")
"""
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=30)
    assert result.status is CallStatus.SUCCESS, result
    assert result.data["stdout"] == "returned\n"
    _assert_none_left(token)
    served.assert_serving()


@pytest.mark.isolation
def test_a_tool_that_closes_or_copies_its_stdout_still_ends_at_once(
    served: ServedDaemon,
) -> None:
    token = "fds-" + uuid.uuid4().hex
    # A copy of stdout held by a lingering child would keep the pipe open.
    code = f"""
import os, subprocess, sys
copy = os.dup(1)
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                 stdout=copy, pass_fds=(copy,))
os.write(copy, b"via the copy\\n")
sys.stdout.flush()
os.close(1)
"""
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=30)
    assert result.status is CallStatus.SUCCESS, result
    assert result.data["stdout"] == "via the copy\n"
    _assert_none_left(token)
