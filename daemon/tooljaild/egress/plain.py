"""Plain HTTP through the proxy: absolute-form requests, forwarded one by one.

Each request on a kept-alive client connection is decided again, by the gate's
policy at that moment (its host may differ from the last one's; a narrowed
policy applies to it). The `Host` header must name the URL's host and port
(`host_mismatch`); hop-by-hop and `Proxy-*` headers are dropped; the request
goes upstream on a connection of its own (`Connection: close`). A sandbox
holding secrets has placeholders swapped for their hosts, leaks refused
(`secret_leak`: a body up to `SCANNED_BODY_LIMIT` is checked whole before
anything is sent), and answers scrubbed (values back to placeholders).

The package cache: a GET to an index host it wants is answered from it when it
holds the URL, and a 200 upstream answer is written to it as the sandbox gets
it; `packages.tooljail.internal` serves it by content hash
(`GET /sha256/<hex>`) to a gate whose policy reaches a package index.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from tooljaild.egress.client_conn import (
    IDLE_TIMEOUT_S,
    CacheWriter,
    ClientConn,
    Done,
    close_writer,
)
from tooljaild.egress.http_bodies import copy_body, reframed
from tooljaild.egress.http_heads import (
    BadRequest,
    BadResponse,
    Framing,
    HeadClosed,
    RequestHead,
    ResponseHead,
    read_response_head,
    request_framing,
    response_framing,
)
from tooljaild.egress.http_targets import parse_authority, parse_target
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.refusals import response
from tooljaild.egress.swap import BodyLeakScanner, ResponseScrubber, SecretLeak, swap_request

SCANNED_BODY_LIMIT = 256 * 1024
"""A request body of a sandbox holding secrets, up to this size, is read and
checked whole before anything is sent upstream; a bigger one is checked as it
streams, and the upstream connection is cut at a leak. As interception's
`HOLD_BYTES`: 64 connections of a sandbox hold at most 16 MiB."""

PACKAGES_HOST = "packages.tooljail.internal"
"""The proxy's own host serving the package cache by content hash (plain HTTP)."""

_PIECE = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection", "expect"}
)


class PlainHttp(ClientConn):
    """A client connection that forwards plain-HTTP requests."""

    async def forward(self, head: RequestHead) -> bool:
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
            await close_writer(up_writer)

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
            raise Done from None
        return body

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
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    head = await read_response_head(up_reader)
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
            headers, out, kept = reframed(headers, client_11)
            keep = keep and kept
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
                    raise Done  # the file shrank: the framing is broken; close
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
