"""Sessions on the runner channel: one sandbox kept for a sequence of calls.

A session is a started, unused `RunnerSandbox` (any backend: everything rides on
its four pipes, see runner_channel) whose worker becomes a *supervisor* that
keeps a live *interpreter* (runner/_session.py). The request pipe stays open for
more lines; each frame the supervisor writes names the call it belongs to.

The daemon's lines (request pipe), one JSON object each:

    {"kind": "session", "keep_processes": bool, "quota_bytes": int,
     "idle_output_bytes_per_s": int, "limits", "cwd", "env", "tooldef", "seal": false,
     "egress": true (only when the session may reach out)}
        first, once, after the ready frame (`runner_line`): the worker becomes
        the supervisor, forks the interpreter (which applies the limits, moves
        to the workspace, takes the env and holds one ``__main__`` namespace)
        and answers {"t": "session"}. With "egress", the interpreter runs the
        egress relay (runner/_egress.py) for the session's life.
    {"op": "call", "seq": n, "tag": hex, "request": {"kind", ...payload, "limits"}}
        one call; ``seq`` counts from 1; ``tag`` is random per call, and every
        frame of the call carries it. Kinds code, file and user run in the
        interpreter; kind "workspace" ({"op", "args", "quota_bytes"}) runs in
        the supervisor itself (`_workspace.run`), where tool code cannot reach.
        Kind "packages" ({"requirements", "known"}: install_packages, see
        runner/_packages.py) runs in the interpreter too: pip is tool code.
    {"op": "interrupt", "seq": n}
        SIGINT to the interpreter if call n is still running there: its code
        sees KeyboardInterrupt (only while tool code runs, never the runner's
        own loop); the call then ends as any call does.
    {"op": "reset", "seq": n}
        kill the interpreter and every process of the session, fork a fresh
        one (workspace kept, cwd back to it); the running call, if any, ends
        with a result that says so; then {"t": "reset"}. A reset kills the
        session's background processes too (their "exited" frames say killed).
    {"op": "spawn"|"connect"|"stats"|"write"|"eof"|"credit"|"signal"|"resize"|"close", "id", ...}
        the session's background processes, terminals and connections to its
        own loopback, which the supervisor runs (runner/_streams.py): the ops
        and their frames ("spawned", "out", "exited", ...) are described in
        session_streams. Their frames belong to no call: they are routed
        before any call's, and stay out of a call's frame budget (their
        credit bounds them).

The supervisor's frames (frame pipe), each on a line of its own:

    {"t": "ready", ...}                       as for every sandbox, first.
    {"t": "session", "interpreter": pid}      the session runs.
    {"t": "yield", "seq": n, "tag", "v": <json>}     a user tool's value.
    {"t": "artifact", "seq": n, "tag", <the runner's artifact fields>}
        one part of an artifact call n made (runner_channel), before its result.
    {"t": "result", "seq": n, "tag", <the runner's result fields>, "reset": bool,
     "resets": int, "usage": {"cpu_s", "memory_peak_bytes"}, "left": {...}}
        call n is over: its output is all written, and (unless the session
        keeps processes) every process it started is dead. ``reset``: the
        interpreter was restarted during the call or while idle before it;
        ``resets``: restarts so far; ``usage``: what call n used (below);
        ``left``: what it left running and met of earlier calls (`LeftRunning`).
    {"t": "result", "seq": n, "tag", "lost": {"code", "signal"}, "asked": bool,
     "reset": true, "resets": int, "usage": {...}}
        call n's interpreter died: killed by a reset the daemon asked for
        (``asked``), or by itself (os._exit, a signal, SIGXCPU, the OOM
        killer): read as a fresh sandbox's exit would be (`outcome_of`).
    {"t": "reset", "seq": n, "resets": int}    a reset asked for is done.
    {"t": "exit", ...}                         a keeper's, when the sandbox ends.

Output is cut exactly per call, in the sandbox. The interpreter's stdout and
stderr are pipes the supervisor reads (runner/_relay.py), fresh for each call
(so a process a call started writes into that call's pipes for good), and
only the running call's reach the daemon's pipes: what kept processes and
threads of ended calls write is dropped in the sandbox, counted (the next
result's ``left``), and read at a bounded rate (`idle_output_bytes_per_s`).
The interpreter flushes before it hands its result to the supervisor, the
supervisor drains the call's pipes into the daemon's and then writes the
result frame, and the daemon, on that frame, reads stdout and stderr until
they are empty (`RunnerPipes.read_output_now`) before it detaches the call's
sink.

A hostile sandbox, again. In a session the interpreter closes the frame pipe
(and the request pipe) right after its fork, before any tool code runs, and
the supervisor is not dumpable: tool code cannot write a frame at all (which
closes, for sessions, the residual risk runner_channel describes, decision 37).
What it can still write is the private pipe to the supervisor, which takes
from it only a yield, an artifact part or the running call's result, bounded
per line, and only with the nonce the supervisor chose for the running call
(sent with its request: code of an earlier call has never seen it). Inside
the interpreter, per-call guards (runner/_turn.py) keep threads of earlier
calls out of the call's sys.stdout, sys.stderr and frame writer. A thread
that outlives its call shares the interpreter's memory, so it can still
dig the live nonce out and speak for a later call: such threads are counted,
and the later call's result says they ran beside it. Frames to the daemon
carry the call's tag; one of another call (or none) is dropped
(`stale_frames`). Frames are still checked as in a single call
(`CallFrames`); one that breaks the protocol ends the session.

Usage per call, not per session. The supervisor measures each call from its
request to its result (runner/_usage.py `CallUsage`: the interpreter's CPU
and resident peak, reset per call, read from outside it), also for a call a
reset or the interpreter's death ended. Where the sandbox has a cgroup, the
backend counts from `begin` too (`RunnerSandbox.usage_from_now`): its CPU
figure counts every process of the session; its memory peak is used where it
can be reset per call (cgroup v1), the supervisor's where it cannot (v2).

Limits: the interpreter's rlimits are set once, at its start; the CPU limit
per call is its soft RLIMIT_CPU moved to (CPU used so far + cpu_s) at each call
start, under a hard limit that stays as the session started (it could never
be raised again). The sandbox's cgroup (memory, pids, CPU share) holds the
whole session.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from collections.abc import Collection, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from tooljaild.sandbox.base import OutputSink, RunOutcome, RunRequest, SandboxError, Termination
from tooljaild.sandbox.channels import Frame, FrameItem, Malformed
from tooljaild.sandbox.frames import (
    MAX_FRAME_BYTES_PER_CALL,
    CallFrames,
    _exit_problem,
    _is_int,
    _short,
)
from tooljaild.sandbox.outcome import read_usage
from tooljaild.sandbox.runner_channel import RunnerPipes, RunnerSandbox, runner_line
from tooljaild.sandbox.session_streams import (
    STREAM_FRAMES,
    PortStream,
    SandboxProcess,
    SandboxWatch,
    Spawn,
    StreamMux,
)
from tooljaild.settings.sandbox import Limits

SESSION_KINDS = frozenset({"code", "file", "user", "workspace", "packages", "command"})
"""The request kinds a session runs."""
_CALL_FRAMES = frozenset({"yield", "artifact", "result"})
"""The frames that name a call (its ``seq``)."""


@dataclass(frozen=True)
class LeftRunning:
    """What a session call left behind it, and what of others' it met.

    Read from the supervisor's result frame: ``processes`` and the dropped
    output of kept processes are the supervisor's own counts; the thread counts
    and the dropped output of threads are the interpreter's (runner/_turn.py).
    """

    processes: int = 0
    """Processes the call started that were alive at its end: killed then,
    unless the session keeps processes (`kept`)."""
    kept: bool = False
    """The session keeps processes: those `processes` run on."""
    threads: int = 0
    """Threads alive in the interpreter at the call's end (the main one aside),
    this call's and earlier calls'; they run on into later calls."""
    earlier_threads: int = 0
    """Threads of earlier calls alive when this call started: code this call
    did not send ran beside it, and could have spoken for it."""
    dropped_bytes: int = 0
    """Output dropped since the call before began to end: written between calls,
    or by threads of earlier calls during this one."""
    dropped_frames: int = 0
    """Frames (yields, artifacts, results) threads of earlier calls tried to send."""
    os_threads_at_start: int = 0
    """Other threads of the interpreter at the call's start as the kernel counts
    them (the supervisor reads it: unlike `earlier_threads`, no code in the
    interpreter can hide one), a library's own worker threads included."""

    @classmethod
    def of(cls, frame: Frame) -> LeftRunning:
        """From a result frame's "left" (anything malformed reads as 0)."""
        left = frame.get("left")
        if not isinstance(left, dict):
            return cls()

        def count(key: str) -> int:
            value = left.get(key)
            return (
                value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
            )

        return cls(
            processes=count("processes"),
            kept=left.get("kept") is True,
            threads=count("threads"),
            earlier_threads=count("earlier_threads"),
            dropped_bytes=count("dropped_bytes"),
            dropped_frames=count("dropped_frames"),
            os_threads_at_start=count("os_threads_at_start"),
        )

    def __bool__(self) -> bool:
        return any(
            (
                self.processes,
                self.threads,
                self.earlier_threads,
                self.dropped_bytes,
                self.dropped_frames,
            )
        )


@dataclass(frozen=True)
class SessionCallEnd:
    """How one call in a session ended."""

    outcome: RunOutcome
    """As a fresh sandbox's run reports it."""
    reset: bool
    """The interpreter was restarted during this call (it crashed, exited with
    os._exit, was killed for a limit, or `reset()` was called), or while idle
    since the previous call: the session's variables are gone."""
    interrupted: bool
    """`interrupt()` was called during this call and the call then ended on its
    own (its code saw KeyboardInterrupt): the variables are kept."""
    left: LeftRunning = LeftRunning()
    """What the call left running, and what of earlier calls' it met."""


@dataclass
class _Call:
    seq: int
    tag: str
    """The call's tag, chosen here: every frame of the call must carry it."""
    frames: CallFrames
    end: asyncio.Future[Frame | None]
    """The call's result frame, or None when the sandbox ended first."""
    interrupted: bool = False


@dataclass
class _Waiters:
    """Futures resolved in order, one per event (reset confirmations)."""

    queue: deque[asyncio.Future[bool]] = field(default_factory=deque)

    def resolve_next(self, value: bool) -> None:
        while self.queue:
            future = self.queue.popleft()
            if not future.done():
                future.set_result(value)
                return

    def resolve_all(self, value: bool) -> None:
        while self.queue:
            self.resolve_next(value)


class SessionSandbox:
    """A sandbox whose runner keeps an interpreter for a sequence of calls.

    One call at a time: the caller serializes (`begin` refuses a second). Made
    by `open`; `close` destroys it.
    """

    def __init__(self, sandbox: RunnerSandbox, pipes: RunnerPipes) -> None:
        loop = asyncio.get_running_loop()
        self.id = sandbox.id
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done when the sandbox is gone (runner died, killed, closed)."""
        self.resets = 0
        """Interpreter restarts so far."""
        self._sandbox = sandbox
        self._pipes = pipes
        self._seq = 0
        self.stale_frames = 0
        """Frames naming a call that is not the running one (dropped)."""
        self._call: _Call | None = None
        self._started: asyncio.Future[bool] = loop.create_future()
        self._resets = _Waiters()
        self._exit_frame: Frame | None = None
        self.streams = StreamMux(pipes.send)
        """Background processes, terminals and port connections (session_streams)."""
        # Their frames are bounded by their credit, not by a call's frame budget.
        pipes.frames.unbudgeted = STREAM_FRAMES

    @classmethod
    async def open(
        cls,
        sandbox: RunnerSandbox,
        *,
        keep_processes: bool,
        quota_bytes: int,
        limits: Limits,
        timeout_s: float,
        idle_output_bytes_per_s: int = 65536,
        env: dict[str, str] | None = None,
        egress: bool | None = None,
    ) -> SessionSandbox:
        """Turn a started, unused sandbox (from a pool or a factory) into a session.

        Args:
            keep_processes: Processes a call starts outlive the call (they
                still die with the session).
            quota_bytes: The workspace quota, for workspace operations (0: none known).
            limits: The session's limits (rlimits of its interpreter; cpu_s per call).
            timeout_s: How long the runner may take to confirm.
            idle_output_bytes_per_s: Output written between calls (by kept
                processes, by threads of ended calls) is dropped in the sandbox;
                past this rate it is not even read (its writers wait).
            env: Variables the interpreter gets on top of the scrubbed
                environment, for the session's life (the egress variables:
                egress/env.py).
            egress: The interpreter runs the egress relay for the session's
                life (runner/_egress.py); None: when the sandbox has an egress
                directory (`Sandbox.egress_dir`: the daemon has `[egress]`).

        Raises:
            SandboxError: When the sandbox is not started, or is used (then it is
                left as it is), or its runner does not confirm (then it is closed).
        """
        pipes, spec = sandbox.hand_over()
        session = cls(sandbox, pipes)
        pipes.frames.on_frame = session._on_frame
        options = {
            "keep_processes": keep_processes,
            "quota_bytes": quota_bytes,
            "idle_output_bytes_per_s": idle_output_bytes_per_s,
        }
        if egress is None:
            egress = sandbox.egress_dir is not None
        line = runner_line(
            "session", options, limits, env or {}, replace(spec, seal=False), egress=egress
        )
        pipes.send(line)
        timer = asyncio.get_running_loop().call_later(timeout_s, _settle, session._started, False)
        try:
            started = await session._started
        except BaseException:  # cancelled: no one else will close it
            await session.close()
            raise
        finally:
            timer.cancel()
        if not started:
            said = pipes.stderr.said()
            await session.close()
            raise SandboxError(
                f"sandbox {sandbox.id} did not start a session: {said or 'no answer'}"
            )
        # No call runs: nothing printed now belongs to any call.
        pipes.stdout.drop()
        pipes.stderr.drop()
        return session

    def _start_failed(self) -> None:
        _settle(self._started, False)

    # ------------------------------------------------------------ calls

    def begin(self, request: RunRequest, sink: OutputSink) -> Coroutine[Any, Any, SessionCallEnd]:
        """Send one call now (kinds code|file|user|workspace); return what waits for its end.

        Output of this call (stdout, stderr and yields) goes to `sink` until its
        end, and nothing of it after: the pipes are read empty when the result
        frame comes, before the call ends. If the sandbox ends during the
        call, the outcome is RUNNER_LOST (or the kill's), not an exception.

        Raises:
            SandboxError: The session has ended, a call is running, or the
                kind cannot run in a session.
        """
        if self.ended.done() or self._call is not None:
            raise SandboxError(f"session sandbox {self.id} is ended or busy")
        if request.kind not in SESSION_KINDS:
            raise SandboxError(f"a {request.kind!r} request cannot run in a session")
        self._seq += 1
        pipes = self._pipes
        frames = CallFrames(
            request.kind,
            sink,
            pipes.frames,
            seal=False,
            keeper=False,
            artifacts=request.artifacts,
        )
        tag = secrets.token_hex(16)
        call = _Call(self._seq, tag, frames, asyncio.get_running_loop().create_future())
        self._call = call
        pipes.frames.limit(MAX_FRAME_BYTES_PER_CALL)
        pipes.stdout.attach(sink)
        pipes.stderr.attach(sink)
        self._sandbox.usage_from_now()  # the call's usage is its own, not the session's
        body = {"kind": request.kind, **request.payload, "limits": request.limits.rlimits()}
        pipes.send(_line({"op": "call", "seq": call.seq, "tag": tag, "request": body}))
        return self._until_end(call)

    async def _until_end(self, call: _Call) -> SessionCallEnd:
        result = await call.end
        frames = call.frames
        sandbox = self._sandbox
        if frames.broken is not None:
            # Only the runner writes frames here: it is broken, the session is over.
            await self.close()
            return SessionCallEnd(await sandbox.outcome_of(frames), False, False)
        if result is None:  # the sandbox ended during the call
            frames.exit_frame = self._exit_frame
            return SessionCallEnd(await sandbox.outcome_of(frames), False, False)
        reset = result.get("reset") is True
        interrupted = call.interrupted and not reset
        left = LeftRunning.of(result)
        lost = result.get("lost")
        if not isinstance(lost, dict):
            return SessionCallEnd(await sandbox.outcome_of(frames), reset, interrupted, left)
        if result.get("asked") is True:
            # Ended by a reset the daemon asked for: as a kill of a fresh sandbox.
            outcome = RunOutcome(
                Termination.KILLED, signal=lost.get("signal"), yields=frames.yields
            )
        else:
            frames.exit_frame = {"t": "exit", **lost}
            outcome = await sandbox.outcome_of(frames)
        # What it used up to its end: the supervisor's figures (it made no result
        # frame of its own), then the backend's own where it has them.
        read_usage(outcome, result)
        sandbox.measure(outcome)
        return SessionCallEnd(outcome, reset, interrupted, left)

    def interrupt(self) -> None:
        """KeyboardInterrupt in the running call's code; a no-op when idle."""
        call = self._call
        if call is None or self.ended.done():
            return
        call.interrupted = True
        self._pipes.send(_line({"op": "interrupt", "seq": call.seq}))

    async def reset(self, timeout_s: float) -> bool:
        """Kill the interpreter and every process of the running call, start a
        fresh interpreter (workspace kept). The running call (if any) ends with
        reset=True.

        Returns:
            False when the runner did not confirm within `timeout_s` (the
            caller closes the session then), or the session has ended.
        """
        if self.ended.done():
            return False
        loop = asyncio.get_running_loop()
        confirmed: asyncio.Future[bool] = loop.create_future()
        self._resets.queue.append(confirmed)
        self._pipes.send(_line({"op": "reset", "seq": self._seq}))
        timer = loop.call_later(timeout_s, _settle, confirmed, False)
        try:
            return await confirmed
        finally:
            timer.cancel()

    async def close(self) -> None:
        """Destroy the sandbox: everything in it dies. Idempotent."""
        await self._sandbox.close()
        self._gone()

    # ------------------------------------------------------------ streams

    async def spawn(self, spec: Spawn) -> SandboxProcess:
        """Start a background process (or a terminal) in the session, in a new
        session of its own: the end of a call does not end it; a reset, the
        session's close or the sandbox's end does (`exited` says killed).

        Raises:
            SpawnError: The supervisor could not start it (the message says
                why; ``limit`` when a limit refused it).
            SandboxError: The session has ended.
        """
        if self.ended.done():
            raise SandboxError(f"session sandbox {self.id} has ended")
        return await self.streams.spawn(spec)

    async def stats(self, pids: Collection[int]) -> dict[int, tuple[float, int]]:
        """pid -> (cpu_s, rss_bytes) of that process and its descendants, for
        processes `spawn` started; a pid that is gone is missing. One round trip.

        Raises:
            SandboxError: The session has ended.
        """
        if self.ended.done():
            raise SandboxError(f"session sandbox {self.id} has ended")
        return await self.streams.stats(pids)

    async def connect_port(
        self, port: int, timeout_s: float = 5.0, *, first: bytes = b""
    ) -> PortStream:
        """Open a TCP connection to 127.0.0.1:`port` inside the session.

        `first` (at most `CHUNK` bytes) goes with the connect op and is written
        the moment the socket is connected: no round trip to the daemon between
        the connect and the client's first bytes (an HTTP request, say).

        Raises:
            PortError: Nothing listens there, the connection was refused or
                did not answer within `timeout_s`; `BadPortError` (also a
                ValueError) for a port outside 1-65535, before anything is sent.
            ValueError: `first` is longer than `CHUNK`.
            SandboxError: The session has ended.
        """
        if self.ended.done():
            raise SandboxError(f"session sandbox {self.id} has ended")
        return await self.streams.connect_port(port, timeout_s, first=first)

    async def watch(
        self, path: str, *, recursive: bool, max_dirs: int = 4096, max_watches: int = 8
    ) -> SandboxWatch:
        """Watch a workspace directory from the supervisor (runner/_watch.py):
        its created, modified, deleted and moved entries, in order, under the
        same credit as a process's output; a "dropped" event where the kernel
        lost some. It ends with the session (its `events()` end).

        Args:
            path: Relative to the workspace; "" is the workspace. Resolved and
                checked as a workspace tool's path is.
            recursive: Watch every directory below as well.
            max_dirs: The session's bound of watched directories (all its watches).
            max_watches: The session's bound of open watches.

        Raises:
            WatchError: The path leaves the workspace or is no directory
                (``bad_path``), or a bound refused it (``limit``).
            SandboxError: The session has ended.
        """
        if self.ended.done():
            raise SandboxError(f"session sandbox {self.id} has ended")
        return await self.streams.watch(
            path, recursive=recursive, max_dirs=max_dirs, max_watches=max_watches
        )

    # ------------------------------------------------------------ frames

    def _on_frame(self, item: FrameItem) -> None:
        if item is None:
            self._gone()
            return
        call = self._call
        if isinstance(item, Malformed):
            if call is not None:
                call.frames.on_frame(item)  # skipped, or the end of the call if fatal
                self._check(call)
            return
        kind = item.get("t")
        if kind in STREAM_FRAMES:  # the session's streams: no call's
            self.streams.on_frame(item)
        elif kind in _CALL_FRAMES:
            if call is not None and item.get("seq") == call.seq and item.get("tag") == call.tag:
                self._on_call_frame(call, item)
            else:  # not the running call's (it ended, or it never was): nobody's
                self.stale_frames += 1
        elif kind == "session" and _is_int(item.get("interpreter")):
            _settle(self._started, True)
        elif kind == "reset":
            self._count_resets(item)
            self._resets.resolve_next(True)
        elif kind == "exit" and _exit_problem(item) is None:
            self._exit_frame = item  # a keeper's: the sandbox is ending
        elif call is not None:
            call.frames.broken = f"a frame of type {_short(kind)} in a session"
            self._end_call(call, None)

    def _on_call_frame(self, call: _Call, frame: Frame) -> None:
        if frame["t"] != "result":  # a yield or an artifact part: checked as any call's
            call.frames.on_frame(frame)
            self._check(call)
            return
        lost = frame.get("lost")
        if lost is not None:
            problem = _exit_problem(lost) if isinstance(lost, dict) else "not an object"
            if problem is not None:
                call.frames.broken = f"a lost-interpreter result frame: {problem}"
        else:
            call.frames.on_frame(frame)  # checked as any call's result
        self._count_resets(frame)
        self._end_call(call, frame)

    def _check(self, call: _Call) -> None:
        if call.frames.broken is not None:
            self._end_call(call, None)

    def _count_resets(self, frame: Frame) -> None:
        resets = frame.get("resets")
        if isinstance(resets, int) and not isinstance(resets, bool):
            self.resets = max(self.resets, resets)

    def _end_call(self, call: _Call, result: Frame | None) -> None:
        """The call is over: its output is cut here, its end is resolved."""
        self._call = None
        pipes = self._pipes
        pipes.read_output_now()  # everything written before the result is the call's
        pipes.stdout.drop()
        pipes.stderr.drop()
        if not call.end.done():
            call.end.set_result(result)

    def _gone(self) -> None:
        """The sandbox has ended: nothing in it can answer any more."""
        if self._call is not None:
            self._end_call(self._call, None)
        self._start_failed()
        self._resets.resolve_all(False)
        self.streams.end()
        if not self.ended.done():
            self.ended.set_result(None)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"
