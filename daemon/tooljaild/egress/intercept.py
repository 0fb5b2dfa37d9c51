"""Interception: a CONNECT tunnel of a sandbox that holds secrets, read as HTTP/1.1.

After the proxy has accepted a CONNECT to an allowed `connect_host:connect_port`
of a sandbox whose policy holds secrets, `serve_intercepted` takes the client
connection over:

1. It reads the ClientHello and checks its server name against the CONNECT
   host (`sni_mismatch` otherwise), then terminates TLS with a leaf the
   daemon's CA mints for that host (the sandbox trusts the CA by its bundle).
2. It reads HTTP/1.1 requests, one after another on the kept-alive connection.
   Each one's Host must be the CONNECT host (`host_mismatch`); placeholders of
   secrets for this host are swapped for their values, and a placeholder of a
   secret for another host, in a header, the URL or the body, is refused as a
   `secret_leak` before any byte of that request leaves (a body up to
   `HOLD_BYTES` is held and scanned whole before the upstream is even dialled;
   a bigger one is scanned as it streams, and the upstream connection is cut
   mid-body on a leak, so it never receives a whole request).
3. It forwards the request over verified TLS (`upstream_ctx`, the CONNECT host
   as server name) to `upstream_addr`, the address the proxy resolved, and
   passes the answer back with every secret's value scrubbed to its placeholder.

The steps live beside this module: TLS toward the sandbox through memory BIOs
(`intercept_tls`), the request loop (`intercept_requests`), the upstream side
(`intercept_upstream`); this module puts them together for one connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from tooljaild.egress.intercept_requests import Account, Deny, Interception, PackageCache
from tooljaild.egress.intercept_tls import TLSServer, read_hello, same_host
from tooljaild.egress.intercept_upstream import Upstream
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.streams import close_writer
from tooljaild.egress.tls import InterceptCA

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a sandbox has to send its ClientHello and finish the TLS handshake."""


async def serve_intercepted(
    client_sock: socket.socket | tuple[asyncio.StreamReader, asyncio.StreamWriter],
    *,
    connect_host: str,
    connect_port: int,
    upstream_addr: tuple[str, int],
    policy: EgressPolicy,
    ca: InterceptCA,
    upstream_ctx: ssl.SSLContext,
    account: Account,
    deny: Deny,
    cache: PackageCache | None = None,
) -> None:
    """Serve one intercepted CONNECT tunnel until either side is done; close it.

    Args:
        client_sock: the sandbox's connection, after the proxy answered the
            CONNECT with 200: a socket, or the proxy's stream pair for it
            (bytes its reader already holds are read first).
        connect_host: the CONNECT host, lowercase (a name or an IP literal).
        connect_port: the CONNECT port.
        upstream_addr: where to connect (resolved and checked by the proxy).
        policy: the gate's policy when the connection came; its secrets.
        ca: mints the leaf the sandbox is shown for `connect_host`.
        upstream_ctx: verifies the upstream (`upstream_context`).
        account: called with (bytes_out, bytes_in) after each request.
        deny: called with (reason, detail) for each refusal; the detail names
            a secret by name only, never its value or placeholder.
        cache: the package cache, when `connect_host` is an index it caches:
            a GET is answered from it when it has the URL, and a 200 answer
            is kept in it (`cache.writer` decides what is cacheable).

    Never raises for anything the sandbox or the upstream does; returns when
    the connection is over (it is closed then).
    """
    if isinstance(client_sock, socket.socket):
        raw_reader, raw_writer = await asyncio.open_connection(sock=client_sock)
    else:
        raw_reader, raw_writer = client_sock
    tls: TLSServer | None = None
    try:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                hello = await read_hello(raw_reader, deny)
                if hello is None:
                    return
                first, sni = hello
                if not same_host(sni, connect_host):
                    deny(
                        "sni_mismatch",
                        f"SNI {sni or '(none)'} in a tunnel to {connect_host}:{connect_port}",
                    )
                    return
                tls = TLSServer(raw_reader, raw_writer, ca.server_context(connect_host))
                await tls.handshake(first)
        except (TimeoutError, ssl.SSLError, OSError):
            return
        await Interception(
            tls,
            host=connect_host,
            port=connect_port,
            upstream=Upstream(connect_host, upstream_addr, upstream_ctx),
            secrets=policy.secrets,
            account=account,
            deny=deny,
            cache=cache,
        ).run()
    except (OSError, ssl.SSLError):
        pass
    finally:
        try:
            if tls is not None:
                await tls.close()
        finally:
            await close_writer(raw_writer, 1.0)
