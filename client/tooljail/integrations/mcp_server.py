"""`tooljail mcp`: the daemon's tools served to MCP clients, over stdio or streamable HTTP.

    tooljail mcp                               # stdio: an MCP client spawns it
    TOOLJAIL_MCP_TOKEN=... tooljail mcp --listen 127.0.0.1:8765   # http://127.0.0.1:8765/mcp
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
- Over HTTP, only requests bearing the bridge's token are served, off
  loopback only over TLS (`_mcp_http`), and each MCP session is a tenant: a
  client name of its own, and only the artifacts its own calls made are
  reachable through the bridge (`_mcp_tenants`). So that `auto` clients get an
  MCP session to be a tenant of, every HTTP bridge (stateful or not) answers
  `server/discover` with the handshake versions; a request without an MCP
  session is a tenant for that request alone.
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
from tooljail.integrations._mcp_http import (
    TOKEN_ENV,
    BearerGate,
    HttpSecurity,
    is_loopback,
    security_for,
)
from tooljail.integrations._mcp_tenants import Tenant
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
from mcp.server.transport_security import TransportSecuritySettings  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS  # noqa: E402

__all__ = [
    "TOKEN_ENV",
    "Bridge",
    "HttpSecurity",
    "bind",
    "main",
    "parse_listen",
    "security_for",
    "serve_http",
    "serve_stdio",
]

HTTP_PATH = "/mcp"
"""Where the streamable HTTP endpoint is: `http://HOST:PORT/mcp`."""

_TENANT_KEY = "tooljail.tenant"
"""The key of an HTTP client's `Tenant` in its MCP connection's state."""

Context = ServerRequestContext[Any, Any]


class Bridge:
    """The daemon's tools as one MCP server's handlers, and its MCP clients' tenants.

    Args:
        client: The daemon's client; the bridge does not close it.
        names: The tools to serve, in this order; None serves all the daemon serves.
        stateful: Give each MCP client one tooljail session, so that a variable
            set by one call is there in the next.
        one_client: The transport serves one client (stdio): it acts as
            `client`, and its session is the bridge's, closed by `aclose`.
            Otherwise (HTTP) each MCP session is a tenant with a client of its
            own from `client_for` (see `_mcp_tenants`), closed with that MCP session.
        client_for: With `one_client=False`, makes a client going by the name given.
    """

    def __init__(
        self,
        client: AsyncClient,
        names: Sequence[str] | None = None,
        *,
        stateful: bool = False,
        one_client: bool = True,
        client_for: Callable[[str], AsyncClient] | None = None,
    ) -> None:
        if not one_client and client_for is None:
            raise TypeError("a bridge of many clients needs client_for, to name each its own")
        self._client = client
        self._names = list(names) if names is not None else None
        self._stateful = stateful
        self._one_client = one_client
        self._client_for = client_for
        self._specs: dict[str, ToolSpec] = {}
        self._only = Tenant(client, owned=False, guarded=False) if one_client else None

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
        if not self._one_client:

            async def discover(
                ctx: Context, params: types.RequestParams | None
            ) -> types.DiscoverResult:
                # A legacy advertisement: mcp's `auto` clients then use the handshake,
                # whose MCP session is what a tenant (its name, its artifacts, its
                # tooljail session) is kept for.
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
        tenant = self._tenant(ctx)
        if isinstance(tenant, str):
            return _error(tenant)
        try:
            return await self._call(ctx, tenant, spec, params.arguments)
        finally:
            if not self._one_client and _connection_state(ctx) is None:
                await tenant.aclose()  # a request without an MCP session stands alone

    async def _call(
        self, ctx: Context, tenant: Tenant, spec: ToolSpec, arguments: dict[str, Any] | None
    ) -> types.CallToolResult:
        refused = tenant.refusal(spec.tool, arguments)
        if refused is not None:
            return _error(refused)
        target: AsyncTarget = tenant.client
        if self._stateful:
            opened = await tenant.open_session()
            if isinstance(opened, str):
                return _error(opened)
            target = opened
        # A fresh id: MCP's tools/call has no id of the model's, only its JSON-RPC
        # request id, which restarts with each connection (a replay would name others).
        call_id = uuid.uuid4().hex
        try:
            if spec.streaming:
                outcome = await _stream(ctx, target, spec, arguments, call_id)
            else:
                outcome = await arun(target, spec, arguments, call_id=call_id)
        except asyncio.CancelledError:
            # The MCP client gave up on the request (notifications/cancelled, which
            # mcp turns into cancelling this handler): stop the call on the daemon
            # too, or it runs on (and holds a session's turn) for nobody.
            await asyncio.shield(_cancel(tenant.client, call_id))
            raise
        outcome = tenant.note(spec.tool, call_id, outcome)
        if isinstance(outcome.error, SessionEndedError) and isinstance(target, AsyncSession):
            # Its text says a new session starts empty: the client's next call opens one.
            tenant.forget(target)
        return _result(outcome)

    async def aclose(self) -> None:
        """Closes the one client's session, if it opened one."""
        if self._only is not None:
            await self._only.aclose()

    def _tenant(self, ctx: Context) -> Tenant | str:
        """The MCP client this request is from (made now if new); a string is why
        the call cannot run."""
        if self._only is not None:
            return self._only
        assert self._client_for is not None  # checked in __init__
        state = _connection_state(ctx)
        if state is None:
            if self._stateful:
                return (
                    "This server keeps a session per MCP session, and this request has none: "
                    "connect with the initialize handshake (mcp's Client(mode='legacy') or "
                    "mode='auto'), not a stateless 2026-07-28 request. The tool did not run."
                )
            # Stands alone: a tenant of its own for this one request.
            return Tenant.new(self._client_for, self._client.client_name)
        connection, tenants = state
        tenant = tenants.get(_TENANT_KEY)
        if tenant is None:
            tenant = tenants[_TENANT_KEY] = Tenant.new(self._client_for, self._client.client_name)
            # Unwound when the MCP session ends (DELETE, idle timeout, shutdown).
            connection.exit_stack.push_async_callback(tenant.aclose)
        assert isinstance(tenant, Tenant)
        return tenant


def _connection(ctx: Context) -> Any:
    """The MCP connection a request came on: its `session_id`, `state`, `exit_stack`.

    mcp 2.3 hands low-level handlers no public path to it (its `Context` rework
    is pending), though `Connection`'s state and exit stack are public for this
    use; None if a later mcp moves it.
    """
    return getattr(ctx.session, "_connection", None)


def _connection_state(ctx: Context) -> tuple[Any, dict[str, Any]] | None:
    """The request's MCP session (a connection with a session id) and its state; None
    for a request without one (stateless 2026-07-28, or over stdio)."""
    connection = _connection(ctx)
    if connection is None or connection.session_id is None:
        return None
    return connection, connection.state


async def _cancel(client: AsyncClient, call_id: str) -> None:
    # The call may have ended, or never reached the daemon: nothing to stop.
    with contextlib.suppress(TooljailError):
        await client.cancel(call_id)


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
    security: HttpSecurity,
    names: Sequence[str] | None = None,
    *,
    client_for: Callable[[str], AsyncClient],
    stateful: bool = False,
    on_ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serves the daemon's tools over streamable HTTP on `sock` until SIGINT or SIGTERM
    (or `stop` is set).

    Only requests bearing `security.token` reach the bridge (else 401); each MCP
    session acts as a client of its own (`client_for`), named after `client`.

    Args:
        client: The daemon's client (the bridge's name; the tools' listing).
        sock: A bound socket (`parse_listen` then `bind`); uvicorn listens on it.
        security: The token and TLS files (`security_for`, which also refuses a
            listener off loopback without TLS).
        names: The tools to serve; None serves all.
        client_for: Makes a client going by the name given, for each MCP session.
        stateful: One tooljail session per MCP session.
        on_ready: Called with the endpoint's URL once connections to it wait to be served.
        stop: Set to stop serving as a signal would (for a bridge run inside a program).
    """
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    bridge = Bridge(client, names, stateful=stateful, one_client=False, client_for=client_for)
    app = bridge.server().streamable_http_app(
        streamable_http_path=HTTP_PATH, host=host, transport_security=_host_checks(host, shown)
    )
    config = uvicorn.Config(
        BearerGate(app, security.token),
        log_level="warning",
        lifespan="on",
        ssl_certfile=security.tls_cert_file,
        ssl_keyfile=security.tls_key_file,
    )
    server = _Uvicorn(config)
    # Listening already, connections wait in the backlog until uvicorn accepts
    # them: the URL can be given out now, without polling for uvicorn's start.
    sock.listen(128)
    if on_ready is not None:
        on_ready(f"{'https' if security.tls else 'http'}://{shown}:{port}{HTTP_PATH}")
    if stop is None:
        await server.serve(sockets=[sock])
        return

    async def stopper() -> None:
        await stop.wait()
        server.should_exit = True  # uvicorn's own way out: sessions closed, then done

    watch = asyncio.create_task(stopper())
    try:
        await server.serve(sockets=[sock])
    finally:
        watch.cancel()


def _host_checks(host: str, shown: str) -> TransportSecuritySettings | None:
    """mcp's Host and Origin checks (against DNS rebinding) for any loopback address,
    not only the three mcp knows; None (mcp's default: none) off loopback, where the
    names clients use are not known here, and the token and TLS guard the listener."""
    if not is_loopback(host):
        return None
    hosts = ["127.0.0.1", "localhost", "[::1]", shown]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in dict.fromkeys(hosts)],
        allowed_origins=[f"{s}://{h}:*" for h in dict.fromkeys(hosts) for s in ("http", "https")],
    )


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
    listener: tuple[socket.socket, HttpSecurity] | None,
    names: Sequence[str] | None,
    stateful: bool,
    on_ready: Callable[[str], None] | None,
) -> None:
    async with AsyncClient(target) as client:
        # Fail at the start, saying why, rather than at the MCP client's first request.
        await atool_specs(client, names)
        if listener is None:
            await serve_stdio(client, names, stateful=stateful)
            return

        def client_for(name: str) -> AsyncClient:
            # The same daemon and credentials (the environment), another name.
            return AsyncClient(target, client_name=name)

        sock, security = listener
        await serve_http(
            client,
            sock,
            security,
            names,
            client_for=client_for,
            stateful=stateful,
            on_ready=on_ready,
        )


def main(
    target: str | None = None,
    *,
    listen: str | None = None,
    names: Sequence[str] | None = None,
    stateful: bool = False,
    on_ready: Callable[[str], None] | None = None,
    token_file: str | os.PathLike[str] | None = None,
    tls_cert_file: str | os.PathLike[str] | None = None,
    tls_key_file: str | os.PathLike[str] | None = None,
) -> None:
    """Serves the daemon's tools over MCP until the client leaves (stdio) or a signal (HTTP).

    Args:
        target: The daemon (None: `TOOLJAIL_TARGET`, else the default socket).
        listen: `HOST:PORT` to serve streamable HTTP on; None serves stdio.
        names: The tools to serve; None serves all the daemon serves.
        stateful: One tooljail session per MCP client.
        on_ready: With `listen`, called with the endpoint's URL once it serves.
        token_file: With `listen`, the file holding the bearer token every
            request must bear (None: `$TOOLJAIL_MCP_TOKEN`; one is required).
        tls_cert_file, tls_key_file: With `listen`, serve HTTPS with these
            (required off loopback).

    Raises:
        ValueError: When `listen` is not `HOST:PORT`; when it has no token, or
            is off loopback without TLS; when a TLS or token option is given
            without `listen`.
        OSError: When its address cannot be bound.
        ToolNotFoundError: When a named tool is not served.
        TooljailError: When the daemon cannot be reached.
    """
    if listen is None:
        if token_file is not None or tls_cert_file is not None or tls_key_file is not None:
            raise ValueError(
                "--token-file and --tls-cert-file/--tls-key-file are for --listen: over "
                "stdio the MCP client spawns the bridge and is its only client"
            )
        asyncio.run(_serve(target, None, names, stateful, on_ready))
        return
    host, port = parse_listen(listen)
    # Checked before binding: a refused listener never serves a moment.
    security = security_for(host, token_file, tls_cert_file, tls_key_file)
    sock = bind(host, port)
    try:
        asyncio.run(_serve(target, (sock, security), names, stateful, on_ready))
    finally:
        sock.close()
