"""egress/intercept*.py against a real local TLS upstream and a client trusting the CA.

The upstream is an HTTPS server on loopback with a certificate for
api.example.com from its own authority (the proxy's upstream trust is set to
it); it records every connection and every whole request it gets. The client
speaks TLS to `serve_intercepted` over a socket pair, as the sandbox's relay
would hand the proxy its connection after a CONNECT.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tooljaild.egress.http_bodies import copy_body
from tooljaild.egress.http_heads import (
    Framing,
    RequestHead,
    read_request_head,
    read_response_head,
    request_framing,
    response_framing,
)
from tooljaild.egress.intercept import serve_intercepted
from tooljaild.egress.intercept_upstream import HOLD_BYTES
from tooljaild.egress.policy import EgressPolicy, HeldSecret
from tooljaild.egress.rules import parse_rule
from tooljaild.egress.tls import InterceptCA, upstream_context

HOST = "api.example.com"


NEWS = HeldSecret(
    "NEWS_API_KEY",
    "V4lue-0f-the-news-key",
    (parse_rule(f"{HOST}:443"),),
    "tooljail-secret-" + "1" * 32,
)
OTHER = HeldSecret(
    "OTHER_KEY",
    "other-secret-value",
    (parse_rule("other.example.com:443"),),
    "tooljail-secret-" + "2" * 32,
)
POLICY = EgressPolicy(allow=(parse_rule(HOST),), secrets=(NEWS, OTHER))


HUGE_BYTES = 48 * 1024 * 1024


class _Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


class _Cache:
    """A package cache in a directory: what serve_intercepted needs of one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lookups: list[str] = []

    def wants(self, host: str) -> bool:
        return host == HOST

    def _path(self, url: str) -> Path:
        return self.root / url.replace("/", "_")

    def lookup(self, url: str) -> Path | None:
        self.lookups.append(url)
        path = self._path(url)
        return path if path.exists() else None

    def writer(self, url: str) -> _CacheWriter | None:
        return _CacheWriter(self._path(url)) if url.endswith(".whl") else None


class _CacheWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    def commit(self) -> Path:
        self.path.write_bytes(self.data)
        return self.path

    def abort(self) -> None:
        self.data.clear()


@dataclass
class Upstream:
    """A local HTTPS server that records what reaches it and answers by path."""

    port: int = 0
    connections: int = 0
    requests: list[tuple[RequestHead, bytes]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await read_request_head(reader)
                sink = _Sink()
                await copy_body(reader, sink, request_framing(head))
                self.requests.append((head, bytes(sink.data)))
                if head.target.startswith("/huge"):
                    await self.huge(writer)
                    continue
                answer = self.answer(head, bytes(sink.data))
                if head.method == "HEAD":
                    answer = answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(answer)
                await writer.drain()
                if head.target.startswith("/close"):
                    return
        except Exception:
            pass
        finally:
            writer.close()

    async def huge(self, writer: asyncio.StreamWriter) -> None:
        """HUGE_BYTES, chunked, written as fast as the reader takes them."""
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (64 * 1024, b"h" * 64 * 1024)
        for _ in range(HUGE_BYTES // (64 * 1024)):
            writer.write(piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def answer(self, head: RequestHead, body: bytes) -> bytes:
        if head.target.startswith("/close"):
            # Delimited by the close, the value in it.
            return b"HTTP/1.1 200 OK\r\n\r\nbefore " + NEWS.value.encode() + b" after"
        if head.target.startswith("/len"):
            text = b"%d" % len(body)
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)
        if head.target.startswith("/big"):
            # A streamed answer bigger than the proxy holds, the value cut across pieces.
            piece = b"x" * 70_000 + NEWS.value.encode() + b"y" * 70_000
            chunks = b"".join(
                b"%x\r\n%s\r\n" % (len(p), p) for p in (piece[:70_005], piece[70_005:]) * 10
            )
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        echo = json.dumps(
            {"target": head.target, "headers": head.headers, "body": body.decode("latin-1")}
        ).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Echo-Key: "
            + (head.get("x-api-key") or "").encode("latin-1")
            + b"\r\nContent-Length: %d\r\n\r\n" % len(echo)
            + echo
        )


@dataclass
class World:
    ca: InterceptCA
    upstream: Upstream
    upstream_ctx: ssl.SSLContext
    client_ctx: ssl.SSLContext
    denials: list[tuple[str, str]]
    usage: list[tuple[int, int]]

    async def tunnel(
        self, *, host: str = HOST, sni: str | None = HOST, cache: _Cache | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.Task[None]]:
        """A client connection through serve_intercepted, TLS done."""
        ours, theirs = socket.socketpair()
        task = asyncio.create_task(self.serve(ours, host, cache))
        reader, writer = await asyncio.open_connection(
            sock=theirs, ssl=self.client_ctx, server_hostname=sni
        )
        return reader, writer, task

    async def serve(
        self, sock: socket.socket, host: str = HOST, cache: _Cache | None = None
    ) -> None:
        await serve_intercepted(
            sock,
            connect_host=host,
            connect_port=443,
            upstream_addr=("127.0.0.1", self.upstream.port),
            policy=POLICY,
            ca=self.ca,
            upstream_ctx=self.upstream_ctx,
            account=lambda out, inn: self.usage.append((out, inn)),
            deny=lambda reason, detail: self.denials.append((reason, detail)),
            cache=cache,
        )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    upstream_ca = InterceptCA.load_or_create(tmp_path / "upstream-ca")
    upstream = Upstream()
    server = await asyncio.start_server(
        upstream.handle, "127.0.0.1", 0, ssl=upstream_ca.server_context(HOST)
    )
    upstream.port = server.sockets[0].getsockname()[1]
    ca = InterceptCA.load_or_create(tmp_path / "intercept-ca")
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    yield World(
        ca=ca,
        upstream=upstream,
        upstream_ctx=upstream_context(tmp_path / "upstream-ca" / "ca.pem"),
        client_ctx=client_ctx,
        denials=[],
        usage=[],
    )
    server.close()
    await server.wait_closed()


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes, method: str = "GET"
) -> tuple[int, list[tuple[str, str]], bytes]:
    writer.write(raw)
    await writer.drain()
    head = await asyncio.wait_for(read_response_head(reader), 10)
    sink = _Sink()
    # out "close": the body's bytes alone, without its chunked framing.
    await copy_body(reader, sink, response_framing(head, method), out=Framing("close"))
    return head.status, head.headers, bytes(sink.data)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await asyncio.wait_for(writer.wait_closed(), 5)


def _get(target: str, *headers: str, host: str = HOST) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def test_placeholders_reach_upstream_as_values_and_echoes_come_back_scrubbed(
    world: World,
) -> None:
    reader, writer, task = await world.tunnel()
    basic = base64.b64encode(f"user:{NEWS.placeholder}".encode()).decode()
    status, headers, body = await _request(
        reader,
        writer,
        _get(
            f"/news?apiKey={NEWS.placeholder}",
            f"X-Api-Key: {NEWS.placeholder}",
            f"Authorization: Basic {basic}",
        ),
    )
    assert status == 200
    ((head, _),) = world.upstream.requests
    assert head.get("x-api-key") == NEWS.value
    assert head.target == f"/news?apiKey={NEWS.value}"
    assert base64.b64decode(head.get("authorization").split()[1]).decode() == f"user:{NEWS.value}"
    # The echo of the value (body, a header, the Basic credentials) is scrubbed.
    assert NEWS.value.encode() not in body
    assert base64.b64encode(f"user:{NEWS.value}".encode()) not in body
    assert dict(headers)["X-Echo-Key"] == NEWS.placeholder
    echoed = json.loads(body)
    assert echoed["target"] == f"/news?apiKey={NEWS.placeholder}"
    assert [NEWS.placeholder] == [v for k, v in echoed["headers"] if k == "X-Api-Key"]
    assert int(dict(headers)["Content-Length"]) == len(body)
    # Kept alive: a second request on the same tunnel and upstream connection.
    status, _, _ = await _request(reader, writer, _get("/again"))
    assert status == 200
    assert len(world.upstream.requests) == 2
    assert world.upstream.connections == 1
    assert world.denials == []
    assert len(world.usage) == 2 and all(o > 0 and i > 0 for o, i in world.usage)
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_package_index_answers_are_cached_and_served_from_the_cache(
    world: World, tmp_path: Path
) -> None:
    cache = _Cache(tmp_path)
    reader, writer, task = await world.tunnel(cache=cache)
    status, _, first = await _request(reader, writer, _get("/files/pkg-1.0-py3-none-any.whl"))
    assert status == 200
    assert len(world.upstream.requests) == 1
    await _close(writer)
    await asyncio.wait_for(task, 10)
    reader, writer, task = await world.tunnel(cache=cache)
    status, headers, again = await _request(reader, writer, _get("/files/pkg-1.0-py3-none-any.whl"))
    assert status == 200
    assert again == first
    assert dict(headers)["Content-Length"] == str(len(first))
    assert len(world.upstream.requests) == 1  # the second came from the cache
    # A URL that carried a secret is no cache key (and not looked up).
    status, _, _ = await _request(reader, writer, _get(f"/files/x.whl?k={NEWS.placeholder}"))
    assert status == 200
    assert all(NEWS.placeholder not in url and NEWS.value not in url for url in cache.lookups)
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_a_big_upload_streams_whole_to_the_upstream(world: World) -> None:
    reader, writer, task = await world.tunnel()
    body = b"z" * (3 * HOLD_BYTES + 12345)
    head = f"POST /len HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(body)}\r\n\r\n"
    status, _, answer = await _request(reader, writer, head.encode() + body, "POST")
    assert (status, answer) == (200, str(len(body)).encode())
    assert world.upstream.requests[0][1] == body
    assert world.usage[0][0] > len(body)
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_close_delimited_answer_is_rechunked_and_the_client_kept(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, headers, body = await _request(reader, writer, _get("/close"))
    assert status == 200
    assert dict(headers).get("Transfer-Encoding") == "chunked"
    assert body == b"before " + NEWS.placeholder.encode() + b" after"
    # The sandbox's connection carries on, over a new upstream connection.
    status, _, _ = await _request(reader, writer, _get("/again"))
    assert status == 200
    assert world.upstream.connections == 2
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_http10_client_gets_a_close_delimited_scrubbed_answer(world: World) -> None:
    reader, writer, task = await world.tunnel()
    writer.write(f"GET /big HTTP/1.0\r\nHost: {HOST}\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(-1), 10)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"chunked" not in head.lower() and b"connection: close" in head.lower()
    assert NEWS.value.encode() not in body
    assert body.count(NEWS.placeholder.encode()) == 10
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_head_request_keeps_its_length_and_sends_no_body(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, headers, body = await _request(
        reader, writer, f"HEAD /x HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode(), "HEAD"
    )
    assert status == 200 and body == b""
    assert int(dict(headers)["Content-Length"]) > 0
    status, _, _ = await _request(reader, writer, _get("/again"))
    assert status == 200
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_a_sandbox_that_does_not_read_costs_bounded_memory(world: World) -> None:
    """A huge answer to a sandbox that stops reading: backpressure reaches the
    upstream (the proxy does not buffer the answer), and the loop stays free."""
    process = psutil.Process()
    reader, writer, task = await world.tunnel()
    before = process.memory_info().rss
    writer.write(_get("/huge"))
    await writer.drain()
    # Not reading for a while: a proxy without backpressure would take it all.
    ticks = 0
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        await asyncio.sleep(0.01)
        ticks += 1
    grown = process.memory_info().rss - before
    assert grown < 16 * 1024 * 1024, grown
    assert ticks > 50  # the loop kept answering meanwhile
    head = await asyncio.wait_for(read_response_head(reader), 10)
    assert head.status == 200
    counter = _Counter()
    await asyncio.wait_for(
        copy_body(reader, counter, response_framing(head, "GET"), out=Framing("close")), 60
    )
    assert counter.count == HUGE_BYTES
    await _close(writer)
    await asyncio.wait_for(task, 10)


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> None:
        self.count += len(data)

    async def drain(self) -> None:
        return None


async def test_big_streamed_answer_is_scrubbed_across_pieces(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, headers, body = await _request(reader, writer, _get("/big"))
    assert status == 200
    assert dict(headers).get("Transfer-Encoding") == "chunked"
    assert len(body) > HOLD_BYTES
    assert NEWS.value.encode() not in body
    assert body.count(NEWS.placeholder.encode()) == 10
    await _close(writer)
    await asyncio.wait_for(task, 10)


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (_get("/", f"X-Key: {OTHER.placeholder}"), "header X-Key"),
        (_get(f"/q?k={OTHER.placeholder}"), "url"),
        (
            (
                f"POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 60\r\n\r\n"
                + f"data={OTHER.placeholder}".ljust(60)
            ).encode(),
            "body",
        ),
        (
            (
                f"POST /upload HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n"
                f"5\r\ndata=\r\n{len(OTHER.placeholder) // 2:x}\r\n"
                f"{OTHER.placeholder[: len(OTHER.placeholder) // 2]}\r\n"
                f"{len(OTHER.placeholder) - len(OTHER.placeholder) // 2:x}\r\n"
                f"{OTHER.placeholder[len(OTHER.placeholder) // 2 :]}\r\n0\r\n\r\n"
            ).encode(),
            "body",
        ),
    ],
)
async def test_a_leak_is_refused_and_nothing_reaches_upstream(
    world: World, raw: bytes, where: str
) -> None:
    reader, writer, task = await world.tunnel()
    status, _, body = await _request(reader, writer, raw)
    assert status == 403
    text = body.decode()
    assert "secret_leak" in text and "OTHER_KEY" in text and where in text
    assert OTHER.placeholder not in text and OTHER.value not in text
    assert world.denials == [("secret_leak", f"OTHER_KEY in the {where}")]
    assert world.upstream.connections == 0
    assert world.upstream.requests == []
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_a_leak_late_in_a_big_body_never_completes_a_request(world: World) -> None:
    reader, writer, task = await world.tunnel()
    body = b"a" * (HOLD_BYTES + 200_000) + OTHER.placeholder.encode()
    writer.write(
        f"POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    writer.write(body)
    await writer.drain()
    head = await asyncio.wait_for(read_response_head(reader), 10)
    assert head.status == 403
    await _close(writer)
    await asyncio.wait_for(task, 10)
    await asyncio.sleep(0.1)
    assert world.upstream.requests == []
    assert world.denials == [("secret_leak", "OTHER_KEY in the body")]


async def test_sni_other_than_the_connect_host_is_refused(world: World) -> None:
    world.client_ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await world.tunnel(sni="evil.example.com")
    await asyncio.sleep(0.1)
    assert world.denials[0][0] == "sni_mismatch"
    assert "evil.example.com" in world.denials[0][1]
    assert world.upstream.connections == 0


async def test_host_header_other_than_the_connect_host_is_refused(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, _, body = await _request(
        reader, writer, _get("/", f"X-Api-Key: {NEWS.placeholder}", host="evil.example.com")
    )
    assert status == 403
    assert b"host_mismatch" in body
    assert world.denials[0][0] == "host_mismatch"
    assert world.upstream.connections == 0
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_absolute_target_naming_another_host_is_refused(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, _, body = await _request(reader, writer, _get("https://evil.example.com/x"))
    assert status == 403
    assert b"host_mismatch" in body
    assert world.upstream.connections == 0
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_not_http_inside_the_tunnel_is_400(world: World) -> None:
    reader, writer, task = await world.tunnel()
    status, _, body = await _request(reader, writer, b"\x00\x01garbage\r\n\r\n")
    assert status == 400
    assert b"not an HTTP/1.1 message" in body
    assert world.denials[0][0] == "bad_request"
    await asyncio.wait_for(task, 10)


async def test_not_tls_after_connect_is_closed(world: World) -> None:
    ours, theirs = socket.socketpair()
    task = asyncio.create_task(world.serve(ours))
    reader, writer = await asyncio.open_connection(sock=theirs)
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    await _close(writer)
    await asyncio.wait_for(task, 10)
    assert world.denials[0][0] == "bad_request"
    await _close(writer)


async def test_upstream_with_an_untrusted_certificate_is_502(world: World) -> None:
    world.upstream_ctx = ssl.create_default_context()  # the system's roots only
    reader, writer, task = await world.tunnel()
    status, _, body = await _request(reader, writer, _get("/"))
    assert status == 502
    assert b"certificate" in body
    assert world.denials == []
    await _close(writer)
    await asyncio.wait_for(task, 10)


async def test_http_client_with_expect_continue(world: World, tmp_path: Path) -> None:
    """http.client (what urllib uses) through the tunnel: a POST with a body."""
    ours, theirs = socket.socketpair()
    task = asyncio.create_task(world.serve(ours))

    def client() -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(HOST, context=world.client_ctx, timeout=10)
        conn.sock = world.client_ctx.wrap_socket(theirs, server_hostname=HOST)
        conn.request(
            "POST",
            "/post",
            body=b'{"q": 1}',
            headers={"X-Api-Key": NEWS.placeholder, "Expect": "100-continue"},
        )
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    status, data = await asyncio.to_thread(client)
    assert status == 200
    ((head, body),) = world.upstream.requests
    assert head.get("x-api-key") == NEWS.value
    assert head.get("expect") is None
    assert body == b'{"q": 1}'
    assert NEWS.value.encode() not in data
    await asyncio.wait_for(task, 10)


def _timed(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


async def test_bench_print_leaf_mint_and_handshake_overhead(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a timed assertion: prints leaf mint time and the interception's
    handshake overhead against a direct TLS connection to the same upstream."""
    mint = _timed(
        lambda: world.ca._mint(
            "bench.example.com", __import__("datetime").datetime.now(__import__("datetime").UTC)
        ),
        50,
    )

    async def direct() -> None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", world.upstream.port, ssl=world.upstream_ctx, server_hostname=HOST
        )
        await _request(reader, writer, _get("/"))
        writer.close()

    async def through() -> None:
        reader, writer, task = await world.tunnel()
        await _request(reader, writer, _get("/"))
        writer.close()
        await task

    async def once(fn: Callable[[], Awaitable[None]]) -> float:
        start = time.perf_counter()
        await fn()
        return time.perf_counter() - start

    await direct()
    await through()
    # Interleaved, so that the machine's load weighs on both alike.
    pairs = [(await once(direct), await once(through)) for _ in range(60)]
    d = sorted(p[0] for p in pairs)[30]
    t = sorted(p[1] for p in pairs)[30]
    with capsys.disabled():
        print(
            f"\nleaf mint: {mint * 1000:.2f} ms; one GET over a fresh connection p50: "
            f"direct TLS {d * 1000:.2f} ms, intercepted {t * 1000:.2f} ms "
            f"(+{(t - d) * 1000:.2f} ms)"
        )
