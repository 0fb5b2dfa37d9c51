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

TLS toward the sandbox runs through memory BIOs rather than asyncio's own TLS
transport: the ClientHello must be read (for the SNI check) before any TLS
object sees it, and bytes the proxy's reader already buffered must not be lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from tooljaild.egress.http import (
    NO_BODY,
    BadRequest,
    BadResponse,
    Framing,
    HeadClosed,
    RequestHead,
    ResponseHead,
    as_chunked,
    copy_body,
    parse_authority,
    parse_target,
    read_request_head,
    read_response_head,
    request_framing,
    response_framing,
)
from tooljaild.egress.policy import EgressPolicy, HeldSecret
from tooljaild.egress.swap import BodyLeakScanner, ResponseScrubber, SecretLeak, swap_request
from tooljaild.egress.tls import InterceptCA, NeedMore, client_hello_sni

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a sandbox has to send its ClientHello and finish the TLS handshake."""
IDLE_TIMEOUT_S = 60.0
"""How long a kept-alive connection waits for the sandbox's next request head."""
UPSTREAM_TIMEOUT_S = 30.0
"""How long connecting to the upstream, or waiting for its answer's head, may take."""
HOLD_BYTES = 256 * 1024
"""A request (head and body) up to this size is held and scanned whole before it is
sent; an answer with a Content-Length up to it is scrubbed whole and re-measured."""
_PIECE = 64 * 1024
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    }
)


class CacheWriter(Protocol):
    """Where a cached answer's body goes as it streams (egress/package_cache.py)."""

    def write(self, data: bytes) -> None: ...
    def commit(self) -> object: ...
    def abort(self) -> None: ...


class PackageCache(Protocol):
    """What interception needs of the package cache (egress/package_cache.py)."""

    def wants(self, host: str) -> bool: ...
    def lookup(self, url: str) -> Path | None: ...
    def writer(self, url: str) -> CacheWriter | None: ...


Account = Callable[[int, int], None]
Deny = Callable[[str, str], None]


class _Valve(asyncio.Transport):
    """Flow control for a StreamReader fed by hand: it pauses the feeder."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()

    def pause_reading(self) -> None:
        self.open.clear()

    def resume_reading(self) -> None:
        self.open.set()

    def is_reading(self) -> bool:
        return self.open.is_set()


class _TLSServer:
    """A server-side TLS session over a plain stream pair, run through memory BIOs.

    `reader` yields the decrypted bytes (flow-controlled); `write`/`drain`
    encrypt toward the client.
    """

    def __init__(
        self,
        raw_reader: asyncio.StreamReader,
        raw_writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
    ) -> None:
        self._raw_reader = raw_reader
        self._raw_writer = raw_writer
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=True)
        self._valve = _Valve()
        self.reader = asyncio.StreamReader(limit=64 * 1024)
        self.reader.set_transport(self._valve)
        self._pump: asyncio.Task[None] | None = None

    def _flush(self) -> None:
        pending = self._out.read()
        if pending:
            self._raw_writer.write(pending)

    async def handshake(self, first: bytes) -> None:
        """Finish the handshake, `first` being the bytes already read (the hello).

        Raises:
            ssl.SSLError, ConnectionError: the handshake failed.
        """
        self._in.write(first)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                await self._raw_writer.drain()
                data = await self._raw_reader.read(_PIECE)
                if not data:
                    raise ConnectionResetError("the client closed during the handshake") from None
                self._in.write(data)
        self._flush()
        await self._raw_writer.drain()
        self._pump = asyncio.create_task(self._run_pump(), name="tooljail-egress-tls-pump")

    async def _run_pump(self) -> None:
        try:
            while True:
                while True:
                    try:
                        data = self._tls.read(_PIECE)
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        self.reader.feed_eof()
                        return
                    if not data:
                        self.reader.feed_eof()
                        return
                    self.reader.feed_data(data)
                    await self._valve.open.wait()
                # Post-handshake messages (TLS 1.3 tickets, alerts) go out too.
                self._flush()
                raw = await self._raw_reader.read(_PIECE)
                if not raw:
                    self.reader.feed_eof()
                    return
                self._in.write(raw)
        except (ssl.SSLError, OSError) as exc:
            self.reader.set_exception(ConnectionResetError(f"TLS from the sandbox failed: {exc}"))

    def write(self, data: bytes) -> None:
        self._tls.write(data)
        self._flush()

    async def drain(self) -> None:
        await self._raw_writer.drain()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._tls.unwrap()
        with contextlib.suppress(OSError):
            self._flush()


def _reply(status: int, phrase: str, body: str) -> bytes:
    data = body.encode("utf-8")
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + data


def _refusal(host: str, port: int, reason: str, why: str) -> bytes:
    return _reply(403, "Forbidden", f"tooljail egress: refused {host}:{port} ({reason}): {why}\n")


def _forwardable(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`headers` without hop-by-hop fields (and any a Connection field names)."""
    named = {
        token.strip().lower()
        for key, value in headers
        if key.lower() == "connection"
        for token in value.split(",")
    }
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() not in named]


def _wants_close(version: str, headers: list[tuple[str, str]]) -> bool:
    tokens = {
        token.strip().lower()
        for key, value in headers
        if key.lower() in ("connection", "proxy-connection")
        for token in value.split(",")
    }
    if version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


class _Held:
    """A writer toward the upstream that holds the first `cap` bytes back.

    The upstream is dialled only when more than `cap` bytes are written or at
    `flush()`: a request refused before then never reaches it at all.
    """

    def __init__(self, connect: Callable[[], Awaitable[asyncio.StreamWriter]], cap: int) -> None:
        self._connect = connect
        self._cap = cap
        self._buffer = bytearray()
        self._writer: asyncio.StreamWriter | None = None
        self.written = 0

    @property
    def started(self) -> bool:
        """Whether any byte went upstream."""
        return self._writer is not None

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self._writer is None:
            self._buffer += data
        else:
            self._writer.write(data)

    async def drain(self) -> None:
        if self._writer is None and len(self._buffer) > self._cap:
            await self.flush()
        elif self._writer is not None:
            await self._writer.drain()

    async def flush(self) -> None:
        if self._writer is None:
            self._writer = await self._connect()
            self._writer.write(bytes(self._buffer))
            self._buffer.clear()
        await self._writer.drain()


class _UpstreamError(Exception):
    """The upstream could not be reached or answered badly (the sandbox gets a 502)."""


class _Interception:
    """One intercepted client connection: its requests, one after another."""

    def __init__(
        self,
        tls: _TLSServer,
        *,
        host: str,
        port: int,
        upstream_addr: tuple[str, int],
        secrets: Sequence[HeldSecret],
        upstream_ctx: ssl.SSLContext,
        account: Account,
        deny: Deny,
        cache: PackageCache | None,
    ) -> None:
        self._tls = tls
        self._cache = cache
        self._host = host
        self._port = port
        self._addr = upstream_addr
        self._secrets = secrets
        self._ctx = upstream_ctx
        self._account = account
        self._deny = deny
        self._up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def _send(self, data: bytes) -> None:
        self._tls.write(data)
        await self._tls.drain()

    async def _refuse(self, reason: str, detail: str, why: str) -> None:
        self._deny(reason, detail)
        await self._send(_refusal(self._host, self._port, reason, why))

    async def _connect(self) -> asyncio.StreamWriter:
        if self._up is not None and not self._up[0].at_eof():
            return self._up[1]
        await self._drop_upstream()
        try:
            self._up = await asyncio.wait_for(
                asyncio.open_connection(
                    self._addr[0],
                    self._addr[1],
                    ssl=self._ctx,
                    server_hostname=self._host,
                    ssl_handshake_timeout=UPSTREAM_TIMEOUT_S,
                ),
                UPSTREAM_TIMEOUT_S,
            )
        except ssl.SSLCertVerificationError as exc:
            raise _UpstreamError(f"its certificate did not verify: {exc.verify_message}") from exc
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            raise _UpstreamError(f"could not connect: {exc.__class__.__name__}") from exc
        return self._up[1]

    async def _drop_upstream(self) -> None:
        if self._up is not None:
            writer = self._up[1]
            self._up = None
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def run(self) -> None:
        try:
            while await self._one():
                pass
        finally:
            await self._drop_upstream()

    def _origin_target(self, head: RequestHead) -> str | None:
        """The target in origin-form, None when it names another host."""
        if head.target.startswith("/") or (head.target == "*" and head.method == "OPTIONS"):
            return head.target
        scheme, host, port, path = parse_target(head)
        if scheme != "https" or (host, port) != (self._host, self._port):
            return None
        return path

    def _host_matches(self, head: RequestHead) -> bool:
        value = head.host_header
        if value is None:
            return False
        try:
            host, port = parse_authority(value)
        except BadRequest:
            return False
        return host == self._host and (443 if port is None else port) == self._port

    async def _one(self) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            head = await asyncio.wait_for(read_request_head(self._tls.reader), IDLE_TIMEOUT_S)
        except (HeadClosed, TimeoutError, ConnectionError):
            return False
        except BadRequest as exc:
            self._deny("bad_request", exc.reason)
            await self._send(_reply(400, "Bad Request", f"tooljail egress: {exc.reason}\n"))
            return False
        if not self._host_matches(head):
            shown = head.host_header or "(none)"
            await self._refuse(
                "host_mismatch",
                f"Host {shown}",
                f"the Host header ({shown}) is not the host this tunnel was opened to",
            )
            return False
        try:
            target = self._origin_target(head)
        except BadRequest as exc:
            target, reason = None, exc.reason
        else:
            reason = "the request names another host than the tunnel's"
        if target is None:
            await self._refuse("host_mismatch", "request target", reason)
            return False
        try:
            new_target, headers = swap_request(
                head.method, target, head.headers, self._host, self._port, self._secrets
            )
        except SecretLeak as leak:
            await self._leak(leak)
            return False
        except ValueError as exc:
            await self._send(_reply(500, "Internal Server Error", f"tooljail egress: {exc}\n"))
            return False
        extra = [(new, old) for (_, new), (_, old) in zip(headers, head.headers, strict=True)]
        cache_url = None
        if (
            self._cache is not None
            and head.method in ("GET", "HEAD")
            and new_target == target
            and self._cache.wants(self._host)
        ):
            # A URL that held a secret is never a cache key.
            authority = self._host if self._port == 443 else f"{self._host}:{self._port}"
            cache_url = f"https://{authority}{target}"
            if await self._send_cached(cache_url, head):
                return not _wants_close(head.version, head.headers)
        try:
            return await self._exchange(head, new_target, headers, extra, cache_url)
        except _UpstreamError as exc:
            await self._drop_upstream()
            await self._send(
                _reply(
                    502,
                    "Bad Gateway",
                    f"tooljail egress: {self._host}:{self._port} failed: {exc}\n",
                )
            )
            return False

    async def _send_cached(self, url: str, head: RequestHead) -> bool:
        """Answer from the package cache; False on a miss (or an unreadable file)."""
        assert self._cache is not None
        if request_framing(head) != NO_BODY:
            return False
        loop = asyncio.get_running_loop()
        path = await loop.run_in_executor(None, self._cache.lookup, url)
        if path is None:
            return False
        try:
            file: BinaryIO = await loop.run_in_executor(None, path.open, "rb")
        except OSError:
            return False
        try:
            size = os.fstat(file.fileno()).st_size
            close = _wants_close(head.version, head.headers)
            reply = ResponseHead(
                "HTTP/1.1",
                200,
                "OK",
                [
                    ("Content-Type", "application/octet-stream"),
                    ("Content-Length", str(size)),
                    *([("Connection", "close")] if close else []),
                ],
            )
            await self._send(reply.to_bytes())
            if head.method == "GET":
                while data := await loop.run_in_executor(None, file.read, _PIECE):
                    await self._send(data)
        finally:
            file.close()
        return True

    async def _leak(self, leak: SecretLeak) -> None:
        await self._refuse(
            "secret_leak",
            f"{leak.secret} in the {leak.where}",
            f"the placeholder of secret {leak.secret} was sent in the {leak.where} to a host "
            "that secret is not for; nothing of this request was sent",
        )

    async def _exchange(
        self,
        head: RequestHead,
        target: str,
        headers: list[tuple[str, str]],
        extra: list[tuple[str, str]],
        cache_url: str | None,
    ) -> bool:
        framing = request_framing(head)
        expect = (head.get("expect") or "").strip().lower() == "100-continue"
        forward = [(k, v) for k, v in _forwardable(headers) if k.lower() != "expect"]
        out_head = RequestHead(head.method, target, "HTTP/1.1", forward)
        scanner = BodyLeakScanner(self._secrets, self._host, self._port)

        def scan(chunk: bytes) -> bytes:
            scanner.feed(chunk)
            return chunk

        held = _Held(self._connect, HOLD_BYTES)
        held.write(out_head.to_bytes())
        bytes_in = 0
        try:
            # The client waits for a 100 before its body: the proxy answers it,
            # since the upstream is not dialled until the body is scanned.
            if expect and framing != NO_BODY:
                await self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                await copy_body(self._tls.reader, held, framing, on_chunk=scan)
            except SecretLeak as leak:
                if held.started:
                    # Cut mid-body: the upstream never gets a whole request.
                    await self._drop_upstream()
                await self._leak(leak)
                return False
            except BadRequest as exc:
                await self._drop_upstream()
                self._deny("bad_request", exc.reason)
                await self._send(_reply(400, "Bad Request", f"tooljail egress: {exc.reason}\n"))
                return False
            try:
                await held.flush()
            except (OSError, ssl.SSLError) as exc:
                raise _UpstreamError(f"the request could not be sent: {exc}") from exc
            keep, bytes_in = await self._answer(head, extra, cache_url)
            return keep
        finally:
            self._account(held.written if held.started else 0, bytes_in)

    async def _answer(
        self, request: RequestHead, extra: list[tuple[str, str]], cache_url: str | None
    ) -> tuple[bool, int]:
        """Pass the upstream's answer back, scrubbed; (keep the client, bytes read).

        With `cache_url`, a 200 answer to a GET is also written to the package
        cache, as the sandbox gets it (scrubbed: no value is ever cached).
        """
        assert self._up is not None
        up_reader = self._up[0]
        try:
            while True:
                head = await asyncio.wait_for(read_response_head(up_reader), UPSTREAM_TIMEOUT_S)
                if head.status == 101:
                    raise _UpstreamError("it switched protocols, which the proxy does not carry")
                if head.status >= 200:
                    break
            framing = response_framing(head, request.method)
        except (BadResponse, TimeoutError, OSError, ssl.SSLError) as exc:
            raise _UpstreamError(f"its answer could not be read: {exc}") from exc
        bytes_in = len(head.to_bytes())
        scrubber = ResponseScrubber(self._secrets, extra)
        client_keep = not _wants_close(request.version, request.headers)
        upstream_keep = framing.kind != "close" and not _wants_close(head.version, head.headers)
        headers = [(k, scrubber.scrub_text(v)) for k, v in _forwardable(head.headers)]
        out = framing
        body: bytes | None = None
        tee: CacheWriter | None = None
        if (
            cache_url is not None
            and self._cache is not None
            and head.status == 200
            and request.method == "GET"
        ):
            tee = self._cache.writer(cache_url)

        def scrub(piece: bytes) -> bytes:
            data = scrubber.feed(piece)
            if tee is not None:
                tee.write(data)
            return data

        def scrub_end() -> bytes:
            data = scrubber.flush()
            if tee is not None:
                tee.write(data)
            return data

        try:
            if framing.kind == "length" and not scrubber.active:
                pass  # nothing to scrub: the length stands
            elif framing.kind == "length" and framing.length <= HOLD_BYTES:
                # Small enough to scrub whole and announce its true length.
                raw = await up_reader.readexactly(framing.length)
                bytes_in += len(raw)
                body = scrub(raw) + scrub_end()
                headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                headers.append(("Content-Length", str(len(body))))
            elif framing.kind in ("length", "chunked", "close"):
                if request.version == "HTTP/1.1":
                    headers, out = as_chunked(headers), Framing("chunked")
                else:
                    headers = [
                        (k, v)
                        for k, v in headers
                        if k.lower() not in ("content-length", "transfer-encoding")
                    ]
                    out, client_keep = Framing("close"), False
            if not client_keep:
                headers.append(("Connection", "close"))
            reason = scrubber.scrub_text(head.reason)
            reply = ResponseHead("HTTP/1.1", head.status, reason, headers)
            await self._send(reply.to_bytes())
            if body is not None:
                await self._send(body)
            elif framing != NO_BODY:
                copied = await copy_body(
                    up_reader,
                    self._tls,
                    framing,
                    on_chunk=scrub,
                    on_end=scrub_end,
                    out=out,
                )
                bytes_in += copied.read
        except (asyncio.IncompleteReadError, BadRequest, OSError, ssl.SSLError):
            # The answer broke off midway: the client's connection cannot be
            # delimited any more, so it closes too.
            if tee is not None:
                tee.abort()
            await self._drop_upstream()
            return False, bytes_in
        except BaseException:
            if tee is not None:
                tee.abort()
            raise
        if tee is not None:
            tee.commit()
        if not upstream_keep:
            await self._drop_upstream()
        return client_keep, bytes_in


def _same_host(sni: str | None, host: str) -> bool:
    """Whether a ClientHello's SNI fits the CONNECT host (an IP literal has none)."""
    if sni is None:
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        except OSError:
            return False
        return True
    return sni == host.lower().rstrip(".")


async def _read_hello(reader: asyncio.StreamReader, deny: Deny) -> tuple[bytes, str | None] | None:
    data = b""
    while True:
        try:
            return data, client_hello_sni(data)
        except NeedMore:
            piece = await reader.read(_PIECE)
            if not piece:
                return None
            data += piece
        except ValueError as exc:
            deny("bad_request", f"not TLS after CONNECT: {exc}")
            return None


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
    tls: _TLSServer | None = None
    try:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                hello = await _read_hello(raw_reader, deny)
                if hello is None:
                    return
                first, sni = hello
                if not _same_host(sni, connect_host):
                    deny(
                        "sni_mismatch",
                        f"SNI {sni or '(none)'} in a tunnel to {connect_host}:{connect_port}",
                    )
                    return
                tls = _TLSServer(raw_reader, raw_writer, ca.server_context(connect_host))
                await tls.handshake(first)
        except (TimeoutError, ssl.SSLError, OSError):
            return
        await _Interception(
            tls,
            host=connect_host,
            port=connect_port,
            upstream_addr=upstream_addr,
            secrets=policy.secrets,
            upstream_ctx=upstream_ctx,
            account=account,
            deny=deny,
            cache=cache,
        ).run()
    except (OSError, ssl.SSLError):
        pass
    finally:
        if tls is not None:
            await tls.close()
        raw_writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(raw_writer.wait_closed(), 1.0)
