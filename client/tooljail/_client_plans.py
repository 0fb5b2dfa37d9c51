"""`_ClientPlans`: what each client method sends and how it reads the answer, once.

Each `_plan_*` method checks its arguments at once (so a bad argument raises
where the method is called, even for a stream) and returns a flow
(`tooljail._steps`) of the router's policies; `Client` runs it with blocking
calls and `AsyncClient` awaits it, each method one line. The method's contract
(arguments, retries, errors) is in `Client`'s docstrings; which daemon each
request names (its `Route`) is decided here, how a route is followed in
`tooljail._routing` and `RouterBase`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tooljail._approvals import sort_waiting
from tooljail._artifact_base import (
    delete_artifact_request,
    get_artifact_request,
    join_chunks,
    join_pages,
    list_artifacts_request,
    merge_artifacts,
    next_page,
)
from tooljail._call_types import CallInfo, CallPage
from tooljail._client_base import _BaseClient
from tooljail._history import DEFAULT_LIMIT, Merge, decode_cursors, from_cursor, list_calls_request
from tooljail._routing import ANY, Daemon, Route, RouteKind
from tooljail._session_base import (
    close_session_request,
    decode_file_info,
    decode_session_info,
    decode_sessions,
    download_request,
    list_sessions_request,
    session_closed_with_daemon,
    set_egress_request,
    upload_messages,
)
from tooljail._steps import Flow, Try, then
from tooljail._types import ArtifactInfo, CallState, SessionInfo, ToolInfo, ToolResult
from tooljail.errors import SessionEndedError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["_ClientPlans"]


class _ClientPlans(_BaseClient):
    """Every method of `Client` and `AsyncClient` as a flow; no I/O."""

    def _ask(self, route: Route, method: str, request: Any, **options: Any) -> Flow[Any]:
        """The answer of unary `method` at the daemon `route` names, with the RPC
        deadline; `options` as `RouterBase.unary` (not retried unless `retry=True`)."""
        options.setdefault("retry", False)
        flow = self._router.unary(route, self._link.rpc(method, request), **options)
        return then(flow, lambda answer: answer[1])

    # --- routing ---

    @staticmethod
    def _call_route(request: pb.CallRequest) -> Route:
        """A call goes to its session's daemon, else to its call id's; a call of the
        `call_status` tool to the daemon of the call it asks about (by that id's
        rendezvous, as the call itself went), the only one that knows it."""
        if request.session_id:
            return Route(RouteKind.SESSION, request.session_id)
        if request.tool == "call_status":
            return Route(RouteKind.NEW_CALL, _asked_call_id(request) or request.call_id)
        return Route(RouteKind.NEW_CALL, request.call_id)

    @staticmethod
    def _approve_route(request: pb.ApproveRequest) -> Route:
        return Route(RouteKind.CALL, request.call_id)

    @staticmethod
    def _session_route(request: Any) -> Route:
        """The daemon of the session a request names (`session_id`)."""
        return Route(RouteKind.SESSION, request.session_id)

    @staticmethod
    def _lost_info(result: pb.Result) -> pb.CallInfo:
        """What `get_call` answers for a call whose daemon is gone."""
        return pb.CallInfo(
            call_id=result.call_id,
            state=pb.CALL_STATE_LOST,
            has_result=True,
            result=result,
            daemon_id=result.daemon_id,
        )

    @staticmethod
    def _lost_cancel(result: pb.Result) -> pb.CancelResponse:
        """What `cancel` answers for a call whose daemon is gone."""
        return pb.CancelResponse(state=pb.CALL_STATE_LOST)

    # --- tools and calls ---

    def _plan_list_tools(self) -> Flow[list[ToolInfo]]:
        return then(self._ask(ANY, "ListTools", pb.ListToolsRequest()), self._decode_tools)

    def _plan_diagnostics(self) -> Flow[list[Any]]:
        return then(self._ask(ANY, "ListTools", pb.ListToolsRequest()), self._decode_diagnostics)

    def _plan_call(
        self, tool: str, args: dict[str, Any] | None, **options: Any
    ) -> Flow[ToolResult]:
        """`Client.call`: the Run RPC, retried under the call's id; LOST when its daemon is gone."""
        request = self._build_call_request(tool, args, **options)
        run = self._link.rpc("Run", request, deadline=False)
        flow = self._router.unary(self._call_route(request), run, on_lost=lambda lost: lost)
        return then(flow, lambda answer: self._decode_result(answer[1]))

    def _plan_stream(self, tool: str, args: dict[str, Any] | None, **options: Any) -> Flow[None]:
        """`Client.stream`: the Call RPC's events, resumed where a drop broke them."""
        request = self._build_call_request(tool, args, **options)
        call = self._link.rpc("Call", request, deadline=False)
        return self._router.follow(self._call_route(request), call)

    def _plan_attach(self, call_id: str, from_seq: int) -> Flow[None]:
        request = self._build_attach_request(call_id, from_seq)
        attach = self._link.rpc("Attach", request, deadline=False)
        return self._router.follow(Route(RouteKind.CALL, request.call_id), attach)

    def _plan_get_call(self, call_id: str) -> Flow[CallInfo]:
        request = pb.GetCallRequest(call_id=self._check_call_id(call_id, required=True))
        route = Route(RouteKind.CALL, request.call_id)
        flow = self._ask(route, "GetCall", request, on_lost=self._lost_info)
        return then(flow, self._decode_call_info)

    def _plan_cancel(self, call_id: str) -> Flow[CallState]:
        request = pb.CancelRequest(call_id=self._check_call_id(call_id, required=True))
        route = Route(RouteKind.CALL, request.call_id)
        return then(
            self._ask(route, "Cancel", request, on_lost=self._lost_cancel), self._decode_cancel
        )

    def _plan_approve(self, call_id: str, approve: bool, reason: str = "") -> Flow[CallInfo]:
        """`Client.approve` (`approve` True) or `Client.deny` (False, with `reason`)."""
        request = self._build_approve_request(call_id, approve, reason)
        flow = self._ask(self._approve_route(request), "Approve", request)
        return then(flow, self._decode_call_info)

    # --- sessions and workspace files ---

    def _plan_open_session(self, request: pb.CreateSessionRequest) -> Flow[SessionInfo]:
        """The one CreateSession RPC, never retried (see `Client.session`)."""
        rpc = self._link.rpc("CreateSession", request)
        flow = self._router.unary(Route(RouteKind.NEW_SESSION), rpc, retry=False)
        return then(flow, self._opened)

    def _opened(self, answer: tuple[Daemon, pb.SessionInfo]) -> SessionInfo:
        return self._router.opened_session(answer[0], decode_session_info(answer[1]))

    def _plan_set_session_egress(self, session_id: str, rules: Sequence[str]) -> Flow[SessionInfo]:
        """`Client.set_session_egress`: retried (the same rules set twice are the same)."""
        request = set_egress_request(session_id, rules)
        flow = self._ask(self._session_route(request), "SetSessionEgress", request, retry=True)
        return then(flow, decode_session_info)

    def _plan_list_sessions(self, all_clients: bool) -> Flow[list[SessionInfo]]:
        flow = self._router.each(self._link.rpc("ListSessions", list_sessions_request(all_clients)))
        return then(flow, lambda answers: [i for resp in answers for i in decode_sessions(resp)])

    def _plan_close_session(self, session_id: str) -> Flow[SessionInfo]:
        request = close_session_request(session_id)
        return self._closed(
            request, self._ask(self._session_route(request), "CloseSession", request, retry=True)
        )

    @staticmethod
    def _closed(request: pb.CloseSessionRequest, flow: Flow[Any]) -> Flow[SessionInfo]:
        try:
            answer = yield from flow
        except SessionEndedError as e:
            return session_closed_with_daemon(request.session_id, e)
        return decode_session_info(answer)

    def _plan_upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> Flow[int]:
        upload = self._link.rpc("UploadFile", messages=upload_messages(session_id, path, data))
        flow = self._router.unary(Route(RouteKind.SESSION, session_id), upload)
        return then(flow, lambda answer: decode_file_info(answer[1]))

    def _plan_download_file(self, session_id: str, path: str) -> Flow[bytes]:
        request = download_request(session_id, path)
        download = self._link.rpc("DownloadFile", request, streamed=True)
        flow = self._router.unary(self._session_route(request), download)
        return then(flow, lambda answer: b"".join(chunk.data for chunk in answer[1]))

    # --- processes of a session (`session.processes`) ---

    def _plan_process(self, method: str, request: Any, *, deadline: bool = True) -> Flow[Any]:
        """Unary process `method` at the session's daemon; not retried (a start or a
        signal twice is not the same as once). Without `deadline`: WaitProcess
        and a stop, which the daemon bounds itself."""
        rpc = self._link.rpc(method, request, deadline=deadline)
        flow = self._router.unary(self._session_route(request), rpc, retry=False)
        return then(flow, lambda answer: answer[1])

    def _plan_process_daemon(self, request: Any) -> Flow[Daemon]:
        """The daemon of the session a process's output stream is read from."""
        return self._router.stream_daemon(self._session_route(request))

    # --- artifacts ---

    def _plan_get_artifact(self, artifact_id: str) -> Flow[bytes]:
        request = get_artifact_request(artifact_id)
        get = self._link.rpc("GetArtifact", request, streamed=True)
        flow = self._router.unary(Route(RouteKind.ARTIFACT, request.artifact_id), get)
        return then(flow, lambda answer: join_chunks(answer[1]))

    def _plan_list_artifacts(
        self, call_id: str | None, session_id: str | None
    ) -> Flow[list[ArtifactInfo]]:
        first = list_artifacts_request(call_id, session_id)

        def every_page(daemon: Daemon) -> Flow[pb.ListArtifactsResponse]:
            # Each daemon's pages in turn; a retry of this daemon starts over.
            pages: list[pb.ListArtifactsResponse] = []
            request: pb.ListArtifactsRequest | None = first
            while request is not None:
                pages.append((yield Try(daemon, self._link.rpc("ListArtifacts", request))))
                request = next_page(first, pages[-1], len(pages))
            return join_pages(pages)

        return then(self._router.each(every_page), merge_artifacts)

    def _plan_delete_artifact(self, artifact_id: str) -> Flow[bool]:
        request = delete_artifact_request(artifact_id)
        route = Route(RouteKind.ARTIFACT, request.artifact_id)
        flow = self._ask(route, "DeleteArtifact", request, retry=True)
        return then(flow, lambda answer: bool(answer.deleted))

    # --- call history (ListCalls) ---

    def _plan_list_calls(self, **filters: Any) -> Flow[CallPage]:
        """`Client.list_calls`: one daemon's page as it answers it; over many, their
        pages merged under a composite cursor (`tooljail._history`). Retried
        (a read). The arguments are checked here, at once."""
        request = list_calls_request(**filters)
        if not self._router.routed:
            return then(self._ask(ANY, "ListCalls", request, retry=True), self._call_page)
        return self._list_calls_routed(request)

    def _list_calls_routed(self, request: pb.ListCallsRequest) -> Flow[CallPage]:
        cursors = decode_cursors(request.cursor)

        def ask(daemon: Daemon, limit: int) -> Flow[tuple[str, pb.ListCallsResponse] | None]:
            cursor = cursors.get(daemon.daemon_id, "")
            if cursor is None or not limit:
                return None  # this daemon has no more, or nothing to ask again
            asked = from_cursor(request, cursor, limit)
            return daemon.daemon_id, (yield Try(daemon, self._link.rpc("ListCalls", asked)))

        limit = request.limit or DEFAULT_LIMIT
        answers = yield from self._router.each(lambda daemon: ask(daemon, limit))
        merge = Merge.of(limit, cursors, [a for a in answers if a is not None])
        if merge.partial:
            again = yield from self._router.each(
                lambda daemon: ask(daemon, merge.partial.get(daemon.daemon_id, 0))
            )
            settled = dict(a for a in again if a is not None)
            for daemon_id in merge.partial:
                merge.settle(daemon_id, settled.get(daemon_id))
        calls, next_cursor = merge.page()
        return CallPage(
            calls=tuple(self._decode_call_info(c) for c in calls), next_cursor=next_cursor
        )

    def _call_page(self, answer: pb.ListCallsResponse) -> CallPage:
        return CallPage(
            calls=tuple(self._decode_call_info(c) for c in answer.calls),
            next_cursor=answer.next_cursor,
        )

    # --- the approval queue (`tooljail._approvals`) ---

    def _plan_list_approvals(self) -> Flow[list[CallInfo]]:
        """`Client.list_approvals`: every daemon's waiting calls, merged, oldest first."""
        flow = self._router.each(self._link.rpc("ListApprovals", pb.ListApprovalsRequest()))
        return then(flow, sort_waiting)

    def _plan_watch_approvals(self) -> Flow[list[tuple[Daemon, Any]]]:
        """`Client.watch_approvals`: a WatchApprovals stream started at every reachable
        daemon (at the one daemon of a single target), no deadline; not retried."""
        rpc = self._link.rpc("WatchApprovals", pb.WatchApprovalsRequest(), deadline=False)

        def start(daemon: Daemon) -> Flow[tuple[Daemon, Any]]:
            return daemon, rpc.start(daemon.stub)  # no I/O: the stream is read later
            yield  # a flow

        return self._router.each(start)


def _asked_call_id(request: pb.CallRequest) -> str:
    """The `call_id` a call_status request asks about; "" if its arguments name none."""
    try:
        arguments = json.loads(request.arguments_json or "{}")
    except ValueError:
        return ""
    asked = arguments.get("call_id") if isinstance(arguments, dict) else None
    return asked if isinstance(asked, str) else ""
