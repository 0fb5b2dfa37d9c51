"""The built-in `call_status`: a model asks what became of one of its calls.

The timeout message sends a model here (`TIMEOUT_MESSAGE`): a call past its
timeout may still take effect, and before calling the tool again the model must
learn whether it did. `call_status {"call_id": ...}` answers from the daemon's
memory and journal (`Services.calls`, GetCall's owner rule: the caller's own
calls, or any for an approver), in a result a model can act on:

- `state`, `running`: whether the call still goes on (queued, awaiting an
  approver, running, running on detached past its timeout);
- `status`, `effect`, `message`, `error`, `data`, `artifacts`: how it ended and
  its result (the data as the call's own result bounds it);
- `next`: what to do now, in words ("still running: ask again in 10 s", "it
  succeeded: do not call it again for the same effect", ...).

An id no call of the caller's has (never used, another's, forgotten) is a
result with status error and effect none, never a refusal: the model reads it
and goes on. The tool only reads: it is idempotent, never needs approval, is
never cached (a cached answer would say "running" forever), every identity may
call it whatever its policy lists (`auth.policy.ALWAYS_ALLOWED`: it tells no
more than GetCall does), and it answers at once (`BuiltinRun.at_once`): it
waits for no slot and no share of calls refuses it, so that a client whose
share is full of the very calls it asks about can still ask.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from tooljail.types import CallInfo, CallState, CallStatus, Effect
from tooljaild.tools.in_daemon import DaemonCall, ToolFailure
from tooljaild.tools.registry import Tool, ToolOptions

__all__ = ["CALL_STATUS_TOOL", "call_status"]

_CALL_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A call id's shape (as `calls.admission.CALL_ID`, a floor above): another string
names no call, and is answered so without a look-up."""

ASK_AGAIN_MIN_S = 2
ASK_AGAIN_MAX_S = 60
"""A running call's `next` says to ask again after half the time it has run so
far, within these bounds: soon for a short call, rarely for a long one."""

_EFFECT_WORDS = {
    Effect.NONE: "it did not take effect",
    Effect.APPLIED: "it is over: whatever it did is done, and nothing more will happen",
    Effect.UNKNOWN: "it may have taken effect in part",
}


def _seconds(since: datetime.datetime | None, now: datetime.datetime) -> float | None:
    return None if since is None else max(0.0, (now - since).total_seconds())


def _ask_again_s(info: CallInfo, now: datetime.datetime) -> int:
    ran = _seconds(info.started_at or info.received_at, now) or 0.0
    return int(min(ASK_AGAIN_MAX_S, max(ASK_AGAIN_MIN_S, ran / 2)))


def _next_while_running(info: CallInfo, now: datetime.datetime) -> str:
    wait = _ask_again_s(info, now)
    if info.state is CallState.AWAITING_APPROVAL:
        what = "it waits for an approver's decision and has not run"
    elif info.state is CallState.QUEUED:
        what = "it waits for room to run and has not started"
    elif info.result is not None and info.result.still_running:
        what = "it passed its timeout and runs on, detached, until it ends"
    else:
        what = "it is running"
    return (
        f"Still running: {what}. Do not call {info.tool} again for the same effect; "
        f"ask again with call_status in {wait} s."
    )


def _next_when_ended(info: CallInfo) -> str:
    result = info.result
    if result is None:  # a journaled call whose result was not recorded
        return (
            f"It ended ({info.state.value}) and its result is not known: check whether "
            f"it took effect before calling {info.tool} again."
        )
    if result.status is CallStatus.SUCCESS:
        return (
            f"It succeeded: its result is in data. Do not call {info.tool} again for the "
            "same effect."
        )
    effect = _EFFECT_WORDS.get(result.effect, "its effect is unknown")
    why = result.message or (result.error.message if result.error else "")
    if result.status is CallStatus.TIMEOUT and result.error is not None:
        why = result.error.message  # its message sends the model here: said once is enough
    head = f"It ended with {result.status.value}" + (f": {why.rstrip('.')}." if why else ".")
    head += f" As for its effect, {effect}."
    if result.effect is Effect.NONE:
        return f"{head} You may call {info.tool} again."
    if result.effect is Effect.UNKNOWN:
        return f"{head} Check whether it did before calling {info.tool} again."
    return head


def _answer(info: CallInfo) -> dict[str, Any]:
    """What `call_status` tells of `info`."""
    now = datetime.datetime.now(datetime.UTC)
    out: dict[str, Any] = {
        "call_id": info.call_id,
        "tool": info.tool,
        "state": info.state.value,
        "running": info.running,
    }
    for key, moment in (
        ("received_at", info.received_at),
        ("started_at", info.started_at),
        ("ended_at", info.ended_at),
    ):
        if moment is not None:
            out[key] = moment.isoformat(timespec="seconds")
    result = info.result
    if result is not None and not info.running:
        out["status"] = result.status.value
        out["effect"] = result.effect.value
        out["message"] = result.message
        if result.error is not None:
            out["error"] = {"type": result.error.type, "message": result.error.message}
        out["data"] = result.data
        if result.artifacts:
            out["artifacts"] = [
                {"artifact_id": a.artifact_id, "name": a.name, "size_bytes": a.size_bytes}
                for a in result.artifacts
            ]
    out["next"] = _next_while_running(info, now) if info.running else _next_when_ended(info)
    return out


def _unknown(call_id: str) -> ToolFailure:
    return ToolFailure(
        "CallNotFound",
        f"No call with the id {call_id!r} is known to this daemon: the id may be "
        "mistyped (use the call id a timeout's message named), another client's, or "
        "forgotten (the journal keeps calls for a bounded time). Nothing is known of "
        "its effect: check whether it took effect before calling that tool again.",
        effect_none=True,
    )


async def call_status(call: DaemonCall) -> dict[str, Any]:
    """What is known of the call `call.arguments["call_id"]`, for its owner.

    Raises:
        ToolFailure: (effect none) no call of that id is known to the caller.
    """
    call_id = str(call.arguments["call_id"]).strip()
    lookup = call.services.calls
    if not _CALL_ID.match(call_id) or lookup is None:
        raise _unknown(call_id[:200])
    info = lookup(call_id, call.identity)
    if info is None:
        raise _unknown(call_id)
    return _answer(info)


CALL_STATUS_TOOL = Tool(
    name="call_status",
    description=(
        "Check on an earlier call by its call id: whether it is still running, how it "
        "ended (status, effect, message), its result data, and what to do next. Use it "
        "when a call timed out (it may still take effect: the timeout's message names "
        "its call id) before calling that tool again. Only reads; calling it never "
        "changes anything."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "call_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 256,
                "description": "The id of the call to check, as a timeout's message or a "
                "result names it.",
            },
        },
        "required": ["call_id"],
        "additionalProperties": False,
    },
    options=ToolOptions(idempotent=True),
    source="builtin",
    builtin="call_status",
)
"""call_status, served by every daemon."""
