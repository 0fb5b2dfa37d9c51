"""`RouterBase`: what the sync and async routers decide alike, without I/O.

After each failed try, whether to pass to the next daemon, retry, or answer
that the holding daemon is gone; what a pinned id's daemon's answers mean
(restarted, forgot a session); how a lost call or session is answered. The
rules themselves are in `tooljail._routing`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import grpc

from tooljail._routing import (
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
from tooljail._types import SessionInfo, ToolResult
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

__all__ = ["Gone", "RouterBase", "Skip"]


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
    """What the sync and async routers share: the table and every decision.

    The subclasses add the loops that send (`_attempts`), look up, fan out and
    run the health loop, each once with blocking calls and once awaited.

    Args:
        client: The client whose retry policy, metadata and credentials apply
            to every daemon (`_BaseClient`).
        targets: What it was told to dial.
        module: `grpc` or `grpc.aio`, whose channels to open.
    """

    def __init__(self, client: Any, targets: Targets, module: Any) -> None:
        self._client = client
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
        channel = self._client._open_channel(self._module, address)
        stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        return self.table.add(address, channel, stub)

    def _map(self, daemon: Daemon, e: grpc.RpcError) -> TooljailError:
        if not self.routed:
            return self._client._map_rpc_error(e)  # type: ignore[no-any-return]
        return map_rpc_error(e, daemon.address)

    def _verdict(
        self, daemon: Daemon, error: TooljailError, attempt: int, *, retry: bool, fresh: bool
    ) -> str:
        """After a failed try: "skip" (next daemon), "retry", "gone" or "raise"."""
        if not self.routed:
            return "retry" if retry and self._client._should_retry(error, attempt) else "raise"
        if is_unavailable(error) or isinstance(error, ShuttingDownError):
            self._note_failure(daemon, error)
        if fresh and attempt == 0 and never_reached(error):
            return "skip"
        # A request bound to its daemon (pinned, or asked of it by lookup) is
        # retried before that daemon is called gone, even a read that one
        # daemon alone would not retry: "lost" must mean the retries failed too.
        if (retry or not fresh) and self._client._should_retry(error, attempt):
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
        answer = self._gone(route, Gone(daemon, error), lambda r: r)
        decoded: ToolResult = self._client._decode_result(answer)
        return decoded

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
