"""call_status answers at once: no slot of the in-daemon tools' pool, no share of
calls, no policy keeps it from a caller (the owner rule still holds: see
tests/integration/test_call_status.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tooljail.errors import OverloadedError
from tooljaild.auth.policy import Identity
from tooljaild.calls.admission import Admission
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS

TOOLS = {t.name: t for t in BUILTIN_TOOLS}


def test_call_status_takes_no_in_daemon_slot_and_no_share(tmp_path: Path) -> None:
    admission = Admission(
        Settings(
            state_dir=tmp_path,
            max_concurrent=1,
            max_queue=0,
            max_calls_per_client=1,
            max_in_daemon_calls=1,
        )
    )
    search, status = TOOLS["search_artifact"], TOOLS["call_status"]
    admission.admit("agent")
    assert admission.slots_for(search).try_take()  # the pool's only slot
    with pytest.raises(OverloadedError):
        admission.check_room("agent", search)
    admission.check_room("agent", status)  # no refusal
    assert admission.slots_for(search) is admission.in_daemon
    assert not admission.slots_for(search).try_take()
    for _ in range(3):
        assert admission.slots_for(status).try_take()


def test_no_policy_hides_or_gates_call_status() -> None:
    narrow = Identity("narrow", tools=frozenset({"ls"}), approval=frozenset({"ls", "call_status"}))
    assert narrow.may_use("call_status") and not narrow.needs_approval("call_status")
    assert narrow.may_use("ls") and narrow.needs_approval("ls")
    assert not narrow.may_use("execute_python_code")


def test_call_status_is_idempotent_at_once_and_describes_its_argument() -> None:
    status = TOOLS["call_status"]
    assert status.options.idempotent
    assert status.run is not None and status.run.at_once and status.run.kind == "daemon"
    assert status.input_schema["required"] == ["call_id"]
    assert status.input_schema["properties"]["call_id"]["description"]
