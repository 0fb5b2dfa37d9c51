"""HTTP/1.1 message bodies for the egress proxy: copied in pieces, re-framed.

A body is never held whole: it is copied from one side to the other in pieces
of at most 64 KiB, each piece shown to a caller's hook (a leak scanner, a
scrubber) on the way. How a body is delimited on the way in is what its head
said (`http_heads.request_framing` / `response_framing`); how it goes out is
the caller's choice. A malformed chunk is refused with `BadRequest`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import NamedTuple, Protocol

from tooljaild.egress.http_heads import (
    HEAD_LIMIT,
    BadRequest,
    Budget,
    Framing,
    Headers,
    read_fields,
    read_line,
)

_PIECE = 64 * 1024
"""How much of a body is read at once."""
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


def as_chunked(headers: Headers) -> Headers:
    """`headers` re-framed as chunked: Content-Length and Transfer-Encoding
    dropped, `Transfer-Encoding: chunked` added.

    For a body whose length `on_chunk` may change (a scrubbed response): the
    length announced before the body can no longer be known. HTTP/1.1 only.
    """
    kept = [(k, v) for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")]
    return [*kept, ("Transfer-Encoding", "chunked")]


def reframed(headers: Headers, client_11: bool) -> tuple[Headers, Framing, bool]:
    """`headers` and the framing for a body whose length may change on its way
    (a scrubbed answer): chunked to an HTTP/1.1 client; to an HTTP/1.0 one, which
    reads no chunks, until close. The bool: whether the connection may be kept."""
    if client_11:
        return as_chunked(headers), Framing("chunked"), True
    kept = [(k, v) for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")]
    return kept, Framing("close"), False


class BodyWriter(Protocol):
    """Where a body is copied to: an `asyncio.StreamWriter`, or anything that
    writes and drains like one (the interception's TLS stream)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Copied(NamedTuple):
    """Bytes of a body read from one side and written to the other (framing included)."""

    read: int
    written: int


async def copy_body(
    reader: asyncio.StreamReader,
    writer: BodyWriter,
    framing: Framing,
    *,
    on_chunk: Callable[[bytes], bytes] | None = None,
    on_end: Callable[[], bytes] | None = None,
    out: Framing | None = None,
) -> Copied:
    """Copy one body from `reader` to `writer`, piece by piece, and re-frame it.

    Args:
        framing: how the body is delimited on `reader`.
        on_chunk: sees every piece of the body's data and returns what to send
            instead (a scanner raises to stop the copy; a scrubber rewrites).
        on_end: called once at the end of the data; what it returns is sent last
            (a scrubber's held-back tail).
        out: how to frame it on `writer`; default `framing`. "length" with an
            `on_chunk` that changes lengths is refused when it happens
            (`ValueError`): pass `Framing("chunked")` (HTTP/1.1 peer, head
            re-framed with `as_chunked`) or `Framing("close")` instead.
            Trailer fields of a chunked body are read (bounded) and dropped:
            nothing in them reaches the other side unchecked.

    Returns:
        The bytes read from `reader` and written to `writer`, framing included.

    Raises:
        BadRequest: a malformed chunk (`BadResponse` for nothing else: callers
            know which side they read). asyncio.IncompleteReadError is mapped to
            BadRequest too ("closed mid-body").
    """
    out = framing if out is None else out
    read = 0
    written = 0
    sent_data = 0

    async def emit(data: bytes) -> None:
        nonlocal written, sent_data
        if not data:
            return
        if out.kind == "chunked":
            frame = b"%x\r\n" % len(data) + data + b"\r\n"
        else:
            if out.kind == "length" and sent_data + len(data) > out.length:
                raise ValueError("the body grew past its Content-Length")
            frame = data
        sent_data += len(data)
        writer.write(frame)
        written += len(frame)
        await writer.drain()

    async def piece(data: bytes) -> None:
        await emit(on_chunk(data) if on_chunk is not None else data)

    async def pieces(left: int, within: str) -> None:
        """Copy exactly `left` bytes, piece by piece (`within`: "a body", "a chunk")."""
        nonlocal read
        while left:
            data = await reader.read(min(left, _PIECE))
            if not data:
                raise BadRequest(f"the connection closed in the middle of {within}")
            read += len(data)
            left -= len(data)
            await piece(data)

    try:
        if framing.kind == "length":
            await pieces(framing.length, "a body")
        elif framing.kind == "close":
            while data := await reader.read(_PIECE):
                read += len(data)
                await piece(data)
        elif framing.kind == "chunked":
            while True:
                line = await read_line(reader, None, BadRequest)
                read += len(line) + 2
                size_text = line.split(b";", 1)[0].strip(b" \t")
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise BadRequest("a malformed chunk size")
                size = int(size_text, 16)
                if size == 0:
                    break
                await pieces(size, "a chunk")
                end = await reader.readexactly(2)
                read += 2
                if end != b"\r\n":
                    raise BadRequest("a chunk not followed by CRLF")
            trailer_budget = Budget(HEAD_LIMIT)
            await read_fields(reader, trailer_budget, BadRequest)
            read += HEAD_LIMIT - trailer_budget.left
    except asyncio.IncompleteReadError as exc:
        raise BadRequest("the connection closed in the middle of a body") from exc
    if on_end is not None:
        await emit(on_end())
    if out.kind == "chunked" and framing.kind != "none":
        writer.write(b"0\r\n\r\n")
        written += 5
        await writer.drain()
    elif out.kind == "length" and sent_data != out.length:
        raise ValueError("the body's length changed: frame it as chunked")
    return Copied(read, written)
