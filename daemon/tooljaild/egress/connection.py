"""One client connection of a sandbox: decide, resolve, then forward or tunnel.

A connection starts with a proxy request: `CONNECT host:port` (a tunnel, TLS
passed through, or intercepted when the gate holds secrets or the host is a
package index being cached) or an absolute-form `http://host[:port]/...`
request (plain HTTP, forwarded request by request: each request on a
keep-alive connection is decided again, by the gate's policy at that moment).
Anything else gets a 400 and the connection closes.

Order of checks for a destination (each refusal answers before anything is
sent upstream): the policy's rules (deny wins; no rules: `no_egress`; an IP
literal a rule does not name: `ip_literal`), then where the name leads
(`resolve.Lookup`: the hosts map, else the resolver and the address checks).
The proxy then connects to the address it checked, never resolving again.

A CONNECT tunnel that is not intercepted still checks the TLS ClientHello's
server name against the CONNECT host (`sni_mismatch`: nothing is sent
upstream). A tunnel that does not begin with TLS is passed as it is: it goes
to the host and port the rules allow; interception is the only way to look
inside, and a sandbox without secrets is not intercepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tooljaild.egress.http import (
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
from tooljaild.egress.intercept import serve_intercepted
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.refusals import refusal_text, response
from tooljaild.egress.resolve import Resolved, Unreachable, ip_literal
from tooljaild.egress.swap import BodyLeakScanner, ResponseScrubber, SecretLeak, swap_request
from tooljaild.egress.tls import NeedMore, client_hello_sni
from tooljaild.egress.tunnel import Tunnel

if TYPE_CHECKING:
    from tooljaild.egress.gate import EgressGate
    from tooljaild.egress.proxy import CacheWriter, EgressProxy

HEAD_TIMEOUT_S = 30.0
"""How long a new connection may take to send its first request head."""

IDLE_TIMEOUT_S = 60.0
"""How long a keep-alive connection may wait between two requests."""

CONNECT_TIMEOUT_S = 10.0
"""How long connecting to an upstream address may take."""

HELLO_TIMEOUT_S = 10.0
"""How long a tunnel's client may take to send its TLS ClientHello."""

HELLO_LIMIT = 16 * 1024
"""The most bytes of a ClientHello read before its server name must be known."""

CLOSE_TIMEOUT_S = 5.0
"""How long closing a connection may wait for its last bytes to leave."""

SCANNED_BODY_LIMIT = 256 * 1024
"""A request body of a sandbox holding secrets, up to this size, is read and
checked whole before anything is sent upstream; a bigger one is checked as it
streams, and the upstream connection is cut at a leak. As interception's
`HOLD_BYTES`: 64 connections of a sandbox hold at most 16 MiB."""

PACKAGES_HOST = "packages.tooljail.internal"
"""The proxy's own host serving the package cache by content hash (plain HTTP)."""

_PIECE = 64 * 1024
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection", "expect"}
)


class _Done(Exception):
    """The connection was answered (a refusal or an error) and must close."""


async def serve(proxy: EgressProxy, gate: EgressGate, sock: socket.socket) -> None:
    """Serve one client connection of `gate` until it closes."""
    reader, writer = await asyncio.open_connection(sock=sock)
    client = _Client(proxy, gate, reader, writer)
    try:
        await client.run()
    finally:
        if client.spliced:
            writer.transport.close()  # the tunnel's protocol saw it end
        else:
            await _close(writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
    except (TimeoutError, OSError):
        writer.transport.abort()


class _Client:
    def __init__(
        self,
        proxy: EgressProxy,
        gate: EgressGate,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.gate = gate
        self.reader = reader
        self.writer = writer
        # Whether an answer to the current request has begun (no other may follow).
        self.answered = False
        # Whether a tunnel took the client's transport over (the streams are done).
        self.spliced = False

    async def run(self) -> None:
        timeout = HEAD_TIMEOUT_S
        while True:
            try:
                head = await asyncio.wait_for(read_request_head(self.reader), timeout)
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
                if not await self.plain(head):
                    return
            except (_Done, OSError, ValueError):
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

    # -- refusals -----------------------------------------------------------

    async def refuse(
        self,
        host: str,
        port: int,
        reason: str,
        rule: str,
        *,
        detail: str = "",
        status: int = 403,
        record: bool = True,
    ) -> None:
        """Answer a refusal (the connection then closes) and record it as a denial."""
        if record:
            self.proxy.deny(self.gate, host, port, reason, rule)
        text = refusal_text(host, port, reason, rule, self.gate.policy.allow, detail)
        phrase = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
        await self.send(response(status, phrase, text))

    async def fail(self, status: int, text: str) -> NoReturn:
        """Answer an upstream failure (not a denial) and close."""
        await self.send(response(status, "Bad Gateway", f"tooljail egress: {text}\n"))
        raise _Done

    async def send(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), CLOSE_TIMEOUT_S)

    # -- destinations -------------------------------------------------------

    async def route(self, host: str, port: int, policy: EgressPolicy) -> Resolved:
        """Where `host:port` may be reached, or a refusal answered (raises _Done)."""
        ip = ip_literal(host)
        verdict = policy.decide(str(ip) if ip is not None else host, port)
        if not verdict.allowed:
            reason = verdict.reason
            if ip is not None and reason == "not_allowed":
                reason = "ip_literal"
            await self.refuse(host, port, reason, verdict.rule)
            raise _Done
        if ip is not None:
            # A rule names this address: it is reached as named, unchecked.
            return Resolved((str(ip),), port)
        found = await self.proxy.lookup.resolve(host, port, hosts=self.proxy.hosts, policy=policy)
        if isinstance(found, Unreachable):
            status = 502 if found.reason == "resolve_failed" else 403
            await self.refuse(
                host, port, found.reason, verdict.rule, detail=found.detail, status=status
            )
            raise _Done
        return found

    async def open_upstream(
        self, host: str, port: int, where: Resolved
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the first checked address that answers; count the connection."""
        failure = "no address"
        for address in where.addresses:
            try:
                opened = await asyncio.wait_for(
                    asyncio.open_connection(address, where.port), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError) as exc:
                failure = str(exc) or type(exc).__name__
                continue
            self.gate.book.connection()
            return opened
        await self.fail(502, f"could not connect to {host}:{port}: {failure}")

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
        client = self.writer.transport
        assert isinstance(client, asyncio.Transport)  # a socket's: reads and writes
        client.pause_reading()
        book = self.gate.book
        tunnel = Tunnel(lambda n: book.bytes(out=n), lambda n: book.bytes(into=n))
        failure = "no address"
        for address in where.addresses:
            try:
                await asyncio.wait_for(tunnel.connect(address, where.port), CONNECT_TIMEOUT_S)
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
                more = await asyncio.wait_for(
                    self.reader.read(HELLO_LIMIT - len(data)), max(left, 0)
                )
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

    # -- plain HTTP ---------------------------------------------------------

    async def plain(self, head: RequestHead) -> bool:
        """Forward one plain-HTTP request; True when the connection may carry another."""
        scheme, host, port, path = parse_target(head)
        if scheme != "http":
            await self.refuse(
                host,
                port,
                "bad_request",
                "",
                detail="an https:// URL goes through CONNECT",
                status=400,
            )
            return False
        authority = _authority(host, port, 80)
        named = head.host_header
        if named is not None:
            try:
                named_host, named_port = parse_authority(named)
            except BadRequest:
                named_host, named_port = "", None
            if named_host != host or (named_port or 80) != port:
                await self.refuse(host, port, "host_mismatch", "")
                return False
        policy = self.gate.policy
        if host == PACKAGES_HOST and port == 80 and self.packages_allowed(policy):
            return await self.packages(head, path)
        where = await self.route(host, port, policy)
        headers = [
            (k, v)
            for k, v in head.headers
            if k.lower() not in _HOP_BY_HOP and not k.lower().startswith("proxy-")
        ]
        if named is None:
            headers.insert(0, ("Host", authority))
        target = path
        # (what was sent, what the sandbox wrote): an echo goes back as written.
        swapped: list[tuple[str, str]] = []
        if policy.secrets:
            before = headers
            try:
                target, headers = swap_request(
                    head.method, target, headers, host, port, policy.secrets
                )
            except SecretLeak as leak:
                await self.leak(host, port, leak)
                return False
            except ValueError as exc:  # a value that cannot go in a header: the operator's
                await self.send(response(500, "Internal Server Error", f"tooljail egress: {exc}\n"))
                return False
            swapped = [(n, o) for (_, n), (_, o) in zip(headers, before, strict=True) if n != o]
            if target != path:
                swapped.append((target, path))
        framing = request_framing(head)
        if (head.get("expect") or "").lower() == "100-continue" and framing.kind != "none":
            # Expect is not passed upstream: the proxy asks for the body itself.
            self.writer.write(_CONTINUE)
        body: bytes | None = None
        if policy.secrets and framing.kind != "none":
            body = await self.scanned_body(host, port, framing, policy)
        keep = _keep_alive(head)
        url = f"http://{authority}{path}"
        cache = self.proxy.cache
        # A URL that held a secret is never a cache key (nor is one by its value).
        cached = cache is not None and head.method == "GET" and target == path and cache.wants(host)
        if cached and cache is not None:
            hit = await asyncio.get_running_loop().run_in_executor(None, cache.lookup, url)
            if hit is not None and await self.send_file(hit, head.method):
                return keep
        up_reader, up_writer = await self.open_upstream(host, port, where)
        try:
            out_head = RequestHead(
                head.method, target, "HTTP/1.1", [*headers, ("Connection", "close")]
            )
            if body is not None:
                out_head.headers = [
                    (k, v)
                    for k, v in out_head.headers
                    if k.lower() not in ("content-length", "transfer-encoding")
                ] + [("Content-Length", str(len(body)))]
                up_writer.write(out_head.to_bytes() + body)
                self.gate.book.bytes(out=len(out_head.to_bytes()) + len(body))
            else:
                data = out_head.to_bytes()
                up_writer.write(data)
                self.gate.book.bytes(out=len(data))
                if framing.kind != "none":
                    scanner = (
                        BodyLeakScanner(policy.secrets, host, port) if policy.secrets else None
                    )
                    try:
                        copied = await copy_body(
                            self.reader, up_writer, framing, on_chunk=_feeder(scanner)
                        )
                    except SecretLeak as leak:
                        up_writer.transport.abort()
                        await self.leak(host, port, leak)
                        return False
                    self.gate.book.bytes(out=copied.written)
            await up_writer.drain()
            return await self.answer(
                head, up_reader, policy, keep, url if cached else None, swapped
            )
        finally:
            await _close(up_writer)

    async def scanned_body(
        self, host: str, port: int, framing: Framing, policy: EgressPolicy
    ) -> bytes | None:
        """A small request body of a sandbox holding secrets, read whole and checked.

        Returns None for a body too big to hold (it is checked as it streams).
        """
        if framing.kind != "length" or framing.length > SCANNED_BODY_LIMIT:
            return None
        try:
            body = await self.reader.readexactly(framing.length)
        except asyncio.IncompleteReadError as exc:
            raise BadRequest("the connection closed in the middle of a body") from exc
        scanner = BodyLeakScanner(policy.secrets, host, port)
        try:
            scanner.feed(body)
        except SecretLeak as leak:
            await self.leak(host, port, leak)
            raise _Done from None
        return body

    async def leak(self, host: str, port: int, leak: SecretLeak) -> None:
        # Only the secret's NAME and where it was found: never its value.
        await self.refuse(
            host,
            port,
            "secret_leak",
            leak.secret,
            detail=(
                f"the placeholder of secret {leak.secret} was sent in the {leak.where}; "
                "it may be sent only to that secret's hosts"
            ),
        )

    async def answer(
        self,
        request: RequestHead,
        up_reader: asyncio.StreamReader,
        policy: EgressPolicy,
        keep: bool,
        cache_url: str | None,
        swapped: list[tuple[str, str]],
    ) -> bool:
        """Relay upstream's answer to the client; True when the client connection stays open."""
        try:
            while True:
                head = await asyncio.wait_for(read_response_head(up_reader), IDLE_TIMEOUT_S)
                # Interim answers (100 Continue, 103 Early Hints) are not passed on.
                if head.status >= 200 or head.status == 101:
                    break
            framing = response_framing(head, request.method)
        except HeadClosed:
            await self.fail(502, "the upstream closed without an answer")
        except BadResponse as exc:
            await self.fail(502, f"the upstream's answer is not HTTP/1.1: {exc.reason}")
        except TimeoutError:
            await self.fail(502, "the upstream did not answer in time")
        if head.status == 101 or head.status < 200:
            await self.fail(502, "protocol upgrades are not passed by the proxy")
        scrubber = ResponseScrubber(policy.secrets, swapped) if policy.secrets else None
        client_11 = request.version == "HTTP/1.1"
        keep = keep and framing.kind != "close"
        headers = [(k, v) for k, v in head.headers if k.lower() not in _HOP_BY_HOP]
        out = framing
        if framing.kind != "none" and (scrubber is not None or not client_11):
            # A scrubbed body may change length, and an HTTP/1.0 client reads
            # no chunks: re-frame it.
            if client_11:
                headers, out = as_chunked(headers), Framing("chunked")
            else:
                headers = [
                    (k, v)
                    for k, v in headers
                    if k.lower() not in ("content-length", "transfer-encoding")
                ]
                out, keep = Framing("close"), False
        headers.append(("Connection", "keep-alive" if keep else "close"))
        out_head = ResponseHead("HTTP/1.1", head.status, head.reason, headers)
        data = out_head.to_bytes()
        if scrubber is not None:
            data = _scrub_once(policy, swapped, data)
        self.answered = True
        self.writer.write(data)
        self.gate.book.bytes(into=len(data))
        writer: CacheWriter | None = None
        cache = self.proxy.cache
        if cache_url is not None and cache is not None and head.status == 200:
            writer = cache.writer(cache_url)

        # The cache keeps what the sandbox gets: scrubbed, never a value.
        def chunk(piece: bytes) -> bytes:
            out = scrubber.feed(piece) if scrubber is not None else piece
            if writer is not None:
                writer.write(out)
            return out

        def end() -> bytes:
            out = scrubber.flush() if scrubber is not None else b""
            if writer is not None:
                writer.write(out)
            return out

        try:
            copied = await copy_body(
                up_reader,
                self.writer,
                framing,
                on_chunk=chunk,
                on_end=end,
                out=out,
            )
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is not None:
            writer.commit()
        self.gate.book.bytes(into=copied.written)
        await self.writer.drain()
        return keep

    # -- the package cache's own host ---------------------------------------

    def packages_allowed(self, policy: EgressPolicy) -> bool:
        """Whether the gate may use the cache's own host: its policy allows a package index."""
        cache = self.proxy.cache
        if cache is None:
            return False
        return any(
            policy.decide(host, port).allowed for host in cache.index_hosts for port in (443, 80)
        )

    async def packages(self, head: RequestHead, path: str) -> bool:
        """Serve GET /sha256/<hex> from the package cache by content hash."""
        cache = self.proxy.cache
        keep = _keep_alive(head)
        if request_framing(head).kind != "none":
            await self.fail(400, "the package cache takes no request body")
        parts = path.split("?", 1)[0].split("/")
        hit: Path | None = None
        if (
            cache is not None
            and head.method in ("GET", "HEAD")
            and len(parts) == 3
            and parts[1] == "sha256"
            and len(parts[2]) == 64
            and all(c in "0123456789abcdef" for c in parts[2])
        ):
            hit = await asyncio.get_running_loop().run_in_executor(
                None, cache.lookup, f"sha256:{parts[2]}"
            )
        if hit is not None and await self.send_file(hit, head.method):
            return keep
        body = b"not in the package cache\n"
        self.answered = True
        self.writer.write(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        self.gate.book.bytes(into=len(body))
        await self.writer.drain()
        return keep

    async def send_file(self, path: Path, method: str) -> bool:
        """Answer 200 with the file's bytes; False when the file is gone."""
        loop = asyncio.get_running_loop()
        try:
            handle = await loop.run_in_executor(None, path.open, "rb")
        except OSError:
            return False
        try:
            size = os.fstat(handle.fileno()).st_size
            self.answered = True
            self.writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                + f"Content-Length: {size}\r\n\r\n".encode()
            )
            if method == "HEAD":
                await self.writer.drain()
                return True
            left = size
            while left > 0:
                piece = await loop.run_in_executor(None, handle.read, min(left, _PIECE))
                if not piece:
                    raise _Done  # the file shrank: the framing is broken; close
                left -= len(piece)
                self.writer.write(piece)
                self.gate.book.bytes(into=len(piece))
                await self.writer.drain()
            return True
        finally:
            handle.close()


def _feeder(scanner: BodyLeakScanner | None) -> Callable[[bytes], bytes] | None:
    if scanner is None:
        return None

    def feed(piece: bytes) -> bytes:
        scanner.feed(piece)
        return piece

    return feed


def _scrub_once(policy: EgressPolicy, swapped: list[tuple[str, str]], data: bytes) -> bytes:
    scrubber = ResponseScrubber(policy.secrets, swapped)
    return scrubber.feed(data) + scrubber.flush()


def _authority(host: str, port: int, default: int) -> str:
    name = f"[{host}]" if ":" in host else host
    return name if port == default else f"{name}:{port}"


def _keep_alive(head: RequestHead) -> bool:
    tokens = {t.strip().lower() for v in head.get_all("connection") for t in v.split(",")}
    if head.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


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
