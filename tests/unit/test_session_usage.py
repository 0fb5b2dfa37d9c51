"""A session call's usage as the supervisor measures it (no cgroup): per call,
also when the interpreter dies or is reset during the call.

On each kind of process sandbox `test_session_channel.open_session` makes.
"""

from __future__ import annotations

import asyncio

from tests.unit.test_session_channel import Opener, call, open_session, started  # noqa: F401
from tooljaild.sandbox.base import RunOutcome, RunRequest, Termination
from tooljaild.sandbox.session_channel import SessionCallEnd

MIB = 2**20
BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end:\n    pass\n"
HOLD = "data = b'x' * (60 * 2**20)\n"


def _usage(end: SessionCallEnd) -> tuple[float, int]:
    outcome: RunOutcome = end.outcome
    assert outcome.cpu_s is not None and outcome.memory_peak_bytes is not None, outcome
    return outcome.cpu_s, outcome.memory_peak_bytes


async def test_each_call_counts_from_its_own_start(open_session: Opener) -> None:  # noqa: F811
    session = await open_session()
    burn, _ = await call(session, BURN.format(s=0.5))
    quiet, _ = await call(session, "x = 1")
    hold, _ = await call(session, HOLD + "del data")
    small, _ = await call(session, "y = 2")
    assert _usage(burn)[0] > 0.4
    assert _usage(quiet)[0] < 0.2
    assert _usage(hold)[1] > 55 * MIB
    assert 0 < _usage(small)[1] < 40 * MIB


async def test_an_interpreter_that_dies_reports_its_call_s_usage(
    open_session: Opener,  # noqa: F811
) -> None:
    session = await open_session()
    await call(session, BURN.format(s=0.3))  # the session's, not the next call's
    died, _ = await call(session, BURN.format(s=0.3) + HOLD + "import os\nos._exit(3)")
    assert died.outcome.termination is Termination.EXITED and died.reset
    cpu, peak = _usage(died)
    assert 0.25 < cpu < 0.55, died.outcome
    assert peak > 55 * MIB, died.outcome


async def test_a_reset_call_reports_usage_up_to_its_end(open_session: Opener) -> None:  # noqa: F811
    session = await open_session()
    await call(session, BURN.format(s=0.3))  # the session's, not the next call's
    # It has used 0.4 s of CPU and holds 60 MB when it says "started".
    deaf = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + HOLD
    task, _ = await started(session, "while True: pass", setup=deaf + BURN.format(s=0.4))
    assert await session.reset(10)
    end = await asyncio.wait_for(task, 10)
    assert end.outcome.termination is Termination.KILLED and end.reset
    cpu, peak = _usage(end)
    assert cpu > 0.35, end.outcome
    assert peak > 55 * MIB, end.outcome


async def test_a_workspace_call_reports_the_supervisor_s_usage(
    open_session: Opener,  # noqa: F811
) -> None:
    session = await open_session()
    await call(session, BURN.format(s=0.3))
    request = RunRequest("workspace", {"op": "ls", "args": {"path": "."}})
    end = await session.begin(request, lambda kind, data: None)
    assert end.outcome.ok, end.outcome
    cpu, peak = _usage(end)
    assert cpu < 0.2 and peak > 0, end.outcome
