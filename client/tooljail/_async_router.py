"""`AsyncRouter`: the asyncio twin of `tooljail._router.Router`, for `AsyncClient`.

The same rules (`tooljail._routing`), the same decisions (`RouterBase`); only
the loops are written again, awaited, and the health loop is a task of the
client's event loop, started by its first routed request.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import grpc
import grpc.aio

from tooljail._client_base import _Progress
from tooljail._router_base import Gone, RouterBase, Skip
from tooljail._routing import (
    HEALTH_INTERVAL_S,
    INFO_TIMEOUT_S,
    Daemon,
    Route,
    RouteKind,
    Targets,
    resolve_dns,
)
from tooljail._types import Output, ToolResult
from tooljail.errors import TooljailError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncRouter"]

_T = TypeVar("_T")

Send = Callable[[Any], Awaitable[_T]]
"""One try of a request: given a daemon's stub, the awaitable RPC."""


class AsyncRouter(RouterBase):
    """Sends an `AsyncClient`'s requests; see `tooljail._router.Router`."""

    def __init__(self, client: Any, targets: Targets) -> None:
        super().__init__(client, targets, grpc.aio)
        self._start_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Stops the health task and closes every channel."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for daemon in list(self.table.daemons):
            await daemon.channel.close()

    # --- the table ---

    async def _ensure_started(self) -> None:
        if not self._started:
            async with self._start_lock:
                if not self._started:
                    await self.refresh()
                    self._task = asyncio.create_task(self._health_loop())
                    self._started = True
        self._check_config()

    async def refresh(self) -> None:
        """Re-resolves a dns name and asks every listed daemon for its DaemonInfo."""
        if self.targets.dns_name:
            try:
                addresses = await asyncio.to_thread(resolve_dns, self.targets.dns_name)
            except OSError:
                addresses = None  # keep what we had: a resolver hiccup is not an empty fleet
            if addresses is not None:
                for address in self.table.relist(addresses):
                    self._add(address)
        request = pb.GetDaemonInfoRequest()
        listed = [d for d in self.table.daemons if d.listed]
        answers = await asyncio.gather(
            *(
                d.stub.GetDaemonInfo(
                    request, timeout=INFO_TIMEOUT_S, metadata=self._client._metadata
                )
                for d in listed
            ),
            return_exceptions=True,
        )
        for daemon, answer in zip(listed, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, grpc.RpcError):
                raise answer
            self._note_info(daemon, answer)

    async def _health_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), HEALTH_INTERVAL_S)
            self._wake.clear()
            await self.refresh()
            # A burst of failures wakes us often; ask at most 5 times a second.
            await asyncio.sleep(0.2)

    def _note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        super()._note_failure(daemon, error)
        self._wake.set()

    # --- sending ---

    async def _attempts(self, daemon: Daemon, send: Send[_T], *, retry: bool, fresh: bool) -> _T:
        """`await send(daemon.stub)` under the retry policy. See `Router._attempts`."""
        attempt = 0
        while True:
            try:
                return await send(daemon.stub)
            except grpc.RpcError as e:
                error = self._map(daemon, e)
                verdict = self._verdict(daemon, error, attempt, retry=retry, fresh=fresh)
                if verdict == "skip":
                    raise Skip() from e
                if verdict == "gone":
                    raise Gone(daemon, error) from e
                if verdict == "raise":
                    raise error from e
            await asyncio.sleep(self._client._backoff_s(attempt))
            attempt += 1

    async def unary(
        self,
        route: Route,
        send: Send[_T],
        *,
        retry: bool = True,
        on_lost: Callable[[pb.Result], _T] | None = None,
    ) -> _T:
        """`send` to the daemon `route` names. See `Router.unary_at`."""
        return (await self.unary_at(route, send, retry=retry, on_lost=on_lost))[1]

    async def unary_at(
        self,
        route: Route,
        send: Send[_T],
        *,
        retry: bool = True,
        on_lost: Callable[[pb.Result], _T] | None = None,
    ) -> tuple[Daemon, _T]:
        """`send` to the daemon `route` names, and that daemon. See `Router.unary_at`."""
        if not self.routed:
            daemon = self.table.daemons[0]
            return daemon, await self._attempts(daemon, send, retry=retry, fresh=False)
        await self._ensure_started()
        pinned = self._pinned(route)
        try:
            if pinned is not None:
                try:
                    return pinned, await self._attempts(pinned, send, retry=retry, fresh=False)
                except TooljailError as error:
                    return pinned, self._pinned_error(route, pinned, error, on_lost)
            if route.kind in (RouteKind.CALL, RouteKind.SESSION, RouteKind.ARTIFACT):
                return await self._lookup(route, send, retry=retry)
            return await self._fresh(route, send, retry=retry)
        except Gone as gone:
            return gone.daemon, self._gone(route, gone, on_lost)

    async def _fresh(self, route: Route, send: Send[_T], *, retry: bool) -> tuple[Daemon, _T]:
        """See `Router._fresh`."""
        key = route.key or uuid.uuid4().hex
        for again in (False, True):
            if again:
                await self.refresh()  # our view may be stale: ask once more before giving up
            for daemon in self.table.ranked(key, serving=True):
                self.pin(route, daemon)
                try:
                    return daemon, await self._attempts(daemon, send, retry=retry, fresh=True)
                except Skip:
                    continue
                except Gone:
                    if route.kind is not RouteKind.ANY:
                        raise
        raise self.table.none_serving()

    async def _lookup(self, route: Route, send: Send[_T], *, retry: bool) -> tuple[Daemon, _T]:
        """See `Router._lookup`."""
        last: TooljailError | None = None
        skipped: list[Daemon] = []
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                skipped.append(daemon)
                continue
            try:
                answer = await self._attempts(daemon, send, retry=retry, fresh=False)
            except Gone:
                skipped.append(daemon)
                continue
            except TooljailError as error:
                if not self._is_not_found(error):
                    raise
                last = error
                continue
            self.pin(route, daemon)
            return daemon, answer
        self._not_found(route, last, skipped)
        raise AssertionError("unreachable")  # _not_found always raises

    async def each(self, send: Send[_T]) -> list[_T]:
        """`send` to every reachable daemon (merged listings). See `Router.each`."""
        if not self.routed:
            return [await self.unary(Route(RouteKind.ANY), send)]
        await self._ensure_started()
        answers = []
        for daemon in [d for d in self.table.daemons if d.reachable and d.listed]:
            try:
                answers.append(await self._attempts(daemon, send, retry=True, fresh=False))
            except Gone:
                continue
        if not answers:
            raise self.table.none_serving()
        return answers

    # --- streams ---

    async def follow(
        self,
        route: Route,
        start: Callable[[Any], Any],
        request: pb.CallRequest | pb.AttachRequest,
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """The events of one call from its daemon. See `Router.follow`."""
        progress = _Progress(request)
        attempt = 0
        # Only a call this client never sent anywhere may pass on to another daemon.
        unsent = route.kind is RouteKind.NEW_CALL and self._pinned(route) is None
        daemon = await self._stream_daemon(route)
        rpc = start(daemon.stub)
        while True:
            verdict = "retry"
            try:
                async for event in rpc:
                    if progress.result is not None:
                        continue  # nothing may follow the Result (see Router.follow)
                    item = progress.take(self._client._decode_event(event))
                    if item is not None:
                        yield item
                break
            except grpc.RpcError as e:
                if progress.result is not None:
                    break
                error = self._map(daemon, e)
                fresh = unsent and progress.fresh
                verdict = self._verdict(daemon, error, attempt, retry=True, fresh=fresh)
                if verdict == "gone":
                    yield self._lost_event(route, daemon, error)
                    return
                if verdict == "raise":
                    raise error from e
            finally:
                if progress.result is None:
                    rpc.cancel()
            if verdict == "skip":
                daemon = await self._stream_daemon(route, fresh_only=True)
                rpc = start(daemon.stub)
                continue
            await asyncio.sleep(self._client._backoff_s(attempt))
            attempt += 1
            rpc = progress.resume(daemon.stub, partial(start, daemon.stub), self._client._metadata)
        if progress.result is None:
            raise self._client._no_result_error()

    async def _stream_daemon(self, route: Route, *, fresh_only: bool = False) -> Daemon:
        """The daemon a stream goes to. See `Router._stream_daemon`."""
        if not self.routed:
            return self.table.daemons[0]
        await self._ensure_started()
        pinned = None if fresh_only else self._pinned(route)
        if pinned is not None:
            return pinned
        if route.kind in (RouteKind.CALL, RouteKind.SESSION):
            return await self._locate(route)
        for daemon in self.table.ranked(route.key, serving=True):
            self.pin(route, daemon)
            return daemon
        raise self.table.none_serving()

    async def _locate(self, route: Route) -> Daemon:
        """See `Router._locate`."""
        if route.kind is RouteKind.CALL:
            call = pb.GetCallRequest(call_id=route.key)
            daemon, _ = await self.unary_at(route, self._client._sender("GetCall", call))
            return daemon
        listing = pb.ListSessionsRequest(all_clients=True)
        send = self._client._sender("ListSessions", listing)
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                continue
            try:
                answer = await self._attempts(daemon, send, retry=True, fresh=False)
            except (Gone, TooljailError):
                continue
            if any(s.session_id == route.key for s in answer.sessions):
                self.pin(route, daemon)
                return daemon
        raise self.table.none_serving()
