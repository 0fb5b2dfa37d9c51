"""`AsyncSession`, the asyncio twin of `Session`, and what `AsyncClient.session()` returns.

`AsyncClient.session(...)` checks its options at once and returns an
`_AsyncSessionStart`, which opens the session when awaited or entered:

    async with client.session() as s:   # closed at the end of the block
        ...
    s = await client.session()          # closed by `await s.close()`
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from tooljail._async_processes import AsyncProcesses
from tooljail._forward import AsyncForward
from tooljail._session_base import _SessionBase
from tooljail._session_host import AsyncSessionHost
from tooljail._terminal import AsyncTerminal, Opening
from tooljail._types import Output, SessionInfo, SessionState, ToolResult
from tooljail._watch import AsyncWatch, watch_request
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncSession"]


class AsyncSession(_SessionBase):
    """A session through an `AsyncClient`: the async twin of `Session`, same contract.

    Example:
        async with client.session(idle_ttl_s=300) as s:
            await s.call("execute_python_code", {"code": "x = 41"})
            result = await s.call("execute_python_code", {"code": "print(x + 1)"})
            print(result.data["stdout"])  # 42
    """

    _client: AsyncSessionHost

    @property
    def processes(self) -> AsyncProcesses:
        """Its background processes: start, list, read, follow, write, signal, stop, wait."""
        return AsyncProcesses(self._client, self.id)

    def watch(self, path: str = "", recursive: bool = True) -> Opening[AsyncWatch]:
        """The changes of a workspace directory, as they happen: `await` it (or
        `async with` it) for an async iterator of `WorkspaceEvent`, in place once
        the await ends; `close()` stops it. See `Session.watch`.

        Raises:
            TypeError: `path` is no str.
        """
        request = watch_request(self.id, path, recursive)
        return Opening(lambda: AsyncWatch.open(self._client._watch_events(request)))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._closing_after(exc):
            await self.close()

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        # Deprecated name of tool_timeout_s (a tool's run time, not an await deadline).
        timeout: float | None = None,  # noqa: ASYNC109
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> ToolResult:
        """Runs a tool in this session. See `Session.call`."""
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return await self._client.call(tool, args, session_id=self.id, timeout=timeout, **options)

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Runs a tool in this session, yielding its output. See `Session.stream`."""
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return self._client.stream(tool, args, session_id=self.id, timeout=timeout, **options)

    async def set_egress(self, rules: Sequence[str]) -> SessionInfo:
        """Replaces this session's egress rules, live.

        See `Session.set_egress`.
        """
        self._info = await self._client.set_session_egress(self.id, rules)
        return self._info

    async def upload(self, path: str, data: bytes | bytearray | memoryview) -> int:
        """Writes `data` to `path` in the workspace. See `Session.upload`."""
        return await self._client.upload_file(self.id, path, data)

    async def download(self, path: str) -> bytes:
        """The content of `path` in the workspace. See `Session.download`."""
        return await self._client.download_file(self.id, path)

    # --- a terminal and forwarded ports (issue 24) ---

    def terminal(
        self,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Opening[AsyncTerminal]:
        """Opens a shell on a PTY in this session: `await` it or `async with` it.
        See `Session.terminal`."""
        return self._client.terminal(self.id, rows=rows, cols=cols, argv=argv, env=env)

    def forward(self, port: int, *, local_port: int = 0) -> Opening[AsyncForward]:
        """Tunnels a local port to `port` on this session's loopback: `await` it or
        `async with` it. See `Session.forward`."""
        return self._client.forward(self.id, port, local_port=local_port)

    async def close(self) -> SessionInfo:
        """Ends the session. See `Session.close`."""
        if self._info.state is not SessionState.CLOSED:
            self._info = await self._client.close_session(self.id)
        return self._info


class _AsyncSessionStart:
    """A session about to open: `await` it for the `AsyncSession`, or `async with` it.

    It opens one session, once: awaiting or entering it a second time raises
    `RuntimeError` rather than open another. Never awaited, it opens nothing.
    """

    def __init__(self, client: AsyncSessionHost, request: pb.CreateSessionRequest) -> None:
        self._client = client
        self._request = request
        self._used = False
        self._session: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        if self._used:
            raise RuntimeError("this client.session(...) was already awaited: call it again")
        self._used = True
        return AsyncSession(self._client, await self._client._create_session(self._request))

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._open()
        return self._session

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:  # None only when __aenter__ raised
            await self._session.__aexit__(exc_type, exc, tb)
