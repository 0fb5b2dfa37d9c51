"""`AsyncClient`, the asyncio twin of `Client`: the same contract, awaited.

Each method awaits the flow `_ClientPlans` makes for it (`Client` runs the
same flow with blocking calls); the contract of each is in `Client`'s docstrings.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import grpc

from tooljail._async_router import AsyncRouter
from tooljail._async_session import _AsyncSessionStart
from tooljail._call_types import CallInfo, CallPage
from tooljail._client_approvals import _AsyncApprovals
from tooljail._forward import AsyncForward, check_ports
from tooljail._session_base import SessionOptions, create_session_request
from tooljail._terminal import AsyncTerminal, Opening, open_request, session_stream_target_async
from tooljail._types import (
    ArtifactInfo,
    CallState,
    CallStatus,
    Diagnostic,
    Output,
    SessionInfo,
    ToolInfo,
    ToolResult,
)
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncClient"]


class AsyncClient(_AsyncApprovals):
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
        rpc_timeout_s: As for `Client`: the deadline of each try of a unary
            RPC; None means none. Not the tool's timeout (`tool_timeout_s`).
        retries: As for `Client`.
        client_name: As for `Client`: the name this client goes by (unauthenticated).
        token, tls_ca_file, tls_cert_file, tls_key_file: As for `Client` (and
            from the same environment variables).
        timeout: Deprecated: the old name of `rpc_timeout_s`.

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the target is unusable or `rpc_timeout_s`
            is not a positive number.
    """

    _router: AsyncRouter

    def _new_router(self) -> AsyncRouter:
        return AsyncRouter(self._link, self._targets)

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

    async def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves. See `Client.list_tools`."""
        return await self._router.run(self._plan_list_tools())

    async def diagnostics(self) -> list[Diagnostic]:
        """The problems found while loading user tools. See `Client.diagnostics`."""
        return await self._router.run(self._plan_diagnostics())

    async def openai_tools(self) -> list[dict[str, Any]]:
        """The served tools as OpenAI tool definitions. See `Client.openai_tools`."""
        return self._openai_tools(await self.list_tools())

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
        # Deprecated name of tool_timeout_s (a tool's run time, not an await deadline).
        timeout: float | None = None,  # noqa: ASYNC109
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> ToolResult:
        """Runs a tool and waits for its result. See `Client.call` for the contract.

        Cancelling the awaiting task cancels the RPC only, not the call on the daemon.
        """
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return await self._router.run(
            self._plan_call(tool, args, session_id=session_id, timeout=timeout, **options)
        )

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Runs a tool and yields its output as it arrives, then its result.

        Arguments are checked when `stream` is called. Closing the iterator early
        (`break` then `aclose()`, e.g. via `contextlib.aclosing`) cancels the RPC
        only: the call keeps running on the daemon; use `cancel(call_id)` to stop
        it. See `Client.stream`.
        """
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return self._router.stream(
            self._plan_stream(tool, args, session_id=session_id, timeout=timeout, **options)
        )

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Follows a call the daemon knows. See `Client.attach`."""
        return self._router.stream(self._plan_attach(call_id, from_seq))

    async def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call. See `Client.get_call`."""
        return await self._router.run(self._plan_get_call(call_id))

    async def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call. See `Client.cancel`."""
        return await self._router.run(self._plan_cancel(call_id))

    async def approve(self, call_id: str) -> CallInfo:
        """Approves a call that waits for approval. See `Client.approve`."""
        return await self._router.run(self._plan_approve(call_id, True))

    async def deny(self, call_id: str, reason: str = "") -> CallInfo:
        """Denies a call that waits for approval. See `Client.deny`."""
        return await self._router.run(self._plan_approve(call_id, False, reason))

    # --- sessions and workspace files ---

    def session(self, **options: Unpack[SessionOptions]) -> _AsyncSessionStart:
        """Opens a session: `async with client.session() as s:` or `s = await client.session()`.

        The options (keywords, as `Client.session`'s) are checked at once; the
        session opens when the returned object is awaited or entered (once),
        and an `async with` block closes it at its end. Not retried: see
        `Client.session`, which has the contract, the options and the errors.
        """
        return _AsyncSessionStart(self, create_session_request(**options))

    async def _create_session(self, request: pb.CreateSessionRequest) -> SessionInfo:
        """The one CreateSession RPC, never retried (see `Client.session`)."""
        return await self._router.run(self._plan_open_session(request))

    async def set_session_egress(self, session_id: str, rules: Sequence[str]) -> SessionInfo:
        """Replaces the egress rules of an open session. See `Client.set_session_egress`."""
        return await self._router.run(self._plan_set_session_egress(session_id, rules))

    async def list_sessions(self, *, all_clients: bool = False) -> list[SessionInfo]:
        """The open sessions of this client, or of every client. See `Client.list_sessions`."""
        return await self._router.run(self._plan_list_sessions(all_clients))

    async def close_session(self, session_id: str) -> SessionInfo:
        """Ends a session. See `Client.close_session`."""
        return await self._router.run(self._plan_close_session(session_id))

    async def upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> int:
        """Writes `data` to `path` in a session's workspace. See `Client.upload_file`."""
        return await self._router.run(self._plan_upload_file(session_id, path, data))

    async def download_file(self, session_id: str, path: str) -> bytes:
        """The content of `path` in a session's workspace. See `Client.download_file`."""
        return await self._router.run(self._plan_download_file(session_id, path))

    # --- a terminal and forwarded ports (issue 24; tooljail._terminal, tooljail._forward) ---

    def terminal(
        self,
        session_id: str,
        *,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Opening[AsyncTerminal]:
        """Opens a shell on a PTY in a session: `await` it or `async with` it.

        See `Client.terminal`; the arguments are checked at once.
        """
        first = open_request(session_id, rows, cols, argv, env)

        async def opening() -> AsyncTerminal:
            stub, metadata, map_error = await session_stream_target_async(self, session_id)
            return await AsyncTerminal.open(stub, metadata, map_error, first)

        return Opening(opening)

    def forward(self, session_id: str, port: int, *, local_port: int = 0) -> Opening[AsyncForward]:
        """Tunnels a local port to `port` on a session's loopback: `await` it or
        `async with` it. See `Client.forward`; the listener is an asyncio server
        on this loop."""
        session_id, port, local_port = check_ports(session_id, port, local_port)

        async def opening() -> AsyncForward:
            stub, metadata, map_error = await session_stream_target_async(self, session_id)
            return await AsyncForward.open(stub, metadata, map_error, session_id, port, local_port)

        return Opening(opening)

    # --- processes of a session (see `tooljail._async_processes`) ---

    async def _process_rpc(self, method: str, request: Any, *, deadline: bool = True) -> Any:
        return await self._router.run(self._plan_process(method, request, deadline=deadline))

    async def _process_output(
        self, request: pb.ReadProcessOutputRequest
    ) -> AsyncGenerator[pb.ProcessOutput, None]:
        """A process's output stream, read here (closing it cancels the RPC)."""
        messages, _ = await self._server_stream(
            "ReadProcessOutput", request, deadline=not request.follow
        )
        try:
            async for message in messages:
                yield message
        finally:
            await messages.aclose()  # closed early: the RPC is cancelled now, not at GC

    async def _watch_events(
        self, request: pb.WatchWorkspaceRequest
    ) -> tuple[AsyncGenerator[pb.WorkspaceEvent, None], Callable[[], object]]:
        """A session's workspace events, read here, and what cancels the RPC (from
        another task too; closing the generator cancels it as well)."""
        return await self._server_stream("WatchWorkspace", request, deadline=False)

    async def _server_stream(
        self,
        method: str,
        request: pb.ReadProcessOutputRequest | pb.WatchWorkspaceRequest,
        *,
        deadline: bool,
    ) -> tuple[AsyncGenerator[Any, None], Callable[[], object]]:
        """A server stream of the session's daemon (pinned as the session is):
        its messages, errors mapped, the RPC cancelled once they end; and what
        cancels it."""
        daemon = await self._router.run(self._plan_process_daemon(request))
        call = self._link.rpc(method, request, deadline=deadline).start(daemon.stub)

        async def messages() -> AsyncGenerator[Any, None]:
            try:
                async for message in call:
                    yield message
            except grpc.RpcError as e:
                raise self._router.map_error(daemon, e) from e
            finally:
                call.cancel()

        return messages(), call.cancel

    # --- artifacts ---

    async def get_artifact(self, artifact_id: str) -> bytes:
        """The bytes of an artifact this client's calls made. See `Client.get_artifact`."""
        return await self._router.run(self._plan_get_artifact(artifact_id))

    async def list_artifacts(
        self, *, call_id: str | None = None, session_id: str | None = None
    ) -> list[ArtifactInfo]:
        """This client's kept artifacts, newest first. See `Client.list_artifacts`."""
        return await self._router.run(self._plan_list_artifacts(call_id, session_id))

    async def delete_artifact(self, artifact_id: str) -> bool:
        """Deletes an artifact of this client's. See `Client.delete_artifact`."""
        return await self._router.run(self._plan_delete_artifact(artifact_id))

    # --- call history ---

    async def list_calls(
        self,
        *,
        tool: str | None = None,
        session_id: str | None = None,
        status: CallStatus | str | None = None,
        since: datetime.datetime | float | None = None,
        until: datetime.datetime | float | None = None,
        running: bool | None = None,
        client_name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> CallPage:
        """A page of the calls the daemon knows, newest first. See `Client.list_calls`."""
        return await self._router.run(
            self._plan_list_calls(tool=tool, session_id=session_id, status=status, since=since,
                                  until=until, running=running, client_name=client_name,
                                  limit=limit, cursor=cursor)
        )  # fmt: skip

    async def iter_calls(self, **filters: Any) -> AsyncIterator[CallInfo]:
        """Every call `list_calls(**filters)` finds, page after page. See `Client.iter_calls`."""
        cursor = filters.pop("cursor", None)
        while True:
            page = await self.list_calls(**filters, cursor=cursor)
            for call in page.calls:
                yield call
            if not page.next_cursor:
                return
            cursor = page.next_cursor
