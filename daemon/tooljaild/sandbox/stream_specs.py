"""What the daemon asks a session's supervisor to start, how it ends, and how it fails.

The pinned names of issue 24's contract, re-exported by `session_streams`
(whose `StreamMux` speaks the ops): `Spawn`, `ProcessExit`, `SpawnError`,
`PortError`, `BadPortError`, `ProcessGoneError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tooljaild.sandbox.base import SandboxError

__all__ = [
    "BadPortError",
    "PortError",
    "ProcessExit",
    "ProcessGoneError",
    "Spawn",
    "SpawnError",
]


class SpawnError(SandboxError):
    """The supervisor could not start the process; the message says why.

    Attributes:
        limit: A limit refused it (fork's EAGAIN: the sandbox's pids limit;
            descriptors; the supervisor's count of streams).
    """

    def __init__(self, message: str, *, limit: bool = False) -> None:
        super().__init__(message)
        self.limit = limit


class PortError(SandboxError):
    """A port of the session cannot be reached: nothing listens, the
    connection was refused, it did not answer in time, or the port is no port."""


class BadPortError(PortError, ValueError):
    """The port is outside 1-65535 (refused before anything is sent)."""


class ProcessGoneError(SandboxError):
    """Input to a process that has ended, or whose stdin is closed (or to a
    connection closed that way)."""


@dataclass(frozen=True)
class Spawn:
    """What to start in the session (see `SessionSandbox.spawn`)."""

    argv: tuple[str, ...]
    """The program and its arguments, as execvp takes them."""
    cwd: str = ""
    """Relative to the session's workspace; "" is the workspace. The supervisor
    refuses one that leaves the workspace or does not exist (SpawnError)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Added to the session's environment."""
    terminal: tuple[int, int] | None = None
    """(rows, cols): run on a new PTY (stdin, stdout and stderr are its slave,
    its controlling terminal); output comes as stream "pty"."""
    stdin: bool = True
    """False: stdin is /dev/null."""


@dataclass(frozen=True)
class ProcessExit:
    """How a process ended."""

    code: int | None
    """Its exit status when it exited."""
    signal: int | None
    """The signal that ended it."""
    killed: bool
    """Ended by the session's reset, close or the sandbox's end, not by itself."""
