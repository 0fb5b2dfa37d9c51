"""`tooljail mcp`: the daemon's tools served to MCP clients, over stdio or streamable HTTP.

    tooljail mcp                               # stdio: an MCP client spawns it
    tooljail mcp --listen 127.0.0.1:8765       # streamable HTTP at http://127.0.0.1:8765/mcp
    tooljail mcp --stateful --tools execute_python_code,read_file

Built on the `mcp` package's low-level `Server`: the tools are the daemon's
(built-in, user, workspace and artifact tools), listed at run time with their
JSON schemas and the optional `timeout_s` every adapter adds, so they are not
Python functions known when this module loads, as `MCPServer` (FastMCP) wants.

- A call's failure (the tool's error, a timeout with its call id, a
  cancellation, the daemon's refusal) is an `isError: true` result whose text
  says what happened, never a raised exception: mcp sends a client only
  "Internal error" for those, and the model could not act on it.
- A streaming tool's output goes out as it arrives, as MCP progress
  notifications whose `message` is the text, when the client sent a progress
  token; the result still carries the whole text.
- With `stateful`, each MCP client gets one tooljail session, opened at its
  first call and closed when the client goes: over stdio the one client of
  the process; over HTTP each MCP session (`Mcp-Session-Id`). The 2026-07-28
  protocol has no sessions, so a stateful HTTP server answers
  `server/discover` with the handshake versions only, which makes
  `mode="auto"` clients open a session with the 2025 handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from tooljail import __version__
from tooljail._async_client import AsyncClient
from tooljail._async_session import AsyncSession
from tooljail.errors import SessionEndedError, TooljailError
from tooljail.integrations.core import (
    AsyncTarget,
    Outcome,
    ToolSpec,
    arun,
    astream,
    atool_specs,
    require,
)

require("mcp", "mcp")

# After `require`, so that a missing `mcp` names the extra to install.
import mcp_types as types  # noqa: E402
import uvicorn  # noqa: E402
from mcp.server.context import ServerRequestContext  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.server.stdio import stdio_server  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS  # noqa: E402

__all__ = ["Bridge", "bind", "main", "parse_listen", "serve_http", "serve_stdio"]

HTTP_PATH = "/mcp"
"""Where the streamable HTTP endpoint is: `http://HOST:PORT/mcp`."""

_SESSION_KEY = "tooljail.session"
"""The key of a stateful HTTP client's session in its MCP connection's state."""

Context = ServerRequestContext[Any, Any]


class Bridge:
    """The daemon's tools as one MCP server's handlers, and stateful clients' sessions.

    Args:
        client: The daemon's client; the bridge does not close it.
        names: The tools to serve, in this order; None serves all the daemon serves.
        stateful: Give each MCP client one tooljail session, so that a variable
            set by one call is there in the next.
        one_client: The transport serves one client (stdio): its session is
            the bridge's, closed by `aclose`. Otherwise (HTTP) each MCP session
            has its own, closed when that MCP session ends.
    """

    def __init__(
        self,
        client: AsyncClient,
        names: Sequence[str] | None = None,
        *,
        stateful: bool = False,
        one_client: bool = True,
    ) -> None:
        self._client = client
        self._names = list(names) if names is not None else None
        self._stateful = stateful
        self._one_client = one_client
        self._specs: dict[str, ToolSpec] = {}
        self._session: AsyncSession | None = None
        # Two first calls of one client at once must open one session, not two.
        self._opening = asyncio.Lock()

    def server(self) -> Server[Any]:
        """A low-level MCP server whose tools are the daemon's."""
        server: Server[Any] = Server(
            "tooljail",
            version=__version__,
            instructions="Tools that run in tooljail sandboxes. Every tool takes an optional "
            "timeout_s; a call that times out may still take effect (its result names the "
            "call id).",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        if self._stateful and not self._one_client:

            async def discover(
                ctx: Context, params: types.RequestParams | None
            ) -> types.DiscoverResult:
                # A legacy advertisement: mcp's `auto` clients then use the handshake,
                # whose MCP session is what a tooljail session is kept for.
                return types.DiscoverResult(
                    supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                    capabilities=server.get_capabilities(),
                )

            server.add_request_handler("server/discover", types.RequestParams, discover)
        return server

    async def refresh(self) -> dict[str, ToolSpec]:
        """Lists the daemon's tools again (user tools may have changed): name -> spec.

        Raises:
            ToolNotFoundError: When a tool named at the start is no longer served.
            TransportError: When the daemon cannot be reached.
        """
        self._specs = {s.name: s for s in await atool_specs(self._client, self._names)}
        return self._specs

    async def list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        """The `tools/list` handler: every tool served, in one page.

        Raises:
            MCPError: When the daemon cannot list them, with its reason.
        """
        try:
            specs = await self.refresh()
        except TooljailError as e:
            # A protocol error, not a tool result: MCPError's message reaches the client.
            raise MCPError(types.INTERNAL_ERROR, f"tooljail: {e}") from e
        return types.ListToolsResult(tools=[_tool(spec) for spec in specs.values()])

    async def call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """The `tools/call` handler: one call's outcome, `isError` when it failed."""
        spec = self._specs.get(params.name)
        if spec is None:
            try:
                spec = (await self.refresh()).get(params.name)
            except TooljailError as e:
                return _error(f"The tools could not be listed: {e}. The tool did not run.")
            if spec is None:
                return _error(
                    f"No tool is named {params.name!r}. The tools served are: "
                    f"{', '.join(self._specs) or 'none'}."
                )
        target = await self._target(ctx)
        if isinstance(target, str):
            return _error(target)
        call_id = uuid.uuid4().hex
        try:
            if spec.streaming:
                outcome = await _stream(ctx, target, spec, params.arguments, call_id)
            else:
                outcome = await arun(target, spec, params.arguments, call_id=call_id)
        except asyncio.CancelledError:
            # The MCP client gave up on the request (notifications/cancelled, which
            # mcp turns into cancelling this handler): stop the call on the daemon
            # too, or it runs on (and holds a session's turn) for nobody.
            await asyncio.shield(self._cancel(call_id))
            raise
        if isinstance(outcome.error, SessionEndedError) and isinstance(target, AsyncSession):
            # Its text says a new session starts empty: the client's next call opens one.
            self._forget(ctx, target)
        return _result(outcome)

    async def _cancel(self, call_id: str) -> None:
        # The call may have ended, or never reached the daemon: nothing to stop.
        with contextlib.suppress(TooljailError):
            await self._client.cancel(call_id)

    async def aclose(self) -> None:
        """Closes the one client's session, if it opened one."""
        session, self._session = self._session, None
        if session is not None:
            await _close(session)

    async def _target(self, ctx: Context) -> AsyncTarget | str:
        """Where the call runs: the client, or this MCP client's session (opened now
        if it has none); a string is why the call cannot run."""
        if not self._stateful:
            return self._client
        if self._one_client:
            async with self._opening:
                if self._session is None:
                    opened = await self._open()
                    if isinstance(opened, str):
                        return opened
                    self._session = opened
                return self._session
        connection = _connection(ctx)
        if connection is None or connection.session_id is None:
            return (
                "This server keeps a session per MCP session, and this request has none: "
                "connect with the initialize handshake (mcp's Client(mode='legacy') or "
                "mode='auto'), not a stateless 2026-07-28 request. The tool did not run."
            )
        async with self._opening:
            session = connection.state.get(_SESSION_KEY)
            if session is None:
                opened = await self._open()
                if isinstance(opened, str):
                    return opened
                session = connection.state[_SESSION_KEY] = opened
                # Unwound when the MCP session ends (DELETE, idle timeout, shutdown).
                connection.exit_stack.push_async_callback(_close, session)
            assert isinstance(session, AsyncSession)
            return session

    async def _open(self) -> AsyncSession | str:
        try:
            return await self._client.session()
        except TooljailError as e:
            return f"A tooljail session could not be opened: {e}. The tool did not run."

    def _forget(self, ctx: Context, session: AsyncSession) -> None:
        if self._session is session:
            self._session = None
            return
        connection = _connection(ctx)
        if connection is not None and connection.state.get(_SESSION_KEY) is session:
            del connection.state[_SESSION_KEY]


def _connection(ctx: Context) -> Any:
    """The MCP connection a request came on: its `session_id`, `state`, `exit_stack`.

    mcp 2.3 hands low-level handlers no public path to it (its `Context` rework
    is pending), though `Connection`'s state and exit stack are public for this
    use; None if a later mcp moves it.
    """
    return getattr(ctx.session, "_connection", None)


async def _close(session: AsyncSession) -> None:
    # The session may be gone already (ended by the daemon): nothing left to close.
    with contextlib.suppress(TooljailError):
        await session.close()


async def _stream(
    ctx: Context,
    target: AsyncTarget,
    spec: ToolSpec,
    arguments: dict[str, Any] | None,
    call_id: str,
) -> Outcome:
    """Runs a streaming tool, sending each piece of output as a progress notification."""
    pieces = 0
    async for item in astream(target, spec, arguments, call_id=call_id):
        if isinstance(item, Outcome):
            return item
        pieces += 1
        # A no-op when the client sent no progress token.
        await ctx.session.report_progress(pieces, None, item)
    raise AssertionError("astream ends with an Outcome")


def _tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.parameters,
        annotations=types.ToolAnnotations(idempotent_hint=spec.idempotent),
    )


def _result(outcome: Outcome) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=outcome.text)],
        # For programs: the status, call id and (on a timeout) still_running.
        structured_content=outcome.as_dict(),
        is_error=not outcome.ok,
    )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


# --- serving ----------------------------------------------------------------------


TERMINATE_GRACE_S = 10.0
"""How long SIGTERM waits for the stdio client's session to close before exiting."""


async def serve_stdio(
    client: AsyncClient, names: Sequence[str] | None = None, *, stateful: bool = False
) -> None:
    """Serves the daemon's tools to the one MCP client on stdin/stdout until it leaves."""
    bridge = Bridge(client, names, stateful=stateful, one_client=True)
    server = bridge.server()
    loop = asyncio.get_running_loop()
    # SIGTERM (the MCP client's host or a supervisor stopping us) closes the session
    # now rather than leaving it to its idle TTL, then exits. Not by cancelling the
    # server: mcp reads stdin on a worker thread, which no cancellation interrupts.
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(_terminate(bridge)))
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        await bridge.aclose()


async def _terminate(bridge: Bridge) -> None:
    try:
        await asyncio.wait_for(bridge.aclose(), TERMINATE_GRACE_S)
    finally:
        os._exit(0)  # the stdin reader thread would hold a normal exit up


async def serve_http(
    client: AsyncClient,
    sock: socket.socket,
    names: Sequence[str] | None = None,
    *,
    stateful: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves the daemon's tools over streamable HTTP on `sock` until SIGINT or SIGTERM.

    Args:
        client: The daemon's client.
        sock: A bound socket (`parse_listen` then `bind`); uvicorn listens on it.
        names: The tools to serve; None serves all.
        stateful: One tooljail session per MCP session.
        on_ready: Called with the endpoint's URL once connections to it wait to be served.
    """
    host, port = sock.getsockname()[:2]
    bridge = Bridge(client, names, stateful=stateful, one_client=False)
    app = bridge.server().streamable_http_app(streamable_http_path=HTTP_PATH, host=host)
    server = _Uvicorn(uvicorn.Config(app, log_level="warning", lifespan="on"))
    # Listening already, connections wait in the backlog until uvicorn accepts
    # them: the URL can be given out now, without polling for uvicorn's start.
    sock.listen(128)
    if on_ready is not None:
        shown = f"[{host}]" if ":" in host else host
        on_ready(f"http://{shown}:{port}{HTTP_PATH}")
    await server.serve(sockets=[sock])


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, but `tooljail mcp` ends with status 0 on SIGINT or SIGTERM.

    As `tooljail serve` does; uvicorn raises the signal again once it has shut
    down, which would end the process by that signal instead.
    """

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[IPv6]:PORT`) as a host and a port (0: any free port).

    Raises:
        ValueError: When it is not of that form.
    """
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen takes HOST:PORT (e.g. 127.0.0.1:8765), got {listen!r}")
    return host, int(port)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port`, for `serve_http`.

    Raises:
        OSError: When it cannot be bound (the port is taken, the host is not ours).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(
    target: str | None,
    sock: socket.socket | None,
    names: Sequence[str] | None,
    stateful: bool,
    on_ready: Callable[[str], None] | None,
) -> None:
    async with AsyncClient(target) as client:
        # Fail at the start, saying why, rather than at the MCP client's first request.
        await atool_specs(client, names)
        if sock is None:
            await serve_stdio(client, names, stateful=stateful)
        else:
            await serve_http(client, sock, names, stateful=stateful, on_ready=on_ready)


def main(
    target: str | None = None,
    *,
    listen: str | None = None,
    names: Sequence[str] | None = None,
    stateful: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serves the daemon's tools over MCP until the client leaves (stdio) or a signal (HTTP).

    Args:
        target: The daemon (None: `TOOLJAIL_TARGET`, else the default socket).
        listen: `HOST:PORT` to serve streamable HTTP on; None serves stdio.
        names: The tools to serve; None serves all the daemon serves.
        stateful: One tooljail session per MCP client.
        on_ready: With `listen`, called with the endpoint's URL once it serves.

    Raises:
        ValueError: When `listen` is not `HOST:PORT`.
        OSError: When its address cannot be bound.
        ToolNotFoundError: When a named tool is not served.
        TooljailError: When the daemon cannot be reached.
    """
    sock = None if listen is None else bind(*parse_listen(listen))
    try:
        asyncio.run(_serve(target, sock, names, stateful, on_ready))
    finally:
        if sock is not None:
            sock.close()
