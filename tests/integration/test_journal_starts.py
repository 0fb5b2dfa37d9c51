"""A call's `running` record: written with its end when the call is short, on
its own when it runs on (`tooljaild.calls.book.START_WRITE_DELAY_S`), and
either way the journal says where and when it started.

Through a real `tooljail serve`; the journal file is read with sqlite3 once the
daemon is gone (it holds the file exclusively while it runs).
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from tooljail import Client
from tooljail.types import CallState

from ..conftest import RunningDaemon

TOOL = "execute_python_code"


def _rows(state_dir: Path) -> dict[str, tuple[str, str, float | None]]:
    """call_id: (state, sandbox_id, started) of every journaled call."""
    db = sqlite3.connect(state_dir / "journal.sqlite3")
    try:
        rows = db.execute("SELECT call_id, state, sandbox_id, started FROM calls").fetchall()
    finally:
        db.close()
    return {call_id: (state, sandbox, started) for call_id, state, sandbox, started in rows}


def test_short_calls_are_journaled_started_with_their_end(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon()
    with Client(daemon.target) as client:
        with client.session() as session:
            for i in range(5):
                result = session.call(TOOL, {"code": "print(1)"}, call_id=f"in-session-{i}")
                assert result.ok, result
        assert client.call(TOOL, {"code": "print(1)"}, call_id="fresh").ok
    daemon.stop(signal.SIGTERM)
    rows = _rows(daemon.state_dir)
    for call_id in [*(f"in-session-{i}" for i in range(5)), "fresh"]:
        state, sandbox, started = rows[call_id]
        assert state == CallState.SUCCEEDED.value, (call_id, rows[call_id])
        assert sandbox, (call_id, rows[call_id])  # where it ran, and when: as before
        assert started is not None and started > 0, (call_id, rows[call_id])


def test_a_call_that_runs_on_is_journaled_running_before_it_ends(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon()
    with Client(daemon.target) as client:
        code = "import time; print('started', flush=True); time.sleep(60)"
        events = client.stream(TOOL, {"code": code}, call_id="long")
        for _ in events:  # its first output: it runs
            break
        events.close()
        assert client.get_call("long").state is CallState.RUNNING
        # Its running record is due START_WRITE_DELAY_S (50 ms) after its start;
        # a cheap RPC a while later is a turn of the loop past it.
        time.sleep(0.5)
        client.get_call("long")
    daemon.stop(signal.SIGKILL)  # no end recorded: the journal shows what it knew
    state, sandbox, started = _rows(daemon.state_dir)["long"]
    assert state == CallState.RUNNING.value
    assert sandbox
    assert started is not None and started > 0
