"""What the daemon remembers of its calls: in memory (bounded) and in the journal.

`CallBook` holds the calls by id, finds a call the journal alone still knows
(after a restart, or once memory let it go), answers a request under an id
already used (`known`), and writes each step of a call's life to the journal:
admitted (before it can start), running (`START_WRITE_DELAY_S` after it
starts, or with its end if that comes first), over (a turn of the event loop
after its caller is answered). With `[journal] durability = "power"` a call also
waits in its task, before it may start, until its admission is on stable
storage (`settled`). The call manager decides; this book remembers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tooljail.errors import ToolNotFoundError
from tooljail.types import CallState, CallStatus, ToolError, ToolResult
from tooljaild.calls import results
from tooljaild.calls.admission import check_call_id, known_call, unknown_call
from tooljaild.calls.call import Call
from tooljaild.journal.store import Journal, JournalError
from tooljaild.settings.config import Settings
from tooljaild.tools.registry import Registry, Tool

log = logging.getLogger(__name__)

PRUNE_EVERY = 1000
"""Finished calls between two prunings of the journal (by age and row count)."""
START_WRITE_DELAY_S = 0.05
"""How long a call's `running` record waits to join its end's (one write, not
two). It tells only a crash's report apart ("lost while running" rather than
"queued": both lost, effect unknown, the same retry rules): its admission, the
"never twice" record, is committed before the call starts, as ever."""
KEPT_EVENT_LOGS = 64
"""Finished calls whose output chunks stay readable; older ones keep only their result."""


class CallBook:
    """The calls remembered, by id, and their journal.

    `settings` and `registry` are the manager's, replaced on a reload: the
    bound on calls remembered, and the tools a journaled call is read with.
    """

    def __init__(self, settings: Settings, registry: Registry, journal: Journal | None) -> None:
        self.settings = settings
        self.registry = registry
        self.journal = journal
        self.calls: OrderedDict[str, Call] = OrderedDict()
        """Calls in memory, oldest admitted first."""
        self._with_events: OrderedDict[str, Call] = OrderedDict()
        self._finished_since_prune = 0
        self._unrecorded: list[tuple[Call, ToolResult]] = []
        """Calls answered but not yet journaled as over (see `end`)."""
        self._unrecorded_starts: dict[str, Call] = {}
        """Calls started but not yet journaled as running (see `running`)."""
        self.on_end: Callable[[Call, ToolResult], None] | None = None
        """Told of each call's end once it is recorded (tooljaild.app.metrics)."""

    def states(self) -> collections.Counter[CallState]:
        """How many of the calls remembered are in each state."""
        return collections.Counter(call.state for call in self.calls.values())

    # ------------------------------------------------------------------ lookups

    def find(self, call_id: str, tool: Tool | None = None) -> Call | None:
        """The call with that id, from memory or else from the journal (as a
        finished Call, read with `tool` when it is the journaled call's); None."""
        return self.calls.get(call_id) or self._from_journal(call_id, tool)

    def get(self, call_id: str) -> Call:
        """The call with that id, from memory or else from the journal.

        Raises:
            CallNotFoundError: The daemon does not know or no longer remembers it.
        """
        call = self.find(call_id)
        if call is None:
            raise unknown_call(call_id)
        return call

    def _from_journal(self, call_id: str, tool: Tool | None) -> Call | None:
        """A call the journal knows (over, or lost to a crash), as a finished Call."""
        if self.journal is None:
            return None
        entry = self.journal.get(call_id)
        if entry is None:
            return None
        if tool is None or tool.name != entry.tool:
            try:
                tool = self.registry.get(entry.tool)
            except ToolNotFoundError:  # served no more: the record still answers
                tool = Tool(name=entry.tool, input_schema={"type": "object"}, source="user")
        return Call.recorded(entry, tool, self.settings)

    def known(self, call_id: str, tool: Tool, fingerprint: str) -> tuple[Call | None, bool]:
        """The call already under `call_id` that answers this request (or None),
        and whether the id is taken over by a rerun of a lost idempotent call.

        Raises:
            InvalidRequestError: The call id is malformed.
            CallIdConflictError: The id belongs to a call with other arguments.
        """
        if not call_id:
            return None, False
        check_call_id(call_id)
        existing = self.find(call_id, tool)
        if existing is None:
            return None, False
        if known_call(existing, tool, fingerprint) is not None:
            return existing, False
        self.calls.pop(call_id, None)  # lost, idempotent: it runs again under its id
        return None, True

    # ------------------------------------------------------------------ its life

    def admitted(self, call: Call, arguments_json: str, rerun: bool) -> None:
        """Journal `call` as admitted (`rerun`: over the lost call of its id)."""
        if self.journal is None:
            return
        # Committed before the call can start: a call the journal does not know
        # never ran, so a retry after a crash cannot run it twice.
        self.journal.admitted(
            call.call_id,
            tool=call.tool.name,
            fingerprint=call.fingerprint,
            arguments_json=arguments_json,
            timeout_s=call.timeout_s,
            idempotent=call.tool.options.idempotent,
            client=call.client,
            session_id=call.session_id,
            arguments_sha256=call.arguments_sha256,
            created=call.received_at,
            replace=rerun,
        )

    @property
    def syncing(self) -> bool:
        """Whether a call must wait for `settled` before it starts ("power")."""
        return self.journal is not None and self.journal.durability == "power"

    async def settled(self, call: Call) -> bool:
        """Wait until `call`'s admission is on stable storage ("power"; at once
        otherwise): the "never runs twice" promise across a power cut. Every
        way a call starts passes here first, in the call's task.

        Returns:
            False when the call is stopped first (a cancel, a drain: a stalled
            disk must not hold them), or its admission cannot be made durable
            (the journal then takes no new call); it is ended, not run.
        """
        if self.journal is None or self.journal.durability != "power":
            return True
        flushed = asyncio.ensure_future(self.journal.durable())
        stopped = call.stop_requested.wait()
        either: set[asyncio.Future[Any]] = {flushed, stopped}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not flushed.done():
            flushed.cancel()  # the flush itself runs on for the others (shielded)
            self.end(call, results.not_started(call))
            return False
        try:
            flushed.result()
        except JournalError as exc:
            log.error("call %s not started: %s", call.call_id, exc)
            failed = results.not_run(call, "its admission could not be made durable")
            error = ToolError(type="JournalUnavailable", message=str(exc))
            self.end(call, failed.model_copy(update={"status": CallStatus.ERROR, "error": error}))
            return False
        return True

    def running(self, call: Call, sandbox_id: str) -> None:
        """Mark the call running in `sandbox_id` (its request is on the way there)."""
        call.state = CallState.RUNNING
        call.started_at = time.monotonic()
        call.started_wall = time.time()
        call.sandbox_id = sandbox_id
        call.running.set(sandbox_id)
        if self.journal is None:
            return
        # Written START_WRITE_DELAY_S later, or with the call's end if it comes
        # first (most session calls): one journal write saved per short call.
        # Readers see the live call in memory meanwhile (`listing.overlay`).
        if not self._unrecorded_starts:
            asyncio.get_running_loop().call_later(START_WRITE_DELAY_S, self.record_starts)
        self._unrecorded_starts[call.call_id] = call

    def record_starts(self) -> None:
        """Journal as running every started call not yet recorded (nor ended)."""
        starts, self._unrecorded_starts = self._unrecorded_starts, {}
        if self.journal is None:
            return
        for call in starts.values():
            try:
                self.journal.running(call.call_id, call.sandbox_id, call.started_wall)
            except JournalError as exc:  # the call runs on; its end says it, or it is lost
                log.error("cannot journal call %s as running: %s", call.call_id, exc)

    def end(self, call: Call, result: ToolResult) -> None:
        """End `call` with `result`: its caller is answered now, the journal a turn later."""
        call.end(results.state_of(result), result)
        # Recorded a turn of the event loop later, once the caller's RPC has
        # answered: the journal's write is then not on the call's path. A crash
        # in between (microseconds) leaves the call `lost` in the journal.
        if not self._unrecorded:
            asyncio.get_running_loop().call_soon(self.record_ends)
        self._unrecorded.append((call, result))

    def record_ends(self) -> None:
        """Journal, count and log every end not recorded yet."""
        ends, self._unrecorded = self._unrecorded, []
        for call, result in ends:
            self._journal_finished(call, result)
            if self.on_end is not None:
                self.on_end(call, result)
            log.info(
                "call finished",
                extra={
                    "call_id": call.call_id,
                    "tool": call.tool.name,
                    "status": result.status.value,
                    "duration_s": round(result.duration_s, 4),
                    "sandbox": call.sandbox_id,
                },
            )

    def _journal_finished(self, call: Call, result: ToolResult) -> None:
        if self.journal is None:
            return
        # Only a final end takes the start along (a journal refuses any other).
        unrecorded = (
            self._unrecorded_starts.pop(call.call_id, None) if call.state.finished else None
        )
        started = None
        if unrecorded is not None and call.started_wall is not None:
            started = (call.sandbox_id, call.started_wall)
        try:
            self.journal.finished(
                call.call_id,
                call.state,
                result.model_dump_json(),
                call.ended_wall,
                status=result.status.value,
                started=started,
            )
        except JournalError as exc:
            # After a restart the call shows as lost: honest, if less precise.
            log.error("cannot journal the end of call %s: %s", call.call_id, exc)
            return
        self._finished_since_prune += 1
        if self._finished_since_prune >= PRUNE_EVERY:
            self._finished_since_prune = 0
            try:
                self.journal.prune()
            except JournalError as exc:
                log.error("cannot prune the journal: %s", exc)

    def forget_old(self, ended: Call) -> None:
        """Bound memory: drop the oldest finished calls and old output logs.

        `ended`'s output joins the logs kept; past `KEPT_EVENT_LOGS` the oldest
        ended one's is released. By end, not by admission: calls end out of
        order, and a log never listed was never released (up to
        `remembered_calls` x `event_buffer_bytes`). Unfinished calls are never
        dropped, but they do not shield the finished ones behind them either:
        one long call must not keep every later one in memory.
        """
        excess = len(self.calls) - self.settings.remembered_calls
        if excess > 0:
            drop: list[str] = []
            for call_id, call in self.calls.items():  # oldest first: usually one step
                if call.state.finished:
                    drop.append(call_id)
                    if len(drop) == excess:
                        break
            for call_id in drop:
                del self.calls[call_id]
        if ended.state.finished:
            self._with_events[ended.call_id] = ended
        while len(self._with_events) > KEPT_EVENT_LOGS:
            _, old = self._with_events.popitem(last=False)
            old.events.release()
