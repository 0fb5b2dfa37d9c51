"""What a background process is started as, checked: its argv, cwd, env, signals.

The shapes of the sandbox floor's process (`sandbox.session_streams`) are
protocols here, so the sessions floor and its tests need no sandbox.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal as signals
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from tooljail.errors import (
    InvalidPathError,
    InvalidRequestError,
    ProcessLimitError,
    ProcessNotFoundError,
    TooljailError,
)
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import SpawnError

__all__ = [
    "MAX_COMMAND_BYTES",
    "MAX_ENV_BYTES",
    "ExitLike",
    "SandboxProcessLike",
    "SpawnSpec",
    "Spawner",
    "Stats",
    "check_cwd",
    "check_env",
    "check_signal",
    "command_argv",
    "parse_signal",
    "spawn_refusal",
    "unknown_process",
]

MAX_ENV_BYTES = 64 * 1024
"""Bytes of a process's added environment, keys and values together."""
MAX_COMMAND_BYTES = 64 * 1024
"""Bytes of a command line (or of an argv, joined)."""
MAX_ARGV = 4096
"""Arguments of an argv."""
_SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash -lc "$0"; else exec sh -c "$0"; fi'
"""Runs a command line with `bash -lc`, or `sh -c` where the sandbox has no bash."""


class SpawnSpec(Protocol):
    """What a process is started as (`sandbox.session_streams.Spawn`)."""

    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def cwd(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def terminal(self) -> tuple[int, int] | None: ...


class ExitLike(Protocol):
    """How a process ended (`sandbox.session_streams.ProcessExit`)."""

    @property
    def code(self) -> int | None: ...
    @property
    def signal(self) -> int | None: ...
    @property
    def killed(self) -> bool: ...


class SandboxProcessLike(Protocol):
    """A process in the sandbox (`sandbox.session_streams.SandboxProcess`)."""

    pid: int

    @property
    def exited(self) -> asyncio.Future[ExitLike]: ...
    async def output(self) -> tuple[str, bytes] | None: ...
    async def write(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def signal(self, signum: int, *, foreground: bool = False) -> None: ...


Spawner = Callable[[SpawnSpec], Awaitable[SandboxProcessLike]]
"""Starts a process in the session's sandbox (`SessionSandbox.spawn`)."""
Stats = Callable[[Collection[int]], Awaitable[dict[int, tuple[float, int]]]]
"""Measures processes in the session's sandbox (`SessionSandbox.stats`)."""


def command_argv(command: str, argv: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """The argv to start, and the command line to show, for exactly one of `command`
    (run by `bash -lc`, or `sh -c` where the sandbox has no bash) and `argv`.

    Raises:
        InvalidRequestError: Both or neither, an empty program, a NUL byte, or too long.
    """
    if bool(command) == bool(argv):
        raise InvalidRequestError(
            "give exactly one of command (a command line, run by bash -lc) and argv "
            "(a program and its arguments)"
        )
    words = [command] if command else list(argv)
    if len(words) > MAX_ARGV:
        raise InvalidRequestError(f"argv has {len(words)} entries; at most {MAX_ARGV}")
    if any("\0" in w for w in words):
        raise InvalidRequestError("a command or argument may not hold a NUL byte")
    if sum(len(w.encode()) for w in words) > MAX_COMMAND_BYTES:
        raise InvalidRequestError(f"the command is longer than {MAX_COMMAND_BYTES} bytes")
    if command:
        if not command.strip():
            raise InvalidRequestError("the command is blank")
        return ("/bin/sh", "-c", _SHELL, command), command
    if not argv[0]:
        raise InvalidRequestError("argv[0] (the program) is empty")
    return tuple(argv), shlex.join(argv)


def check_cwd(cwd: str) -> str:
    """`cwd` as a workspace-relative directory ("" is the workspace).

    Raises:
        InvalidPathError: Absolute, leaving the workspace, or with a NUL byte.
    """
    if "\0" in cwd:
        raise InvalidPathError("cwd may not hold a NUL byte")
    if len(cwd.encode()) > 4096:
        raise InvalidPathError("cwd is longer than 4096 bytes")
    if not cwd or cwd == ".":
        return ""
    if cwd.startswith("/") or ".." in Path(cwd).parts:
        raise InvalidPathError(
            f"cwd {cwd[:200]!r} must be a directory of the workspace, relative to it "
            "(no leading '/', no '..')"
        )
    return os.path.normpath(cwd)


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` if every key and value may be a process's environment.

    Raises:
        InvalidRequestError: A key empty or holding "=" or NUL, a value holding NUL,
            or more than `MAX_ENV_BYTES` in all.
    """
    size = 0
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidRequestError("env maps names to strings")
        if not key or "=" in key or "\0" in key:
            raise InvalidRequestError(
                f"env name {key[:100]!r} is not a variable name: not empty, no '=', no NUL"
            )
        if "\0" in value:
            raise InvalidRequestError(f"env {key[:100]!r} holds a NUL byte")
        size += len(key.encode()) + len(value.encode()) + 2
    if size > MAX_ENV_BYTES:
        raise InvalidRequestError(f"env is larger than {MAX_ENV_BYTES} bytes in all")
    return dict(env)


def check_signal(signum: int) -> None:
    """Raises InvalidRequestError unless `signum` is a signal number (1..64)."""
    if not 1 <= signum <= 64:
        raise InvalidRequestError(f"signal {signum} is not a signal number (1 to 64)")


def parse_signal(value: str | int | None) -> int:
    """A signal number from a name ("TERM", "SIGTERM") or number; None: SIGTERM.

    Raises:
        InvalidRequestError: Neither.
    """
    if value is None or value == "":
        return int(signals.SIGTERM)
    if isinstance(value, int) and not isinstance(value, bool):
        check_signal(value)
        return value
    text = str(value).strip().upper()
    if text.isdigit():
        check_signal(int(text))
        return int(text)
    name = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise InvalidRequestError(
            f"signal {str(value)[:40]!r} is not a signal name or number (e.g. TERM, INT, 9)"
        ) from None


def unknown_process(process_id: str) -> ProcessNotFoundError:
    """The one answer for a process id the caller may not see (never one, or
    another session's or client's)."""
    return ProcessNotFoundError(
        f"no process {process_id[:80]!r} in this session (list_processes names its "
        "processes; a session's processes end with it)"
    )


def spawn_refusal(exc: SandboxError, spec: SpawnSpec) -> TooljailError:
    """What the caller is told when the sandbox did not start `spec`."""
    if isinstance(exc, SpawnError) and exc.limit:
        return ProcessLimitError(
            f"the session's sandbox refused to start another process: {exc}. It holds as "
            "many processes as its pids limit allows; stop one first"
        )
    if isinstance(exc, SpawnError):  # the sandbox is fine; it refused this one
        if spec.cwd and "cwd" in str(exc):
            return InvalidPathError(str(exc))
        return InvalidRequestError(f"the process could not start: {exc}")
    return exc
