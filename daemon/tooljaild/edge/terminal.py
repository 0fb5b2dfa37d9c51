"""rpc Terminal: a PTY running a shell in a session, for as long as its stream lasts.

The first `TerminalInput` is `open` (the session, the window size, the argv and
env); the daemon answers `opened` (the shell as a process of the session), then
the PTY's bytes as `data`, and last `exited`. Later inputs are `data` (keys),
`resize` and `signal` (to the terminal's foreground process group, as a
terminal's Ctrl-C would). An end of the client's input (a half close) sends
nothing to the shell: the stream lasts until the shell exits.

Flow control end to end: the PTY is read (`SandboxProcess.output`) only once
the previous chunk was handed to gRPC (the async generator's consumer awaits
each write), and a PTY nobody reads blocks its writer in the sandbox, as a
real one does. A client that stops reading therefore holds the daemon's
memory at gRPC's own flow-control window, whatever the shell prints. Input
goes the other way the same way: the next message is read only once the
previous one was written to the PTY (`SandboxProcess.write` waits for room).

The stream's end before the shell's (the client went away, the RPC was
cancelled) hangs the shell up: SIGHUP to its process group, as a terminal
that closes does, then SIGKILL after `HANGUP_GRACE_S` if it is still there.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import signal
import time
from collections.abc import AsyncIterator, Callable

from tooljail.errors import InvalidRequestError, PermissionDeniedError
from tooljail.types import ProcessInfo, ProcessState
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.wire import process_info_to_proto
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import (
    ProcessExit,
    ProcessGoneError,
    SandboxProcess,
    Spawn,
)
from tooljaild.sessions.session import Session, ended_error

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SHELL",
    "DEFAULT_SIZE",
    "HANGUP_GRACE_S",
    "MAX_SIZE",
    "serve_terminal",
]

DEFAULT_SHELL: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    # exec: the shell is the process itself (its pid is the terminal's).
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
)
"""An empty argv: `bash -l`, or `sh -l` where the sandbox has no bash."""

DEFAULT_SIZE = (24, 80)
"""Rows and columns when `open` gives none (0)."""

MAX_SIZE = 10_000
"""The most rows or columns a window may have (a real screen has a few hundred)."""

HANGUP_GRACE_S = 2.0
"""After the SIGHUP of a terminal whose client went away, SIGKILL this much later."""

MAX_INPUT_BYTES = 1 << 20
"""The most bytes one `data` input may carry (the SDK sends keys, or 64 KiB pieces)."""

_hangups: set[asyncio.Task[None]] = set()
"""Hang-ups under way: held so they are not collected before they end."""


def _size(rows: int, cols: int) -> tuple[int, int]:
    if rows > MAX_SIZE or cols > MAX_SIZE:
        raise InvalidRequestError(
            f"a terminal of {rows}x{cols} is too large: at most {MAX_SIZE} rows and columns"
        )
    return (rows or DEFAULT_SIZE[0], cols or DEFAULT_SIZE[1])


def _check_signal(signum: int) -> int:
    if not 1 <= signum < signal.NSIG:
        raise InvalidRequestError(
            f"signal {signum} does not exist: send a signal number from 1 to {signal.NSIG - 1} "
            "(2 is SIGINT, Ctrl-C)"
        )
    return signum


def check_terminal_allowed(allowed: frozenset[str] | None) -> None:
    """Refuse a terminal to a caller whose commands are checked against an allow-list.

    An interactive shell runs whatever is typed into it: no allow-list of
    programs can be checked on it.

    Args:
        allowed: The caller's commands allow-list (`[commands] allow`, narrowed
            per identity); None or empty: no allow-list.

    Raises:
        PermissionDeniedError: There is an allow-list.
    """
    if allowed:
        raise PermissionDeniedError(
            "a terminal is refused here: commands are checked against an allow-list "
            "([commands] allow), and an interactive shell cannot be checked. Run "
            "allowed commands with run_command instead."
        )


async def _first(requests: AsyncIterator[pb.TerminalInput], timeout_s: float) -> pb.TerminalOpen:
    try:
        first = await asyncio.wait_for(anext(requests, None), timeout_s)
    except TimeoutError:
        raise InvalidRequestError(
            f"a terminal's first message (open) did not come within {timeout_s:g}s"
        ) from None
    if first is None or first.WhichOneof("kind") != "open":
        raise InvalidRequestError(
            "a terminal's first message must be `open`, naming the session (and its size)"
        )
    return first.open


async def _start_shell(
    session: Session, opened: pb.TerminalOpen
) -> tuple[SandboxProcess, ProcessInfo]:
    """The shell on a new PTY of the session, and how it is listed."""
    rows, cols = _size(opened.rows, opened.cols)
    argv = tuple(opened.argv) or DEFAULT_SHELL
    env = {"TERM": "xterm-256color", **dict(opened.env)}
    spec = Spawn(argv=argv, env=env, terminal=(rows, cols))
    command = "bash -l" if not opened.argv else shlex.join(argv)
    # The shell is one of the session's processes (listed, counted against
    # `max_processes`, ended with the session); its bytes are this stream's alone.
    try:
        info = await session.processes.start(spec, name="terminal", command=command, terminal=True)
    except SandboxError:  # its sandbox has ended (a refusal is a TooljailError)
        session.check_open()
        raise ended_error(session.id, "sandbox_died") from None
    process = session.processes.get(info.process_id).process
    if not isinstance(process, SandboxProcess):  # the table holds the sandbox's own
        raise TypeError(f"a terminal needs a SandboxProcess, got {type(process).__name__}")
    return process, info


def _ended(info: ProcessInfo, end: ProcessExit) -> ProcessInfo:
    """`info` once the process ended as `end` (a `ProcessExit`)."""
    state = ProcessState.KILLED if end.killed else ProcessState.EXITED
    return info.model_copy(
        update={
            "state": state,
            "exit_code": end.code,
            "signal": end.signal or 0,
            "ended_unix": time.time(),
        }
    )


async def _pump_input(
    requests: AsyncIterator[pb.TerminalInput], process: SandboxProcess, session: Session
) -> None:
    """The client's keys, resizes and signals to the terminal, one at a time."""
    async for message in requests:
        session.touch()  # a terminal in use is the session in use (its idle TTL)
        kind = message.WhichOneof("kind")
        if kind == "data":
            if len(message.data) > MAX_INPUT_BYTES:
                raise InvalidRequestError(
                    f"a terminal input of {len(message.data)} bytes is too large: send at "
                    f"most {MAX_INPUT_BYTES} per message"
                )
            try:
                await process.write(message.data)
            except ProcessGoneError:
                return  # the shell ended: its exit is on its way to the client
        elif kind == "resize":
            process.resize(*_size(message.resize.rows, message.resize.cols))
        elif kind == "signal":
            process.signal(_check_signal(message.signal), foreground=True)
        elif kind == "open":
            raise InvalidRequestError("a terminal is opened once, by its first message")


async def _hang_up(process: SandboxProcess, grace_s: float) -> None:
    """SIGHUP to the shell's group, then SIGKILL after `grace_s` if it still runs."""
    process.signal(signal.SIGHUP)
    try:
        await asyncio.wait_for(asyncio.shield(process.exited), grace_s)
    except TimeoutError:
        process.signal(signal.SIGKILL)


def hang_up_later(process: SandboxProcess, grace_s: float = HANGUP_GRACE_S) -> None:
    """Start `_hang_up` as a task of its own (the stream that asks is ending)."""
    task = asyncio.get_running_loop().create_task(_hang_up(process, grace_s))
    _hangups.add(task)
    task.add_done_callback(_hangups.discard)


async def serve_terminal(
    requests: AsyncIterator[pb.TerminalInput],
    own_session: Callable[[str], Session],
    *,
    open_timeout_s: float,
    commands_allowed: frozenset[str] | None = None,
) -> AsyncIterator[pb.TerminalOutput]:
    """The Terminal RPC: open, stream both ways, end with the shell's exit.

    Args:
        requests: The client's messages.
        own_session: The caller's open session of an id (another client's is
            NOT_FOUND, `ToolRunnerServicer._own_session`).
        open_timeout_s: How long the first message may take.
        commands_allowed: The caller's commands allow-list, if any: a terminal
            is then refused (`check_terminal_allowed`).

    Raises:
        InvalidRequestError: The first message is not `open`, a size or signal
            is out of range, or an input is too large.
        PermissionDeniedError: The session's commands are allow-listed.
        SessionNotFoundError, SessionEndedError: As `own_session`.
        ProcessLimitError: The session may start no more processes.
    """
    opened = await _first(requests, open_timeout_s)
    session = own_session(opened.session_id)
    check_terminal_allowed(commands_allowed)
    process, info = await _start_shell(session, opened)
    pump = asyncio.ensure_future(_pump_input(requests, process, session))
    waiting: asyncio.Future[tuple[str, bytes] | None] | None = None
    exited = False
    try:
        yield pb.TerminalOutput(opened=process_info_to_proto(info))
        while True:
            waiting = asyncio.ensure_future(process.output())
            await asyncio.wait((waiting, pump), return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and not pump.cancelled() and (error := pump.exception()) is not None:
                raise error
            # The client's input may have ended (a half close): output goes on.
            chunk = await waiting
            waiting = None
            if chunk is None:
                break
            # The next read waits for this write: the PTY is read only as fast
            # as the client takes its bytes.
            session.touch()
            yield pb.TerminalOutput(data=chunk[1])
        end = await process.exited
        exited = True
        yield pb.TerminalOutput(exited=process_info_to_proto(_ended(info, end)))
    finally:
        pump.cancel()
        if waiting is not None:
            waiting.cancel()
        if not exited and not process.exited.done():
            log.info("terminal of session %s: its client went away; hanging up", session.id)
            hang_up_later(process)
