"""What a sandbox's runner reported, as a `RunOutcome`: the same for every backend.

The runner's frames (the protocol is in runner_channel) say how a call ended:
a result frame when the tool returned or raised, and the keeper's exit frame
with the worker's exit code or signal. This module turns them, and what the
backend knows besides (it killed the sandbox; the kernel killed it for memory;
the sandbox broke the frame protocol), into one typed outcome.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

from tooljail.types import ToolError
from tooljaild.sandbox.base import RunOutcome, Termination
from tooljaild.sandbox.channels import Frame

_SIGNAL_REASONS: dict[int, tuple[Termination, str, str]] = {
    signal.SIGXCPU.value: (
        Termination.CPU_LIMIT,
        "CpuLimit",
        "the tool used up its CPU time limit",
    ),
    signal.SIGXFSZ.value: (
        Termination.FILE_SIZE_LIMIT,
        "FileSizeLimit",
        "the tool wrote a file past its size limit",
    ),
}


def outcome_of(
    result: Frame | None, exit_frame: Frame | None, yields: int, **how: Any
) -> RunOutcome:
    """The outcome of one call (see `_outcome_of` for the arguments), with the
    usage the worker measured in its result frame, when it wrote one."""
    outcome = _outcome_of(result, exit_frame, yields, **how)
    read_usage(outcome, result)
    return outcome


def read_usage(outcome: RunOutcome, result: Frame | None) -> None:
    """Set `outcome`'s usage to what the runner measured in `result`, if it did."""
    usage = result.get("usage") if result is not None else None
    if isinstance(usage, dict):
        with contextlib.suppress(TypeError, ValueError):
            outcome.cpu_s = float(usage["cpu_s"])
            outcome.memory_peak_bytes = int(usage["memory_peak_bytes"])


def _outcome_of(
    result: Frame | None,
    exit_frame: Frame | None,
    yields: int,
    *,
    killed: bool,
    out_of_memory: bool,
    memory_bytes: int,
    lost_hint: str = "the tool may have killed it",
    protocol_error: str | None = None,
) -> RunOutcome:
    """The outcome of one call.

    Args:
        result: The runner's result frame, if it wrote one.
        exit_frame: The keeper's exit frame, if it wrote one.
        yields: Values a generator tool yielded.
        killed: The daemon killed the sandbox (why: the call's `StopReason`,
            which `calls.results` reads together with this outcome).
        out_of_memory: The kernel OOM-killed a process of the sandbox (only
            looked at when the tool left no result and died of SIGKILL).
        memory_bytes: The sandbox's memory limit, for the message.
        lost_hint: Why a runner might end without a word, for the message.
        protocol_error: How the sandbox broke the frame protocol, if it did:
            then its frames say nothing, and the sandbox was killed.
    """
    sig = exit_frame.get("signal") if exit_frame else None
    code = exit_frame.get("code") if exit_frame else None
    if killed:
        return RunOutcome(Termination.KILLED, exit_code=code, signal=sig, yields=yields)
    if protocol_error is not None:
        # Whatever the tool did is unknown: the runner is no longer to be believed.
        return RunOutcome(
            Termination.RUNNER_LOST,
            yields=yields,
            error=ToolError(
                type="ProtocolError",
                message=f"the sandbox broke the runner's frame protocol ({protocol_error}), "
                "so it was killed and what the tool did is unknown; tool code that writes "
                "into the runner's frame pipe does this",
            ),
        )
    if result is not None:
        exit_code = int(result.get("exit_code", 0))
        if result.get("ok"):
            return RunOutcome(
                Termination.RETURNED,
                value_kind=result.get("kind", "none"),
                value=result.get("value"),
                exit_code=exit_code,
                yields=yields,
            )
        err = result.get("error") or {}
        error = ToolError(
            type=str(err.get("type", "Error")),
            message=str(err.get("message", "")),
            traceback=str(err.get("traceback", "")),
        )
        termination = Termination.EXITED if error.type == "ExitCode" else Termination.RAISED
        return RunOutcome(termination, error=error, exit_code=exit_code, yields=yields)
    if sig == signal.SIGKILL and out_of_memory:
        return RunOutcome(
            Termination.OUT_OF_MEMORY,
            signal=int(sig),
            yields=yields,
            error=ToolError(
                type="OutOfMemory",
                message=f"the sandbox used up its memory ({memory_bytes} bytes, all its "
                "processes together) and the kernel killed the tool",
            ),
        )
    if sig:
        return signal_outcome(int(sig), yields)
    if code is not None:
        return RunOutcome(
            Termination.EXITED,
            exit_code=int(code),
            yields=yields,
            error=ToolError(
                type="ExitCode",
                message=f"the process exited with code {code} before the tool returned",
            ),
        )
    return RunOutcome(
        Termination.RUNNER_LOST,
        yields=yields,
        error=ToolError(
            type="RunnerLost",
            message="the sandbox's runner ended without reporting the tool's outcome "
            f"({lost_hint})",
        ),
    )


def signal_outcome(sig: int, yields: int) -> RunOutcome:
    """The outcome of a tool whose process died of `sig`: typed where a limit did it."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    termination, type_, message = _SIGNAL_REASONS.get(
        sig,
        (Termination.SIGNALED, "Signal", f"the tool's process was killed by {name} ({sig})"),
    )
    return RunOutcome(
        termination,
        signal=sig,
        yields=yields,
        error=ToolError(type=type_, message=message),
    )
