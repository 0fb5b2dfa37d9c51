"""The journal's record of calls awaiting approval: the state, and what a restart
makes of it (lost, but with effect none: such a call never ran)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tooljail import CallState, Effect
from tooljaild.journal.store import LOST_MESSAGE, LOST_WAITING_MESSAGE, Journal


def _admit(journal: Journal, call_id: str) -> None:
    journal.admitted(
        call_id, tool="echo", fingerprint="f", arguments_json="{}", timeout_s=5, idempotent=False
    )


def test_a_waiting_call_is_lost_with_effect_none_and_an_approved_one_as_any(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal.open(path) as journal:
        _admit(journal, "waits")
        journal.waiting("waits", CallState.AWAITING_APPROVAL)
        entry = journal.get("waits")
        assert entry is not None and entry.state is CallState.AWAITING_APPROVAL
        _admit(journal, "approved")
        journal.waiting("approved", CallState.AWAITING_APPROVAL)
        journal.waiting("approved", CallState.QUEUED)
        journal.running("approved", "sb-1")
    with Journal.open(path) as journal:
        lost = {e.call_id: e.result() for e in journal.recover()}
    waited, ran = lost["waits"], lost["approved"]
    assert waited is not None and waited.effect is Effect.NONE
    assert waited.message == LOST_WAITING_MESSAGE
    assert ran is not None and ran.effect is Effect.UNKNOWN and ran.message == LOST_MESSAGE


def test_only_an_unstarted_call_can_wait(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "journal.sqlite3") as journal:
        _admit(journal, "c1")
        with pytest.raises(ValueError, match="not a waiting state"):
            journal.waiting("c1", CallState.RUNNING)
        journal.running("c1", "sb-1")
        with pytest.raises(ValueError, match="no unstarted call 'c1'"):
            journal.waiting("c1", CallState.AWAITING_APPROVAL)
