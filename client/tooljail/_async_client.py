"""`AsyncClient`, the asyncio twin of `Client`: the same contract, awaited.

Only the methods that touch the channel are here; the rest is `_BaseClient`'s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import grpc.aio

from tooljail._artifact_base import (
    decode_artifacts,
    delete_artifact_request,
    get_artifact_request,
    join_chunks,
    list_artifacts_request,
)
from tooljail._async_session import _AsyncSessionStart
from tooljail._client_base import _BaseClient, _new_stub, _Progress
from tooljail._session_base import (
    close_session_request,
    create_session_request,
    decode_file_info,
    decode_session_info,
    decode_sessions,
    download_request,
    list_sessions_request,
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
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncClient"]

_T = TypeVar("_T")


class AsyncClient(_BaseClient):
    """An asyncio client of one tooljail daemon; the async twin of `Client`.

    Create it inside the event loop that uses it (gRPC binds the channel to it).

    Example:
        async with AsyncClient() as client:
            async for item in client.stream("execute_python_code_stream", {...}):
                ...

    Args:
        target: As for `Client`.
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
        target: str | None = None,
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
        self._channel: grpc.aio.Channel = self._open_channel(grpc.aio)
        self._stub = _new_stub(self._channel)

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
        """Closes the channel; RPCs still in flight are cancelled."""
        await self._channel.close()

    async def _retried(self, send: Callable[[], Awaitable[_T]], *, retry: bool = True) -> _T:
        """`await send()`, the RPC, with its failure mapped. See `Client._retried`."""
        attempt = 0
        while True:
            try:
                return await send()
            except grpc.RpcError as e:
                error = self._map_rpc_error(e)
                if not (retry and self._should_retry(error, attempt)):
                    raise error from e
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1

    async def _unary(self, method: Callable[..., Any], request: Any, *, retry: bool = False) -> Any:
        return await self._retried(
            lambda: method(
                request, timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            ),
            retry=retry,
        )

    async def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves. See `Client.list_tools`."""
        resp: pb.ListToolsResponse = await self._unary(self._stub.ListTools, pb.ListToolsRequest())
        return self._decode_tools(resp)

    async def diagnostics(self) -> list[Diagnostic]:
        """The problems found while loading user tools. See `Client.diagnostics`."""
        resp: pb.ListToolsResponse = await self._unary(self._stub.ListTools, pb.ListToolsRequest())
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
        return self._decode_result(
            await self._retried(
                lambda: self._stub.Run(request, wait_for_ready=False, metadata=self._metadata)
            )
        )

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
        return self._stream(request)

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Follows a call the daemon knows. See `Client.attach`."""
        request = self._build_attach_request(call_id, from_seq)
        return self._follow(
            lambda: self._stub.Attach(request, wait_for_ready=False, metadata=self._metadata),
            request,
        )

    def _stream(self, request: pb.CallRequest) -> AsyncGenerator[Output | ToolResult, None]:
        return self._follow(
            lambda: self._stub.Call(request, wait_for_ready=False, metadata=self._metadata), request
        )

    async def _follow(
        self, start: Callable[[], Any], request: pb.CallRequest | pb.AttachRequest
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """The events of one call; a dropped connection is resumed where it broke."""
        progress = _Progress(request)
        attempt = 0
        rpc = start()
        while True:
            try:
                async for event in rpc:
                    if progress.result is not None:
                        continue  # nothing may follow the Result (see Client._follow)
                    item = progress.take(self._decode_event(event))
                    if item is not None:
                        yield item
                break
            except grpc.RpcError as e:
                if progress.result is not None:
                    break
                error = self._map_rpc_error(e)
                if not self._should_retry(error, attempt):
                    raise error from e
            finally:
                if progress.result is None:
                    rpc.cancel()
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1
            rpc = progress.resume(self._stub, start, self._metadata)
        if progress.result is None:
            raise self._no_result_error()

    async def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call. See `Client.get_call`."""
        request = pb.GetCallRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CallInfo = await self._unary(self._stub.GetCall, request)
        return self._decode_call_info(resp)

    async def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call. See `Client.cancel`."""
        request = pb.CancelRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CancelResponse = await self._unary(self._stub.Cancel, request)
        return self._decode_cancel(resp)

    async def approve(self, call_id: str) -> CallInfo:
        """Approves a call that waits for approval. See `Client.approve`."""
        request = self._build_approve_request(call_id, True, "")
        return self._decode_call_info(await self._unary(self._stub.Approve, request))

    async def deny(self, call_id: str, reason: str = "") -> CallInfo:
        """Denies a call that waits for approval. See `Client.deny`."""
        request = self._build_approve_request(call_id, False, reason)
        return self._decode_call_info(await self._unary(self._stub.Approve, request))

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
        return decode_session_info(await self._unary(self._stub.CreateSession, request))

    async def list_sessions(self, *, all_clients: bool = False) -> list[SessionInfo]:
        """The open sessions of this client, or of every client. See `Client.list_sessions`."""
        resp: pb.ListSessionsResponse = await self._unary(
            self._stub.ListSessions, list_sessions_request(all_clients), retry=True
        )
        return decode_sessions(resp)

    async def close_session(self, session_id: str) -> SessionInfo:
        """Ends a session. See `Client.close_session`."""
        request = close_session_request(session_id)
        resp: pb.SessionInfo = await self._unary(self._stub.CloseSession, request, retry=True)
        return decode_session_info(resp)

    async def upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> int:
        """Writes `data` to `path` in a session's workspace. See `Client.upload_file`."""
        make_chunks = upload_messages(session_id, path, data)
        resp: pb.FileInfo = await self._retried(
            lambda: self._stub.UploadFile(
                make_chunks(),
                timeout=self._timeout,
                wait_for_ready=False,
                metadata=self._metadata,
            )
        )
        return decode_file_info(resp)

    async def download_file(self, session_id: str, path: str) -> bytes:
        """The content of `path` in a session's workspace. See `Client.download_file`."""
        request = download_request(session_id, path)

        async def gather() -> bytes:
            rpc = self._stub.DownloadFile(
                request, timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            )
            return b"".join([chunk.data async for chunk in rpc])

        return await self._retried(gather)

    # --- artifacts ---

    async def get_artifact(self, artifact_id: str) -> bytes:
        """The bytes of an artifact this client's calls made. See `Client.get_artifact`."""
        request = get_artifact_request(artifact_id)

        async def gather() -> bytes:
            rpc = self._stub.GetArtifact(
                request, timeout=self._timeout, wait_for_ready=False, metadata=self._metadata
            )
            return join_chunks([chunk async for chunk in rpc])

        return await self._retried(gather)

    async def list_artifacts(
        self, *, call_id: str | None = None, session_id: str | None = None
    ) -> list[ArtifactInfo]:
        """This client's kept artifacts, newest first. See `Client.list_artifacts`."""
        request = list_artifacts_request(call_id, session_id)
        return decode_artifacts(await self._unary(self._stub.ListArtifacts, request, retry=True))

    async def delete_artifact(self, artifact_id: str) -> bool:
        """Deletes an artifact of this client's. See `Client.delete_artifact`."""
        request = delete_artifact_request(artifact_id)
        resp: pb.DeleteArtifactResponse = await self._unary(
            self._stub.DeleteArtifact, request, retry=True
        )
        return resp.deleted
