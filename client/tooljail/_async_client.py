"""`AsyncClient`, the asyncio twin of `Client`: the same contract, awaited.

Only the methods that touch the channel are here; the rest is `_BaseClient`'s.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any, Self

from tooljail._artifact_base import (
    delete_artifact_request,
    get_artifact_request,
    join_chunks,
    join_pages,
    list_artifacts_request,
    merge_artifacts,
    next_page,
)
from tooljail._async_router import AsyncRouter
from tooljail._async_session import _AsyncSessionStart
from tooljail._client_base import _BaseClient
from tooljail._routing import ANY, Route, RouteKind
from tooljail._session_base import (
    close_session_request,
    create_session_request,
    decode_file_info,
    decode_session_info,
    decode_sessions,
    download_request,
    list_sessions_request,
    session_closed_with_daemon,
    upload_messages,
)
from tooljail._types import (
    ArtifactInfo,
    CallInfo,
    CallState,
    Diagnostic,
    Output,
    SessionInfo,
    ToolInfo,
    ToolResult,
)
from tooljail.errors import SessionEndedError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncClient"]


class AsyncClient(_BaseClient):
    """An asyncio client of one tooljail daemon, or of many; the async twin of `Client`.

    Create it inside the event loop that uses it (gRPC binds the channel to it).
    Over many daemons, the health checks run as a task of that loop, started
    by the first request.

    Example:
        async with AsyncClient() as client:
            async for item in client.stream("execute_python_code_stream", {...}):
                ...

    Args:
        target: As for `Client`: one daemon, a list of them, or a dns:/// name.
        timeout: As for `Client`: the deadline of each unary RPC; None means none.
        retries: As for `Client`.
        client_name: As for `Client`: the name this client goes by (unauthenticated).
        token, tls_ca_file, tls_cert_file, tls_key_file: As for `Client` (and
            from the same environment variables).

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the target is unusable or the timeout is not
            a positive number.
    """

    def __init__(
        self,
        target: str | list[str] | tuple[str, ...] | None = None,
        *,
        timeout: float | None = None,
        retries: int = 3,
        client_name: str | None = None,
        token: str | None = None,
        tls_ca_file: str | os.PathLike[str] | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(
            target, timeout=timeout, retries=retries, client_name=client_name, token=token,
            tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file, tls_key_file=tls_key_file,
        )  # fmt: skip
        self._router = AsyncRouter(self, self._targets)
        if not self._targets.routed:
            self._channel, self._stub = self._router.table.daemons[0].channel_and_stub

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channels; RPCs still in flight are cancelled."""
        await self._router.close()

    async def _unary(self, route: Route, method: str, request: Any, **options: Any) -> Any:
        """`method` of the daemon `route` names. See `Client._unary`."""
        options.setdefault("retry", False)
        return await self._router.unary(route, self._sender(method, request), **options)

    async def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves. See `Client.list_tools`."""
        resp: pb.ListToolsResponse = await self._unary(ANY, "ListTools", pb.ListToolsRequest())
        return self._decode_tools(resp)

    async def diagnostics(self) -> list[Diagnostic]:
        """The problems found while loading user tools. See `Client.diagnostics`."""
        resp: pb.ListToolsResponse = await self._unary(ANY, "ListTools", pb.ListToolsRequest())
        return self._decode_diagnostics(resp)

    async def openai_tools(self) -> list[dict[str, Any]]:
        """The served tools as OpenAI tool definitions. See `Client.openai_tools`."""
        return self._openai_tools(await self.list_tools())

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        # The tool call's own timeout, enforced by the daemon: not an await deadline.
        timeout: float | None = None,  # noqa: ASYNC109
        call_id: str | None = None,
        session_id: str | None = None,
    ) -> ToolResult:
        """Runs a tool and waits for its result. See `Client.call` for the contract.

        Cancelling the awaiting task cancels the RPC only, not the call on the daemon.
        """
        request = self._build_call_request(
            tool, args, timeout=timeout, call_id=call_id, session_id=session_id
        )
        resp: pb.Result = await self._router.unary(
            self._call_route(request),
            lambda stub: stub.Run(request, wait_for_ready=False, metadata=self._metadata),
            on_lost=lambda lost: lost,
        )
        return self._decode_result(resp)

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Runs a tool and yields its output as it arrives, then its result.

        Arguments are checked when `stream` is called. Closing the iterator early
        (`break` then `aclose()`, e.g. via `contextlib.aclosing`) cancels the RPC
        only: the call keeps running on the daemon; use `cancel(call_id)` to stop
        it. See `Client.stream`.
        """
        request = self._build_call_request(
            tool, args, timeout=timeout, call_id=call_id, session_id=session_id
        )
        return self._router.follow(
            self._call_route(request),
            lambda stub: stub.Call(request, wait_for_ready=False, metadata=self._metadata),
            request,
        )

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Follows a call the daemon knows. See `Client.attach`."""
        request = self._build_attach_request(call_id, from_seq)
        return self._router.follow(
            Route(RouteKind.CALL, request.call_id),
            lambda stub: stub.Attach(request, wait_for_ready=False, metadata=self._metadata),
            request,
        )

    async def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call. See `Client.get_call`."""
        request = pb.GetCallRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CallInfo = await self._unary(
            Route(RouteKind.CALL, request.call_id), "GetCall", request, on_lost=self._lost_info
        )
        return self._decode_call_info(resp)

    async def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call. See `Client.cancel`."""
        request = pb.CancelRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CancelResponse = await self._unary(
            Route(RouteKind.CALL, request.call_id), "Cancel", request, on_lost=self._lost_cancel
        )
        return self._decode_cancel(resp)

    async def approve(self, call_id: str) -> CallInfo:
        """Approves a call that waits for approval. See `Client.approve`."""
        request = self._build_approve_request(call_id, True, "")
        route = self._approve_route(request)
        return self._decode_call_info(await self._unary(route, "Approve", request))

    async def deny(self, call_id: str, reason: str = "") -> CallInfo:
        """Denies a call that waits for approval. See `Client.deny`."""
        request = self._build_approve_request(call_id, False, reason)
        route = self._approve_route(request)
        return self._decode_call_info(await self._unary(route, "Approve", request))

    # --- sessions and workspace files ---

    def session(
        self,
        *,
        idle_ttl_s: float | None = None,
        max_lifetime_s: float | None = None,
        memory_bytes: int | None = None,
        pids: int | None = None,
        cpus: float | None = None,
        workspace_bytes: int | None = None,
        keep_processes: bool = False,
    ) -> _AsyncSessionStart:
        """Opens a session: `async with client.session() as s:` or `s = await client.session()`.

        The options are checked at once; the session opens when the returned
        object is awaited or entered (once), and an `async with` block closes
        it at its end. Not retried: see `Client.session`, which has the
        contract, the options and the errors.
        """
        request = create_session_request(
            idle_ttl_s=idle_ttl_s,
            max_lifetime_s=max_lifetime_s,
            memory_bytes=memory_bytes,
            pids=pids,
            cpus=cpus,
            workspace_bytes=workspace_bytes,
            keep_processes=keep_processes,
        )
        return _AsyncSessionStart(self, request)

    async def _create_session(self, request: pb.CreateSessionRequest) -> SessionInfo:
        """The one CreateSession RPC, never retried (see `Client.session`)."""
        daemon, resp = await self._router.unary_at(
            Route(RouteKind.NEW_SESSION), self._sender("CreateSession", request), retry=False
        )
        return self._router.opened_session(daemon, decode_session_info(resp))

    async def list_sessions(self, *, all_clients: bool = False) -> list[SessionInfo]:
        """The open sessions of this client, or of every client. See `Client.list_sessions`."""
        send = self._sender("ListSessions", list_sessions_request(all_clients))
        return [info for resp in await self._router.each(send) for info in decode_sessions(resp)]

    async def close_session(self, session_id: str) -> SessionInfo:
        """Ends a session. See `Client.close_session`."""
        request = close_session_request(session_id)
        route = self._session_route(request)
        try:
            resp = await self._unary(route, "CloseSession", request, retry=True)
        except SessionEndedError as e:
            return session_closed_with_daemon(request.session_id, e)
        return decode_session_info(resp)

    async def upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> int:
        """Writes `data` to `path` in a session's workspace. See `Client.upload_file`."""
        make_chunks = upload_messages(session_id, path, data)
        resp: pb.FileInfo = await self._router.unary(
            Route(RouteKind.SESSION, session_id),
            lambda stub: stub.UploadFile(
                make_chunks(), timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            ),
        )
        return decode_file_info(resp)

    async def download_file(self, session_id: str, path: str) -> bytes:
        """The content of `path` in a session's workspace. See `Client.download_file`."""
        request = download_request(session_id, path)

        async def gather(stub: Any) -> bytes:
            rpc = stub.DownloadFile(
                request, timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            )
            return b"".join([chunk.data async for chunk in rpc])

        return await self._router.unary(self._session_route(request), gather)

    # --- artifacts ---

    async def get_artifact(self, artifact_id: str) -> bytes:
        """The bytes of an artifact this client's calls made. See `Client.get_artifact`."""
        request = get_artifact_request(artifact_id)

        async def gather(stub: Any) -> bytes:
            rpc = stub.GetArtifact(
                request, timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            )
            return join_chunks([chunk async for chunk in rpc])

        return await self._router.unary(Route(RouteKind.ARTIFACT, request.artifact_id), gather)

    async def list_artifacts(
        self, *, call_id: str | None = None, session_id: str | None = None
    ) -> list[ArtifactInfo]:
        """This client's kept artifacts, newest first. See `Client.list_artifacts`."""
        first = list_artifacts_request(call_id, session_id)

        async def every_page(stub: Any) -> pb.ListArtifactsResponse:
            # Each daemon's pages in turn; a retry of this daemon starts over.
            pages: list[pb.ListArtifactsResponse] = []
            request: pb.ListArtifactsRequest | None = first
            while request is not None:
                pages.append(await self._sender("ListArtifacts", request)(stub))
                request = next_page(first, pages[-1], len(pages))
            return join_pages(pages)

        return merge_artifacts(await self._router.each(every_page))

    async def delete_artifact(self, artifact_id: str) -> bool:
        """Deletes an artifact of this client's. See `Client.delete_artifact`."""
        request = delete_artifact_request(artifact_id)
        route = Route(RouteKind.ARTIFACT, request.artifact_id)
        resp: pb.DeleteArtifactResponse = await self._unary(
            route, "DeleteArtifact", request, retry=True
        )
        return resp.deleted
