"""`RouterBase`: every routing policy of the SDK, once, as flows of I/O-free steps.

What to decide after each failed try (pass to the next daemon, retry, or answer
that the holding daemon is gone), what a pinned id's daemon's answers mean
(restarted, forgot a session), how a lost call or session is answered; and the
loops that use those decisions (retry, route, look up, fan out, resume a
stream), written once as flows (`tooljail._steps`) that `Router` drives with
blocking calls and `AsyncRouter` awaited. The rules themselves are in
`tooljail._routing`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from tooljail._link import ClientLink, Rpc, backoff_s, decode_event, decode_result, no_result_error
from tooljail._routing import (
    ANY,
    Daemon,
    DaemonTable,
    Pin,
    Route,
    RouteKind,
    Targets,
    is_unavailable,
    lost_result,
    map_rpc_error,
    never_reached,
    session_lost,
)
from tooljail._steps import END, Emit, Flow, Read, Refresh, Start, Try, Wait
from tooljail._types import Output, SessionInfo, ToolResult
from tooljail._wire import result_to_proto
from tooljail.errors import (
    InvalidRequestError,
    SessionEndedError,
    ShuttingDownError,
    TooljailError,
    TransportError,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

__all__ = ["Gone", "RouterBase", "Send", "Skip"]

_T = TypeVar("_T")

Send = Rpc | Callable[[Daemon], Flow[Any]]
"""One try of a request on a daemon: an `Rpc`, or a flow of several (a listing's pages)."""


class Skip(Exception):
    """Internal: the daemon never had the request; the next one may take it."""


class Gone(Exception):
    """Internal: the daemon holding the request cannot be reached (after retries)."""

    def __init__(self, daemon: Daemon, error: TooljailError) -> None:
        super().__init__(str(error))
        self.daemon = daemon
        self.error = error


_NOT_FOUND_CODES = frozenset({"call_not_found", "session_not_found", "artifact_not_found"})


class RouterBase:
    """What the sync and async routers share: the table, every decision and every loop.

    The subclasses drive the flows (`run`, `stream`) and keep the table fresh
    (`refresh`, the health loop), once with blocking calls and once awaited.

    Args:
        link: What the client hands in: its retry policy, metadata and how to
            open a channel to a daemon (with its credentials).
        targets: What it was told to dial.
        module: `grpc` or `grpc.aio`, whose channels to open.
    """

    def __init__(self, link: ClientLink, targets: Targets, module: Any) -> None:
        self._link = link
        self.targets = targets
        self._module = module
        self.table = DaemonTable()
        for address in targets.addresses:
            self._add(address)
        self._started = False

    @property
    def routed(self) -> bool:
        return self.targets.routed

    def _add(self, address: str) -> Daemon:
        channel = self._link.open_channel(self._module, address)
        stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        return self.table.add(address, channel, stub)

    def _relist(self, addresses: list[str]) -> None:
        """A dns name's addresses now: channels to the new ones (the gone ones stay, unlisted)."""
        for address in self.table.relist(addresses):
            self._add(address)

    def map_error(self, daemon: Daemon, e: grpc.RpcError) -> TooljailError:
        if not self.routed:
            return self._link.map_error(e)
        return map_rpc_error(e, daemon.address)

    def _verdict(
        self, daemon: Daemon, error: TooljailError, attempt: int, *, retry: bool, fresh: bool
    ) -> str:
        """After a failed try: "skip" (next daemon), "retry", "gone" or "raise"."""
        if not self.routed:
            return "retry" if retry and self._link.should_retry(error, attempt) else "raise"
        if is_unavailable(error) or isinstance(error, ShuttingDownError):
            self._note_failure(daemon, error)
        if fresh and attempt == 0 and never_reached(error):
            return "skip"
        # A request bound to its daemon (pinned, or asked of it by lookup) is
        # retried before that daemon is called gone, even a read that one
        # daemon alone would not retry: "lost" must mean the retries failed too.
        if (retry or not fresh) and self._link.should_retry(error, attempt):
            return "retry"
        return "gone" if is_unavailable(error) else "raise"

    def _note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        self.table.note_failure(daemon, error)

    def _note_info(self, daemon: Daemon, answer: Any) -> None:
        """A GetDaemonInfo answer (or its error) into the table."""
        if isinstance(answer, pb.DaemonInfo):
            # A duplicate id is kept as table.config_error, raised at the next request.
            with contextlib.suppress(InvalidRequestError):
                self.table.note_info(daemon, answer)
            return
        error = map_rpc_error(answer, daemon.address)
        if isinstance(error, TransportError) and error.status == "UNIMPLEMENTED":
            # A daemon older than GetDaemonInfo: its address stands for its id.
            self.table.note_info(daemon, pb.DaemonInfo(daemon_id=daemon.address))
        else:
            self.table.note_failure(daemon, error)

    def _check_config(self) -> None:
        if self.table.config_error is not None:
            raise self.table.config_error

    def _pinned(self, route: Route) -> Daemon | None:
        """The daemon `route`'s id is pinned to, if any; a restarted daemon
        means the session pinned there is lost.

        Raises:
            SessionEndedError: reason "daemon_lost", for a session whose daemon
                was restarted since it opened.
        """
        pin = self._pin_of(route)
        if pin is None:
            return None
        if route.kind is RouteKind.SESSION and pin.restarted:
            raise session_lost(route.key, pin.daemon, "was restarted")
        return pin.daemon

    def _pin_of(self, route: Route) -> Pin | None:
        if route.kind in (RouteKind.NEW_CALL, RouteKind.CALL):
            return self.table.calls.get(route.key)
        if route.kind is RouteKind.SESSION:
            return self.table.sessions.get(route.key)
        return None

    def pin(self, route: Route, daemon: Daemon) -> None:
        """Remembers that `route`'s id lives on `daemon` (calls and sessions; a new
        session is pinned by its client once the daemon has named it)."""
        if route.kind in (RouteKind.NEW_CALL, RouteKind.CALL):
            self.table.calls.put(route.key, Pin(daemon, daemon.started_unix))
        elif route.kind is RouteKind.SESSION:
            self.table.sessions.put(route.key, Pin(daemon, daemon.started_unix))

    def opened_session(self, daemon: Daemon, info: SessionInfo) -> SessionInfo:
        """A session just opened on `daemon`: pinned there, and named by it."""
        if not self.routed:
            return info
        self.pin(Route(RouteKind.SESSION, info.session_id), daemon)
        return info if info.daemon_id else info.model_copy(update={"daemon_id": daemon.daemon_id})

    def _pinned_error(
        self, route: Route, daemon: Daemon, error: TooljailError, on_lost: Any
    ) -> Any:
        """What a pinned id's daemon answered with `error`, as the caller should
        see it: a daemon that no longer knows a session (or says it restarted)
        lost it; a daemon restarted since that no longer knows a call lost it.

        Returns:
            The LOST answer (`on_lost`) of a call its restarted daemon forgot.

        Raises:
            TooljailError: `error`, or `SessionEndedError` (reason "daemon_lost").
        """
        why = "was restarted and no longer holds it"
        if route.kind is RouteKind.SESSION and (
            error.code == "session_not_found"
            or (isinstance(error, SessionEndedError) and error.reason == "daemon_restart")
        ):
            raise session_lost(route.key, daemon, why) from error
        pin = self._pin_of(route)
        if error.code == "call_not_found" and on_lost and pin is not None and pin.restarted:
            return on_lost(result_to_proto(lost_result(route.key, daemon, why)))
        raise error

    def _gone(self, route: Route, gone: Gone, on_lost: Any) -> Any:
        """The answer when the daemon holding `route`'s id cannot be reached."""
        why = f"is unreachable: {gone.error}"
        if route.kind is RouteKind.SESSION:
            raise session_lost(route.key, gone.daemon, why) from gone.error
        if on_lost is not None and route.kind in (RouteKind.NEW_CALL, RouteKind.CALL):
            return on_lost(result_to_proto(lost_result(route.key, gone.daemon, why)))
        raise gone.error

    def _lost_event(self, route: Route, daemon: Daemon, error: TooljailError) -> ToolResult:
        """The last item of a stream whose daemon is gone (a session's raises)."""
        return decode_result(self._gone(route, Gone(daemon, error), lambda r: r))

    @staticmethod
    def _is_not_found(error: TooljailError) -> bool:
        return error.code in _NOT_FOUND_CODES

    def _not_found(self, route: Route, last: TooljailError | None, skipped: list[Daemon]) -> None:
        """Raises: no daemon asked knows `route`'s id (naming those that could not be asked)."""
        if last is None:
            raise self.table.none_serving()
        if skipped:
            last.add_note("not asked, unreachable: " + ", ".join(d.describe() for d in skipped))
        raise last

    # --- flows: the loops, once for both routers ---

    def _ready(self) -> Flow[None]:
        """Before a routed request: the table is known (the first asks every daemon)."""
        if not self._started:
            yield Start()
        self._check_config()

    def _attempts(self, daemon: Daemon, send: Send, *, retry: bool, fresh: bool) -> Flow[Any]:
        """`send` on `daemon` under the retry policy.

        Raises:
            Skip: When `fresh` and the daemon never had the request.
            Gone: When routed and the daemon stays unreachable.
            TooljailError: The daemon's answer, or a transport failure.
        """
        attempt = 0
        while True:
            try:
                if isinstance(send, Rpc):
                    return (yield Try(daemon, send))
                return (yield from send(daemon))
            except grpc.RpcError as e:
                error = self.map_error(daemon, e)
                verdict = self._verdict(daemon, error, attempt, retry=retry, fresh=fresh)
                if verdict == "skip":
                    raise Skip() from e
                if verdict == "gone":
                    raise Gone(daemon, error) from e
                if verdict == "raise":
                    raise error from e
            yield Wait(backoff_s(attempt))
            attempt += 1

    def unary(
        self,
        route: Route,
        send: Send,
        *,
        retry: bool = True,
        on_lost: Callable[[pb.Result], Any] | None = None,
    ) -> Flow[tuple[Daemon, Any]]:
        """`send` to the daemon `route` names: that daemon, and its answer.

        Args:
            route: Which daemon: see `RouteKind`.
            send: One try of the request, given the daemon.
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
            return daemon, (yield from self._attempts(daemon, send, retry=retry, fresh=False))
        yield from self._ready()
        pinned = self._pinned(route)
        try:
            if pinned is not None:
                try:
                    answer = yield from self._attempts(pinned, send, retry=retry, fresh=False)
                except TooljailError as error:
                    return pinned, self._pinned_error(route, pinned, error, on_lost)
                return pinned, answer
            if route.kind in (RouteKind.CALL, RouteKind.SESSION, RouteKind.ARTIFACT):
                return (yield from self._lookup(route, send, retry=retry))
            return (yield from self._fresh(route, send, retry=retry))
        except Gone as gone:
            return gone.daemon, self._gone(route, gone, on_lost)

    def _fresh(self, route: Route, send: Send, *, retry: bool) -> Flow[tuple[Daemon, Any]]:
        """To the first serving daemon by rendezvous of the route's id (or a fresh
        one), passing on only while a daemon never had the request."""
        key = route.key or uuid.uuid4().hex
        for again in (False, True):
            if again:
                yield Refresh()  # our view may be stale: ask once more before giving up
            for daemon in self.table.ranked(key, serving=True):
                self.pin(route, daemon)
                try:
                    answer = yield from self._attempts(daemon, send, retry=retry, fresh=True)
                except Skip:
                    continue
                except Gone:
                    if route.kind is not RouteKind.ANY:
                        raise
                    continue
                return daemon, answer
        raise self.table.none_serving()

    def _lookup(self, route: Route, send: Send, *, retry: bool) -> Flow[tuple[Daemon, Any]]:
        """To each reachable daemon in rendezvous order until one knows the id."""
        last: TooljailError | None = None
        skipped: list[Daemon] = []
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                skipped.append(daemon)
                continue
            try:
                answer = yield from self._attempts(daemon, send, retry=retry, fresh=False)
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

    def each(self, send: Send) -> Flow[list[Any]]:
        """`send` to every reachable daemon (merged listings), retried each."""
        if not self.routed:
            return [(yield from self.unary(ANY, send))[1]]
        yield from self._ready()
        answers = []
        for daemon in [d for d in self.table.daemons if d.reachable and d.listed]:
            try:
                answers.append((yield from self._attempts(daemon, send, retry=True, fresh=False)))
            except Gone:
                continue
        if not answers:
            raise self.table.none_serving()
        return answers

    def follow(self, route: Route, rpc: Rpc) -> Flow[None]:
        """The events of one call from its daemon (`rpc`: its Call or Attach), emitted;
        a dropped connection is resumed where it broke (Attach after the last
        chunk), on the same daemon."""
        progress = _Progress(rpc)
        attempt = 0
        # Only a call this client never sent anywhere may pass on to another daemon.
        unsent = route.kind is RouteKind.NEW_CALL and self._pinned(route) is None
        daemon = yield from self._stream_daemon(route)
        call = rpc.start(daemon.stub)
        while True:
            verdict = "retry"
            try:
                while (event := (yield Read(call))) is not END:
                    if progress.result is not None:
                        # Nothing may follow the Result; read on only to reach the status.
                        continue
                    item = progress.take(decode_event(event))
                    if item is not None:
                        yield Emit(item)
                break
            except grpc.RpcError as e:
                # Once the result is in, the call's outcome is known: a failure while
                # reading the final status changes nothing for the caller.
                if progress.result is not None:
                    break
                error = self.map_error(daemon, e)
                fresh = unsent and progress.fresh
                verdict = self._verdict(daemon, error, attempt, retry=True, fresh=fresh)
                if verdict == "gone":
                    yield Emit(self._lost_event(route, daemon, error))
                    return
                if verdict == "raise":
                    raise error from e
            finally:
                # Left early (caller closed us, or an error): stop the RPC. Not after
                # the result, so the daemon's handler finishes undisturbed.
                if progress.result is None:
                    call.cancel()
            if verdict == "skip":
                daemon = yield from self._stream_daemon(route, fresh_only=True)
                call = rpc.start(daemon.stub)
                continue
            yield Wait(backoff_s(attempt))
            attempt += 1
            call = progress.resume(daemon.stub)
        if progress.result is None:
            raise no_result_error()

    def stream_daemon(self, route: Route) -> Flow[Daemon]:
        """The daemon of a stream its caller reads itself (a process's output)."""
        return self._stream_daemon(route)

    def _stream_daemon(self, route: Route, *, fresh_only: bool = False) -> Flow[Daemon]:
        """The daemon a stream goes to, pinned before its first byte is sent."""
        if not self.routed:
            return self.table.daemons[0]
        yield from self._ready()
        pinned = None if fresh_only else self._pinned(route)
        if pinned is not None:
            return pinned
        if route.kind in (RouteKind.CALL, RouteKind.SESSION):
            return (yield from self._locate(route))
        for daemon in self.table.ranked(route.key, serving=True):
            self.pin(route, daemon)
            return daemon
        raise self.table.none_serving()

    def _locate(self, route: Route) -> Flow[Daemon]:
        """The daemon of a call (GetCall) or session (ListSessions: nothing else
        asks without acting) this client did not send."""
        if route.kind is RouteKind.CALL:
            call = pb.GetCallRequest(call_id=route.key)
            daemon, _ = yield from self.unary(route, self._link.rpc("GetCall", call))
            return daemon
        listing = self._link.rpc("ListSessions", pb.ListSessionsRequest(all_clients=True))
        for daemon in self.table.ranked(route.key, serving=False):
            if not daemon.reachable:
                continue
            try:
                answer = yield from self._attempts(daemon, listing, retry=True, fresh=False)
            except (Gone, TooljailError):
                continue
            if any(s.session_id == route.key for s in answer.sessions):
                self.pin(route, daemon)
                return daemon
        raise self.table.none_serving()


class _Progress:
    """How far a caller got in one call's events, to resume it after a drop."""

    def __init__(self, rpc: Rpc) -> None:
        self._rpc = rpc
        request = rpc.message
        self._last_seq = (
            max(0, request.from_seq - 1) if isinstance(request, pb.AttachRequest) else 0
        )
        self._seen = False
        self.result: ToolResult | None = None

    @property
    def fresh(self) -> bool:
        """Nothing of the call came back yet (not even `Started`)."""
        return not self._seen

    def take(self, item: Output | ToolResult | None) -> Output | ToolResult | None:
        """Note an event; return it unless it is one the caller already has."""
        self._seen = True  # even Started (None): the daemon has the call
        if item is None:
            return None
        if isinstance(item, ToolResult):
            self.result = item
            return item
        if item.seq:
            if item.seq <= self._last_seq:
                return None  # replayed after a resume: the caller has it
            self._last_seq = item.seq
        return item

    def resume(self, stub: Any) -> Any:
        """The RPC that picks up where the broken one stopped.

        Before the daemon was seen to have the call, the same request again
        (its call id makes the daemon join a call it already runs); after,
        Attach from the chunk after the last one the caller got.
        """
        if not self._seen and isinstance(self._rpc.message, pb.CallRequest):
            return self._rpc.start(stub)
        attach = pb.AttachRequest(call_id=self._rpc.message.call_id, from_seq=self._last_seq + 1)
        return Rpc("Attach", attach, self._rpc.metadata).start(stub)
