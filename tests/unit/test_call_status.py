"""call_status answers at once: no slot of the in-daemon tools' pool, no share of
calls, no policy keeps it from a caller (the owner rule still holds: see
tests/integration/test_call_status.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tooljail.errors import OverloadedError
from tooljail.types import CallInfo, CallState, CallStatus, Effect, ToolError, ToolResult
from tooljaild.auth.policy import Identity
from tooljaild.calls.admission import Admission
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.call_status import _answer
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


def _ended(status: CallStatus, effect: Effect, **result: Any) -> CallInfo:
    state = {
        CallStatus.SUCCESS: CallState.SUCCEEDED,
        CallStatus.ERROR: CallState.FAILED,
        CallStatus.TIMEOUT: CallState.TIMED_OUT,
        CallStatus.LOST: CallState.LOST,
    }[status]
    done = ToolResult(call_id="c1", status=status, effect=effect, tool="append", **result)
    return CallInfo(call_id="c1", tool="append", state=state, result=done)


def test_what_to_do_next_after_each_ending() -> None:
    ok = _answer(_ended(CallStatus.SUCCESS, Effect.APPLIED, data="done"))
    assert ok["data"] == "done" and ok["status"] == "success" and ok["running"] is False
    assert ok["next"].startswith("It succeeded") and "Do not call append again" in ok["next"]

    timeout = _answer(
        _ended(
            CallStatus.TIMEOUT,
            Effect.UNKNOWN,
            message="The call timed out after 1s. It may still take effect: check with the "
            "call_status tool (call_id 'c1') whether it did before calling it again.",
            error=ToolError(type="Timeout", message="no result within 1s"),
        )
    )
    assert timeout["next"] == (
        "It ended with timeout: no result within 1s. As for its effect, it may have taken "
        "effect in part. Check whether it did before calling append again."
    )
    failed = _answer(
        _ended(CallStatus.ERROR, Effect.APPLIED, message="The tool raised ValueError: no.")
    )
    assert failed["next"].startswith("It ended with error: The tool raised ValueError: no.")
    assert "nothing more will happen" in failed["next"]
    lost = _answer(_ended(CallStatus.LOST, Effect.UNKNOWN, message="The daemon stopped."))
    assert "Check whether it did before calling append again" in lost["next"]
