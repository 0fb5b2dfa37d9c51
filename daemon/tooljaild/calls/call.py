"""One call of a tool: its state, what it waits for, and why it was stopped.

A call has one state (`Call.state`, a `CallState`) and three moments others
wait for, each a `Once`:

- `running`: it got a sandbox and its request is on the way (the sandbox id);
  never given to a call that ends before it runs.
- `answered`: its caller's one result. Usually the call's end; for a call
  past its timeout but allowed to run on (`kill_after_s`), "timeout, still
  running", given before the end.
- `ended`: its final result, which `GetCall` and `Attach` report.

Why a call was stopped from outside is one `StopReason`, given once by
`request_stop` (`stop_requested`, a `Once` too: a queued call waits for its
slot or for it); the result it leads to is decided in `calls.results`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from tooljail.common import utc_from_unix
from tooljail.types import ArtifactRef, CallInfo, CallState, StreamKind, ToolResult
from tooljaild.artifacts.store import ArtifactStore, Origin
from tooljaild.calls.artifacts import CallArtifacts
from tooljaild.calls.output import Event, EventLog, HeadTail
from tooljaild.egress.gate import EgressGate
from tooljaild.egress.policy import NO_EGRESS, EgressPolicy
from tooljaild.egress.usage import GateMark
from tooljaild.journal.store import JournalEntry
from tooljaild.sandbox.base import RunRequest
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.registry import Tool

T = TypeVar("T")


class StopReason(enum.StrEnum):
    """Why the daemon stopped a call (killed its sandbox, or kept it from starting)."""

    TIMEOUT = "timeout"
    """It passed its timeout (and was not allowed to run on past it)."""
    HARD_TIMEOUT = "hard_timeout"
    """It ran on past its timeout and reached `kill_after_s`."""
    CANCELLED = "cancelled"
    """A client cancelled it."""
    SHUTDOWN = "shutdown"
    """The daemon shut down before it ended."""
    OUTPUT_LIMIT = "output_limit"
    """It wrote more output than `output_limit_bytes`."""
    REVOKED = "revoked"
    """Its identity was revoked (a reload of the tokens file) before it ran."""


class Once(Generic[T]):
    """A value given once, which any number of tasks may await.

    Each awaiter gets a future of its own (`wait`), resolved directly by `set`:
    cancelling it (its RPC is gone) cancels nothing else, as `asyncio.shield`
    would ensure, and the awaiter resumes one turn of the event loop sooner
    than through a shield. On the call path that turn is part of the time to
    answer (docs/decisions.md #30).
    """

    __slots__ = ("_closed", "_given", "_value", "_waiters")

    def __init__(self) -> None:
        self._value: Any = None
        self._given = False
        self._closed = False
        self._waiters: list[asyncio.Future[T]] = []

    def done(self) -> bool:
        """True once the value is given."""
        return self._given

    def result(self) -> T:
        """The value.

        Raises:
            asyncio.InvalidStateError: It is not given yet.
        """
        if not self._given:
            raise asyncio.InvalidStateError("the value is not given yet")
        value: T = self._value
        return value

    def set(self, value: T) -> bool:
        """Give the value and wake every awaiter. Returns False (and changes
        nothing) when a value was given before or the Once is closed."""
        if self._given or self._closed:
            return False
        self._value, self._given = value, True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(value)
        return True

    def close(self) -> None:
        """No value will come: pending awaiters are cancelled, and so is every
        later `wait`. Does nothing once the value is given."""
        if self._given:
            return
        self._closed = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.cancel()

    def wait(self) -> asyncio.Future[T]:
        """A future of the value for one awaiter; cancelling it cancels nothing else.

        Already done (awaiting it does not suspend) when the value is given;
        cancelled when the Once is closed.
        """
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._given:
            waiter.set_result(self._value)
        elif self._closed:
            waiter.cancel()
        else:
            self._waiters.append(waiter)
        return waiter


class Call:
    """One execution of a tool, from admission to its final result."""

    def __init__(
        self,
        call_id: str,
        tool: Tool,
        arguments: dict[str, Any],
        fingerprint: str,
        timeout_s: float,
        settings: Settings,
        limits: Limits,
        client: str = "",
        store: ArtifactStore | None = None,
    ) -> None:
        """
        Args:
            store: Where the call's artifacts go (its output past the result's
                head and tail, a result too large, files from its sandbox);
                None: it makes none.
        """
        self.call_id = call_id
        self.tool = tool
        self.arguments = arguments
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self.limits = limits
        self.client = client
        """Who asked for the call (see `CallManager.submit`)."""
        self.session_id = ""
        """The session it runs in; "" for a call in a fresh sandbox of its own."""
        self.egress: EgressPolicy = NO_EGRESS
        """What its sandbox may reach (`calls.egress.policy_for`, at admission)."""
        self.gate: EgressGate | None = None
        """Its sandbox's egress gate while it runs (its own, or its session's)."""
        self.gate_mark: GateMark | None = None
        """The gate's usage at the call's start: its result tells what came after."""
        self.artifacts: list[ArtifactRef] = []
        """What it made so far (see `ToolResult.artifacts`), in order."""
        self.made: CallArtifacts | None = None
        """Writes its artifacts, when it has a store."""
        if store is not None:
            self.made = CallArtifacts(
                store, self._origin, self.artifacts, limits.output_limit_bytes
            )
        self.state = CallState.QUEUED
        self.counted = False
        """It counts among the daemon's running and queued calls (`Admission`):
        from admission on, or for a call held for approval, once approved."""
        self.sandbox_id = ""
        self.arguments_sha256 = ""
        """SHA-256 of its canonical arguments (`tooljail.common.arguments_sha256`),
        set at admission: every result of the call carries it."""
        self.created = time.monotonic()
        self.received_at = time.time()
        """Wall clock at admission (`CallInfo.received_at`); `created` is monotonic."""
        self.started_at: float | None = None
        self.started_wall: float | None = None
        """Wall clock when it reached a sandbox; `started_at` is monotonic."""
        self.ended_wall: float | None = None
        """Wall clock when it ended."""
        self.events = EventLog(settings.event_buffer_bytes)
        kept = max(1024, limits.output_bytes // 2)
        self.stdout = HeadTail(kept)
        self.stderr = HeadTail(kept)
        self.running: Once[str] = Once()
        """The sandbox id, once the call runs; closed if it ends without running."""
        self.answered: Once[ToolResult] = Once()
        """The one result its caller gets (the end, or "timeout, still running")."""
        self.ended: Once[ToolResult] = Once()
        """Its final result."""
        self.stop_requested: Once[StopReason] = Once()
        """Why it is being stopped, once `request_stop` was called."""
        self._kill: Callable[[], None] | None = None

    @classmethod
    def recorded(cls, entry: JournalEntry, tool: Tool, settings: Settings) -> Call:
        """A call this daemon knows only from the journal: over, with its result."""
        call = cls(
            entry.call_id,
            tool,
            {},
            entry.fingerprint,
            entry.timeout_s,
            settings,
            Limits(),
            client=entry.client,  # its owner, as when it was live
        )
        call.sandbox_id = entry.sandbox_id or ""
        call.session_id = entry.session_id
        call.arguments_sha256 = entry.arguments_sha256
        call.received_at = entry.created
        call.started_wall, call.ended_wall = entry.started, entry.ended
        call.state = entry.state
        result = entry.result()
        if result is not None:  # a journal that recovered holds a result for every call
            call.answered.set(result)
            call.ended.set(result)
        call.running.close()
        call.stop_requested.close()
        call.events.close()
        return call

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the call is being stopped; None while nobody asked."""
        return self.stop_requested.result() if self.stop_requested.done() else None

    @property
    def result(self) -> ToolResult | None:
        """The final result; None until the call ends."""
        return self.ended.result() if self.ended.done() else None

    def with_artifacts(self, request: RunRequest) -> RunRequest:
        """`request`, sending the artifacts its sandbox makes to this call's store."""
        if self.made is None:
            return request
        # The runner is told the store's per-call bounds, so it sends no artifact
        # the store would drop (a file past them is skipped there, and said).
        payload = {**request.payload, "artifact_limits": self.made.limits()}
        return dataclasses.replace(request, payload=payload, artifacts=self.made.part)

    def _origin(self) -> Origin:
        return Origin(self.client, self.call_id, self.session_id, self.tool.name)

    def sink(self, stream: StreamKind, data: bytes) -> None:
        """Take a chunk of the tool's output (the sandbox's `OutputSink`)."""
        if stream is StreamKind.STDOUT:
            self._keep(stream, self.stdout, data)
        elif stream is StreamKind.STDERR:
            self._keep(stream, self.stderr, data)
        self.events.append(stream, data)
        limit = self.limits.output_limit_bytes
        if limit and self.stdout.total + self.stderr.total > limit:
            self.request_stop(StopReason.OUTPUT_LIMIT)

    def _keep(self, stream: StreamKind, kept: HeadTail, data: bytes) -> None:
        if self.made is not None and kept.total + len(data) > kept.capacity:
            # Before the head and tail drop their first byte: see calls.artifacts.
            self.made.spill(stream, kept, data)
        kept.add(data)

    def request_stop(self, reason: StopReason) -> None:
        """Stop the call: kill its sandbox while it runs, keep it from starting
        while it waits. The first reason given is the one its result tells."""
        self.stop_requested.set(reason)
        if self._kill is not None:
            self._kill()

    def kill_with(self, kill: Callable[[], None] | None) -> None:
        """From now on, `request_stop` calls `kill` (which must not block, and may
        be called more than once); a stop asked for before calls it at once.
        None: the call runs no more, nothing to kill.

        A plain setter rather than a context manager: this is on every call's
        path, and a generator-based `with` costs microseconds there.
        """
        self._kill = kill
        if kill is not None and self.stop_requested.done():
            kill()

    def answer(self, result: ToolResult) -> None:
        """Give the caller its result, once: the call's end, or "timeout, still running"."""
        self.answered.set(result)

    def end(self, state: CallState, result: ToolResult) -> None:
        """Settle the call: its final state and result; its caller hears it if not yet."""
        self.state = state
        if self.ended_wall is None:
            self.ended_wall = time.time()
        self.answered.set(result)
        self.ended.set(result)
        self.running.close()
        self.stop_requested.close()

    def compact(self) -> None:
        """Let go of what only a running call needs (its result is built by now)."""
        if self.made is not None:
            self.made.close()
            self.made = None
        self.arguments = {}
        self.stdout, self.stderr = HeadTail(0), HeadTail(0)
        # A remembered call keeps no gate (closed, or its session's) nor its book.
        self.gate, self.gate_mark = None, None

    def info(self) -> CallInfo:
        """The call as this object knows it. Its arguments only while it holds
        them (until `compact`, and never for a call read from the journal):
        `CallBook` completes them from the journal."""
        result = self.result
        if result is None and self.answered.done():
            result = self.answered.result()
        arguments = json.dumps(self.arguments, ensure_ascii=False) if self.arguments else ""
        return CallInfo(
            call_id=self.call_id,
            tool=self.tool.name,
            state=self.state,
            result=result,
            arguments_json=arguments,
            arguments_bytes=len(arguments.encode("utf-8", "surrogatepass")),
            arguments_sha256=self.arguments_sha256,
            client_name=self.client,
            session_id=self.session_id,
            received_at=utc_from_unix(self.received_at),
            started_at=utc_from_unix(self.started_wall),
            ended_at=utc_from_unix(self.ended_wall),
            timeout_s=self.timeout_s,
            sandbox_id=self.sandbox_id,
        )

    async def stream(self, from_seq: int = 1) -> AsyncIterator[Event]:
        """The call's output chunks, live, ending where the caller's result stands."""
        async for event in self.events.follow(from_seq, until=self.answered.wait()):
            yield event
