"""The sandbox interface every backend implements, and what flows through it.

A sandbox is started ahead of demand (`start`), runs exactly one request
(`run`), and is then destroyed (`close`). `kill` may be called at any time from
another task; `run` then returns promptly with `killed=True`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tooljail.errors import TooljailError
from tooljail.types import StreamKind, ToolError
from tooljaild.settings.sandbox import Limits

OutputSink = Callable[[StreamKind, bytes], None]
"""Receives each chunk of output as it is read. Must not block."""


@dataclass(frozen=True)
class ArtifactPart:
    """One part of an artifact a sandbox sent (runner_channel's "artifact" frame),
    checked: parts of one artifact come in order, numbered from 0."""

    name: str
    mime_type: str
    source: str
    data: bytes
    part: int
    last: bool


ArtifactSink = Callable[[ArtifactPart], bool]
"""Receives each artifact part as it is read; True when it kept the part whole.
Must not block for long (a local file write)."""


@dataclass(frozen=True)
class RunRequest:
    """One thing to run inside a sandbox."""

    kind: Literal["code", "file", "user", "describe", "workspace", "packages", "command"]
    payload: dict[str, Any]
    """Kind-specific fields: code | path, args | module_path, function, args | files
    | op, args, quota_bytes | requirements, known (a session's only) | command or
    argv, dir, vars, stdin."""
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables on top of the sandbox's scrubbed environment."""
    artifacts: ArtifactSink | None = field(default=None, compare=False)
    """Where artifacts the sandbox sends go; None: they are dropped (still checked)."""
    egress: bool = False
    """The call may reach out through the daemon's egress proxy: the runner
    starts its relay (runner/_egress.py) before the tool runs. Its environment
    (`env`) then holds the proxy variables (egress/env.py)."""


class Termination(enum.StrEnum):
    """How the tool's process ended."""

    RETURNED = "returned"
    RAISED = "raised"
    EXITED = "exited"
    SIGNALED = "signaled"
    KILLED = "killed"
    """Killed by the daemon (`Sandbox.kill`). Why is the call's to say: its
    `calls.StopReason`, which `calls.results` reads before this."""
    CPU_LIMIT = "cpu_limit"
    OUT_OF_MEMORY = "out_of_memory"
    FILE_SIZE_LIMIT = "file_size_limit"
    RUNNER_LOST = "runner_lost"
    """The sandbox's runner vanished without saying how the tool ended."""


@dataclass
class RunOutcome:
    """What a sandbox reports at the end of a run."""

    termination: Termination
    value_kind: Literal["none", "json", "text"] = "none"
    value: Any = None
    error: ToolError | None = None
    exit_code: int | None = None
    signal: int | None = None
    yields: int = 0
    cpu_s: float | None = None
    """CPU seconds the run used; None when nothing measured it."""
    memory_peak_bytes: int | None = None
    """The run's peak memory in bytes; None when nothing measured it."""

    @property
    def ok(self) -> bool:
        return self.termination is Termination.RETURNED


async def first_words(stream: asyncio.StreamReader | None, timeout_s: float = 1.0) -> str:
    """What a process that failed to start wrote first (up to 4 KiB), for the error."""
    if stream is None:
        return ""
    with contextlib.suppress(TimeoutError):
        return (
            (await asyncio.wait_for(stream.read(4096), timeout_s)).decode(errors="replace").strip()
        )
    return ""


class SandboxError(TooljailError):
    """The sandbox could not be started or broke down (not the tool's fault)."""


class Sandbox(abc.ABC):
    """One isolated place to run one request."""

    id: str
    workspace: Path
    egress_dir: Path | None = None
    """This sandbox's egress directory on the host (egress/dirs.py), which it
    sees read-only at /run/tooljail: where the daemon opens its gate. None:
    the daemon has no egress (no `[egress]`), or the sandbox has no network
    namespace of its own to confine it (the process backend without
    namespaces: it shares the host's network anyway)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Make the sandbox ready to take a request.

        Raises:
            SandboxError: When it cannot be started.
        """

    @abc.abstractmethod
    async def run(self, request: RunRequest, sink: OutputSink) -> RunOutcome:
        """Run the request, feeding output to `sink` as it arrives.

        Returns when the tool's whole process tree is gone. Never raises for
        what the tool does; a tool that crashes is an outcome.

        Raises:
            SandboxError: When the sandbox itself fails (not started, used twice).
        """

    def begin(self, request: RunRequest, sink: OutputSink) -> Coroutine[Any, Any, RunOutcome]:
        """Send the request now, where the backend can without waiting; return
        what waits for the outcome (as `run` would).

        The default sends nothing early: it returns `run`'s coroutine.

        Raises:
            SandboxError: As `run` (at once, where the backend checks early).
        """
        return self.run(request, sink)

    @abc.abstractmethod
    async def kill(self) -> None:
        """Stop everything running in the sandbox. Idempotent; safe before `run`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill what is left and release every resource. Idempotent."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """True while a started sandbox can still take its request."""
