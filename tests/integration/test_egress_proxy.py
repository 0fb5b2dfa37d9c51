"""The egress proxy over real sockets: the test plays the sandbox's relay.

Each test opens a gate in a temporary directory, connects to its proxy.sock
as the relay does, and passes one end of a socket pair (or an accepted TCP
socket) per connection; it then speaks HTTP on the other end. Local servers on
127.0.0.1 stand in for the world, mapped by name through the hosts map, and
record every connection they get: a refusal must leave them untouched.
"""

from __future__ import annotations

import contextlib
import gc
import http.server
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.certs import Authority
from tooljaild.egress.gate import EgressGate
from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.policy import NO_EGRESS, EgressPolicy, HeldSecret
from tooljaild.egress.proxy import EgressProxy
from tooljaild.egress.rules import parse_rules
from tooljaild.egress.tls import InterceptCA
from tooljaild.egress.usage import MAX_DENIALS

# -- the world: recording servers -------------------------------------------

BIG = bytes(range(256)) * (32 * 1024)  # 8 MiB


@dataclass
class Record:
    connections: list[tuple[str, int]] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    sni: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> int:
        with self.lock:
            return len(self.connections) + len(self.requests)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go out in two writes: with Nagle on, the body would wait
    # for the proxy's delayed ACK of the head (the world's delay, not the proxy's).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body_in = self.rfile.read(length) if length else b""
        if len(body_in) < length:
            return  # a request cut mid-body never counts as received
        with self.server.record.lock:
            self.server.record.requests.append(
                (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            )
        body = b"hello from " + self.server.label.encode() + b" " + body_in[:64]
        if self.path == "/big":
            body = BIG
        if self.headers.get("X-Echo"):
            body += b" echo=" + self.headers["X-Echo"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, label: str, tls: ssl.SSLContext | None = None) -> None:
        self.label = label
        self.record = Record()
        self.tls = tls
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self.record.lock:
            self.record.connections.append(client_address[:2])
        if self.tls is not None:
            try:
                request.settimeout(10)
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        try:
            super().finish_request(request, client_address)
        finally:
            with contextlib.suppress(OSError):
                request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@dataclass
class World:
    http: _Server
    https: _Server
    ca_file: Path
    directory: Path

    def nothing_reached(self) -> bool:
        return self.http.record.count() == 0 and self.https.record.count() == 0


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    ca = Authority(tmp_path, "world")
    leaf = ca.issue("api.example.com", server=True, names=("api.example.com", "localhost"))
    cert, key = leaf.cert, leaf.key
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    https = _Server("https", tls)

    def remember(sock: Any, name: str | None, ctx: ssl.SSLContext) -> None:
        with https.record.lock:
            https.record.sni.append(name)

    tls.sni_callback = remember  # type: ignore[assignment]
    plain = _Server("http")
    servers = [plain, https]
    threads = [threading.Thread(target=s.serve_forever, args=(0.05,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield World(plain, https, ca.ca_file, tmp_path)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


# -- the proxy and the relay --------------------------------------------------

NAMES = {
    "loopback.test": ["127.0.0.1"],
    "metadata.test": ["169.254.169.254"],
    "mixed.test": ["93.184.216.34", "10.1.2.3"],
    "mapped6.test": ["::ffff:127.0.0.1"],
}


async def fake_resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return NAMES[host]
    raise OSError(f"no such name {host}")


def hosts_for(world: World) -> HostsMap:
    http_at = ("127.0.0.1", world.http.port)
    https_at = ("127.0.0.1", world.https.port)
    return HostsMap(
        {
            ("api.example.com", 80): http_at,
            ("data.example.org", 80): http_at,
            ("api.example.com", 443): https_at,
            ("data.example.org", 443): https_at,
            ("api.example.com", 8080): http_at,
            # Names no rule allows, mapped anyway: a proxy that let them pass
            # would reach the recording servers.
            ("evil.example.com", None): http_at,
            ("example.net", None): http_at,
            ("blocked.example.net", None): http_at,
        }
    )


def policy(*rules: str, deny: tuple[str, ...] = ()) -> EgressPolicy:
    return EgressPolicy(allow=parse_rules(rules, "test"), deny=parse_rules(deny, "test"))


@pytest.fixture
def proxy(world: World) -> Iterator[EgressProxy]:
    denied: list[str] = []
    p = EgressProxy(
        hosts=hosts_for(world),
        upstream_ca_file=world.ca_file,
        ca=InterceptCA.load_or_create(world.directory / "intercept-ca"),
        on_denial=denied.append,
        resolver=fake_resolver,
    )
    p.denied = denied  # type: ignore[attr-defined]
    try:
        yield p
    finally:
        while _RELAYS:
            _RELAYS.pop().close()
        p.stop()


_RELAYS: list[Relay] = []


class Relay:
    """The sandbox's relay: one Unix connection to the gate, one fd per connection."""

    def __init__(self, gate: EgressGate) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(gate.path))
        _RELAYS.append(self)

    def pass_fd(self, fd: int) -> None:
        socket.send_fds(self.sock, [b"c"], [fd])

    def connection(self) -> socket.socket:
        """A client connection through the gate (our end of a socket pair)."""
        mine, theirs = socket.socketpair()
        try:
            self.pass_fd(theirs.fileno())
        finally:
            theirs.close()
        mine.settimeout(10)
        return mine

    def close(self) -> None:
        self.sock.close()


def open_gate(
    proxy: EgressProxy,
    world: World,
    pol: EgressPolicy,
    *,
    name: str = "g",
    max_connections: int = 64,
) -> EgressGate:
    directory = world.directory / f"gate-{name}"
    directory.mkdir()
    return proxy.open_gate(directory, pol, max_connections=max_connections, label=name)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length framed, or until close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, headers, _dechunk(body)
    if "content-length" in headers:
        want = int(headers["content-length"])
        while len(body) < want:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    else:
        while chunk := sock.recv(65536):
            body += chunk
    return status, headers, body


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2 :]


def get(
    sock: socket.socket, url: str, host: str | None = None, extra: str = ""
) -> tuple[int, dict[str, str], bytes]:
    if host is None:
        host = url.split("/")[2]
    sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
    return read_response(sock)


def closed(sock: socket.socket) -> bool:
    """Whether the proxy closed this connection (EOF, after any answer)."""
    try:
        while sock.recv(65536):
            pass
    except (ConnectionError, TimeoutError):
        return True
    return True


def denials(gate: EgressGate) -> dict[str, int]:
    _, found = gate.since(gate.mark().__class__(gate.book.usage().__class__(), 0, {}))
    return {d.reason: d.count for d in found}


def wait_denial(gate: EgressGate, reason: str, count: int = 1, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while denials(gate).get(reason, 0) < count:
        assert time.monotonic() < deadline, f"no {reason} denial: {denials(gate)}"
        time.sleep(0.005)


# -- allowed --------------------------------------------------------------------


def test_plain_get_reaches_a_mapped_host_and_keeps_alive(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com", "data.example.org"))
    mark = gate.mark()
    relay = Relay(gate)
    with relay.connection() as conn:
        status, _, body = get(
            conn, "http://api.example.com/hello?x=1", extra="Proxy-Authorization: Basic eA==\r\n"
        )
        assert status == 200 and body == b"hello from http "
        # The same client connection, another host: decided again, and allowed.
        status, _, body = get(conn, "http://data.example.org/two")
        assert status == 200
    method, path, headers = world.http.record.requests[0]
    assert (method, path) == ("GET", "/hello?x=1")
    assert headers["host"] == "api.example.com"
    assert "proxy-authorization" not in headers
    assert world.http.record.requests[1][2]["host"] == "data.example.org"
    usage, denied = gate.since(mark)
    assert denied == ()
    assert usage.connections == 2
    assert usage.bytes_out > 0 and usage.bytes_in > 0
    assert stat_mode(gate.path) == 0o666


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_plain_post_body_is_forwarded(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        conn.sendall(
            b"POST http://api.example.com/p HTTP/1.1\r\nHost: api.example.com\r\n"
            b"Content-Length: 4\r\n\r\nbody"
        )
        status, _, body = read_response(conn)
    assert status == 200 and body.endswith(b"body")


def tls_client(world: World) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(world.ca_file))


def connect_tunnel(conn: socket.socket, authority: str) -> tuple[int, bytes]:
    conn.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    status = int(data.split(b" ")[1]) if data else 0
    return status, data


def test_connect_passes_tls_through(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    mark = gate.mark()
    with Relay(gate).connection() as conn:
        status, _ = connect_tunnel(conn, "api.example.com:443")
        assert status == 200
        with tls_client(world).wrap_socket(conn, server_hostname="api.example.com") as tls:
            status, _, body = get(tls, "/via-tunnel", host="api.example.com")
    assert status == 200 and body == b"hello from https "
    assert world.https.record.sni == ["api.example.com"]
    assert world.https.record.requests[0][1] == "/via-tunnel"
    usage, denied = gate.since(mark)
    assert denied == () and usage.connections == 1
    assert usage.bytes_out > 200 and usage.bytes_in > 200  # handshakes both ways


def test_accepted_tcp_socket_works_as_the_relay_passes_it(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        relay.pass_fd(accepted.fileno())
        with client, accepted:
            client.settimeout(10)
            status, _, _ = get(client, "http://api.example.com/tcp")
            # The proxy's writes to the sandbox are not held by Nagle: asyncio
            # sets TCP_NODELAY on the passed socket (ours is the same socket).
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert status == 200


# -- refused: each reason, and nothing reaches the world ----------------------


@pytest.mark.parametrize(
    ("rules", "deny", "url", "reason"),
    [
        (("api.example.com",), (), "http://evil.example.com/", "not_allowed"),
        (("*.example.net",), (), "http://example.net/", "not_allowed"),  # a wildcard's parent
        (("*.example.net",), ("blocked.example.net",), "http://blocked.example.net/", "deny_rule"),
        (("api.example.com",), (), "http://api.example.com:8080/", "port_not_allowed"),
        (("api.example.com",), (), "http://127.0.0.1:{http}/", "ip_literal"),
        (("loopback.test:{http}",), (), "http://loopback.test:{http}/", "private_address"),
        (("metadata.test",), (), "http://metadata.test/latest/meta-data/", "private_address"),
        (("mixed.test",), (), "http://mixed.test/", "private_address"),
        (("mapped6.test",), (), "http://mapped6.test/", "private_address"),
        (("nowhere.test",), (), "http://nowhere.test/", "resolve_failed"),
    ],
)
def test_plain_refusals(
    proxy: EgressProxy,
    world: World,
    rules: tuple[str, ...],
    deny: tuple[str, ...],
    url: str,
    reason: str,
) -> None:
    fill = {"http": world.http.port}
    gate = open_gate(proxy, world, policy(*(r.format(**fill) for r in rules), deny=deny))
    url = url.format(**fill)
    with Relay(gate).connection() as conn:
        status, headers, body = get(conn, url)
        text = body.decode()
        assert status in (403, 502), text
        assert f"({reason})" in text and "tooljail egress: refused" in text
        assert "this sandbox may reach: " in text
        assert headers["connection"] == "close"
        assert closed(conn)
    host_port = url.split("/")[2]
    assert (host_port if ":" in host_port else host_port + ":80") in text
    assert world.nothing_reached()
    _, found = gate.since(_origin(gate))
    assert [(d.reason, d.count) for d in found] == [(reason, 1)]
    assert reason in proxy.denied  # type: ignore[attr-defined]


def _origin(gate: EgressGate) -> Any:
    from tooljaild.egress.usage import GateMark, NetUsage

    return GateMark(NetUsage(), 0, {})


def test_a_rule_naming_the_address_lets_a_private_name_through(
    proxy: EgressProxy, world: World
) -> None:
    port = world.http.port
    gate = open_gate(proxy, world, policy(f"loopback.test:{port}", f"127.0.0.1:{port}"))
    with Relay(gate).connection() as conn:
        status, _, _ = get(conn, f"http://loopback.test:{port}/named")
        assert status == 200
        # And the literal itself, named by the rule.
        status, _, _ = get(conn, f"http://127.0.0.1:{port}/literal")
        assert status == 200


def test_host_header_must_match_the_url(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com", "evil.example.com"))
    with Relay(gate).connection() as conn:
        status, _, body = get(conn, "http://api.example.com/", host="evil.example.com")
    assert status == 403 and b"(host_mismatch)" in body
    assert world.nothing_reached()
    assert denials(gate) == {"host_mismatch": 1}


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # TLS to the proxy
        b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",  # origin-form
        b"SSH-2.0-OpenSSH_9.0\r\n",
        b"GET http://api.example.com/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ],
)
def test_non_proxy_requests_get_400_and_close(
    proxy: EgressProxy, world: World, request_bytes: bytes
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        conn.sendall(request_bytes)
        status, _, body = read_response(conn)
        assert status == 400 and b"(bad_request)" in body
        assert closed(conn)
    assert world.nothing_reached()
    assert denials(gate) == {"bad_request": 1}


def test_no_egress_policy(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, NO_EGRESS)
    with Relay(gate).connection() as conn:
        status, _, body = get(conn, "http://api.example.com/")
    assert status == 403 and b"(no_egress)" in body and b"may reach: nothing" in body
    assert world.nothing_reached()


def test_connect_refused_before_any_tunnel(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        status, data = connect_tunnel(conn, "evil.example.com:443")
        assert status == 403 and b"(not_allowed)" in data
        assert closed(conn)
    with Relay(gate).connection() as conn:
        status, data = connect_tunnel(conn, "api.example.com:8443")
        assert status == 403 and b"(port_not_allowed)" in data
    assert world.nothing_reached()


def test_connect_with_another_sni_is_cut_before_upstream(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        status, _ = connect_tunnel(conn, "api.example.com:443")
        assert status == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls_client(world).wrap_socket(conn, server_hostname="evil.example.com")
    assert world.nothing_reached()
    assert denials(gate) == {"sni_mismatch": 1}


def test_connect_of_a_fragmented_hello_still_checks_sni(proxy: EgressProxy, world: World) -> None:
    """A ClientHello sent a few bytes at a time is read whole before anything goes upstream."""
    gate = open_gate(proxy, world, policy("api.example.com"))
    ctx = tls_client(world)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="evil.example.com")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "api.example.com:443")[0] == 200
        for i in range(0, len(hello), 7):
            conn.sendall(hello[i : i + 7])
            time.sleep(0.001)
        assert closed(conn)
    assert world.nothing_reached()
    assert denials(gate) == {"sni_mismatch": 1}


# -- live policy ------------------------------------------------------------------


def test_set_policy_applies_to_the_next_connection(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com", "data.example.org"))
    relay = Relay(gate)
    with relay.connection() as conn:
        assert get(conn, "http://api.example.com/before")[0] == 200
    gate.set_policy(policy("data.example.org"))
    started = time.monotonic()
    with relay.connection() as conn:
        status, _, body = get(conn, "http://api.example.com/after")
    assert status == 403 and b"may reach: data.example.org" in body
    assert time.monotonic() - started < 1.0
    assert [r[1] for r in world.http.record.requests] == ["/before"]


# -- bounds -------------------------------------------------------------------------


def test_ten_thousand_connections_are_bounded(proxy: EgressProxy, world: World) -> None:
    limit = 8
    gate = open_gate(proxy, world, policy("api.example.com"), max_connections=limit)
    other = open_gate(proxy, world, policy("api.example.com"), name="other")
    relay = Relay(gate)
    held = [relay.connection() for _ in range(limit)]  # open and idle: they hold every slot
    deadline = time.monotonic() + 5
    while gate.open_connections < limit:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    me = psutil.Process()
    gc.collect()
    rss_before = me.memory_info().rss
    fds_before = me.num_fds()
    flood = 10_000
    slowest = 0.0
    stop = threading.Event()

    def probe() -> None:
        # Another sandbox's gate keeps answering while this one is flooded.
        nonlocal slowest
        probe_relay = Relay(other)
        while not stop.is_set():
            started = time.monotonic()
            with probe_relay.connection() as conn:
                assert get(conn, "http://api.example.com/probe")[0] == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.02)
        probe_relay.close()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for _ in range(flood):
            mine, theirs = socket.socketpair()
            relay.pass_fd(theirs.fileno())
            theirs.close()
            mine.close()
        wait_denial(gate, "connection_limit", flood, timeout=60)
    finally:
        stop.set()
        prober.join(30)
    gc.collect()
    rss_growth = me.memory_info().rss - rss_before
    _, found = gate.since(_origin(gate))
    assert len(found) <= MAX_DENIALS
    (limit_denial,) = [d for d in found if d.reason == "connection_limit"]
    assert limit_denial.count == flood
    assert limit_denial.rule == f"limits.max_egress_connections = {limit}"
    # Every refused descriptor was closed: no growth beyond a few.
    assert me.num_fds() - fds_before < 50
    assert rss_growth < 20 * 1024 * 1024, rss_growth
    assert slowest < 2.0, slowest
    print(f"\n10,000 refused: RSS +{rss_growth >> 10} KiB, slowest probe {slowest * 1000:.1f} ms")
    for conn in held:
        conn.close()
    # The slots free up: a new connection is served.
    deadline = time.monotonic() + 5
    while gate.open_connections:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with relay.connection() as conn:
        assert get(conn, "http://api.example.com/after")[0] == 200


def test_the_limit_answers_503(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"), max_connections=1)
    relay = Relay(gate)
    with relay.connection():
        time.sleep(0.05)
        with relay.connection() as refused:
            status, _, _ = read_response(refused)
    assert status == 503
    assert denials(gate) == {"connection_limit": 1}


def test_descriptors_that_are_not_stream_sockets_are_refused(
    proxy: EgressProxy, world: World
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    # Counted once the gate holds the relay's connection (accepted on the
    # egress loop's turn, not before open_gate returns).
    with relay.connection() as conn:
        assert get(conn, "http://api.example.com/first")[0] == 200
    deadline = time.monotonic() + 5
    while gate.open_connections and time.monotonic() < deadline:
        time.sleep(0.01)
    fds_before = psutil.Process().num_fds()
    read_end, write_end = os.pipe()
    listener = socket.create_server(("127.0.0.1", 0))
    dgram_a, dgram_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    file_fd = os.open(world.ca_file, os.O_RDONLY)
    unconnected = socket.socket()
    for fd in (read_end, listener.fileno(), dgram_b.fileno(), file_fd, unconnected.fileno()):
        relay.pass_fd(fd)
    wait_denial(gate, "bad_request", 5)
    unconnected.close()
    for fd in (read_end, write_end, file_fd):
        os.close(fd)
    listener.close()
    dgram_a.close()
    dgram_b.close()
    # The proxy kept none of them, and the relay still works.
    with relay.connection() as conn:
        assert get(conn, "http://api.example.com/ok")[0] == 200
    deadline = time.monotonic() + 5
    while psutil.Process().num_fds() > fds_before + 1:  # the relay's served connection closing
        assert time.monotonic() < deadline, (psutil.Process().num_fds(), fds_before)
        time.sleep(0.01)


def test_a_message_without_a_descriptor_closes_that_relay(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    relay.sock.sendall(b"c")
    relay.sock.settimeout(5)
    assert relay.sock.recv(1) == b""  # closed by the gate
    with Relay(gate).connection() as conn:
        assert get(conn, "http://api.example.com/ok")[0] == 200


def test_relays_per_gate_are_bounded(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relays = [Relay(gate) for _ in range(4)]
    extra = Relay(gate)
    extra.sock.settimeout(5)
    assert extra.sock.recv(1) == b""
    with relays[3].connection() as conn:
        assert get(conn, "http://api.example.com/ok")[0] == 200


def test_a_killed_relay_cuts_only_itself(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    first = Relay(gate)
    with first.connection() as conn:
        assert get(conn, "http://api.example.com/one")[0] == 200
    first.close()  # the relay died
    second = Relay(gate)
    with second.connection() as conn:
        assert get(conn, "http://api.example.com/two")[0] == 200


def test_close_unlinks_and_stops(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    conn = relay.connection()
    time.sleep(0.05)
    gate.close()
    gate.close()  # idempotent
    assert not gate.path.exists()
    assert closed(conn)
    conn.close()


def test_opening_and_closing_a_gate_never_wait_for_a_busy_egress_loop(
    proxy: EgressProxy, world: World
) -> None:
    """The daemon's gRPC loop opens and closes gates: a proxy loop held up (by a
    flood, by TLS work) must not hold it up too. The gate still works once the
    loop is free (a relay that came meanwhile waited in the backlog)."""
    proxy.start()
    loop = proxy._loop
    assert loop is not None
    loop.call_soon_threadsafe(time.sleep, 1.0)  # the egress loop is busy for 1 s
    started = time.monotonic()
    gate = open_gate(proxy, world, policy("api.example.com"))
    spare = open_gate(proxy, world, policy("api.example.com"), name="spare")
    spare.close()
    took = time.monotonic() - started
    assert took < 0.3, f"open/close waited {took:.3f} s for the busy egress loop"
    with Relay(gate).connection() as conn:
        assert get(conn, "http://api.example.com/late")[0] == 200
    gate.close()


def test_closed_gates_leave_nothing_behind(proxy: EgressProxy, world: World) -> None:
    for i in range(50):
        gate = open_gate(proxy, world, policy("api.example.com"), name=f"n{i}")
        with Relay(gate).connection() as conn:
            get(conn, "http://evil.example.com/")  # a denial: a log entry for the gate
        gate.close()
    # close() never waits for the egress loop (the gRPC loop calls it): the
    # loop lets go of what the gates held on its next turns.
    deadline = time.monotonic() + 5
    while (proxy.gates or proxy.connections) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.gates == 0
    assert proxy.connections == 0
    assert proxy._denial_log._per_gate == {}


# -- the denial log ------------------------------------------------------------------


def test_denial_log_lines_are_rate_limited(
    proxy: EgressProxy, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    with caplog.at_level(logging.WARNING, logger="tooljaild.egress"):
        for _ in range(50):
            with relay.connection() as conn:
                get(conn, "http://evil.example.com/")
    lines = [r for r in caplog.records if r.name == "tooljaild.egress"]
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]
    assert lines[0].__dict__["reason"] == "not_allowed"
    assert lines[0].__dict__["host"] == "evil.example.com"
    assert denials(gate) == {"not_allowed": 50}


def test_refusal_lists_at_most_ten_rules(proxy: EgressProxy, world: World) -> None:
    rules = [f"h{i}.example.com" for i in range(25)]
    gate = open_gate(proxy, world, policy(*rules))
    with Relay(gate).connection() as conn:
        _, _, body = get(conn, "http://evil.example.com/")
    text = body.decode()
    assert "h9.example.com" in text and "h10.example.com" not in text
    assert "and 15 more" in text


# -- secrets on plain HTTP ---------------------------------------------------------

SECRET_VALUE = "s3cr3t-VALUE-0123456789"


def holding_secret(*rules: str) -> tuple[EgressPolicy, str]:
    held = HeldSecret(
        name="API_KEY",
        value=SECRET_VALUE,
        hosts=parse_rules(["api.example.com"], "test"),
        placeholder="tooljail-secret-" + "ab" * 16,
    )
    return EgressPolicy(allow=parse_rules(rules, "test"), secrets=(held,)), held.placeholder


def test_a_placeholder_is_swapped_for_its_host_and_scrubbed_back(
    proxy: EgressProxy, world: World
) -> None:
    pol, placeholder = holding_secret("api.example.com")
    gate = open_gate(proxy, world, pol)
    with Relay(gate).connection() as conn:
        status, _, body = get(
            conn,
            f"http://api.example.com/q?key={placeholder}",
            extra=f"X-Echo: {placeholder}\r\n",
        )
    assert status == 200
    _, path, seen = world.http.record.requests[0]
    assert path == f"/q?key={SECRET_VALUE}"
    assert seen["x-echo"] == SECRET_VALUE
    # The server echoed the value: the sandbox reads the placeholder.
    assert SECRET_VALUE.encode() not in body
    assert body.endswith(b"echo=" + placeholder.encode())


@pytest.mark.parametrize("where", ["header", "url", "body", "big body"])
def test_a_placeholder_sent_elsewhere_is_a_leak(
    proxy: EgressProxy, world: World, where: str
) -> None:
    pol, placeholder = holding_secret("api.example.com", "data.example.org")
    gate = open_gate(proxy, world, pol)
    with Relay(gate).connection() as conn:
        if where == "header":
            status, _, body = get(
                conn, "http://data.example.org/", extra=f"X-Key: {placeholder}\r\n"
            )
        elif where == "url":
            status, _, body = get(conn, f"http://data.example.org/?k={placeholder}")
        else:
            payload = placeholder.encode()
            if where == "big body":
                payload = b"x" * (2 * 1024 * 1024) + payload
            conn.sendall(
                b"POST http://data.example.org/p HTTP/1.1\r\nHost: data.example.org\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            )
            with contextlib.suppress(ConnectionError):
                conn.sendall(payload)
            status, _, body = read_response(conn)
    assert status == 403 and b"(secret_leak)" in body and b"API_KEY" in body
    assert SECRET_VALUE.encode() not in body and placeholder.encode() not in body
    assert world.http.record.requests == []
    assert denials(gate) == {"secret_leak": 1}


def _nagle_get(
    context: ssl.SSLContext, relay: Relay, *, session: ssl.SSLSession | None = None
) -> Any:
    """One GET through an intercepted tunnel on a passed TCP socket, Nagle left on
    (as http.client, so urllib, leaves it): the time from the handshake's end to
    the answer, the client's TLS session, whether it was resumed."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        relay.pass_fd(accepted.fileno())
        accepted.close()
    with client:
        client.settimeout(10)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        status, _ = connect_tunnel(client, "api.example.com:443")
        assert status == 200
        with context.wrap_socket(client, server_hostname="api.example.com", session=session) as tls:
            began = time.perf_counter()
            status, _, body = get(tls, "/nagle", host="api.example.com")
            took = time.perf_counter() - began
            assert status == 200 and body == b"hello from https "
            return took, tls.session, tls.session_reused


def test_an_intercepted_tunnel_does_not_hold_a_nagle_client_for_a_delayed_ack(
    proxy: EgressProxy, world: World
) -> None:
    """After the client's Finished the proxy sends a TLS 1.3 ticket, which carries
    the ACK; without it a Nagle client's request waited out the peer's delayed
    ACK (40 ms and more, every connection)."""
    pol, _ = holding_secret("api.example.com")
    relay = Relay(open_gate(proxy, world, pol))
    context = ssl.create_default_context(cadata=proxy.ca.cert_pem.decode())
    runs = [_nagle_get(context, relay) for _ in range(3)]
    assert min(took for took, _, _ in runs) < 0.030, runs
    session = runs[-1][1]
    assert session is not None and session.has_ticket and not runs[-1][2]
    # The ticket resumes toward the same host (its leaf's context) only.
    _, _, reused = _nagle_get(context, relay, session=session)
    assert reused


# -- the package cache ----------------------------------------------------------------


class FakeWriter:
    def __init__(self, cache: FakeCache, url: str) -> None:
        self.cache, self.url, self.data = cache, url, b""

    def write(self, data: bytes) -> None:
        self.data += data

    def commit(self) -> Path:
        path = self.cache.directory / f"f{len(self.cache.files)}"
        path.write_bytes(self.data)
        self.cache.files[self.url] = path
        return path

    def abort(self) -> None:
        self.cache.aborted.append(self.url)


class FakeCache:
    index_hosts = frozenset({"api.example.com"})

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, Path] = {}
        self.aborted: list[str] = []

    def wants(self, host: str) -> bool:
        return host in self.index_hosts

    def lookup(self, url: str) -> Path | None:
        return self.files.get(url)

    def writer(self, url: str) -> FakeWriter | None:
        return FakeWriter(self, url)


@pytest.fixture
def cache(proxy: EgressProxy, world: World) -> FakeCache:
    fake = FakeCache(world.directory)
    proxy._cache = fake  # the proxy under test, with a cache
    return fake


def test_a_cached_get_is_served_from_the_cache(
    proxy: EgressProxy, world: World, cache: FakeCache
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    relay = Relay(gate)
    with relay.connection() as conn:
        first = get(conn, "http://api.example.com/files/a.whl")
        second = get(conn, "http://api.example.com/files/a.whl")
    assert first[0] == second[0] == 200
    assert first[2] == second[2] == b"hello from http "
    assert len(world.http.record.requests) == 1  # the second came from the cache
    assert list(cache.files) == ["http://api.example.com/files/a.whl"]


def test_the_cache_host_serves_by_hash(proxy: EgressProxy, world: World, cache: FakeCache) -> None:
    digest = "0" * 63 + "1"
    (world.directory / "wheel").write_bytes(b"wheel bytes")
    cache.files[f"sha256:{digest}"] = world.directory / "wheel"
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        found = get(conn, f"http://packages.tooljail.internal/sha256/{digest}")
        missing = get(conn, "http://packages.tooljail.internal/sha256/" + "2" * 64)
        bad = get(conn, "http://packages.tooljail.internal/../etc/passwd")
    assert found[0] == 200 and found[2] == b"wheel bytes"
    assert missing[0] == 404 and bad[0] == 404
    # A gate whose policy reaches no package index may not use it.
    other = open_gate(proxy, world, policy("data.example.org"), name="other")
    with Relay(other).connection() as conn:
        status, _, body = get(conn, f"http://packages.tooljail.internal/sha256/{digest}")
    assert status in (403, 502) and b"wheel bytes" not in body
    assert world.nothing_reached()


# -- interception: a sandbox holding secrets ---------------------------------------


def test_connect_of_a_sandbox_holding_secrets_is_intercepted(
    proxy: EgressProxy, world: World
) -> None:
    pol, placeholder = holding_secret("api.example.com", "data.example.org")
    gate = open_gate(proxy, world, pol)
    mark = gate.mark()
    trust = ssl.create_default_context(cadata=proxy.ca.cert_pem.decode())
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "api.example.com:443")[0] == 200
        with trust.wrap_socket(conn, server_hostname="api.example.com") as tls:
            status, _, body = get(
                tls, "/swapped", host="api.example.com", extra=f"X-Echo: {placeholder}\r\n"
            )
    assert status == 200
    assert world.https.record.requests[0][2]["x-echo"] == SECRET_VALUE
    assert SECRET_VALUE.encode() not in body and placeholder.encode() in body
    deadline = time.monotonic() + 5
    while gate.since(mark)[0].bytes_in == 0:  # counted when the exchange ends
        assert time.monotonic() < deadline
        time.sleep(0.01)
    usage, denied = gate.since(mark)
    assert denied == () and usage.connections == 1 and usage.bytes_out > 0
    # The placeholder sent to another allowed host through its tunnel: refused.
    requests = len(world.https.record.requests)
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "data.example.org:443")[0] == 200
        with trust.wrap_socket(conn, server_hostname="data.example.org") as tls:
            status, _, body = get(
                tls, "/", host="data.example.org", extra=f"Authorization: Bearer {placeholder}\r\n"
            )
    assert status == 403 and b"API_KEY" in body
    assert len(world.https.record.requests) == requests
    assert denials(gate) == {"secret_leak": 1}


def test_the_cache_keeps_what_the_sandbox_gets_never_a_value(
    proxy: EgressProxy, world: World, cache: FakeCache
) -> None:
    pol, placeholder = holding_secret("api.example.com")
    gate = open_gate(proxy, world, pol)
    with Relay(gate).connection() as conn:
        get(conn, "http://api.example.com/files/b.whl", extra=f"X-Echo: {placeholder}\r\n")
        get(conn, f"http://api.example.com/files/c.whl?k={placeholder}")
    # The URL that held a placeholder is no cache key; the echo was kept scrubbed.
    assert list(cache.files) == ["http://api.example.com/files/b.whl"]
    kept = cache.files["http://api.example.com/files/b.whl"].read_bytes()
    assert SECRET_VALUE.encode() not in kept and placeholder.encode() in kept


def test_a_gate_in_a_deep_directory_still_listens(proxy: EgressProxy, world: World) -> None:
    deep = world.directory / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    gate = proxy.open_gate(deep, policy("api.example.com"), max_connections=4, label="deep")
    assert len(str(gate.path)) > 108 and gate.path.exists()
    relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dirfd = os.open(deep, os.O_PATH)
    try:
        relay.connect(f"/proc/self/fd/{dirfd}/proxy.sock")
    finally:
        os.close(dirfd)
    with relay:
        mine, theirs = socket.socketpair()
        socket.send_fds(relay, [b"c"], [theirs.fileno()])
        theirs.close()
        with mine:
            mine.settimeout(10)
            assert get(mine, "http://api.example.com/deep")[0] == 200
    gate.close()
    assert not gate.path.exists()


def test_a_tunnel_that_is_not_tls_passes_to_the_allowed_port_with_half_close(
    proxy: EgressProxy, world: World
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    mark = gate.mark()
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "api.example.com:80")[0] == 200
        conn.sendall(b"GET /in-tunnel HTTP/1.0\r\nHost: api.example.com\r\n\r\n")
        conn.shutdown(socket.SHUT_WR)  # the half-close reaches the server
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.") and data.endswith(b"hello from http ")
    assert world.http.record.requests[0][1] == "/in-tunnel"
    usage, _ = gate.since(mark)
    assert usage.connections == 1 and usage.bytes_in == len(data)


def test_closing_the_gate_cuts_its_open_tunnels(proxy: EgressProxy, world: World) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "api.example.com:443")[0] == 200
        with tls_client(world).wrap_socket(conn, server_hostname="api.example.com") as tls:
            assert get(tls, "/open", host="api.example.com")[0] == 200
            gate.close()
            # close() never waits for the egress loop: the cut is its next
            # turn, which a loaded machine may delay.
            deadline = time.monotonic() + 5
            while gate.open_connections and time.monotonic() < deadline:
                time.sleep(0.01)
            assert gate.open_connections == 0
            tls.settimeout(5)
            with pytest.raises((ssl.SSLError, OSError)):
                tls.sendall(b"GET /after HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
                if not tls.recv(1):
                    raise ConnectionError("closed")


def test_a_big_download_through_a_tunnel_is_whole_and_counted(
    proxy: EgressProxy, world: World
) -> None:
    gate = open_gate(proxy, world, policy("api.example.com"))
    mark = gate.mark()
    with Relay(gate).connection() as conn:
        assert connect_tunnel(conn, "api.example.com:443")[0] == 200
        with tls_client(world).wrap_socket(conn, server_hostname="api.example.com") as tls:
            tls.sendall(b"GET /big HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
            time.sleep(0.3)  # a slow reader: the proxy must hold back, not buffer all
            status, _, body = read_response(tls)
    assert status == 200 and body == BIG
    usage, _ = gate.since(mark)
    assert usage.bytes_in > len(BIG)
