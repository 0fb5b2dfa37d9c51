"""One client connection of a sandbox: its requests read, CONNECT tunnelled.

A connection starts with a proxy request: `CONNECT host:port` (a tunnel, TLS
passed through, or intercepted when the gate holds secrets or the host is a
package index being cached) or an absolute-form `http://host[:port]/...`
request (plain HTTP: `egress/plain.py`). Anything else gets a 400 and the
connection closes.

A CONNECT tunnel that is not intercepted still checks the TLS ClientHello's
server name against the CONNECT host (`sni_mismatch`: nothing is sent
upstream). A tunnel that does not begin with TLS is passed as it is: it goes
to the host and port the rules allow; interception is the only way to look
inside, and a sandbox without secrets is not intercepted.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, cast

from tooljaild.egress.client_conn import (
    CONNECT_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    Done,
    ProxyLike,
    close_writer,
)
from tooljaild.egress.http_heads import (
    BadRequest,
    BadResponse,
    HeadClosed,
    RequestHead,
    read_request_head,
)
from tooljaild.egress.http_targets import parse_target
from tooljaild.egress.intercept import serve_intercepted
from tooljaild.egress.plain import PlainHttp
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.refusals import response
from tooljaild.egress.resolve import Resolved
from tooljaild.egress.tls import NeedMore, client_hello_sni
from tooljaild.egress.tunnel import Tunnel

if TYPE_CHECKING:
    from tooljaild.egress.gate import EgressGate

HELLO_TIMEOUT_S = 10.0
"""How long a tunnel's client may take to send its TLS ClientHello."""

HELLO_LIMIT = 16 * 1024
"""The most bytes of a ClientHello read before its server name must be known."""

_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


async def serve(proxy: ProxyLike, gate: EgressGate, sock: socket.socket) -> None:
    """Serve one client connection of `gate` until it closes."""
    reader, writer = await asyncio.open_connection(sock=sock)
    client = _Client(proxy, gate, reader, writer)
    try:
        await client.run()
    finally:
        if client.spliced:
            writer.transport.close()  # the tunnel's protocol saw it end
        else:
            await close_writer(writer)


class _Client(PlainHttp):
    async def run(self) -> None:
        timeout = HEAD_TIMEOUT_S
        while True:
            try:
                # asyncio.timeout, not wait_for: wait_for runs its awaitable
                # in a task of its own, a loop turn or two per step of every
                # connection (the same below).
                async with asyncio.timeout(timeout):
                    head = await read_request_head(self.reader)
            except (HeadClosed, TimeoutError, OSError):
                return
            except BadRequest as exc:
                await self.refuse("", 0, "bad_request", "", detail=exc.reason, status=400)
                return
            self.answered = False
            try:
                if head.method.upper() == "CONNECT":
                    await self.tunnel(head)
                    return
                if not await self.forward(head):
                    return
            except (Done, OSError, ValueError):
                return
            except BadResponse as exc:
                # The upstream's answer broke: say so if the answer has not begun.
                if not self.answered:
                    await self.send(response(502, "Bad Gateway", f"tooljail egress: {exc}\n"))
                return
            except BadRequest as exc:
                # A target or body the client framed badly.
                if not self.answered:
                    await self.refuse("", 0, "bad_request", "", detail=exc.reason, status=400)
                return
            timeout = IDLE_TIMEOUT_S

    # -- CONNECT ------------------------------------------------------------

    async def tunnel(self, head: RequestHead) -> None:
        _, host, port, _ = parse_target(head)
        policy = self.gate.policy
        where = await self.route(host, port, policy)
        cache = self.proxy.cache
        if policy.intercept or (cache is not None and cache.wants(host)):
            await self.intercepted(host, port, where, policy)
            return
        self.writer.write(_ESTABLISHED)
        await self.writer.drain()
        hello = await self.read_hello(host, port)
        if hello is None:
            return
        # From here on the proxy reads nothing more of the client: what it
        # sends waits in the kernel until the tunnel takes the transport over.
        # A socket's transport: reads and writes (uvloop's are not subclasses
        # of asyncio.Transport, so this is said, not checked).
        client = cast(asyncio.Transport, self.writer.transport)
        client.pause_reading()
        book = self.gate.book
        tunnel = Tunnel(lambda n: book.bytes(out=n), lambda n: book.bytes(into=n))
        failure = "no address"
        for address in where.addresses:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await tunnel.connect(address, where.port)
            except (OSError, TimeoutError) as exc:
                failure = str(exc) or type(exc).__name__
                continue
            break
        else:
            client.resume_reading()
            await self.fail(502, f"could not connect to {host}:{port}: {failure}")
        book.connection()
        rest, ended = _take_buffered(self.reader)
        self.spliced = True
        await tunnel.run(client, hello + rest, ended)

    async def read_hello(self, host: str, port: int) -> bytes | None:
        """The tunnel's first bytes, once the ClientHello's server name is checked.

        Returns the bytes to send upstream first (b"" when the client sent
        nothing within the timeout: a protocol whose server speaks first), or
        None when the tunnel must close (refused, or the client left).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HELLO_TIMEOUT_S
        data = b""
        while True:
            try:
                sni = client_hello_sni(data)
            except NeedMore:
                pass
            except ValueError:
                if data[:1] == b"\x16":
                    # It says TLS handshake but cannot be read: its server
                    # name is unknown, so it does not go upstream.
                    self.proxy.deny(self.gate, host, port, "bad_request", "")
                    return None
                return data  # not TLS: passed as it is (see the module docstring)
            else:
                if sni is not None and sni.lower().rstrip(".") != host:
                    # The tunnel is open: no 403 can be read; close it unsent.
                    self.proxy.deny(self.gate, host, port, "sni_mismatch", "")
                    return None
                return data
            if len(data) >= HELLO_LIMIT:
                self.proxy.deny(self.gate, host, port, "bad_request", "")
                return None
            left = deadline - loop.time()
            try:
                async with asyncio.timeout(max(left, 0)):
                    more = await self.reader.read(HELLO_LIMIT - len(data))
            except TimeoutError:
                if not data:
                    return b""
                self.proxy.deny(self.gate, host, port, "bad_request", "")
                return None
            if not more:
                return None
            data += more

    async def intercepted(
        self, host: str, port: int, where: Resolved, policy: EgressPolicy
    ) -> None:
        self.writer.write(_ESTABLISHED)
        await self.writer.drain()
        book = self.gate.book
        cache = self.proxy.cache

        def account(out: int, into: int) -> None:
            book.bytes(out=out, into=into)

        def deny(reason: str, detail: str) -> None:
            # The detail names a secret by name at most (intercept's contract).
            self.proxy.deny(self.gate, host, port, reason, detail[:200])

        book.connection()
        await serve_intercepted(
            (self.reader, self.writer),
            connect_host=host,
            connect_port=port,
            upstream_addr=(where.addresses[0], where.port),
            policy=policy,
            ca=self.proxy.ca,
            upstream_ctx=self.proxy.upstream_context(),
            account=account,
            deny=deny,
            cache=cache if cache is not None and cache.wants(host) else None,
        )


def _take_buffered(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What `reader` holds now (emptied) and whether its peer had half-closed.

    StreamReader tells neither without awaiting, so its buffer is read
    directly; the reader is not used again (its transport was paused first).
    """
    buffer = getattr(reader, "_buffer", None)
    ended = bool(getattr(reader, "_eof", False))
    if not isinstance(buffer, bytearray):
        return b"", ended
    data = bytes(buffer)
    buffer.clear()
    return data, ended
