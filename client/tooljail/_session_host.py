"""What a session needs of the client that made it: `SessionHost` and `AsyncSessionHost`.

A session fills in its id and calls its client's own methods; it names only
these methods, as a Protocol, so `_session` does not import `_client` (which
imports `_session` to make one) and the SDK has no import circle. `Client`
and `AsyncClient` satisfy them as they are (mypy checks it where they hand
themselves to a session).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tooljail._types import Output, SessionInfo, ToolResult
from tooljail.v1 import tooljail_pb2 as pb

if TYPE_CHECKING:
    from tooljail._forward import AsyncForward, Forward
    from tooljail._terminal import AsyncTerminal, Opening, Terminal

__all__ = ["AsyncSessionHost", "SessionHost"]


class SessionHost(Protocol):
    """The blocking client's methods a `Session` calls (as `Client`'s)."""

    def call(
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
    ) -> ToolResult: ...

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
    ) -> Generator[Output | ToolResult, None, None]: ...

    def close_session(self, session_id: str) -> SessionInfo: ...

    def set_session_egress(self, session_id: str, rules: Sequence[str]) -> SessionInfo: ...

    def upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> int: ...

    def download_file(self, session_id: str, path: str) -> bytes: ...

    def terminal(
        self,
        session_id: str,
        *,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Terminal: ...

    def forward(self, session_id: str, port: int, *, local_port: int = 0) -> Forward: ...

    def _process_rpc(self, method: str, request: Any, *, deadline: bool = True) -> Any: ...

    def _process_output(
        self, request: pb.ReadProcessOutputRequest
    ) -> Generator[pb.ProcessOutput, None, None]: ...

    def _watch_events(
        self, request: pb.WatchWorkspaceRequest
    ) -> tuple[Generator[pb.WorkspaceEvent, None, None], Callable[[], object]]: ...


class AsyncSessionHost(Protocol):
    """The asyncio client's methods an `AsyncSession` calls (as `AsyncClient`'s)."""

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> ToolResult: ...

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
    ) -> AsyncGenerator[Output | ToolResult, None]: ...

    async def close_session(self, session_id: str) -> SessionInfo: ...

    async def set_session_egress(self, session_id: str, rules: Sequence[str]) -> SessionInfo: ...

    async def upload_file(
        self, session_id: str, path: str, data: bytes | bytearray | memoryview
    ) -> int: ...

    async def download_file(self, session_id: str, path: str) -> bytes: ...

    def terminal(
        self,
        session_id: str,
        *,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Opening[AsyncTerminal]: ...

    def forward(
        self, session_id: str, port: int, *, local_port: int = 0
    ) -> Opening[AsyncForward]: ...

    async def _process_rpc(self, method: str, request: Any, *, deadline: bool = True) -> Any: ...

    def _process_output(
        self, request: pb.ReadProcessOutputRequest
    ) -> AsyncGenerator[pb.ProcessOutput, None]: ...

    async def _watch_events(
        self, request: pb.WatchWorkspaceRequest
    ) -> tuple[AsyncGenerator[pb.WorkspaceEvent, None], Callable[[], object]]: ...

    async def _create_session(self, request: pb.CreateSessionRequest) -> SessionInfo: ...
