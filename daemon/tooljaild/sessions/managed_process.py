"""One background process of a session as the daemon holds it (`ManagedProcess`):
its sandbox process, its output log, its state and its end. The table of a
session's processes is `sessions.processes`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from tooljail.types import ProcessInfo, ProcessState
from tooljaild.sandbox.base import SandboxError
from tooljaild.sessions.process_output import OutputLog
from tooljaild.sessions.process_specs import ExitLike, SandboxProcessLike

__all__ = ["ManagedProcess"]

log = logging.getLogger("tooljaild.sessions.processes")


class ManagedProcess:
    """One background process of a session, as the daemon keeps it."""

    def __init__(
        self,
        process_id: str,
        session_id: str,
        name: str,
        command: str,
        process: SandboxProcessLike,
        output: OutputLog | None,
        *,
        terminal: bool,
    ) -> None:
        self.id = process_id
        self.session_id = session_id
        self.name = name
        self.command = command
        self.process = process
        """Its bytes in the sandbox (a terminal reads and writes them directly)."""
        self.output = output
        """Its kept output (None for a terminal's: it goes to its one stream)."""
        self.terminal = terminal
        self.started_unix = time.time()
        self.ended_unix = 0.0
        self.state = ProcessState.RUNNING
        self.exit_code: int | None = None
        self.signal = 0
        self.cpu_s = 0.0
        self.memory_bytes = 0
        self.ending = False
        """Its session ends or resets: the kill that follows is the session's, not its own."""
        self.end_reported = False
        """A result (or a close) has named its end by a reset (`end_all`)."""
        self.drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolves once its output is all in the log (or it has none kept)."""
        self._reader: asyncio.Task[None] | None = None
        process.exited.add_done_callback(self._exited)

    @property
    def running(self) -> bool:
        return self.state is ProcessState.RUNNING

    def _exited(self, future: asyncio.Future[ExitLike]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.end(ProcessState.KILLED)
            return
        how = future.result()
        killed = how.killed or self.ending
        self.exit_code = None if killed or how.signal else how.code
        self.signal = how.signal or 0
        self.end(ProcessState.KILLED if killed else ProcessState.EXITED)

    def end(self, state: ProcessState) -> None:
        """Mark it ended (once)."""
        if self.state is ProcessState.RUNNING:
            self.state = state
            self.ended_unix = time.time()

    def read_output(self, on_done: Callable[[ManagedProcess], None]) -> None:
        """Start the task that drains its output into its log, whoever reads it."""
        if self.output is None:
            self.drained.set_result(None)
            return
        self._reader = asyncio.create_task(self._drain(on_done), name=f"process-{self.id}")

    async def _drain(self, on_done: Callable[[ManagedProcess], None]) -> None:
        assert self.output is not None
        try:
            while (item := await self.process.output()) is not None:
                self.output.append(*item)
        except (SandboxError, OSError) as exc:
            log.info("the output of process %s ended early: %s", self.id, exc)
        finally:
            on_done(self)
            if not self.drained.done():
                self.drained.set_result(None)

    def stop_reading(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()

    def info(self) -> ProcessInfo:
        log_ = self.output
        return ProcessInfo(
            process_id=self.id,
            session_id=self.session_id,
            name=self.name,
            command=self.command,
            pid=self.process.pid,
            state=self.state,
            exit_code=self.exit_code,
            signal=self.signal,
            started_unix=self.started_unix,
            ended_unix=self.ended_unix,
            cpu_s=self.cpu_s,
            memory_bytes=self.memory_bytes,
            output_bytes=0 if log_ is None else log_.end,
            ring_start=0 if log_ is None else log_.ring_start,
            output_artifact_id="" if log_ is None else log_.artifact_id,
            terminal=self.terminal,
        )
