"""Background processes of a session: their table, their control, their end.

A session's `ProcessTable` (`session.processes`) starts processes in the
session's sandbox (`SessionSandbox.spawn`: the supervisor forks them in new
sessions, so a call's end-of-call sweep spares them), keeps each one's output
(`sessions.process_output`: one reader task per process drains it into its
log at once, whoever reads it, so a process never blocks on a reader that
went away), and ends them all with the session or its interpreter's reset
(`end_all`).

Bounds: `[sessions] max_processes` running at once per session (and as many
ended ones kept for reading, oldest forgotten first); a fork the sandbox's
pids limit refuses is a `ProcessLimitError` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal as signals
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from tooljail.errors import InvalidRequestError, ProcessLimitError
from tooljail.types import ProcessInfo, ProcessState
from tooljaild.artifacts.store import ArtifactStore, ArtifactWriter, Origin
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import Spawn
from tooljaild.sessions.managed_process import ManagedProcess
from tooljaild.sessions.process_output import Chunk, OutputLog, RingBudget, Select
from tooljaild.sessions.process_specs import (
    Spawner,
    SpawnSpec,
    Stats,
    check_cwd,
    check_env,
    check_signal,
    command_argv,
    parse_signal,
    spawn_refusal,
    unknown_process,
)

__all__ = [
    "END_WAIT_S",
    "Chunk",
    "ManagedProcess",
    "OutputLog",
    "ProcessTable",
    "Select",
    "SpawnSpec",
    "check_env",
    "command_argv",
    "parse_signal",
    "unknown_process",
]

log = logging.getLogger(__name__)

END_WAIT_S = 5.0
"""How long `end_all` waits for the sandbox to report its processes' ends."""


_Chunks = list[Chunk]
_Infos = list[ProcessInfo]


class ProcessTable:
    """The background processes of one session.

    Args:
        session_id: Its session.
        owner: The session's client (owner of the spilled output artifacts).
        spawn: Starts a process in the session's sandbox.
        stats: Measures processes there (None: not measured).
        max_processes: Running at once (`[sessions] max_processes`).
        ring_bytes: Output kept in memory per process (`process_output_ring_bytes`).
        artifacts: Where output past the ring goes (None: it is dropped).
        budget: The daemon's bound on every ring together (None: none).
    """

    def __init__(
        self,
        session_id: str,
        owner: str,
        spawn: Spawner,
        stats: Stats | None,
        *,
        max_processes: int,
        ring_bytes: int,
        artifacts: ArtifactStore | None,
        budget: RingBudget | None = None,
    ) -> None:
        self.session_id = session_id
        self._owner = owner
        self._spawn = spawn
        self._stats = stats
        self._max = max_processes
        self._ring_bytes = ring_bytes
        self._artifacts = artifacts
        self._budget = budget
        self._processes: OrderedDict[str, ManagedProcess] = OrderedDict()
        self._starting = 0
        self.closed = False

    def __len__(self) -> int:
        return len(self._processes)

    @property
    def running(self) -> int:
        return sum(1 for p in self._processes.values() if p.running)

    # ------------------------------------------------------------- start

    async def start_command(
        self,
        command: str = "",
        argv: Sequence[str] = (),
        *,
        name: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Check and start one process: exactly one of `command` and `argv`.

        Raises:
            InvalidRequestError, InvalidPathError: As `command_argv`, `check_cwd`,
                `check_env`; or a name longer than 256 characters.
            ProcessLimitError, InvalidRequestError, SandboxError: As `start`.
        """
        argv_, shown = command_argv(command, argv)
        if len(name) > 256:
            raise InvalidRequestError("a process's name is at most 256 characters")
        spec = Spawn(argv=argv_, cwd=check_cwd(cwd), env=check_env(env or {}))
        return await self.start(spec, name=name, command=shown)

    async def start(
        self, spec: SpawnSpec, *, name: str, command: str, terminal: bool = False
    ) -> ProcessInfo:
        """Start `spec` in the session's sandbox and keep it (its output too, unless
        it runs on a terminal).

        Raises:
            ProcessLimitError: The session runs `max_processes` already, or the
                sandbox's pids limit refused the fork.
            InvalidPathError: The sandbox refused its cwd.
            InvalidRequestError: The sandbox refused it otherwise (its message says).
            SandboxError: The session's sandbox has ended.
        """
        if self.closed:
            raise SandboxError(f"session {self.session_id} has ended; it starts no process")
        if self.running + self._starting >= self._max:
            raise ProcessLimitError(
                f"session {self.session_id!r} runs {self._max} background processes, as many "
                "as it may ([sessions] max_processes): stop one (stop_process) first"
            )
        self._starting += 1
        try:
            process = await self._spawn(spec)
        except SandboxError as exc:
            raise spawn_refusal(exc, spec) from exc
        finally:
            self._starting -= 1
        process_id = "p-" + secrets.token_hex(6)
        output = (
            None
            if terminal
            else OutputLog(self._ring_bytes, self._spill_for(process_id), self._budget)
        )
        managed = ManagedProcess(
            process_id, self.session_id, name, command, process, output, terminal=terminal
        )
        if self.closed:  # the session ended while it started: it ends with it
            process.signal(signals.SIGKILL)
            managed.end(ProcessState.KILLED)
        self._processes[process_id] = managed
        managed.read_output(self._drained)
        self._forget_ended()
        log.info(
            "process started",
            extra={"session": self.session_id, "process_id": process_id, "pid": process.pid},
        )
        return managed.info()

    def _spill_for(self, process_id: str) -> Callable[[], ArtifactWriter] | None:
        store = self._artifacts
        if store is None:
            return None
        origin = Origin(owner=self._owner, session_id=self.session_id, tool="start_process")
        return lambda: store.writer(f"{process_id}-output.txt", "text/plain", origin, "process")

    def _drained(self, process: ManagedProcess) -> None:
        if process.output is None:
            return
        store = self._artifacts
        owner = self._owner
        process.output.close(None if store is None else lambda a: store.path(a, owner))

    def _forget_ended(self) -> None:
        """Keep at most `max_processes` ended processes, forgetting the oldest."""
        ended = [p for p in self._processes.values() if not p.running and p.drained.done()]
        for p in ended[: max(0, len(ended) - self._max)]:
            del self._processes[p.id]
            if p.output is not None:
                p.output.release()

    # ------------------------------------------------------------- find

    def get(self, process_id: str) -> ManagedProcess:
        """The process of that id of this session.

        Raises:
            ProcessNotFoundError: None (another session's reads the same).
        """
        found = self._processes.get(process_id)
        if found is None:
            raise unknown_process(process_id)
        return found

    async def list(self) -> _Infos:
        """Every process kept, oldest first, with fresh CPU and memory of the running."""
        running = {p.process.pid: p for p in self._processes.values() if p.running}
        if running and self._stats is not None:
            try:
                measured = await asyncio.wait_for(self._stats(list(running)), 5.0)
            except (SandboxError, TimeoutError) as exc:
                log.info("could not measure the processes of %s: %s", self.session_id, exc)
                measured = {}
            for pid, (cpu_s, rss) in measured.items():
                if (p := running.get(pid)) is not None:
                    p.cpu_s, p.memory_bytes = cpu_s, rss
        return [p.info() for p in self._processes.values()]

    # ------------------------------------------------------------- output

    def read(
        self, process_id: str, offset: int, limit: int = 0, select: Select = "both"
    ) -> tuple[_Chunks, int, int]:
        """Its output from `offset` (`OutputLog.read`); never waits.

        Raises:
            ProcessNotFoundError: As `get`.
            InvalidRequestError: A negative offset or limit; a terminal's process
                (its output is its terminal's).
        """
        return self._log(process_id).read(offset, limit, select)

    async def follow(
        self, process_id: str, offset: int, select: Select = "both", limit: int = 0
    ) -> AsyncIterator[Chunk]:
        """Its output from `offset`, live, until it ended and all of it came.

        An offset past the end waits for the output to reach it. Each byte
        comes once; re-attach from the last chunk's end to go on.

        Raises:
            ProcessNotFoundError, InvalidRequestError: As `read`, at the first step.
        """
        output = self._log(process_id)
        left = limit
        while True:
            # The event is taken before the read: output that comes after the
            # read sets it, so no wake-up is missed.
            changed = output.watch()
            chunks, offset, _ = output.read(offset, left if limit else 0, select)
            for chunk in chunks:
                yield chunk
                left -= len(chunk.data)
            if limit and left <= 0:
                return
            if offset < output.end:
                await asyncio.sleep(0)  # more to read (a spill, a passed-over stream)
                continue
            if output.eof:
                return
            await changed.wait()

    def _log(self, process_id: str) -> OutputLog:
        process = self.get(process_id)
        if process.output is None:
            raise InvalidRequestError(
                f"process {process_id!r} runs a terminal: its output goes to its terminal"
            )
        return process.output

    # ------------------------------------------------------------- control

    async def write(self, process_id: str, data: bytes, eof: bool = False) -> ProcessInfo:
        """Write `data` to its stdin (waits for room), then close it if `eof`.

        Raises:
            ProcessNotFoundError: As `get`.
            InvalidRequestError: It has ended, or its stdin is closed.
        """
        process = self.get(process_id)
        try:
            if data:
                await process.process.write(data)
            if eof:
                process.process.close_stdin()
        except SandboxError as exc:
            raise InvalidRequestError(
                f"process {process_id!r} takes no more input: it ended or its stdin "
                f"was closed ({exc})"
            ) from exc
        return process.info()

    def signal(self, process_id: str, signum: int) -> ProcessInfo:
        """Send `signum` to its process group (a no-op once it ended).

        Raises:
            ProcessNotFoundError: As `get`.
            InvalidRequestError: Not a signal number.
        """
        process = self.get(process_id)
        check_signal(signum)
        process.process.signal(signum)
        return process.info()

    async def stop(
        self, process_id: str, signum: int = signals.SIGTERM, grace_s: float = 5.0
    ) -> ProcessInfo:
        """Send `signum`; if it still runs `grace_s` later, SIGKILL. Its state then.

        Raises:
            ProcessNotFoundError: As `get`.
            InvalidRequestError: Not a signal, or a grace outside [0, 300] s.
        """
        process = self.get(process_id)
        check_signal(signum)
        if not 0 <= grace_s <= 300 or grace_s != grace_s:
            raise InvalidRequestError(f"grace_s {grace_s} must be within [0, 300] seconds")
        if process.running:
            process.process.signal(signum)
            if not await _ended_within(process, grace_s):
                process.process.signal(signals.SIGKILL)
                await _ended_within(process, END_WAIT_S)
        return process.info()

    async def wait(self, process_id: str, timeout_s: float) -> ProcessInfo:
        """Wait at most `timeout_s` (0: not at all) for its end; its state then.

        Raises:
            ProcessNotFoundError: As `get`.
            InvalidRequestError: A negative or NaN timeout.
        """
        process = self.get(process_id)
        if not timeout_s >= 0:
            raise InvalidRequestError(f"timeout_s {timeout_s} must be 0 or more")
        await _ended_within(process, min(timeout_s, 24 * 3600.0))
        return process.info()

    async def end_all(self, reason: str) -> _Infos:
        """End every running process (the session closes or its interpreter was
        reset, `reason`): killed, marked KILLED, their spills kept. What ended.

        After a close (`closed`) the table starts nothing more.
        """
        if reason != "reset":
            self.closed = True
        running = [p for p in self._processes.values() if p.running]
        for p in running:
            p.ending = True
            p.process.signal(signals.SIGKILL)
        if running:
            await asyncio.wait(
                [asyncio.ensure_future(_ended_within(p, END_WAIT_S)) for p in running]
            )
        for p in running:
            p.end(ProcessState.KILLED)
        # What ended with this reset or close: those it killed, and those the
        # sandbox reported killed (its sweep) that no result has named yet.
        ended = [
            p
            for p in self._processes.values()
            if p.state is ProcessState.KILLED and not p.end_reported
        ]
        for p in ended:
            p.end_reported = True
        if self.closed:
            for p in self._processes.values():
                p.stop_reading()
                self._drained(p)
                if p.output is not None:  # nobody can read a closed session's processes
                    p.output.release()
        if ended:
            log.info(
                "processes ended",
                extra={"session": self.session_id, "reason": reason, "processes": len(ended)},
            )
        return [p.info() for p in ended]


async def _ended_within(process: ManagedProcess, timeout_s: float) -> bool:
    """Wait at most `timeout_s` for its end (and its output's); True if it ended."""
    if process.running or not process.drained.done():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.shield(asyncio.gather(process.process.exited, process.drained)),
                timeout_s,
            )
    return not process.running
