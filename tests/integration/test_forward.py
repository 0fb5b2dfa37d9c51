"""Forwarded ports (issue 24, item 4), through a real daemon over gRPC.

A server in the session (`python3 -m http.server`, run on the session's own
terminal so it lives as long as the test needs it) is reached from the test
through `session.forward(port)` with urllib; the bad cases give clear errors
at connect time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tests.integration.test_terminal import read_until
from tooljail import AsyncClient, Client, Session, Terminal
from tooljail.errors import PortUnreachableError, SessionNotFoundError

pytestmark = pytest.mark.timeout(120)

SERVER = ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]


def _serve(session: Session) -> Terminal:
    """`python3 -m http.server 8000` in the session, once it listens."""
    term = session.terminal(argv=SERVER)
    read_until(term, rb"Serving HTTP", timeout=30)
    return term


def test_a_server_in_the_session_is_reached_through_the_tunnel(served: ServedDaemon) -> None:
    body = os.urandom(3 * 2**20)
    with Client(served.target) as client, client.session() as s:
        s.upload("hello.txt", b"hello from the session\n")
        s.upload("big.bin", body)
        with _serve(s) as server, s.forward(8000) as fwd:
            host, port = fwd.address.split(":")
            assert host == "127.0.0.1" and int(port) == fwd.local_port > 0
            with urllib.request.urlopen(f"http://{fwd.address}/hello.txt", timeout=10) as r:
                assert r.read() == b"hello from the session\n"
            # Several connections at once, each with the whole body, in order.
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                got = list(pool.map(lambda _: _get(fwd.address, "/big.bin"), range(4)))
            digest = hashlib.sha256(body).digest()
            assert all(hashlib.sha256(g).digest() == digest for g in got)
            # The server's access log, on its terminal.
            read_until(server, rb"GET /big.bin")


_SERVE_TWICE = (
    "import socket\n"
    "s = socket.create_server(('127.0.0.1', 8100))\n"
    "print('listening', flush=True)\n"
    "for _ in range(2):\n"
    "    c, _ = s.accept()\n"
    "    data = b''\n"
    "    while chunk := c.recv(65536): data += chunk\n"
    "    c.sendall(data[::-1]); c.close()\n"
)


def test_a_half_close_reaches_the_server_and_its_answer_comes_back(served: ServedDaemon) -> None:
    with (
        Client(served.target) as client,
        client.session() as s,
        s.terminal(argv=["python3", "-c", _SERVE_TWICE]) as term,
    ):
        read_until(term, rb"listening")
        # Opening checks the port with a connection of its own, closed at once:
        # the server's first accept gets that one, its second ours.
        with s.forward(8100) as fwd:
            host, port = fwd.address.split(":")
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(b"abcdef")
                conn.shutdown(socket.SHUT_WR)
                assert _recv_all(conn) == b"fedcba"


def test_a_port_nothing_listens_on_is_a_clear_error(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        listens = f"nothing listens on port 8001 in session '{s.id}'"
        with pytest.raises(PortUnreachableError, match=listens):
            s.forward(8001)
        for bad in (0, 70000):
            with pytest.raises(PortUnreachableError, match="outside 1-65535"):
                s.forward(bad)


def test_another_clients_session_is_not_found(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    from tests.integration.test_terminal import _tokens

    served = serve(auth={"tokens_file": _tokens(tmp_path)})
    a, b = Client(served.target, token="term-token-a"), Client(served.target, token="term-token-b")
    with a, b, a.session() as session, pytest.raises(SessionNotFoundError):
        b.forward(session.id, 8000)


def test_the_async_forward_and_terminal(served: ServedDaemon) -> None:
    async def main() -> None:
        async with AsyncClient(served.target) as client, client.session() as s:
            await s.upload("hello.txt", b"async hello\n")
            async with s.terminal(argv=SERVER) as server:
                seen = b""
                while b"Serving HTTP" not in seen:
                    seen += await server.read(timeout=30)
                async with s.forward(8000) as fwd:
                    body = await asyncio.to_thread(_get, fwd.address, "/hello.txt")
                    assert body == b"async hello\n"
                with pytest.raises(PortUnreachableError):
                    await s.forward(8002)

    asyncio.run(main())


def test_the_cli_port_forward(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        s.upload("hello.txt", b"cli hello\n")
        with _serve(s):
            free = socket.create_server(("127.0.0.1", 0))
            local = free.getsockname()[1]
            free.close()
            command = [sys.executable, "-m", "tooljaild", "sessions", "port-forward"]
            command += ["--target", served.target, s.id, f"{local}:8000"]
            with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as cli:
                try:
                    assert cli.stdout is not None
                    line = cli.stdout.readline()
                    assert f"127.0.0.1:{local} -> port 8000" in line, line
                    assert _get(f"127.0.0.1:{local}", "/hello.txt") == b"cli hello\n"
                finally:
                    cli.send_signal(2)
                    assert cli.wait(10) == 0


def _get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=20) as r:
        data: bytes = r.read()
        return data


def _recv_all(conn: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + 10
    while chunk := conn.recv(65536):
        data += chunk
        assert time.monotonic() < deadline
    return data


_FLOOD = (
    "import socket\n"
    "s = socket.create_server(('127.0.0.1', 8200))\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    try:\n"
    "        c.recv(1)\n"  # the probe sends nothing and closes; ours sends one byte
    "        while True: c.sendall(b'x' * 65536)\n"
    "    except OSError: pass\n"
)

_SINK = (
    "import socket, time\n"
    "s = socket.create_server(('127.0.0.1', 8201))\n"
    "print('listening', flush=True)\n"
    "conns = []\n"
    "while True: conns.append(s.accept()[0])\n"  # accepts, never reads
)


def test_a_slow_side_does_not_grow_the_daemon(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    """A server flooding a local client that reads nothing, and a local client
    flooding a server that reads nothing, for 3 s each: the daemon's RSS stays
    within a small bound and it answers meanwhile."""
    daemon = start_daemon()
    proc = psutil.Process(daemon.pid)
    with (
        Client(daemon.target) as client,
        client.session() as s,
        s.terminal(argv=["python3", "-c", _FLOOD]) as flood,
        s.terminal(argv=["python3", "-c", _SINK]) as sink,
    ):
        read_until(flood, rb"listening")
        read_until(sink, rb"listening")
        with s.forward(8200) as out, s.forward(8201) as into:
            slow = socket.create_connection(_host_port(out.address), timeout=10)
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            slow.sendall(b"go")
            pushing = socket.create_connection(_host_port(into.address), timeout=10)
            stop = threading.Event()

            def push() -> None:
                pushing.settimeout(0.2)
                while not stop.is_set():
                    try:
                        pushing.send(b"y" * 65536)
                    except TimeoutError:
                        continue
                    except OSError:
                        return

            pusher = threading.Thread(target=push, daemon=True)
            pusher.start()
            time.sleep(1)  # the windows and buffers fill
            rss_before = proc.memory_info().rss
            started, slowest = time.monotonic(), 0.0
            while time.monotonic() - started < 3:
                asked = time.monotonic()
                client.list_sessions()
                slowest = max(slowest, time.monotonic() - asked)
                time.sleep(0.2)
            grown = proc.memory_info().rss - rss_before
            print(f"daemon RSS growth with both sides of a tunnel stalled: {grown / 2**20:.1f} MiB")
            assert grown < 16 * 2**20, f"the daemon grew by {grown / 2**20:.1f} MiB"
            assert slowest < 0.5, f"ListSessions took {slowest:.2f}s"
            assert slow.recv(65536).startswith(b"x")  # stalled, not lost
            stop.set()
            pusher.join(5)
            slow.close()
            pushing.close()
    daemon.assert_serving()


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.split(":")
    return host, int(port)


def test_the_sessions_end_ends_its_tunnels(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        s = client.session()
        with _serve(s), s.forward(8000) as fwd:
            conn = socket.create_connection(_host_port(fwd.address), timeout=10)
            time.sleep(0.3)  # the stream is open, the connection idle
            s.close()
            started = time.monotonic()
            assert _recv_all(conn) == b""  # the end, not a hang
            # The stream itself ends, though this client never closes its side.
            while fwd._connections:
                assert time.monotonic() - started < 5, "the tunnel outlived its session"
                time.sleep(0.05)
            conn.close()


def test_a_tunnel_in_use_keeps_its_session_from_idling_out(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        s = client.session(idle_ttl_s=1)
        s.upload("hello.txt", b"still here\n")
        # A background process (not a terminal, whose output would count as use).
        s.processes.start(argv=SERVER, name="http")
        deadline = time.monotonic() + 15
        while True:
            try:
                probe = s.forward(8000)
                break
            except PortUnreachableError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with probe as fwd:
            for _ in range(6):  # 3 s of requests, three times the idle TTL
                assert _get(fwd.address, "/hello.txt") == b"still here\n"
                time.sleep(0.5)
        assert s.call("execute_python_code", {"code": "print(1)"}).ok
        s.close()


@pytest.mark.docker
def test_a_terminal_and_a_forwarded_port_on_docker(serve: Callable[..., ServedDaemon]) -> None:
    """The same streams on the docker backend: a shell on a PTY in the container,
    and a server on the container's own loopback reached through the tunnel."""
    served = serve(backend="docker")
    with Client(served.target) as client, client.session() as s:
        s.upload("hello.txt", b"hello from a container\n")
        with s.terminal(rows=30, cols=100) as term:
            term.write(b"test -e /.dockerenv && echo in-docker-$((6*7))\n")
            read_until(term, rb"in-docker-42")
            term.write(b"stty size\n")
            read_until(term, rb"30 100")
            term.write(b"exit 3\n")
            while term.read(timeout=15):
                pass
            assert term.exit_code == 3
        with _serve(s) as server, s.forward(8000) as fwd:
            with urllib.request.urlopen(f"http://{fwd.address}/hello.txt", timeout=10) as r:
                assert r.read() == b"hello from a container\n"
            read_until(server, rb"GET /hello.txt")
