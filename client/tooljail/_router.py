"""`Router`: how a blocking `Client` sends each request, to one daemon or over many.

With one plain target it only applies the retry policy to the one channel
(today's behaviour, nothing more on the hot path). With many it routes as
`tooljail._routing` says, and a daemon thread keeps the daemon table fresh.
The asyncio twin is `tooljail._async_router`.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable, Generator
from functools import partial
from typing import Any, TypeVar

import grpc

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

__all__ = ["Router"]

_T = TypeVar("_T")

Send = Callable[[Any], _T]
"""One try of a request: given a daemon's stub, make the RPC."""


class Router(RouterBase):
    """Sends a `Client`'s requests; see `tooljail._routing` for the rules."""

    def __init__(self, client: Any, targets: Targets) -> None:
        super().__init__(client, targets, grpc)
        self._start_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def close(self) -> None:
        """Stops the health thread and closes every channel."""
        self._closed.set()
        self._wake.set()
        for daemon in list(self.table.daemons):
            daemon.channel.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=INFO_TIMEOUT_S + 1)

    # --- the table ---

    def _ensure_started(self) -> None:
        """The first routed request learns every daemon's id, then starts the health thread."""
        if not self._started:
            with self._start_lock:
                if not self._started:
                    self.refresh()
                    # The thread holds the router weakly: a client dropped without
                    # close() is collected (its channels with it), and the thread ends.
                    self._thread = threading.Thread(
                        target=_health_loop,
                        args=(weakref.ref(self), self._wake, self._closed),
                        name="tooljail-daemon-health",
                        daemon=True,
                    )
                    self._thread.start()
                    self._started = True
        self._check_config()

    def refresh(self) -> None:
        """Re-resolves a dns name and asks every listed daemon for its DaemonInfo."""
        if self.targets.dns_name:
            try:
                addresses = resolve_dns(self.targets.dns_name)
            except OSError:
                addresses = None  # keep what we had: a resolver hiccup is not an empty fleet
            if addresses is not None:
                for address in self.table.relist(addresses):
                    self._add(address)
        request = pb.GetDaemonInfoRequest()
        asked = [
            (d, d.stub.GetDaemonInfo.future(
                request, timeout=INFO_TIMEOUT_S, metadata=self._client._metadata
            ))
            for d in self.table.daemons
            if d.listed
        ]  # fmt: skip
        for daemon, future in asked:
            try:
                answer: Any = future.result()
            except grpc.RpcError as e:
                answer = e
            self._note_info(daemon, answer)

    def _note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        super()._note_failure(daemon, error)
        self._wake.set()

    # --- sending ---

    def _attempts(self, daemon: Daemon, send: Send[_T], *, retry: bool, fresh: bool) -> _T:
        """`send(daemon.stub)` under the retry policy.

        Raises:
            Skip: When `fresh` and the daemon never had the request.
            Gone: When routed and the daemon stays unreachable.
            TooljailError: The daemon's answer, or a transport failure.
        """
        attempt = 0
        while True:
            try:
                return send(daemon.stub)
            except grpc.RpcError as e:
                error = self._map(daemon, e)
                verdict = self._verdict(daemon, error, attempt, retry=retry, fresh=fresh)
                if verdict == "skip":
                    raise Skip() from e
                if verdict == "gone":
                    raise Gone(daemon, error) from e
                if verdict == "raise":
                    raise error from e
            time.sleep(self._client._backoff_s(attempt))
            attempt += 1

    def unary(
        self,
        route: Route,
        send: Send[_T],
        *,
        retry: bool = True,
        on_lost: Callable[[pb.Result], _T] | None = None,
    ) -> _T:
        """`send` to the daemon `route` names; see `unary_at`."""
        return self.unary_at(route, send, retry=retry, on_lost=on_lost)[1]

    def unary_at(
        self,
        route: Route,
        send: Send[_T],
        *,
        retry: bool = True,
        on_lost: Callable[[pb.Result], _T] | None = None,
    ) -> tuple[Daemon, _T]:
        """`send` to the daemon `route` names, and that daemon.

        Args:
            route: Which daemon: see `RouteKind`.
            send: One try of the RPC, given the daemon's stub.
            retry: Whether the retry policy applies.
            on_lost: For a call whose daemon is gone: the answer made of its
                LOST result; None raises the transport error instead.

        Raises:
            SessionEndedError: reason "daemon_lost", when a session's daemon is
                gone or was restarted.
            TooljailError: As the RPC, or when no daemon takes new calls.
        """
        if not self.routed:
            daemon = self.table.daemons[0]
            return daemon, self._attempts(daemon, send, retry=retry, fresh=False)
        self._ensure_started()
        pinned = self._pinned(route)
        try:
            if pinned is not None:
                try:
                    return pinned, self._attempts(pinned, send, retry=retry, fresh=False)
                except TooljailError as error:
                    return pinned, self._pinned_error(route, pinned, error, on_lost)
            if route.kind in (RouteKind.CALL, RouteKind.SESSION, RouteKind.ARTIFACT):
                return self._lookup(route, send, retry=retry)
            return self._fresh(route, send, retry=retry)
        except Gone as gone:
            return gone.daemon, self._gone(route, gone, on_lost)

    def _fresh(self, route: Route, send: Send[_T], *, retry: bool) -> tuple[Daemon, _T]:
        """To the first serving daemon by rendezvous of the route's id (or a fresh
        one), passing on only while a daemon never had the request."""
        key = route.key or uuid.uuid4().hex
        for again in (False, True):
            if again:
                self.refresh()  # our view may be stale: ask once more before giving up
            for daemon in self.table.ranked(key, serving=True):
                self.pin(route, daemon)
                try:
                    return daemon, self._attempts(daemon, send, retry=retry, fresh=True)
                except Skip:
                    continue
                except Gone:
                    if route.kind is not RouteKind.ANY:
                        raise
        raise self.table.none_serving()

    def _lookup(self, route: Route, send: Send[_T], *, retry: bool) -> tuple[Daemon, _T]:
        """To each reachable daemon in rendezvous order until one knows the id."""
        last: TooljailError | None = None
        skipped: list[Daemon] = []
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                skipped.append(daemon)
                continue
            try:
                answer = self._attempts(daemon, send, retry=retry, fresh=False)
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

    def each(self, send: Send[_T]) -> list[_T]:
        """`send` to every reachable daemon (merged listings), retried each."""
        if not self.routed:
            return [self.unary(Route(RouteKind.ANY), send)]
        self._ensure_started()
        answers = []
        for daemon in [d for d in self.table.daemons if d.reachable and d.listed]:
            try:
                answers.append(self._attempts(daemon, send, retry=True, fresh=False))
            except Gone:
                continue
        if not answers:
            raise self.table.none_serving()
        return answers

    # --- streams ---

    def follow(
        self,
        route: Route,
        start: Callable[[Any], Any],
        request: pb.CallRequest | pb.AttachRequest,
    ) -> Generator[Output | ToolResult, None, None]:
        """The events of one call from its daemon; a dropped connection is resumed
        where it broke (Attach after the last chunk), on the same daemon."""
        progress = _Progress(request)
        attempt = 0
        # Only a call this client never sent anywhere may pass on to another daemon.
        unsent = route.kind is RouteKind.NEW_CALL and self._pinned(route) is None
        daemon = self._stream_daemon(route)
        rpc = start(daemon.stub)
        while True:
            verdict = "retry"
            try:
                for event in rpc:
                    if progress.result is not None:
                        # Nothing may follow the Result; read on only to reach the status.
                        continue
                    item = progress.take(self._client._decode_event(event))
                    if item is not None:
                        yield item
                break
            except grpc.RpcError as e:
                # Once the result is in, the call's outcome is known: a failure while
                # reading the final status changes nothing for the caller.
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
                # Left early (caller closed us, or an error): stop the RPC. Not after
                # the result, so the daemon's handler finishes undisturbed.
                if progress.result is None:
                    rpc.cancel()
            if verdict == "skip":
                daemon = self._stream_daemon(route, fresh_only=True)
                rpc = start(daemon.stub)
                continue
            time.sleep(self._client._backoff_s(attempt))
            attempt += 1
            rpc = progress.resume(daemon.stub, partial(start, daemon.stub), self._client._metadata)
        if progress.result is None:
            raise self._client._no_result_error()

    def _stream_daemon(self, route: Route, *, fresh_only: bool = False) -> Daemon:
        """The daemon a stream goes to, pinned before its first byte is sent."""
        if not self.routed:
            return self.table.daemons[0]
        self._ensure_started()
        pinned = None if fresh_only else self._pinned(route)
        if pinned is not None:
            return pinned
        if route.kind in (RouteKind.CALL, RouteKind.SESSION):
            return self._locate(route)
        for daemon in self.table.ranked(route.key, serving=True):
            self.pin(route, daemon)
            return daemon
        raise self.table.none_serving()

    def _locate(self, route: Route) -> Daemon:
        """The daemon of a call (GetCall) or session (ListSessions: nothing else
        asks without acting) this client did not send."""
        if route.kind is RouteKind.CALL:
            call = pb.GetCallRequest(call_id=route.key)
            daemon, _ = self.unary_at(route, self._client._sender("GetCall", call))
            return daemon
        listing = pb.ListSessionsRequest(all_clients=True)
        send = self._client._sender("ListSessions", listing)
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                continue
            try:
                answer = self._attempts(daemon, send, retry=True, fresh=False)
            except (Gone, TooljailError):
                continue
            if any(s.session_id == route.key for s in answer.sessions):
                self.pin(route, daemon)
                return daemon
        raise self.table.none_serving()


def _health_loop(ref: weakref.ref[Router], wake: threading.Event, closed: threading.Event) -> None:
    """Refreshes the router's table every `HEALTH_INTERVAL_S`, or when woken."""
    while not closed.is_set():
        wake.wait(HEALTH_INTERVAL_S)
        wake.clear()
        router = ref()
        if router is None or closed.is_set():
            return
        try:
            router.refresh()
        except ValueError:
            return  # a channel closed under us: the client is closing
        del router
        # A burst of failures wakes us often; ask at most 5 times a second.
        time.sleep(0.2)
