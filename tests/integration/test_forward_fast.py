"""The tunnel's short cuts keep its guarantees (issue 24, port-forward latency).

Through a real daemon over gRPC: the client's first bytes ride the stream's
first message and the supervisor's connect op (written once the socket is
connected, within the input credit); the sync `Forward` keeps a stream open
ahead of its next connection (replaced when unused, and never the cause of a
lost connection when the daemon stops waiting for it); a server that speaks
first is not held back by the wait for the client's first bytes.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ServedDaemon
from tests.integration.test_terminal import read_until
from tooljail import AsyncClient, Client, Session, Terminal
from tooljail._terminal import session_stream_target
from tooljail.v1 import tooljail_pb2 as pb

pytestmark = pytest.mark.timeout(120)

_ECHO = (
    "import socket\n"
    "s = socket.create_server(('127.0.0.1', 8200))\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    c.sendall(b'hello?')\n"
    "    while chunk := c.recv(65536): c.sendall(chunk)\n"
    "    c.close()\n"
)
"""Greets each connection first (as SSH or SMTP do), then echoes until EOF."""


def _echo(session: Session) -> Terminal:
    term = session.terminal(argv=["python3", "-c", _ECHO])
    read_until(term, rb"listening", timeout=30)
    return term


def _pattern(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


@pytest.mark.parametrize("first_bytes", [13, 64 * 1024, 100_000])
def test_the_first_bytes_go_with_the_connect_and_the_rest_follow_in_order(
    served: ServedDaemon, first_bytes: int
) -> None:
    # 13 bytes and a whole 64 KiB chunk ride the connect op (the daemon's
    # credit then starts that much lower); 100 000 bytes are more than one op
    # carries and go as a write after it. 2 MiB more follow: past the window
    # many times over, so a credit counted wrong would stall or lose bytes.
    sent = _pattern(first_bytes + 2 * 2**20)
    with Client(served.target) as client, client.session() as s, _echo(s):
        stub, metadata, _ = session_stream_target(client, s.id)

        def requests() -> Iterator[pb.PortData]:
            yield pb.PortData(session_id=s.id, port=8200, data=sent[:first_bytes])
            for at in range(first_bytes, len(sent), 64 * 1024):
                yield pb.PortData(data=sent[at : at + 64 * 1024])
            yield pb.PortData(eof=True)

        got = b""
        answers = stub.ForwardPort(requests(), metadata=metadata, timeout=60)
        connected = next(answers)
        assert connected.port == 8200 and not connected.data  # "connected" first
        for message in answers:
            got += message.data
            if message.eof:
                break
        assert got == b"hello?" + sent


def test_the_first_message_may_carry_data_and_eof_at_once(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s, _echo(s):
        stub, metadata, _ = session_stream_target(client, s.id)
        first = pb.PortData(session_id=s.id, port=8200, data=b"all of it", eof=True)
        got = b""
        for message in stub.ForwardPort(iter([first]), metadata=metadata, timeout=30):
            got += message.data
            if message.eof:
                break
        assert got == b"hello?all of it"


def test_a_server_that_speaks_first_is_not_held_back(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s, _echo(s), s.forward(8200) as fwd:
        host, port = fwd.address.split(":")
        for _ in range(5):
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                began = time.monotonic()
                assert conn.recv(6) == b"hello?"  # the client said nothing yet
                waited = time.monotonic() - began
                conn.sendall(b"ping")
                assert conn.recv(4) == b"ping"
                # The wait for first bytes is 1 ms; the rest is the tunnel.
                assert waited < 1.0, f"the greeting took {waited:.3f}s"


def _get(address: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}/hi.txt", timeout=10) as reply:
        body: bytes = reply.read()
        return body


def test_connections_work_when_the_daemon_stops_waiting_for_idle_streams(
    serve: Callable[..., ServedDaemon],
) -> None:
    # The daemon ends a stream whose first message does not come within
    # transfer_idle_timeout_s: here far less than the SDK's 5 s, so every
    # stream the forward opens ahead ends unused before it is needed.
    served = serve(sessions={"transfer_idle_timeout_s": 0.2})
    with Client(served.target) as client, client.session() as s:
        s.upload("hi.txt", b"still here\n")
        term = s.terminal(argv=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"])
        with term:
            read_until(term, rb"Serving HTTP", timeout=30)
            with s.forward(8000) as fwd:
                for pause in (0.0, 0.5, 0.19, 0.21, 0.5):
                    time.sleep(pause)
                    assert _get(fwd.address) == b"still here\n"
                # Several at once, each on a stream (none lost to an ended one).
                results: list[bytes] = []
                threads = [
                    threading.Thread(target=lambda: results.append(_get(fwd.address)))
                    for _ in range(6)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
                assert results == [b"still here\n"] * 6


def test_closing_a_forward_ends_its_stream_opened_ahead(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s, _echo(s):
        fwd = s.forward(8200)
        deadline = time.monotonic() + 10
        while fwd._spare is None or fwd._spare.call is None:  # opened ahead, unused
            assert time.monotonic() < deadline
            time.sleep(0.01)
        spare = fwd._spare
        fwd.close()
        while not spare.call.done():
            assert time.monotonic() < deadline, "the unused stream outlived its forward"
            time.sleep(0.01)
        assert not fwd._connections


def test_the_async_forward_carries_first_bytes_and_lets_a_server_speak_first(
    served: ServedDaemon,
) -> None:
    async def main() -> None:
        async with AsyncClient(served.target) as client, client.session() as s:
            term = await s.terminal(argv=["python3", "-c", _ECHO])
            async with term:
                seen = b""
                while b"listening" not in seen:
                    seen += await term.read(timeout=30)
                async with s.forward(8200) as fwd:
                    host, port = fwd.address.split(":")
                    # The server speaks first: the greeting comes unasked.
                    reader, writer = await asyncio.open_connection(host, int(port))
                    assert await asyncio.wait_for(reader.readexactly(6), 10) == b"hello?"
                    writer.write(b"ping")
                    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
                    writer.close()
                    # The client speaks first: its bytes go with the connect.
                    reader, writer = await asyncio.open_connection(host, int(port))
                    writer.write(b"first words")
                    writer.write_eof()
                    got = await asyncio.wait_for(reader.read(), 10)
                    assert got == b"hello?first words"
                    writer.close()

    asyncio.run(main())
