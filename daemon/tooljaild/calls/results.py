"""What every ending of a call means: one pure function to its `ToolResult`.

Two words describe an ending, each from the side that knows it: the sandbox
says how the tool's process ended (`Termination`, in the run's `RunOutcome`),
and the call says why the daemon stopped it, if it did (`StopReason`). A stop
decides: a killed run means nothing by itself (DESIGN.md "Result semantics").

Effects: a tool that ended by itself (returned, raised, exited, crashed) has
`effect=applied`: whatever it did is done and nothing more will happen. A tool
stopped from outside (timeout, cancel, shutdown, output limit) or whose runner
vanished has `effect=unknown`. A call that never reached a sandbox has
`effect=none`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tooljail.types import (
    TIMEOUT_MESSAGE,
    CallState,
    CallStatus,
    Effect,
    ProcessInfo,
    ToolError,
    ToolResult,
    Usage,
)
from tooljaild.calls.call import Call, StopReason
from tooljaild.sandbox.base import RunOutcome, Termination
from tooljaild.sandbox.session_channel import LeftRunning, SessionCallEnd
from tooljaild.sessions.session import END_MESSAGES, Session
from tooljaild.tools.builtin.workspace import NOTHING_PERSISTS

NO_OUTPUT_MESSAGE = "Tool executed successfully (no output)"
CANCELLED_MESSAGE = (
    "The call was cancelled while it ran. It may have taken effect in part: check "
    "before calling it again."
)
SHUTDOWN_MESSAGE = (
    "The daemon shut down while the call ran. It may have taken effect in part: check "
    "before calling it again."
)
NOT_STARTED = "the call was cancelled before it started"
REVOKED = (
    "the identity that asked for it was revoked (the tokens file no longer lets it "
    "call this tool) before it ran"
)
ENVELOPE_KEYS = {"status", "data", "message", "error"}

_FAILED_BY_ITSELF = {
    Termination.RAISED,
    Termination.EXITED,
    Termination.SIGNALED,
    Termination.CPU_LIMIT,
    Termination.FILE_SIZE_LIMIT,
    Termination.OUT_OF_MEMORY,
}
"""Endings where the tool's own process is over: whatever it did is done."""


def result_of(call: Call, outcome: RunOutcome, stop: StopReason | None) -> ToolResult:
    """The result of a call that ran: what its run reported, read in the light
    of why the daemon stopped it (`stop`; None when it did not). A workspace
    tool's result outside a session says that nothing it wrote persists.

    Pure but for the clock (the duration ends now).
    """
    result = _result_of(call, outcome, stop)
    if result.usage is not None and (outcome.cpu_s, outcome.memory_peak_bytes) != (None, None):
        measured = {
            "cpu_s": outcome.cpu_s or 0.0,
            "memory_peak_bytes": outcome.memory_peak_bytes or 0,
        }
        result = result.model_copy(update={"usage": result.usage.model_copy(update=measured)})
    run = call.tool.run
    if run is not None and run.kind == "workspace" and not call.session_id:
        message = f"{result.message} {NOTHING_PERSISTS}".strip()
        return result.model_copy(update={"message": message})
    return result


def _result_of(call: Call, outcome: RunOutcome, stop: StopReason | None) -> ToolResult:
    if stop is not None:
        return stopped(call, stop)
    t = outcome.termination
    if t is Termination.RETURNED or (t is Termination.EXITED and outcome.exit_code == 0):
        return _succeeded(call, outcome)
    if t is Termination.KILLED:  # a kill the call did not ask for: no stop reason to tell
        error = ToolError(type="Killed", message="the daemon killed the sandbox")
        return _failed(call, outcome, Effect.UNKNOWN, "The tool was killed.", error)
    error = outcome.error or ToolError(type="Error", message="the tool failed")
    effect = Effect.APPLIED if t in _FAILED_BY_ITSELF else Effect.UNKNOWN
    return _failed(call, outcome, effect, _failure_message(outcome, error), error)


def stopped(call: Call, stop: StopReason) -> ToolResult:
    """The result of a running call the daemon stopped (killed) for `stop`."""
    if stop is StopReason.TIMEOUT:
        return timed_out(call, still_running=False)
    if stop is StopReason.HARD_TIMEOUT:
        return timed_out(call, still_running=False).model_copy(
            update={
                "message": f"The call was killed at its kill_after_s limit of "
                f"{call.tool.options.kill_after_s:g}s; it may have taken effect in part.",
            }
        )
    if stop is StopReason.OUTPUT_LIMIT:
        limit = call.limits.output_limit_bytes
        return _result(
            call,
            status=CallStatus.ERROR,
            effect=Effect.UNKNOWN,
            message=f"The tool wrote more than {limit} bytes of output and was stopped. "
            "It may have taken effect in part: check before calling it again.",
            data=_python_data(call, None),
            error=ToolError(type="OutputLimit", message=f"output past {limit} bytes"),
        )
    if stop is StopReason.REVOKED:  # stopped just as it started: it may have begun
        return _result(
            call,
            status=CallStatus.CANCELLED,
            effect=Effect.UNKNOWN,
            message=f"The call was stopped as it started: {REVOKED}. It may have "
            "taken effect in part.",
            data=_python_data(call, None),
            error=ToolError(type="IdentityRevoked", message=REVOKED),
        )
    return _result(
        call,
        status=CallStatus.CANCELLED,
        effect=Effect.UNKNOWN,
        message=CANCELLED_MESSAGE if stop is StopReason.CANCELLED else SHUTDOWN_MESSAGE,
        data=_python_data(call, None),
        error=ToolError(type="Cancelled", message=f"stopped: {stop}"),
    )


def timed_out(call: Call, *, still_running: bool) -> ToolResult:
    """The result of a call past its timeout; `still_running`: it runs on, detached."""
    message = TIMEOUT_MESSAGE.format(timeout=call.timeout_s, call_id=call.call_id)
    if still_running:
        message += (
            f" It keeps running detached for up to {call.tool.options.kill_after_s:g}s "
            "from its start; call_status says when it has ended, and how."
        )
    return _result(
        call,
        status=CallStatus.TIMEOUT,
        effect=Effect.UNKNOWN,
        message=message,
        still_running=still_running,
        data=_python_data(call, None),
        error=ToolError(type="Timeout", message=f"no result within {call.timeout_s:g}s"),
    )


def not_run(call: Call, why: str) -> ToolResult:
    """The result of a call stopped before it reached a sandbox."""
    return _result(
        call,
        status=CallStatus.CANCELLED,
        effect=Effect.NONE,
        message=f"The tool did not run: {why}.",
        error=ToolError(type="Cancelled", message=why),
    )


def not_started(call: Call) -> ToolResult:
    """The result of a call stopped while it waited (for a slot, its session's
    turn, an approver): it did not run, and the stop says why."""
    if call.stop_reason is StopReason.REVOKED:
        return revoked(call)
    return not_run(call, NOT_STARTED)


def revoked(call: Call) -> ToolResult:
    """The result of a call whose identity was revoked before it ran."""
    return _result(
        call,
        status=CallStatus.CANCELLED,
        effect=Effect.NONE,
        message=f"The tool did not run: {REVOKED}.",
        error=ToolError(type="IdentityRevoked", message=REVOKED),
    )


def sandbox_failed(call: Call, why: str) -> ToolResult:
    """The result of a call for which no sandbox could be started."""
    return _result(
        call,
        status=CallStatus.ERROR,
        effect=Effect.NONE,
        message="The tool did not run: no sandbox could be started. Try again later.",
        error=ToolError(type="SandboxUnavailable", message=why),
    )


def internal_error(call: Call, exc: Exception) -> ToolResult:
    """The result of a call the daemon itself failed (a bug of ours)."""
    return _result(
        call,
        status=CallStatus.ERROR,
        effect=Effect.UNKNOWN,
        message="The daemon failed while running the call; it may have taken effect.",
        error=ToolError(type="InternalError", message=f"{type(exc).__name__}: {exc}"),
    )


SESSION_KEPT = (
    " The running code was interrupted (KeyboardInterrupt) and stopped: the session and "
    "its variables are kept."
)
SESSION_RESET = (
    " The session's interpreter was restarted: every variable, import and open object "
    "of the session is gone (define them again); its workspace files are kept."
)


def in_session(
    call: Call, end: SessionCallEnd, stop: StopReason | None, session: Session
) -> ToolResult:
    """The result of a call that ran in `session`: as `result_of` says, plus what
    became of the session (kept, its interpreter restarted, or gone)."""
    if not session.open:
        if stop is None or stop is StopReason.SHUTDOWN:
            return session_gone(call, session.id, session.end_reason, ran=True)
        # Stopped (timeout, cancel, output) and then the session had to go: the
        # stop is what happened to the call, the session's end what it left.
        result = stopped(call, stop)
        why = END_MESSAGES.get(session.end_reason, session.end_reason)
        message = (
            f"{result.message} Session {session.id!r} had to be given up ({why}): its "
            "state is gone (variables and workspace files): create a new session."
        )
        return result.model_copy(update={"message": message, "session_reset": True})
    result = result_of(call, end.outcome, stop)
    message = result.message
    if end.reset:
        message += (
            SESSION_RESET
            if stop is not None
            else (
                " The session's interpreter ended during (or before) this call and was "
                "restarted: every variable, import and open object of the session is gone "
                "(define them again); its workspace files are kept."
            )
        )
    elif stop is not None and end.interrupted:
        message += SESSION_KEPT
    update: dict[str, Any] = {"session_reset": end.reset}
    if end.left:
        message += " " + left_running_note(end.left)
        if isinstance(result.data, dict) and _output_is_data(call):
            update["data"] = {**result.data, "left_running": left_running_data(end.left)}
    update["message"] = message.strip()
    return result.model_copy(update=update)


def left_running_data(left: LeftRunning) -> dict[str, Any]:
    """What a session call left running, as the Python tools' data says it."""
    return {
        "threads": left.threads,
        "processes": left.processes,
        "processes_kept": left.kept,
        "earlier_threads": left.earlier_threads,
        "dropped_output_bytes": left.dropped_bytes,
        "interpreter_threads_at_start": left.os_threads_at_start,
    }


def left_running_note(left: LeftRunning) -> str:
    """What a session call left running, and met of earlier calls', in words a model reads."""
    notes = []
    if left.earlier_threads or left.dropped_frames:
        notes.append(
            f"{_count(left.earlier_threads, 'thread')} started by earlier calls "
            f"{'was' if left.earlier_threads == 1 else 'were'} running "
            "in the session's interpreter during this call: their output was dropped, but "
            "their code could have acted in this call, this result included; to be sure, "
            "run it again in a new session."
        )
    if left.threads:
        notes.append(
            f"This call leaves {_count(left.threads, 'thread')} running in the session's "
            "interpreter (the main one aside), which run on into later calls; what they "
            "print after this call's end is dropped."
        )
    if left.processes:
        fate = (
            "still running (the session keeps processes); what they print between calls is dropped"
            if left.kept
            else "still running at its end: they were killed"
        )
        notes.append(f"{_count(left.processes, 'process')} this call started {_were(left)} {fate}.")
    if left.dropped_bytes:
        notes.append(
            f"{left.dropped_bytes} bytes of output written between calls or by threads of "
            "earlier calls were dropped."
        )
    return " ".join(notes)


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{n} {noun if n == 1 else plural}"


def _were(left: LeftRunning) -> str:
    return (
        "is"
        if left.processes == 1 and left.kept
        else "was"
        if left.processes == 1
        else ("are" if left.kept else "were")
    )


def session_gone(call: Call, session_id: str, reason: str, *, ran: bool = False) -> ToolResult:
    """The result of a call whose session ended before or while it ran."""
    why = END_MESSAGES.get(reason, reason or "it ended")
    if ran:
        return _result(
            call,
            status=CallStatus.CANCELLED if reason != "sandbox_died" else CallStatus.ERROR,
            effect=Effect.UNKNOWN,
            message=f"Session {session_id!r} ended while the call ran: {why}. The call may "
            "have taken effect in part. The session's state is gone (variables and "
            "workspace files): create a new session.",
            data=_python_data(call, None),
            error=ToolError(type="SessionEnded", message=f"session ended: {reason}"),
            session_reset=True,
        )
    return _result(
        call,
        status=CallStatus.CANCELLED,
        effect=Effect.NONE,
        message=f"The tool did not run: session {session_id!r} ended before its turn "
        f"came ({why}). Its state is gone: create a new session.",
        error=ToolError(type="SessionEnded", message=f"session ended: {reason}"),
    )


def state_of(result: ToolResult) -> CallState:
    """The state a call ends in with `result` (RUNNING: it runs on, detached)."""
    if result.still_running:
        return CallState.RUNNING
    return {
        CallStatus.SUCCESS: CallState.SUCCEEDED,
        CallStatus.PARTIAL: CallState.SUCCEEDED,
        CallStatus.ERROR: CallState.FAILED,
        CallStatus.TIMEOUT: CallState.TIMED_OUT,
        CallStatus.CANCELLED: CallState.CANCELLED,
        CallStatus.LOST: CallState.LOST,
    }[result.status]


def _succeeded(call: Call, outcome: RunOutcome) -> ToolResult:
    if _output_is_data(call):
        return _result(
            call, status=CallStatus.SUCCESS, effect=Effect.APPLIED, data=_python_data(call, 0)
        )
    value, kind = outcome.value, outcome.value_kind
    if kind == "none":
        streamed = f"Tool streamed {outcome.yields} values" if outcome.yields else ""
        return _result(
            call,
            status=CallStatus.SUCCESS,
            effect=Effect.APPLIED,
            message=streamed or NO_OUTPUT_MESSAGE,
        )
    envelope = envelope_of(value) if kind == "json" else None
    if envelope is not None:
        return _result(call, effect=Effect.APPLIED, **envelope)
    return _result(call, status=CallStatus.SUCCESS, effect=Effect.APPLIED, data=value)


def _failed(
    call: Call, outcome: RunOutcome, effect: Effect, message: str, error: ToolError
) -> ToolResult:
    exit_code = -outcome.signal if outcome.signal else outcome.exit_code
    return _result(
        call,
        status=CallStatus.ERROR,
        effect=effect,
        message=message,
        error=error,
        data=_python_data(call, exit_code),
    )


def _failure_message(outcome: RunOutcome, error: ToolError) -> str:
    t = outcome.termination
    if t is Termination.RAISED:
        return f"The tool raised {error.type}: {error.message}"
    if t is Termination.EXITED:
        return f"The program exited with code {outcome.exit_code}."
    if t in (
        Termination.SIGNALED,
        Termination.CPU_LIMIT,
        Termination.FILE_SIZE_LIMIT,
        Termination.OUT_OF_MEMORY,
    ):
        return f"The program was terminated: {error.message}."
    return f"The tool failed: {error.message}"


def _result(call: Call, **fields: Any) -> ToolResult:
    made = call.made
    if made is not None:
        # Its artifacts join the result: the output spilled (committed now, once),
        # and the data when too large for the model's context (calls.artifacts).
        made.commit_spills()
        notes = list(made.notes)
        data = fields.get("data")
        if data is not None and not _output_is_data(call):
            offloaded = made.offload(data)
            if offloaded is not None:
                fields["data"], note = offloaded
                notes.append(note)
        if notes:
            fields["message"] = " ".join([fields.get("message", ""), *notes]).strip()
    duration_s = time.monotonic() - (call.started_at or call.created)
    output_bytes = call.stdout.total + call.stderr.total
    return ToolResult(
        call_id=call.call_id,
        tool=call.tool.name,
        duration_s=duration_s,
        output_bytes=output_bytes,
        # CPU and memory are the run's to say (result_of adds them).
        usage=Usage(wall_s=duration_s, output_bytes=output_bytes),
        truncated=call.stdout.truncated or call.stderr.truncated,
        session_id=call.session_id,
        artifacts=tuple(call.artifacts),
        arguments_sha256=call.arguments_sha256,
        **fields,
    )


def _output_is_data(call: Call) -> bool:
    """The call's result data is the program's output (the Python built-ins)."""
    run = call.tool.run
    return run is not None and run.output_is_data


def _python_data(call: Call, exit_code: int | None) -> dict[str, Any] | None:
    """The Python tools' data ({stdout, stderr, exit_code}); None for other tools."""
    if not _output_is_data(call):
        return None
    return {"stdout": call.stdout.text(), "stderr": call.stderr.text(), "exit_code": exit_code}


def envelope_of(value: Any) -> dict[str, Any] | None:
    """Read a returned dict of exactly the envelope shape as the result itself."""
    if not isinstance(value, dict) or not value or not set(value) <= ENVELOPE_KEYS:
        return None
    if "status" not in value:
        if set(value) != {"error"}:
            return None
        value = {"status": "error", **value}
    try:
        status = CallStatus(value["status"])
    except ValueError:
        return None
    if status in (CallStatus.TIMEOUT, CallStatus.CANCELLED, CallStatus.LOST):
        return None  # only the daemon says these
    raw_error = value.get("error")
    error = None
    if raw_error is not None:
        if isinstance(raw_error, dict):
            error = ToolError(
                type=str(raw_error.get("type", "Error")),
                message=str(raw_error.get("message", "")),
                traceback=str(raw_error.get("traceback", "")),
            )
        else:
            error = ToolError(type="Error", message=str(raw_error))
    message = value.get("message")
    return {
        "status": status,
        "data": value.get("data"),
        "message": "" if message is None else str(message),
        "error": error,
    }


def with_processes_ended(result: ToolResult, ended: Sequence[ProcessInfo]) -> ToolResult:
    """`result`, naming the session's background processes its reset ended."""
    if not ended:
        return result
    names = ", ".join(p.process_id + (f" ({p.name})" if p.name else "") for p in ended[:10])
    more = f" and {len(ended) - 10} more" if len(ended) > 10 else ""
    message = (
        f"{result.message} The reset also killed the session's background processes "
        f"{names}{more}: start them again if you need them (their output so far stays "
        "readable with read_process_output)."
    )
    return result.model_copy(update={"message": message.strip(), "processes_ended": tuple(ended)})
