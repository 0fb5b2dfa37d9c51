"""egress/http_heads.py, http_bodies.py, http_targets.py: strict, bounded HTTP/1.1 messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tooljaild.egress.http_bodies import as_chunked, copy_body
from tooljaild.egress.http_heads import (
    BadRequest,
    BadResponse,
    Framing,
    HeadClosed,
    RequestHead,
    ResponseHead,
    read_request_head,
    read_response_head,
    request_framing,
    response_framing,
)
from tooljaild.egress.http_targets import parse_authority, parse_target


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


class _Sink:
    """A StreamWriter stand-in that keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def _writer(sink: _Sink) -> Any:
    return sink


async def test_request_head_round_trip() -> None:
    raw = (
        b"GET http://api.example.com/x?q=1 HTTP/1.1\r\nHost: api.example.com\r\n"
        b"X-A:  v  \r\n\r\nBODY"
    )
    reader = _reader(raw)
    head = await read_request_head(reader)
    assert (head.method, head.target, head.version) == (
        "GET",
        "http://api.example.com/x?q=1",
        "HTTP/1.1",
    )
    assert head.host_header == "api.example.com"
    assert head.get("x-a") == "v"
    assert head.to_bytes() == (
        b"GET http://api.example.com/x?q=1 HTTP/1.1\r\nHost: api.example.com\r\nX-A: v\r\n\r\n"
    )
    assert await reader.read() == b"BODY"


async def test_bare_lf_and_leading_empty_lines_are_read() -> None:
    head = await read_request_head(_reader(b"\r\nGET / HTTP/1.0\nHost: a\n\n"))
    assert head.version == "HTTP/1.0"
    assert head.host_header == "a"


async def test_eof_before_any_byte_is_head_closed() -> None:
    with pytest.raises(HeadClosed):
        await read_request_head(_reader(b""))


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "not an http"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "request line"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1"),
        (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "folding"),
        (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "malformed header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "more than one host"),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "both",
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", "malformed content-length"),
        (b"POST / HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\n", "malformed content-length"),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "conflicting"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "other than chunked"),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "http/1.0"),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", "control character"),
        (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", "bare cr"),
        (b"GET / HTTP/1.1\r\nHost: a\r\n", "closed"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", "longer than"),
        (
            b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n",
            "more than 100",
        ),
    ],
)
async def test_bad_requests_are_refused(raw: bytes, what: str) -> None:
    with pytest.raises(BadRequest) as caught:
        await read_request_head(_reader(raw))
    assert what.lower() in caught.value.reason.lower()


async def test_whole_head_is_bounded() -> None:
    raw = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(90))
    with pytest.raises(BadRequest, match="too big"):
        await read_request_head(_reader(raw + b"\r\n"), limit=64 * 1024)


async def test_a_line_past_the_readers_limit_is_refused_not_buffered() -> None:
    reader = asyncio.StreamReader(limit=16 * 1024)
    reader.feed_data(b"GET / HTTP/1.1\r\nX: " + b"a" * 100_000)
    with pytest.raises(BadRequest, match="longer than"):
        await read_request_head(reader)


async def test_response_head_and_framing() -> None:
    head = await read_response_head(_reader(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"))
    assert (head.status, head.reason) == (200, "OK")
    assert response_framing(head, "GET") == Framing("length", 5)
    assert response_framing(head, "HEAD") == Framing("none")
    no_reason = await read_response_head(_reader(b"HTTP/1.1 204\r\n\r\n"))
    assert response_framing(no_reason, "GET") == Framing("none")
    close = ResponseHead("HTTP/1.1", 200, "OK", [])
    assert response_framing(close, "GET") == Framing("close")
    chunked = ResponseHead("HTTP/1.1", 200, "OK", [("Transfer-Encoding", "chunked")])
    assert response_framing(chunked, "GET") == Framing("chunked")
    with pytest.raises(BadResponse):
        await read_response_head(_reader(b"HTTP/9 200 OK\r\n\r\n"))
    both = ResponseHead(
        "HTTP/1.1", 200, "OK", [("Transfer-Encoding", "chunked"), ("Content-Length", "1")]
    )
    with pytest.raises(BadResponse):
        response_framing(both, "GET")


def test_request_framing() -> None:
    assert request_framing(RequestHead("GET", "/", "HTTP/1.1", [])) == Framing("none")
    head = RequestHead("POST", "/", "HTTP/1.1", [("Content-Length", "0")])
    assert request_framing(head) == Framing("none")


async def test_copy_length_body() -> None:
    sink = _Sink()
    copied = await copy_body(_reader(b"hello world"), _writer(sink), Framing("length", 5))
    assert bytes(sink.data) == b"hello"
    assert copied == (5, 5)


async def test_copy_length_short_is_refused() -> None:
    with pytest.raises(BadRequest, match="closed"):
        await copy_body(_reader(b"hel"), _writer(_Sink()), Framing("length", 5))


async def test_copy_chunked_with_extensions_and_trailers() -> None:
    raw = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: secret\r\n\r\nNEXT"
    reader = _reader(raw)
    sink = _Sink()
    copied = await copy_body(reader, _writer(sink), Framing("chunked"))
    # Trailers are dropped: nothing in them reaches the other side unchecked.
    assert bytes(sink.data) == b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    assert copied.read == len(raw) - 4
    assert await reader.read() == b"NEXT"


@pytest.mark.parametrize(
    "raw",
    [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabXX0\r\n\r\n", b"2\r\nab", b"1" * 17 + b"\r\n"],
)
async def test_copy_bad_chunked_is_refused(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        await copy_body(_reader(raw), _writer(_Sink()), Framing("chunked"))


async def test_on_chunk_that_changes_lengths_is_rechunked() -> None:
    sink = _Sink()
    await copy_body(
        _reader(b"abcabc"),
        _writer(sink),
        Framing("length", 6),
        on_chunk=lambda data: data.replace(b"b", b"BBB"),
        on_end=lambda: b"!",
        out=Framing("chunked"),
    )
    assert bytes(sink.data) == b"a\r\naBBBcaBBBc\r\n1\r\n!\r\n0\r\n\r\n"
    assert as_chunked([("Content-Length", "6"), ("X", "y")]) == [
        ("X", "y"),
        ("Transfer-Encoding", "chunked"),
    ]


async def test_on_chunk_that_changes_a_fixed_length_is_refused() -> None:
    with pytest.raises(ValueError, match=r"(?i)length"):
        await copy_body(
            _reader(b"abc"),
            _writer(_Sink()),
            Framing("length", 3),
            on_chunk=lambda data: data + b"x",
        )


async def test_copy_until_close() -> None:
    sink = _Sink()
    await copy_body(_reader(b"x" * 200_000), _writer(sink), Framing("close"))
    assert len(sink.data) == 200_000


@pytest.mark.parametrize(
    ("target", "method", "expected"),
    [
        ("http://API.example.com./a?b=1#f", "GET", ("http", "api.example.com", 80, "/a?b=1")),
        ("http://h:8080", "GET", ("http", "h", 8080, "/")),
        ("http://h?x=1", "GET", ("http", "h", 80, "/?x=1")),
        ("https://10.0.0.5/", "GET", ("https", "10.0.0.5", 443, "/")),
        ("http://[::1]:81/", "GET", ("http", "::1", 81, "/")),
        ("api.example.com:443", "CONNECT", ("", "api.example.com", 443, "")),
        ("[::1]:443", "CONNECT", ("", "::1", 443, "")),
    ],
)
def test_parse_target(target: str, method: str, expected: tuple[str, str, int, str]) -> None:
    assert parse_target(RequestHead(method, target, "HTTP/1.1", [])) == expected


@pytest.mark.parametrize(
    ("target", "method"),
    [
        ("/path", "GET"),
        ("ftp://h/", "GET"),
        ("http://user:pw@h/", "GET"),
        ("http://h:0/", "GET"),
        ("http://h:99999/", "GET"),
        ("http://h%2e.com/", "GET"),
        ("http:///x", "GET"),
        ("h", "CONNECT"),
        ("h:x", "CONNECT"),
        ("[zz]:1", "CONNECT"),
        ("bad_host-.com:443", "CONNECT"),
    ],
)
def test_parse_target_refuses(target: str, method: str) -> None:
    with pytest.raises(BadRequest):
        parse_target(RequestHead(method, target, "HTTP/1.1", []))


def test_parse_authority() -> None:
    assert parse_authority("Example.com:8443") == ("example.com", 8443)
    assert parse_authority("example.com") == ("example.com", None)
