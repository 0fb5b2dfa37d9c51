"""`client.watch_approvals()`: the approval queue as it changes, for an approver.

One server stream per daemon, `WatchApprovals`: first a REQUESTED event for
each call waiting now that this approver may decide, then each new request
(REQUESTED) and each end of waiting (DECIDED: approved, denied, timed out,
cancelled, revoked, stopped at shutdown; the call's state says which), as they
happen. Over many daemons, the watch reads every daemon reachable when it
opens, merged in the order events arrive (each daemon's own events in order;
`event.call.daemon_id` names it); a daemon that stops ends its part cleanly.

Both open at once: `watch_approvals()` returns (or the `await` ends) once each
daemon has the watch in place (its initial metadata), so a request made right
after is reported, and a caller that is no approver is refused there
(`PermissionDeniedError`). A watch that fell behind is ended by the daemon with
`OverloadedError` (RESOURCE_EXHAUSTED): watch again, it starts with the calls
waiting then.

`ApprovalWatch` (blocking: a reader thread per daemon feeds a bounded queue)
and `AsyncApprovalWatch` (a task per daemon) share `decode_approval_event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Self

import grpc

from tooljail._call_types import ApprovalEvent, ApprovalEventKind
from tooljail._routing import Daemon
from tooljail._wire import call_info_from_proto
from tooljail.errors import InternalError, TooljailError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["ApprovalWatch", "AsyncApprovalWatch", "decode_approval_event", "sort_waiting"]

MapError = Callable[[Daemon, grpc.RpcError], TooljailError]

_KIND = {
    pb.APPROVAL_EVENT_KIND_REQUESTED: ApprovalEventKind.REQUESTED,
    pb.APPROVAL_EVENT_KIND_DECIDED: ApprovalEventKind.DECIDED,
}

BACKLOG = 1000
"""Events read from the daemons and not yet taken by the caller: past it the
readers wait (and the daemons, through gRPC's flow control, hold the rest)."""


def decode_approval_event(message: pb.ApprovalEvent) -> ApprovalEvent | None:
    """An `ApprovalEvent` from the wire; None for a kind this SDK does not know (a
    newer daemon's), which the watch skips.

    Raises:
        InternalError: The call in it cannot be read.
    """
    kind = _KIND.get(message.kind)
    if kind is None:
        return None
    try:
        return ApprovalEvent(kind=kind, call=call_info_from_proto(message.call))
    except ValueError as e:
        raise InternalError(f"the daemon sent an approval event this SDK cannot read: {e}") from e


def sort_waiting(answers: list[pb.ListApprovalsResponse]) -> list[Any]:
    """The calls of every daemon's ListApprovals answer, oldest first."""
    calls = [call_info_from_proto(m) for answer in answers for m in answer.calls]
    return sorted(calls, key=lambda c: c.received_at.timestamp() if c.received_at else 0.0)


def check_opened(daemon: Daemon, call: Any, map_error: MapError) -> None:
    """Raise the error of a watch the daemon refused (a blocking call whose initial
    metadata came: it has ended then only if it was refused)."""
    call.initial_metadata()
    if call.done() and call.code() is not grpc.StatusCode.OK:
        raise map_error(daemon, call)


class ApprovalWatch:
    """The approval queue's events, in order (`Client.watch_approvals`).

    An iterator of `ApprovalEvent`, and a context manager whose exit stops the
    watch. Iteration ends once every daemon's stream has ended (they end when
    their daemon stops); an error of one daemon's stream is raised (and the
    watch closed).

    Example:
        with client.watch_approvals() as events:
            for event in events:
                print(event.kind, event.call.call_id, event.call.arguments)
    """

    def __init__(self, calls: list[tuple[Daemon, Any]], map_error: MapError) -> None:
        self._calls = calls
        self._closed = False
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(BACKLOG)
        try:
            for daemon, call in calls:
                check_opened(daemon, call, map_error)
        except BaseException:
            self.close()
            raise
        self._open = len(calls)
        for daemon, call in calls:
            threading.Thread(target=self._read, args=(daemon, call, map_error), daemon=True).start()

    def _read(self, daemon: Daemon, call: Any, map_error: MapError) -> None:
        try:
            for message in call:
                self._put(("event", message))
            self._put(("end", None))
        except grpc.RpcError as e:
            self._put(("error", map_error(daemon, e)))

    def _put(self, item: tuple[str, Any]) -> None:
        # Waits while the caller is behind; gives up once the watch is closed.
        while not self._closed:
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[ApprovalEvent]:
        return self

    def __next__(self) -> ApprovalEvent:
        while not self._closed:
            what, value = self._queue.get()
            if self._closed:
                break
            if what == "event":
                event = decode_approval_event(value)
                if event is not None:
                    return event
            elif what == "end":
                self._open -= 1
                if not self._open:
                    break
            else:
                self.close()
                raise value
        raise StopIteration

    def close(self) -> None:
        """Stop watching; idempotent. From another thread too: an iteration
        blocked there ends."""
        self._closed = True
        for _, call in self._calls:
            call.cancel()
        with contextlib.suppress(queue.Full):  # wake a reader blocked in `__next__`
            self._queue.put_nowait(("end", None))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncApprovalWatch:
    """`ApprovalWatch` for an `AsyncClient`: an async iterator and async context manager."""

    def __init__(self, calls: list[tuple[Daemon, Any]], map_error: MapError) -> None:
        self._calls = calls
        self._map_error = map_error
        self._closed = False
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(BACKLOG)
        self._open = len(calls)
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, calls: list[tuple[Daemon, Any]], map_error: MapError) -> AsyncApprovalWatch:
        """The watch, once each daemon has it in place (or raise its refusal)."""
        watch = cls(calls, map_error)
        try:
            for daemon, call in calls:
                await call.initial_metadata()
                if call.done() and await call.code() != grpc.StatusCode.OK:
                    try:
                        async for _ in call:
                            pass
                    except grpc.RpcError as e:
                        raise map_error(daemon, e) from e
        except BaseException:
            await watch.close()
            raise
        watch._tasks = [asyncio.ensure_future(watch._read(d, c)) for d, c in calls]
        return watch

    async def _read(self, daemon: Daemon, call: Any) -> None:
        try:
            async for message in call:
                await self._queue.put(("event", message))
            await self._queue.put(("end", None))
        except grpc.RpcError as e:
            await self._queue.put(("error", self._map_error(daemon, e)))

    def __aiter__(self) -> AsyncIterator[ApprovalEvent]:
        return self

    async def __anext__(self) -> ApprovalEvent:
        while not self._closed:
            what, value = await self._queue.get()
            if self._closed:
                break
            if what == "event":
                event = decode_approval_event(value)
                if event is not None:
                    return event
            elif what == "end":
                self._open -= 1
                if not self._open:
                    break
            else:
                await self.close()
                raise value
        raise StopAsyncIteration

    async def close(self) -> None:
        """Stop watching; idempotent. From another task too: its iteration ends."""
        self._closed = True
        for _, call in self._calls:
            call.cancel()
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.QueueFull):  # wake a reader waiting in `__anext__`
            self._queue.put_nowait(("end", None))

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
