"""The model-facing tools of a session's background processes.

`start_process`, `list_processes`, `read_process_output`, `write_process_input`
and `stop_process`: in-daemon handlers (`BuiltinRun.needs_session`: a call
without a session is refused at admission) over the session's
`ProcessTable`. They take no turn of the session: its processes run beside its
calls, so a model starts a server in one call and reads its log three calls
later, while the server runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal as signals
from typing import Any

from tooljail.errors import InvalidArgumentsError, TooljailError
from tooljaild.sessions.process_specs import parse_signal
from tooljaild.sessions.session import Session
from tooljaild.settings.config import Settings
from tooljaild.tools.in_daemon import DaemonCall, ToolFailure
from tooljaild.tools.registry import Tool

__all__ = [
    "PROCESS_TOOLS",
    "PROCESS_TOOL_RUNS",
    "READ_LIMIT_BYTES",
    "check_stop_arguments",
]

READ_LIMIT_BYTES = 16 * 1024
"""What `read_process_output` returns at most when no `limit` is given."""
MAX_READ_LIMIT_BYTES = 1024 * 1024
"""The largest `limit` it takes."""
DRAIN_WAIT_S = 1.0
"""How long `read_process_output` waits for an ended process's last output."""
STOP_GRACE_S = 5.0
"""How long `stop_process` waits after SIGTERM before SIGKILL."""
_PROCESS_ID = {"type": "string", "description": "The id start_process returned (p-...)."}

PROCESS_TOOLS: tuple[Tool, ...] = (
    Tool(
        name="start_process",
        description=(
            "Start a command in the background in the current session (its workspace, "
            'its limits), e.g. a dev server: {"command": "python -m http.server 8000"}. '
            "It runs by bash -lc (sh where there is no bash) and keeps running after this "
            "call, until it ends, you stop it (stop_process), or the session ends or is "
            "reset. Returns {process_id}. Read its output later with read_process_output."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line to run."},
                "name": {"type": "string", "description": "A name for it (for your lists)."},
                "cwd": {
                    "type": "string",
                    "description": "A directory of the workspace, relative to it "
                    "(default: the workspace).",
                },
                "env": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Environment variables to add.",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        source="builtin",
        builtin="start_process",
    ),
    Tool(
        name="list_processes",
        description=(
            "List the current session's background processes: {processes: [{process_id, "
            "name, command, pid, state (running, exited, killed), exit_code, started_unix, "
            "cpu_s, memory_bytes, output_bytes}]}."
        ),
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        source="builtin",
        builtin="list_processes",
    ),
    Tool(
        name="read_process_output",
        description=(
            "Read a background process's output from an offset: stdout and stderr lines "
            "interleaved as they came (stderr lines are included). Returns {output, "
            "next_offset, running, exit_code}; call again with offset=next_offset to read "
            "on (nothing is missed or repeated). Returns at once: an empty output means "
            f"nothing new yet. At most `limit` bytes (default {READ_LIMIT_BYTES})."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": _PROCESS_ID,
                "offset": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Where to start: 0, or the next_offset of the last read.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_READ_LIMIT_BYTES,
                    "description": f"The most bytes to return (default {READ_LIMIT_BYTES}).",
                },
            },
            "required": ["process_id"],
            "additionalProperties": False,
        },
        source="builtin",
        builtin="read_process_output",
    ),
    Tool(
        name="write_process_input",
        description=(
            'Write text to a background process\'s stdin, e.g. {"process_id": "p-...", '
            '"data": "yes\\n"} (add the newline a line needs). eof=true closes its '
            "stdin after the data."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": _PROCESS_ID,
                "data": {
                    "type": "string",
                    "maxLength": MAX_READ_LIMIT_BYTES,
                    "description": "The text to write (a line needs its newline).",
                },
                "eof": {
                    "type": "boolean",
                    "default": False,
                    "description": "Close the process's stdin after the data.",
                },
            },
            "required": ["process_id", "data"],
            "additionalProperties": False,
        },
        source="builtin",
        builtin="write_process_input",
    ),
    Tool(
        name="stop_process",
        description=(
            "Stop a background process: SIGTERM, then SIGKILL if it is still running "
            f'{STOP_GRACE_S:g}s later. With signal (a name such as "INT" or "HUP", or a '
            "number), only that signal is sent. Returns the process as it is then."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": _PROCESS_ID,
                "signal": {
                    "type": "string",
                    "description": "A signal to send instead of stopping it: a name "
                    "(INT, HUP, TERM, KILL...) or a number.",
                },
            },
            "required": ["process_id"],
            "additionalProperties": False,
        },
        source="builtin",
        builtin="stop_process",
    ),
)
"""The process tools (served by every daemon with sessions)."""


def check_stop_arguments(arguments: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`stop_process`'s signal, as a number, checked at admission.

    Raises:
        InvalidArgumentsError: Not a signal name or number.
    """
    value = arguments.get("signal")
    if value is None:
        return arguments
    try:
        number = parse_signal(value)
    except TooljailError as exc:
        raise InvalidArgumentsError(
            exc.message, parameter="signal", expected="a signal name or number", actual=str(value)
        ) from None
    return {**arguments, "signal": number}


def _session(call: DaemonCall) -> Session:
    if call.session is None:
        raise ToolFailure(
            "SessionRequired", f"{call.tool} works on a session: call it with a session_id"
        )
    call.session.touch()  # a use for its idle TTL, though it takes no turn
    return call.session


async def start_process(call: DaemonCall) -> dict[str, Any]:
    a = call.arguments
    info = await _session(call).processes.start_command(
        str(a["command"]),
        name=str(a.get("name") or ""),
        cwd=str(a.get("cwd") or ""),
        env=dict(a.get("env") or {}),
    )
    return {"process_id": info.process_id}


async def list_processes(call: DaemonCall) -> dict[str, Any]:
    infos = await _session(call).processes.list()
    return {"processes": [i.model_dump(mode="json") for i in infos]}


async def read_process_output(call: DaemonCall) -> dict[str, Any]:
    a = call.arguments
    table = _session(call).processes
    process_id = str(a["process_id"])
    process = table.get(process_id)
    if not process.running and not process.drained.done():
        # It ended: its last output is on its way; "running": false promises it all.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(process.drained), DRAIN_WAIT_S)
    chunks, next_offset, skipped = table.read(
        process_id, int(a.get("offset") or 0), int(a.get("limit") or READ_LIMIT_BYTES)
    )
    raw = b"".join(c.data for c in chunks)
    info = process.info()
    if next_offset < info.output_bytes:
        # Cut where `limit` split a character: the next read starts with it whole.
        cut = _split_character(raw)
        if cut < len(raw):  # never all of it: a read must move on (a limit of 1)
            raw, next_offset = raw[: len(raw) - cut], next_offset - cut
    data: dict[str, Any] = {
        "output": raw.decode("utf-8", "replace"),
        "next_offset": next_offset,
        "running": info.running,
        "exit_code": info.exit_code,
    }
    if skipped:
        data["skipped_bytes"] = skipped  # no longer kept (the ring passed them, no artifact)
    return data


def _split_character(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character they do not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the character's first
            size = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back if byte >= 0xC0 and size > back else 0
    return 0


async def write_process_input(call: DaemonCall) -> dict[str, Any]:
    a = call.arguments
    info = await _session(call).processes.write(
        str(a["process_id"]), str(a["data"]).encode(), bool(a.get("eof"))
    )
    return {"process_id": info.process_id, "running": info.running}


async def stop_process(call: DaemonCall) -> dict[str, Any]:
    a = call.arguments
    table = _session(call).processes
    process_id = str(a["process_id"])
    signum = a.get("signal")
    if signum is None:
        info = await table.stop(process_id, signals.SIGTERM, STOP_GRACE_S)
    else:
        table.signal(process_id, int(signum))
        info = await table.wait(process_id, 0.5)  # a moment to see it end, if it does
    return info.model_dump(mode="json")


PROCESS_TOOL_RUNS = {
    "start_process": start_process,
    "list_processes": list_processes,
    "read_process_output": read_process_output,
    "write_process_input": write_process_input,
    "stop_process": stop_process,
}
"""Each process tool's in-daemon handler, by name."""
