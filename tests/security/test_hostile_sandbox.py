"""The sandbox as the daemon's adversary: tool code writes into the runner's frame pipe.

The frame pipe is open in the worker that runs the tool's code (at descriptor
64, close-on-exec), so model-written code can forge, garble, flood and
oversize frames. What must hold (runner_channel's "A hostile sandbox"): the
daemon's memory stays bounded per call, a broken protocol ends the call with
a ProtocolError (effect unknown) and kills the sandbox, and a forged "sealed"
result leaves nothing running. Each attack runs through a real daemon.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest

from tests.security.conftest import (
    MiB,
    SecurityDaemon,
    assert_nothing_left,
    live_processes_mentioning,
    report,
    run_code,
)
from tooljail import CallStatus, Effect, ToolResult

pytestmark = pytest.mark.timeout(180)

FRAME_FD = 64

WRITE_FRAMES = f"""
import json, os, stat
def write(data):
    # The frame pipe, where the runner keeps it: a pipe at descriptor {FRAME_FD}.
    assert stat.S_ISFIFO(os.fstat({FRAME_FD}).st_mode)
    view = memoryview(data)
    while view:
        view = view[os.write({FRAME_FD}, view):]
"""


def flood_code(line: bytes, count: int) -> str:
    """Code that writes `line` `count` times into the frame pipe, in big writes."""
    return (
        WRITE_FRAMES
        + f"""
block = {line!r} * 10000
for _ in range({count} // 10000):
    write(block)
print('REPORT ' + json.dumps({{'wrote': {count}}}))
"""
    )


def assert_protocol_error(result: ToolResult, why: str) -> None:
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None and result.error.type == "ProtocolError", result
    assert why in result.error.message, result.error.message
    assert result.effect is Effect.UNKNOWN, result


def rss(daemon: SecurityDaemon) -> int:
    return int(psutil.Process(daemon.pid).memory_info().rss)


def test_a_flood_of_forged_frames_leaves_the_daemons_memory_bounded(
    fresh_daemon: SecurityDaemon,
) -> None:
    """1,000,000 forged yield frames (22 MB) per call used to grow the daemon by
    73 MB a call, for good; now the first ends the call, and the rest is read
    and dropped unparsed. Lines that are no frames are bounded by count."""
    daemon = fresh_daemon
    daemon.assert_serving()
    run_code(daemon, flood_code(b"junk\n", 10_000), timeout=60)  # warm every path once
    before = rss(daemon)
    for _ in range(4):
        result = run_code(daemon, flood_code(b'\n{"t":"yield","v":1}\n', 1_000_000), timeout=120)
        assert_protocol_error(result, "cannot yield")
    result = run_code(daemon, flood_code(b"not a frame\n", 1_000_000), timeout=120)
    assert_protocol_error(result, "lines of frames")
    grown = rss(daemon) - before
    assert grown < 20 * MiB, f"the daemon grew by {grown / MiB:.1f} MiB"
    daemon.assert_serving()


def test_a_giant_line_is_dropped_and_a_flood_of_bytes_ends_the_call(
    daemon: SecurityDaemon,
) -> None:
    """A 20 MiB line without an end is dropped as it comes (the call's own result
    still stands); 80 MiB into the pipe is more than a call may send."""
    before = rss(daemon)
    code = WRITE_FRAMES + "write(b'[' * (20 * 2**20))\nprint('REPORT {\"done\": 1}')\n"
    result = run_code(daemon, code, timeout=120)
    assert result.ok, result
    assert report(result) == {"done": 1}
    code = WRITE_FRAMES + "for _ in range(80):\n    write(b'{' * 2**20 + b'\\n')\n"
    assert_protocol_error(run_code(daemon, code, timeout=120), "more frame bytes")
    grown = rss(daemon) - before
    assert grown < 40 * MiB, f"the daemon grew by {grown / MiB:.1f} MiB"
    daemon.assert_serving()


def test_malformed_lines_are_skipped_and_the_real_result_stands(daemon: SecurityDaemon) -> None:
    """Not UTF-8, not JSON, not an object, nested too deep, too many containers,
    digits past the limit: none is a frame, none harms the call or the daemon."""
    lines = [
        b"\xff\xfe\xfd",
        b"{not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"t": "result", "value": [' + b"{}," * 300_000 + b"{}]}",
        b"9" * 100_000,
    ]
    code = (
        WRITE_FRAMES + f"for line in {lines!r}:\n    write(b'\\n' + line + b'\\n')\nprint('fine')\n"
    )
    result = run_code(daemon, code, timeout=60)
    assert result.ok, result
    assert result.data["stdout"] == "fine\n"
    daemon.assert_serving()


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        ({"t": "result", "ok": "yes", "exit_code": 0}, "boolean ok"),
        ({"t": "result", "ok": True, "kind": "json", "value": [1], "exit_code": 0}, "none"),
        ({"t": "result", "ok": False, "exit_code": 1, "error": "boom"}, "well-formed error"),
        ({"t": "exit", "code": 0, "signal": None}, "type 'exit'"),
        ({"t": "ready", "worker": 2, "keeper": 1}, "type 'ready'"),
        ({"t": "x" * 10_000}, "type 'xxx"),
    ],
)
def test_a_forged_frame_of_the_wrong_shape_ends_the_call_with_a_protocol_error(
    daemon: SecurityDaemon, frame: dict[str, object], why: str, token: str
) -> None:
    """The sandbox is killed at once: a child it started does not outlive the call."""
    code = (
        WRITE_FRAMES
        + f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
time.sleep(0.3)
write(b'\\n' + {json.dumps(frame).encode()!r} + b'\\n')
time.sleep(60)
"""
    )
    started = time.monotonic()
    result = run_code(daemon, code, timeout=90)
    assert time.monotonic() - started < 30, "the call waited for its timeout"
    assert_protocol_error(result, why)
    assert len(result.error.message) < 1000 if result.error else True  # no echo of 10 KB
    assert_nothing_left(token, timeout=5)
    daemon.assert_serving()


def test_a_forged_sealed_result_leaves_no_process_running(
    daemon: SecurityDaemon, token: str
) -> None:
    """A worker that claims it sealed the sandbox (decision 18: "nothing else
    lives") while a detached child lives on, then closes its output and goes on
    itself. Nothing holds the call's pipes open, so only the sealed result ends
    the call: the daemon kills the sandbox on it, before it answers, so when
    the caller hears the result neither the child nor the worker runs on."""
    sealed = {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
    sealed["sealed"] = True
    code = (
        WRITE_FRAMES
        + f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 stdin=subprocess.DEVNULL, start_new_session=True)
time.sleep(0.3)
print('forging', flush=True)
write(b'\\n' + {json.dumps(sealed).encode()!r} + b'\\n')
os.closerange(0, 3)
time.sleep(60)
"""
    )
    started = time.monotonic()
    result = run_code(daemon, code, timeout=90)
    left = live_processes_mentioning(token)
    assert not left, f"the child outlived the call's answer: {left}"
    assert time.monotonic() - started < 30, "the call waited for its timeout"
    # The forged result is the tool's own word about its own call, as its stdout is.
    assert result.ok, result
    assert result.data["stdout"] == "forging\n"
    daemon.assert_serving()


def test_a_generator_tool_cannot_be_forged_from_code(daemon: SecurityDaemon) -> None:
    """A yield frame is only ever a user tool's: code that writes one fails."""
    code = WRITE_FRAMES + 'write(b\'\\n{"t": "yield", "v": "forged"}\\n\')\nprint(\'after\')\n'
    result = run_code(daemon, code, timeout=60)
    assert_protocol_error(result, "cannot yield")
    assert "forged" not in json.dumps(result.data)
