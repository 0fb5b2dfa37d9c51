"""`Forward` and `AsyncForward`: a local listener that tunnels TCP into a session's loopback.

As `kubectl port-forward` does: `session.forward(8000)` listens on
127.0.0.1 (a free port unless `local_port` is given; `.address` names it), and
each TCP connection it accepts becomes one rpc ForwardPort stream to the
daemon, which connects to 127.0.0.1:8000 inside the session's sandbox. Bytes go
both ways with half closes; closing the forward closes the listener and every
connection it carries.

Opening it checks the port once (one stream, closed at once): nothing
listening there is `PortUnreachableError` from `forward(...)` itself, not
from the first connection. A connection whose port went away later is
closed (the client sees a reset or an empty reply).

Backpressure both ways: a connection's socket is read only as fast as gRPC
takes the bytes, and the stream is read only as fast as the socket takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import selectors
import socket
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

import grpc

from tooljail._session_base import check_session_id
from tooljail._terminal import MapError
from tooljail.errors import InvalidRequestError, TransportError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncForward", "Forward", "check_ports"]

CHUNK_BYTES = 64 * 1024
"""Bytes read from a local connection per message."""
FIRST_BYTES_WAIT_S = 0.001
"""How long a new connection's first message waits for its client's first
bytes, so they go with it (and the daemon sends them with its connect: one
round trip less for an HTTP request). A client that waits for the server to
speak first (SSH, SMTP) is held up at most this long, once per connection,
while the stream is being set up anyway."""


def check_ports(session_id: str, port: int, local_port: int) -> tuple[str, int, int]:
    """The session id and ports, checked before anything is opened.

    Raises:
        TypeError: When a port is not an int.
        InvalidRequestError: When the session id is empty or `local_port` is
            outside 0-65535 (the daemon checks `port`: PortUnreachableError).
    """
    for name, value in (("port", port), ("local_port", local_port)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= local_port <= 65535:
        raise InvalidRequestError(f"local_port must be from 0 to 65535, got {local_port}")
    return check_session_id(session_id), port, local_port


def _first(session_id: str, port: int) -> pb.PortData:
    return pb.PortData(session_id=session_id, port=port)


class _Connection:
    """One accepted connection and its stream (blocking)."""

    def __init__(self, sock: socket.socket, stub: Any, metadata: Any, first: pb.PortData):
        self.sock = sock
        self._stub, self._metadata, self._first = stub, metadata, first
        self.call: Any = None

    def _opening(self) -> pb.PortData:
        """The first message: the session and the port, with the client's
        first bytes when they come within `FIRST_BYTES_WAIT_S`."""
        first = pb.PortData()
        first.CopyFrom(self._first)
        try:
            self.sock.settimeout(FIRST_BYTES_WAIT_S)
            data = self.sock.recv(CHUNK_BYTES)
        except TimeoutError:
            return first  # the server speaks first, or the client is slow: no matter
        except OSError:
            data = b""
        finally:
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)
        if data:
            first.data = data
        else:
            first.eof = True
        return first

    def _requests(self) -> Iterator[pb.PortData]:
        # Run by gRPC's own thread for this call: it asks for the next message
        # only once the previous one was sent, so the socket is read no faster.
        first = self._opening()
        yield first
        if first.eof:
            return
        while True:
            try:
                data = self.sock.recv(CHUNK_BYTES)
            except OSError:
                return
            if not data:
                yield pb.PortData(eof=True)
                return
            yield pb.PortData(data=data)

    def run(self) -> None:
        try:
            self.call = self._stub.ForwardPort(self._requests(), metadata=self._metadata)
            for message in self.call:
                if message.data:
                    self.sock.sendall(message.data)
                if message.eof:
                    with contextlib.suppress(OSError):
                        self.sock.shutdown(socket.SHUT_WR)
        except (grpc.RpcError, OSError):
            pass  # the connection is closed below: its client sees the end
        finally:
            self.close()

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Forward:
    """A local port tunnelled to a port of a session (blocking client).

    Example:
        with session.forward(8000) as fwd:
            urllib.request.urlopen(f"http://{fwd.address}/")

    Attributes:
        address: "127.0.0.1:PORT", where the local listener accepts.
        local_port: That PORT.
        port: The port in the session.
    """

    def __init__(
        self,
        stub: Any,
        metadata: Any,
        map_error: MapError,
        session_id: str,
        port: int,
        local_port: int = 0,
    ) -> None:
        self._stub, self._metadata = stub, metadata
        self._first = _first(session_id, port)
        self.port = port
        _probe(stub, metadata, map_error, self._first)
        self._listener = socket.create_server(("127.0.0.1", local_port))
        self._listener.setblocking(False)
        self.local_port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.local_port}"
        self._connections: set[_Connection] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._accept, name="tooljail-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in selector.select():
                    if key.fileobj is not self._listener or self._closed.is_set():
                        continue
                    with contextlib.suppress(BlockingIOError, OSError):
                        sock, _ = self._listener.accept()
                        sock.setblocking(True)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        connection = _Connection(sock, self._stub, self._metadata, self._first)
        with self._lock:
            self._connections.add(connection)

        def run() -> None:
            try:
                connection.run()
            finally:
                with self._lock:
                    self._connections.discard(connection)

        threading.Thread(target=run, name="tooljail-forward-conn", daemon=True).start()

    def close(self) -> None:
        """Closes the listener and every connection it carries. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _probe(stub: Any, metadata: Any, map_error: MapError, first: pb.PortData) -> None:
    """Open one stream to the port and close it: raises what a connection would."""
    requests: queue.Queue[pb.PortData | None] = queue.Queue()
    requests.put(first)

    def messages() -> Iterator[pb.PortData]:
        while (item := requests.get()) is not None:
            yield item

    call = stub.ForwardPort(messages(), metadata=metadata)
    try:
        next(call)
    except grpc.RpcError as e:
        raise map_error(e) from e
    except StopIteration:
        raise TransportError("the daemon ended a forwarded port's stream at once") from None
    finally:
        requests.put(None)
        call.cancel()


class AsyncForward:
    """The asyncio twin of `Forward`: an asyncio server on the client's loop.

    Made by `await client.forward(...)` or `async with session.forward(8000)`.
    """

    def __init__(self, stub: Any, metadata: Any, port: int, first: pb.PortData) -> None:
        self._stub, self._metadata, self._first = stub, metadata, first
        self.port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.local_port = 0
        self.address = ""

    @classmethod
    async def open(
        cls,
        stub: Any,
        metadata: Any,
        map_error: MapError,
        session_id: str,
        port: int,
        local_port: int = 0,
    ) -> AsyncForward:
        """Checks the port (one stream), then listens on 127.0.0.1:`local_port`."""
        first = _first(session_id, port)
        call = stub.ForwardPort(metadata=metadata)
        try:
            await call.write(first)
            answer = await call.read()
        except grpc.RpcError as e:
            raise map_error(e) from e
        finally:
            call.cancel()
        if answer is grpc.aio.EOF:
            raise TransportError("the daemon ended a forwarded port's stream at once")
        forward = cls(stub, metadata, port, first)
        forward._server = await asyncio.start_server(forward._serve, "127.0.0.1", local_port)
        forward.local_port = forward._server.sockets[0].getsockname()[1]
        forward.address = f"127.0.0.1:{forward.local_port}"
        return forward

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        call = self._stub.ForwardPort(metadata=self._metadata)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        async def upstream() -> None:
            await call.write(self._first)
            while data := await reader.read(CHUNK_BYTES):
                await call.write(pb.PortData(data=data))
            await call.write(pb.PortData(eof=True))

        sending = asyncio.ensure_future(upstream())
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                if message.data:
                    writer.write(message.data)
                    await writer.drain()
                if message.eof and writer.can_write_eof():
                    writer.write_eof()
            await sending
        except (grpc.RpcError, OSError, asyncio.InvalidStateError):
            pass  # the connection is closed below: its client sees the end
        finally:
            sending.cancel()
            call.cancel()
            writer.close()
            self._tasks.discard(task)

    async def close(self) -> None:
        """Closes the listener and every connection it carries. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
