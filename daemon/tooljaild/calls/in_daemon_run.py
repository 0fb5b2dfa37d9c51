"""Running one call of an in-daemon built-in (`tooljaild.tools.in_daemon`): its handler,
awaited within the call's timeout; a timeout or a stop cancels it.

Its outcome reads as a user tool's: a value is the result's data (offloaded when
large), a `ToolFailure` or one of our errors (a session ended, an artifact gone) a
failure the model reads, with effect unknown where the failure says it may have
taken effect in part.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from tooljail.errors import TooljailError
from tooljail.types import Effect, ToolError, ToolResult
from tooljaild.calls import results
from tooljaild.calls.call import Call, StopReason
from tooljaild.sandbox.base import RunOutcome, Termination
from tooljaild.tools.in_daemon import DaemonCall, Handler, ToolFailure


async def run_in_daemon(call: Call, handler: Handler, work: DaemonCall) -> ToolResult:
    """Await `handler(work)` for `call`, stoppable; its result."""
    inner = asyncio.ensure_future(handler(work))
    timer = asyncio.get_running_loop().call_later(
        call.timeout_s, call.request_stop, StopReason.TIMEOUT
    )

    def stop() -> None:
        inner.cancel()

    call.kill_with(stop)
    maybe_applied = nothing_done = False
    try:
        value = await inner
    except asyncio.CancelledError:
        if call.stop_reason is None:
            raise  # the daemon's own task was cancelled
        outcome = RunOutcome(Termination.KILLED)
    except ToolFailure as failure:
        maybe_applied, nothing_done = failure.effect_unknown, failure.effect_none
        error = ToolError(type=failure.type, message=failure.message)
        outcome = RunOutcome(Termination.RAISED, error=error)
    except TooljailError as exc:  # a session ended, an artifact gone, ...
        error = ToolError(type=type(exc).__name__, message=exc.message)
        outcome = RunOutcome(Termination.RAISED, error=error)
    else:
        kind: Literal["none", "json"] = "none" if value is None else "json"
        outcome = RunOutcome(Termination.RETURNED, value_kind=kind, value=value)
    finally:
        timer.cancel()
        call.kill_with(None)
    result = results.result_of(call, outcome, call.stop_reason)
    if maybe_applied or nothing_done:
        effect = Effect.UNKNOWN if maybe_applied else Effect.NONE
        result = result.model_copy(update={"effect": effect})
    return result
