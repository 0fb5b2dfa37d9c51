"""The upstream side of an intercepted request: dialled late, answered scrubbed.

`Upstream` is the one kept-alive connection an intercepted tunnel has to its
host, over verified TLS (the CONNECT host as server name) to the address the
proxy resolved and checked. `HeldWriter` holds a request's first `HOLD_BYTES`
back and dials only past them (or when the request is whole and scanned), so a
request refused for a leak before then never reaches the upstream at all.
`pass_answer` carries the upstream's answer back with every secret's value
scrubbed to its placeholder, and tees a cacheable answer into the package cache.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from tooljail.errors import TooljailError
from tooljaild.egress.http_bodies import BodyWriter, copy_body, reframed
from tooljaild.egress.http_heads import (
    NO_BODY,
    BadRequest,
    BadResponse,
    Headers,
    RequestHead,
    ResponseHead,
    read_response_head,
    response_framing,
)
from tooljaild.egress.policy import HeldSecret
from tooljaild.egress.streams import close_writer
from tooljaild.egress.swap import ResponseScrubber

UPSTREAM_TIMEOUT_S = 30.0
"""How long connecting to the upstream, or waiting for its answer's head, may take."""
HOLD_BYTES = 256 * 1024
"""A request (head and body) up to this size is held and scanned whole before it is
sent; an answer with a Content-Length up to it is scrubbed whole and re-measured."""
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


class UpstreamError(TooljailError):
    """The upstream could not be reached or answered badly (the sandbox gets a 502).

    Control flow inside an intercepted connection, never raised past it; in the
    daemon's error tree like every exception the daemon defines."""


def forwardable(headers: Headers) -> Headers:
    """`headers` without hop-by-hop fields (and any a Connection field names)."""
    named = {
        token.strip().lower()
        for key, value in headers
        if key.lower() == "connection"
        for token in value.split(",")
    }
    return [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() not in named]


def wants_close(version: str, headers: Headers) -> bool:
    """Whether a message of `version` with `headers` ends its connection."""
    tokens = {
        token.strip().lower()
        for key, value in headers
        if key.lower() in ("connection", "proxy-connection")
        for token in value.split(",")
    }
    if version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


class Upstream:
    """The tunnel's one connection to `host` at `addr`, opened on demand and kept."""

    def __init__(self, host: str, addr: tuple[str, int], context: ssl.SSLContext) -> None:
        self._host = host
        self._addr = addr
        self._ctx = context
        self._up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @property
    def reader(self) -> asyncio.StreamReader:
        """The open connection's reader (only after `connect`)."""
        assert self._up is not None
        return self._up[0]

    async def connect(self) -> asyncio.StreamWriter:
        """The open connection's writer, connecting (again) when there is none.

        Raises:
            UpstreamError: it could not be reached, or its certificate did not verify.
        """
        if self._up is not None and not self._up[0].at_eof():
            return self._up[1]
        await self.drop()
        try:
            async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
                self._up = await asyncio.open_connection(
                    self._addr[0],
                    self._addr[1],
                    ssl=self._ctx,
                    server_hostname=self._host,
                    ssl_handshake_timeout=UPSTREAM_TIMEOUT_S,
                )
        except ssl.SSLCertVerificationError as exc:
            raise UpstreamError(f"its certificate did not verify: {exc.verify_message}") from exc
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            raise UpstreamError(f"could not connect: {exc.__class__.__name__}") from exc
        return self._up[1]

    async def drop(self) -> None:
        """Close the connection (if any); the next `connect` opens a new one."""
        if self._up is not None:
            writer = self._up[1]
            self._up = None
            await close_writer(writer, 1.0)


class HeldWriter:
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
        """Dial (when not yet) and send everything held."""
        if self._writer is None:
            self._writer = await self._connect()
            self._writer.write(bytes(self._buffer))
            self._buffer.clear()
        await self._writer.drain()


async def pass_answer(
    upstream: Upstream,
    client: BodyWriter,
    request: RequestHead,
    *,
    secrets: Sequence[HeldSecret],
    extra: Headers,
    tee_for: Callable[[], CacheWriter | None] | None = None,
) -> tuple[bool, int]:
    """Pass the upstream's answer to `request` back to `client`, scrubbed.

    Args:
        extra: (value sent, placeholder) pairs of this request's swapped
            headers, scrubbed from the answer too.
        tee_for: asked for a cache writer when the answer is a 200 to a GET;
            the answer is written to it as the sandbox gets it (scrubbed: no
            value is ever cached), committed when whole, aborted otherwise.

    Returns:
        (whether the client's connection stays open, bytes read from the upstream).

    Raises:
        UpstreamError: the answer's head could not be read (nothing was sent
            to the client yet).
    """
    up_reader = upstream.reader
    try:
        while True:
            async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
                head = await read_response_head(up_reader)
            if head.status == 101:
                raise UpstreamError("it switched protocols, which the proxy does not carry")
            if head.status >= 200:
                break
        framing = response_framing(head, request.method)
    except (BadResponse, TimeoutError, OSError, ssl.SSLError) as exc:
        raise UpstreamError(f"its answer could not be read: {exc}") from exc
    bytes_in = len(head.to_bytes())
    scrubber = ResponseScrubber(secrets, extra)
    client_keep = not wants_close(request.version, request.headers)
    upstream_keep = framing.kind != "close" and not wants_close(head.version, head.headers)
    headers = [(k, scrubber.scrub_text(v)) for k, v in forwardable(head.headers)]
    out = framing
    body: bytes | None = None
    tee: CacheWriter | None = None
    if tee_for is not None and head.status == 200 and request.method == "GET":
        tee = tee_for()

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

    async def send(data: bytes) -> None:
        client.write(data)
        await client.drain()

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
            headers, out, kept = reframed(headers, request.version == "HTTP/1.1")
            client_keep = client_keep and kept
        if not client_keep:
            headers.append(("Connection", "close"))
        reason = scrubber.scrub_text(head.reason)
        reply = ResponseHead("HTTP/1.1", head.status, reason, headers)
        await send(reply.to_bytes())
        if body is not None:
            await send(body)
        elif framing != NO_BODY:
            copied = await copy_body(
                up_reader, client, framing, on_chunk=scrub, on_end=scrub_end, out=out
            )
            bytes_in += copied.read
    except (asyncio.IncompleteReadError, BadRequest, OSError, ssl.SSLError):
        # The answer broke off midway: the client's connection cannot be
        # delimited any more, so it closes too.
        if tee is not None:
            tee.abort()
        await upstream.drop()
        return False, bytes_in
    except BaseException:
        if tee is not None:
            tee.abort()
        raise
    if tee is not None:
        tee.commit()
    if not upstream_keep:
        await upstream.drop()
    return client_keep, bytes_in
