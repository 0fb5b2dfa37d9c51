"""HTTP/1.1 message heads for the egress proxy: strict and bounded.

The proxy reads what a sandbox sends and what an upstream answers; both are
untrusted. Everything here is bounded before it is buffered: a head is at most
`limit` bytes (64 KiB), a line at most 8 KiB, at most 100 header fields.
Anything a lenient parser would "repair" (obs-fold, both Content-Length and
Transfer-Encoding, a bad or conflicting Content-Length, whitespace before a
colon, control characters) is refused with `BadRequest` (`BadResponse` for an
upstream's answer), because two parsers that repair differently are how
requests get smuggled past a proxy. A head's framing (how its body is
delimited) is read here too, so a head that is returned can be framed; the
body itself is copied by `http_bodies`, a proxy request's target read by
`http_targets`.

Heads are re-serialised by `to_bytes()` (CRLF, one space after the colon), so
what goes on is what was checked, never the bytes as received.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from tooljail.errors import TooljailError

HEAD_LIMIT = 64 * 1024
"""Default bound on a whole head (request or status line plus header fields)."""
LINE_LIMIT = 8 * 1024
"""Bound on one line of a head, a chunk-size line or a trailer line."""
MAX_HEADERS = 100
"""Bound on the header fields of one head (and on the trailer fields of a body)."""
_MAX_EMPTY_LINES = 4
"""Empty lines tolerated before a request line (some clients send CRLF after a body)."""

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A field value: visible ASCII, obs-text (bytes >= 0x80), spaces and tabs; never
# CR, LF, NUL or another control character.
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_REQUEST_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/1\.[01]")
_STATUS = re.compile(rb"[0-9]{3}")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


class BadRequest(TooljailError):
    """A message the proxy will not read: not HTTP/1.x, too big, or badly framed.

    `reason` is a short text a person can act on; it never quotes header values
    (they may hold a secret's placeholder or value).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadResponse(BadRequest):
    """An upstream's answer the proxy will not read (the sandbox gets a 502)."""


class HeadClosed(BadRequest):
    """The peer closed the connection before sending any byte of a head.

    Between keep-alive requests this is the ordinary end of a connection, not
    an error; it is a `BadRequest` so that a caller that does not care may treat
    both alike.
    """

    def __init__(self) -> None:
        super().__init__("the connection closed before a message began")


Headers = list[tuple[str, str]]


def _get_all(headers: Headers, name: str) -> list[str]:
    lname = name.lower()
    return [v for k, v in headers if k.lower() == lname]


def _get(headers: Headers, name: str) -> str | None:
    values = _get_all(headers, name)
    return values[0] if values else None


def _headers_bytes(headers: Headers) -> bytes:
    return b"".join(k.encode("latin-1") + b": " + v.encode("latin-1") + b"\r\n" for k, v in headers)


@dataclass
class RequestHead:
    """A request line and its header fields, in order, names as sent.

    Header values are `str` decoded as latin-1 (bytes preserved one-to-one).
    """

    method: str
    target: str
    version: str
    headers: Headers = field(default_factory=list)

    @property
    def host_header(self) -> str | None:
        """The Host field's value (at most one exists: more is refused on read)."""
        return _get(self.headers, "host")

    def get(self, name: str) -> str | None:
        """The first value of field `name` (any case), None when absent."""
        return _get(self.headers, name)

    def get_all(self, name: str) -> list[str]:
        """Every value of field `name` (any case), in order."""
        return _get_all(self.headers, name)

    def to_bytes(self) -> bytes:
        """The head as it goes on the wire: request line, fields, empty line."""
        line = f"{self.method} {self.target} {self.version}\r\n".encode("latin-1")
        return line + _headers_bytes(self.headers) + b"\r\n"


@dataclass
class ResponseHead:
    """A status line and its header fields, in order, names as sent."""

    version: str
    status: int
    reason: str
    headers: Headers = field(default_factory=list)

    def get(self, name: str) -> str | None:
        """The first value of field `name` (any case), None when absent."""
        return _get(self.headers, name)

    def get_all(self, name: str) -> list[str]:
        """Every value of field `name` (any case), in order."""
        return _get_all(self.headers, name)

    def to_bytes(self) -> bytes:
        """The head as it goes on the wire: status line, fields, empty line."""
        line = f"{self.version} {self.status} {self.reason}\r\n".encode("latin-1")
        return line + _headers_bytes(self.headers) + b"\r\n"


class Budget:
    """What is left of a head's (or a trailer's) byte budget."""

    def __init__(self, limit: int) -> None:
        self.left = limit


async def read_line(
    reader: asyncio.StreamReader,
    budget: Budget | None,
    error: type[BadRequest],
    *,
    first: bytes = b"",
) -> bytes:
    """One line without its CRLF (or bare LF); bounded by LINE_LIMIT and the budget.

    Raises:
        error: the line is too long, holds a bare CR, or the stream ended mid-line.
        asyncio.IncompleteReadError: the stream ended before any byte of the line.
    """
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError as exc:
        raise error(f"a line is longer than {LINE_LIMIT} bytes") from exc
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise
        raise error("the connection closed in the middle of a line") from exc
    raw = first + raw
    if len(raw) > LINE_LIMIT:
        raise error(f"a line is longer than {LINE_LIMIT} bytes")
    if budget is not None:
        budget.left -= len(raw)
        if budget.left < 0:
            raise error("the head is too big")
    line = raw[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    if b"\r" in line:
        raise error("a bare CR in a line")
    return line


async def read_fields(
    reader: asyncio.StreamReader, budget: Budget | None, error: type[BadRequest]
) -> Headers:
    """Header (or trailer) fields up to the empty line."""
    headers: Headers = []
    while True:
        try:
            line = await read_line(reader, budget, error)
        except asyncio.IncompleteReadError as exc:
            raise error("the connection closed before the head ended") from exc
        if not line:
            return headers
        if line[:1] in (b" ", b"\t"):
            raise error("obsolete line folding in a header")
        if len(headers) >= MAX_HEADERS:
            raise error(f"more than {MAX_HEADERS} header fields")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise error("a malformed header field")
        value = value.strip(b" \t")
        if not _FIELD_VALUE.fullmatch(value):
            raise error(f"a control character in header {name.decode('ascii')}")
        headers.append((name.decode("ascii"), value.decode("latin-1")))


async def _first_line(
    reader: asyncio.StreamReader, budget: Budget, error: type[BadRequest], *, skip_empty: int
) -> bytes:
    started = False
    for _ in range(skip_empty + 1):
        try:
            # The first byte alone first: a client that speaks TLS (or SSH) to
            # the proxy sends no newline and waits; it is told at once instead.
            first = await reader.readexactly(1)
            started = True
            if first not in b"\r\n" and not _TOKEN.fullmatch(first):
                raise error("not an HTTP/1.1 message (a request must begin with a method)")
            line = await read_line(reader, budget, error, first=first)
        except asyncio.IncompleteReadError as exc:
            if started:
                raise error("the connection closed before the head ended") from exc
            raise HeadClosed() from exc
        if line:
            return line
    raise error("too many empty lines before the head")


def _check_single(headers: Headers, name: str, error: type[BadRequest]) -> None:
    if len(_get_all(headers, name)) > 1:
        raise error(f"more than one {name} header")


async def read_request_head(
    reader: asyncio.StreamReader, *, limit: int = HEAD_LIMIT
) -> RequestHead:
    """Read one request head; the body (if any) stays in `reader`.

    Args:
        reader: the client's stream. The caller bounds the wait (wrap in
            `asyncio.timeout`): this function never times out by itself.
        limit: the most bytes the whole head may take.

    Raises:
        HeadClosed: the stream ended before the first byte (a keep-alive close).
        BadRequest: not an HTTP/1.0 or 1.1 request, over a bound, or malformed;
            including more than one Host header and a bad or conflicting framing
            (checked here so that a head that is returned can be framed).
    """
    budget = Budget(limit)
    line = await _first_line(reader, budget, BadRequest, skip_empty=_MAX_EMPTY_LINES)
    parts = line.split(b" ")
    if len(parts) != 3:
        raise BadRequest("not an HTTP request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _VERSION.fullmatch(version):
        raise BadRequest("not an HTTP/1.1 request line")
    if not _REQUEST_TARGET.fullmatch(target):
        raise BadRequest("a malformed request target")
    headers = await read_fields(reader, budget, BadRequest)
    head = RequestHead(
        method.decode("ascii"), target.decode("ascii"), version.decode("ascii"), headers
    )
    _check_single(headers, "host", BadRequest)
    request_framing(head)
    return head


async def read_response_head(
    reader: asyncio.StreamReader, *, limit: int = HEAD_LIMIT
) -> ResponseHead:
    """Read one response head (1xx included: the caller loops over them).

    Raises:
        HeadClosed: the stream ended before the first byte.
        BadResponse: not an HTTP/1.x status line, over a bound, or malformed.
    """
    budget = Budget(limit)
    line = await _first_line(reader, budget, BadResponse, skip_empty=0)
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        raise BadResponse("not an HTTP status line")
    version, status = parts[0], parts[1]
    reason = parts[2] if len(parts) == 3 else b""
    if not _VERSION.fullmatch(version) or not _STATUS.fullmatch(status):
        raise BadResponse("not an HTTP/1.1 status line")
    if not _FIELD_VALUE.fullmatch(reason):
        raise BadResponse("a control character in the status line")
    headers = await read_fields(reader, budget, BadResponse)
    return ResponseHead(version.decode("ascii"), int(status), reason.decode("latin-1"), headers)


class Framing(NamedTuple):
    """How a body is delimited.

    kind: "none" (no body), "length" (`length` bytes), "chunked", or "close"
    (until the sender closes: responses only).
    """

    kind: Literal["none", "length", "chunked", "close"]
    length: int = 0


NO_BODY = Framing("none")


def _framing(
    headers: Headers, version: str, error: type[BadRequest], *, default: Framing
) -> Framing:
    te = _get_all(headers, "transfer-encoding")
    cl = _get_all(headers, "content-length")
    if te and cl:
        raise error("both Content-Length and Transfer-Encoding")
    if te:
        if version == "HTTP/1.0":
            raise error("Transfer-Encoding in an HTTP/1.0 message")
        codings = [c.strip().lower() for v in te for c in v.split(",")]
        if codings == ["chunked"]:
            return Framing("chunked")
        raise error("a Transfer-Encoding other than chunked")
    if cl:
        values = {v.strip() for v in cl}
        if len(values) != 1:
            raise error("conflicting Content-Length headers")
        (value,) = values
        if not _CONTENT_LENGTH.fullmatch(value):
            raise error("a malformed Content-Length")
        length = int(value)
        return Framing("length", length) if length else NO_BODY
    return default


def request_framing(head: RequestHead) -> Framing:
    """The framing of a request's body ("none" when it has neither CL nor TE).

    Raises:
        BadRequest: both CL and TE, a coding other than chunked, a bad or
            conflicting Content-Length.
    """
    return _framing(head.headers, head.version, BadRequest, default=NO_BODY)


def response_framing(head: ResponseHead, request_method: str) -> Framing:
    """The framing of a response's body, given the method of its request.

    A HEAD request's answer, 1xx, 204 and 304 have no body; otherwise
    Transfer-Encoding chunked, else Content-Length, else until close.

    Raises:
        BadResponse: both CL and TE, a coding other than chunked, a bad CL.
    """
    if request_method.upper() == "HEAD" or head.status < 200 or head.status in (204, 304):
        return NO_BODY
    if request_method.upper() == "CONNECT" and 200 <= head.status < 300:
        return NO_BODY
    return _framing(head.headers, head.version, BadResponse, default=Framing("close"))
