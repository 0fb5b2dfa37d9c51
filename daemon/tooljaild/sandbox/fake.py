"""A scripted sandbox for tests: no processes, the same interface.

The script is an async function that plays the tool: it may write output
through the sink and returns the outcome. `kill` cancels it, and `run` then
reports `Termination.KILLED`, as a real backend does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path

from tooljaild.sandbox.base import (
    OutputSink,
    RunOutcome,
    RunRequest,
    Sandbox,
    SandboxError,
    Termination,
)

Script = Callable[[RunRequest, OutputSink], Awaitable[RunOutcome]]

_ids = itertools.count(1)


async def returns_nothing(request: RunRequest, sink: OutputSink) -> RunOutcome:
    return RunOutcome(Termination.RETURNED)


class FakeSandbox(Sandbox):
    """Runs `script` in place of a tool; records what happened to it."""

    def __init__(self, script: Script = returns_nothing, *, fail_start: bool = False) -> None:
        self.id = f"fake-{next(_ids)}"
        self.workspace = Path("/nonexistent") / self.id
        self._script = script
        self._fail_start = fail_start
        self._task: asyncio.Task[RunOutcome] | None = None
        self.started = False
        self.used = False
        self.killed = False
        self.closed = False
        self.requests: list[RunRequest] = []

    @property
    def alive(self) -> bool:
        return self.started and not self.used and not self.closed

    async def start(self) -> None:
        if self._fail_start:
            raise SandboxError("fake sandbox refused to start")
        self.started = True

    async def run(self, request: RunRequest, sink: OutputSink) -> RunOutcome:
        if not self.alive:
            raise SandboxError(f"sandbox {self.id} is not ready for a request")
        self.used = True
        self.requests.append(request)
        self._task = asyncio.ensure_future(self._script(request, sink))
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self.killed:
                return RunOutcome(Termination.KILLED)
            raise

    async def kill(self) -> None:
        # `killed` records that a kill interrupted the script, as a test wants to know.
        if self._task is not None and not self._task.done():
            self.killed = True
            self._task.cancel()
            await asyncio.wait({self._task})

    async def close(self) -> None:
        await self.kill()
        self.closed = True
