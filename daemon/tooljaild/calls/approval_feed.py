"""Who watches the approval queue, and what each watcher has yet to be sent.

`ApprovalFeed` is the approval queue's subscriber list (`Approvals` publishes
to it; the edge's WatchApprovals reads one `Watcher` per stream). Each event,
an `ApprovalEvent` built once and shared by every watcher, says a call now
waits for a decision (REQUESTED, published by `Approvals.hold`) or waits no
more (DECIDED: approved, denied, timed out, cancelled, revoked, stopped at
shutdown; published by `Approvals.settled` once the call's state says which).

A watcher sees only the calls an approver may decide, as `Approvals.decide`
checks: calls of tools its own policy lets it call. It starts with a REQUESTED
event per call already waiting, taken in the same turn as it subscribes, so
nothing is missed or told twice between that snapshot and the live events.

Bounds, so that a watcher that never reads cannot grow the daemon:

- the watchers open at once, in all and per identity (`[auth]
  max_approval_watchers`, `max_approval_watchers_per_identity`): past either,
  `subscribe` raises `OverloadedError` (RESOURCE_EXHAUSTED with a retry hint);
- each watcher's backlog, in bytes (`[auth] approval_watch_buffer_bytes`,
  about the events' arguments): past it, the backlog is dropped at once and
  the watcher fails with `OverloadedError` telling it to watch again. Dropping
  events and going on would leave an approver UI with a wrong picture of the
  queue; ending the stream is honest, and a new watch starts with the calls
  waiting then (a resync);
- each event's arguments are cut to the journal's bound (`cut_arguments`).

A reload that takes an identity's approver right away (or the identity)
fails its watchers with `PermissionDeniedError` (`reauthorize`); one that
changes its tools changes what it sees from then on. At shutdown `close` ends
every watcher cleanly: it is sent what it has pending, then its stream ends.

Nothing here knows gRPC; all of it runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable

from tooljail.errors import (
    OverloadedError,
    PermissionDeniedError,
    ShuttingDownError,
    TooljailError,
)
from tooljail.types import ApprovalEvent, ApprovalEventKind, CallInfo
from tooljaild.auth.policy import Identity

__all__ = ["ApprovalFeed", "Watcher", "cut_arguments"]

log = logging.getLogger(__name__)

EVENT_OVERHEAD_BYTES = 512
"""What an event costs besides its arguments (ids, names, times, a short result),
counted against a watcher's backlog bound: an estimate on the safe side."""


def cut_arguments(info: CallInfo, max_bytes: int) -> CallInfo:
    """`info` with its arguments JSON cut to `max_bytes` UTF-8 bytes (as the journal
    cuts them: `arguments_truncated` set, `arguments_bytes` the whole length)."""
    encoded = info.arguments_json.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return info
    kept = encoded[:max_bytes].decode("utf-8", errors="ignore")
    return info.model_copy(
        update={
            "arguments_json": kept,
            "arguments_truncated": True,
            "arguments_bytes": max(info.arguments_bytes, len(encoded)),
        }
    )


def _size(event: ApprovalEvent) -> int:
    return EVENT_OVERHEAD_BYTES + len(event.call.arguments_json)


class Watcher:
    """One WatchApprovals stream's events, in order, bounded (see the module doc).

    Read it with `next`; the feed fills it. Its `failed` event is set when the
    feed ends it with an error (`error`): the edge stops a write in progress then.
    """

    def __init__(self, identity: Identity, max_bytes: int) -> None:
        self.identity = identity
        self._max_bytes = max_bytes
        self._events: deque[tuple[ApprovalEvent, int]] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self._closed = False
        self.failed = asyncio.Event()
        self.error: TooljailError | None = None

    def sees(self, info: CallInfo) -> bool:
        """Whether this watcher's approver may decide the call (`Approvals.decide`)."""
        return self.identity.may_use(info.tool)

    def put(self, event: ApprovalEvent, size: int) -> None:
        """Queue `event`; past the backlog bound, fail instead (one event always fits)."""
        if self.error is not None or self._closed:
            return
        if self._events and self._bytes + size > self._max_bytes:
            self.fail(
                OverloadedError(
                    "this approvals watch fell behind: more than "
                    f"{self._max_bytes:,} bytes of events waited for its reader ([auth] "
                    "approval_watch_buffer_bytes), so they were dropped and the watch "
                    "ended; watch again (it starts with the calls waiting now), and read "
                    "events as they come",
                    retry_after_s=1.0,
                )
            )
            return
        self._events.append((event, size))
        self._bytes += size
        self._ready.set()

    def fail(self, error: TooljailError) -> None:
        """End this watcher with `error`: its backlog is let go at once."""
        if self.error is not None:
            return
        self.error = error
        self._events.clear()
        self._bytes = 0
        self.failed.set()
        self._ready.set()

    def close(self) -> None:
        """End this watcher cleanly: what it has pending is still read, then the end."""
        self._closed = True
        self._ready.set()

    async def next(self) -> ApprovalEvent | None:
        """The next event; None once closed and read to the end.

        Raises:
            TooljailError: The feed ended it (`error`: fell behind, or its right
                to watch was revoked).
        """
        while True:
            if self.error is not None:
                raise self.error
            if self._events:
                event, size = self._events.popleft()
                self._bytes -= size
                return event
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()


class ApprovalFeed:
    """The approval queue's watchers (see the module doc).

    Args:
        max_watchers: Watchers at once, in all (0: none allowed).
        per_identity: Watchers one identity may hold at once.
        buffer_bytes: One watcher's backlog bound.
        max_argument_bytes: What is kept of each event's arguments.
    """

    def __init__(
        self,
        *,
        max_watchers: int = 64,
        per_identity: int = 4,
        buffer_bytes: int = 1024 * 1024,
        max_argument_bytes: int = 64 * 1024,
    ) -> None:
        self.max_watchers = max_watchers
        self.per_identity = per_identity
        self.buffer_bytes = buffer_bytes
        self.max_argument_bytes = max_argument_bytes
        self._watchers: list[Watcher] = []
        self._by_identity: Counter[str] = Counter()
        self._closed = False

    @property
    def watching(self) -> int:
        """Watchers open now."""
        return len(self._watchers)

    def subscribe(self, identity: Identity, waiting: Iterable[ApprovalEvent]) -> Watcher:
        """A new watcher for `identity`, holding first the events of `waiting` (the
        REQUESTED events of the calls waiting now, oldest first) that it may decide.

        The snapshot does not count against the watcher's backlog bound: its events
        are the ones the approval queue holds anyway (shared, not copied), and
        their number is bounded by the calls that may wait (`[auth]
        max_calls_awaiting_approval` per identity); a snapshot larger than the bound
        must not end a watch before its reader had a chance to read.

        Raises:
            OverloadedError: The daemon's or this identity's bound of watchers is reached.
            ShuttingDownError: The daemon stops (its watches were closed).
        """
        if self._closed:
            raise ShuttingDownError(
                "the daemon is stopping: watch another daemon, or this one once it is back"
            )
        if len(self._watchers) >= self.max_watchers:
            raise OverloadedError(
                f"this daemon serves {self.max_watchers} approval watches at most ([auth] "
                "max_approval_watchers), and all are open; use ListApprovals, or try "
                "again later",
                retry_after_s=5.0,
            )
        if self._by_identity[identity.name] >= self.per_identity:
            raise OverloadedError(
                f"this approver already holds {self.per_identity} approval watches, its "
                "most ([auth] max_approval_watchers_per_identity); close one first",
                retry_after_s=5.0,
            )
        watcher = Watcher(identity, self.buffer_bytes)
        # No await from the snapshot to the subscription: no event slips between.
        for event in waiting:
            if watcher.sees(event.call):
                watcher.put(event, 0)
        self._watchers.append(watcher)
        self._by_identity[identity.name] += 1
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        """`watcher`'s stream is over; idempotent."""
        if watcher not in self._watchers:
            return
        self._watchers.remove(watcher)
        self._by_identity[watcher.identity.name] -= 1
        if not self._by_identity[watcher.identity.name]:
            del self._by_identity[watcher.identity.name]

    def publish(self, kind: ApprovalEventKind, info: CallInfo) -> ApprovalEvent:
        """Tell every watcher that may decide the call: one event, shared.

        Returns:
            The event (its arguments cut), for the approval queue to keep.
        """
        event = self._event(kind, info)
        size = _size(event)
        for watcher in self._watchers:
            if watcher.sees(info):
                watcher.put(event, size)
        return event

    def reauthorize(self, identity_named: Callable[[str], Identity | None]) -> int:
        """A reload's identities: fail the watchers of an identity gone or no
        longer an approver; the others see by their new policy from now on.

        Returns:
            How many watchers were ended.
        """
        ended = 0
        for watcher in list(self._watchers):
            now = identity_named(watcher.identity.name)
            if now is None or not now.approver:
                watcher.fail(
                    PermissionDeniedError(
                        "this identity may no longer approve or deny calls (the tokens "
                        "file was reloaded), so its approvals watch ended"
                    )
                )
                self.unsubscribe(watcher)
                ended += 1
            else:
                watcher.identity = now
        if ended:
            log.warning("ended %d approval watches of identities no longer approvers", ended)
        return ended

    def close(self) -> None:
        """The daemon stops: every watcher ends once sent what it has; no new one."""
        self._closed = True
        for watcher in self._watchers:
            watcher.close()

    def _event(self, kind: ApprovalEventKind, info: CallInfo) -> ApprovalEvent:
        return ApprovalEvent(kind=kind, call=cut_arguments(info, self.max_argument_bytes))
