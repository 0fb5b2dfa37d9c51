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
import time
from collections.abc import Callable, Iterator
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
SPARE_IDLE_S = 5.0
"""A `Forward` keeps one stream opened ahead of its next connection, so a
connection does not wait for a stream's set-up (about a millisecond of gRPC
on both sides); one unused for this long is replaced, well within the daemon's
wait for a stream's first message ([sessions] transfer_idle_timeout_s, 30 s by
default). Against a daemon that waits less, the first one ends unused and
the forward opens none ahead from then on (a connection given to it just as
it ended gets a stream of its own)."""
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
    """One stream, opened ahead of its connection, then one accepted connection (blocking).

    The stream is set up before a connection needs it (the set-up costs about
    a millisecond of gRPC on both sides): a connection accepted later is
    handed over (`give`) and its first message goes at once. A stream nobody
    took is ended by `close` (the daemon, waiting for its first message, sees
    it cancelled).
    """

    def __init__(self, stub: Any, metadata: Any, first: pb.PortData, *, ahead: bool) -> None:
        self._stub, self._metadata, self._first = stub, metadata, first
        self.ahead = ahead
        """Opened before its connection came (else: for a connection at hand)."""
        self.sock: socket.socket | None = None
        self.call: Any = None
        self.opened = time.monotonic()
        self._state = _WAITING
        self._closing = False
        self._ready = threading.Condition()

    @property
    def idle(self) -> bool:
        """Still waiting for a connection, its stream alive."""
        return self._state == _WAITING and not (self.call is not None and self.call.done())

    def give(self, sock: socket.socket) -> bool:
        """Hand over an accepted connection; False when the stream has ended already."""
        with self._ready:
            if self._state != _WAITING or (self.call is not None and self.call.done()):
                return False
            self.sock, self._state = sock, _GIVEN
            self._ready.notify_all()
            return True

    def _take(self) -> socket.socket | None:
        """The connection, once given (None: the stream ended first)."""
        with self._ready:
            while self._state == _WAITING:
                self._ready.wait()
            if self._state != _GIVEN or (self.call is not None and self.call.done()):
                return None  # (its stream ended: `run` gives the connection another)
            self._state = _TAKEN
            return self.sock

    def _opening(self, sock: socket.socket) -> pb.PortData:
        """The first message: the session and the port, with the client's
        first bytes when they come within `FIRST_BYTES_WAIT_S`."""
        first = pb.PortData()
        first.CopyFrom(self._first)
        try:
            sock.settimeout(FIRST_BYTES_WAIT_S)
            data = sock.recv(CHUNK_BYTES)
        except TimeoutError:
            return first  # the server speaks first, or the client is slow: no matter
        except OSError:
            data = b""
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(None)
        if data:
            first.data = data
        else:
            first.eof = True
        return first

    def _requests(self) -> Iterator[pb.PortData]:
        # Run by gRPC's own thread for this call: it asks for the next message
        # only once the previous one was sent, so the socket is read no faster.
        sock = self._take()
        if sock is None:
            return
        first = self._opening(sock)
        yield first
        if first.eof:
            return
        while True:
            try:
                data = sock.recv(CHUNK_BYTES)
            except OSError:
                return
            if not data:
                yield pb.PortData(eof=True)
                return
            yield pb.PortData(data=data)

    def run(self, unused: Callable[[socket.socket | None], None]) -> None:
        """Relay until the stream ends.

        Args:
            unused: Told when the stream ended before it was used, not closed
                here (the daemon stopped waiting for its first message), with
                the connection given just then, if one was: it needs a stream
                of its own.
        """
        try:
            self.call = self._stub.ForwardPort(self._requests(), metadata=self._metadata)
            for message in self.call:
                if message.data:
                    assert self.sock is not None  # (no answer comes before the first message)
                    self.sock.sendall(message.data)
                if message.eof and self.sock is not None:
                    with contextlib.suppress(OSError):
                        self.sock.shutdown(socket.SHUT_WR)
        except (grpc.RpcError, OSError):
            pass  # the connection is closed below: its client sees the end
        finally:
            with self._ready:
                given = self._state == _GIVEN  # given, but its stream never read it
                ended_unused = (
                    self.ahead and self._state in (_WAITING, _GIVEN) and not self._closing
                )
                self._state = _ENDED
                self._ready.notify_all()
            sock = self.sock if given else None
            if sock is not None:
                self.sock = None
            self.close()
            if ended_unused:
                unused(sock)

    def close(self) -> None:
        with self._ready:
            self._closing = True
            if self._state == _WAITING:
                self._state = _ENDED
                self._ready.notify_all()
        if self.call is not None:
            self.call.cancel()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()


_WAITING, _GIVEN, _TAKEN, _ENDED = range(4)
"""A `_Connection`'s states: its stream waits for a connection; one was given;
its stream took it; the stream has ended."""


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
        self._spare: _Connection | None = None
        """The stream opened for the next connection (the accepting thread's)."""
        self._ahead = True
        """Streams are opened ahead (until one ends unused: `_ended_unused`)."""
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._accept, name="tooljail-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            self._renew_spare()
            while not self._closed.is_set():
                for key, _ in selector.select(SPARE_IDLE_S / 2):
                    if key.fileobj is not self._listener or self._closed.is_set():
                        continue
                    with contextlib.suppress(BlockingIOError, OSError):
                        sock, _ = self._listener.accept()
                        sock.setblocking(True)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._serve(sock)
                spare = self._spare
                if self._ahead and (spare is None or not spare.idle or _age(spare) > SPARE_IDLE_S):
                    self._renew_spare()

    def _renew_spare(self) -> None:
        """A fresh stream for the next connection (the one unused is ended)."""
        old, self._spare = self._spare, None
        if old is not None:
            old.close()
        self._spare = self._open(ahead=True) if self._ahead else None

    def _serve(self, sock: socket.socket) -> None:
        """Hand `sock` to the stream opened for it, then open the next one."""
        spare, self._spare = self._spare, None
        if spare is None or _age(spare) > SPARE_IDLE_S or not self._give(spare, sock):
            if spare is not None:
                spare.close()
            self._orphan(sock)
        self._spare = self._open(ahead=True) if self._ahead else None

    def _ended_unused(self, sock: socket.socket | None) -> None:
        """A stream opened ahead ended unused: this daemon waits less than
        `SPARE_IDLE_S` for a stream's first message, so this forward opens
        none ahead any more (one could end while its first message is on
        its way). The connection given to it, if any, gets a stream of its own."""
        self._ahead = False
        if sock is not None:
            self._orphan(sock)

    def _orphan(self, sock: socket.socket) -> None:
        """`sock` on a stream opened now (its spare had ended unused)."""
        connection = self._open(ahead=False)
        if connection is None or not self._give(connection, sock):
            with contextlib.suppress(OSError):
                sock.close()

    def _give(self, connection: _Connection, sock: socket.socket) -> bool:
        """`sock` to `connection`, which from now on is one this forward carries."""
        with self._lock:
            if self._closed.is_set():
                return False
            self._connections.add(connection)  # (before: its end discards it)
        if connection.give(sock):
            return True
        with self._lock:
            self._connections.discard(connection)
        return False

    def _open(self, *, ahead: bool) -> _Connection | None:
        """A stream, opened on a thread of its own, waiting for its connection."""
        if self._closed.is_set():
            return None
        connection = _Connection(self._stub, self._metadata, self._first, ahead=ahead)

        def run() -> None:
            try:
                connection.run(self._ended_unused)
            finally:
                with self._lock:
                    self._connections.discard(connection)

        threading.Thread(target=run, name="tooljail-forward-conn", daemon=True).start()
        return connection

    def close(self) -> None:
        """Closes the listener and every connection it carries. Idempotent."""
        if self._closed.is_set():
            return
        with self._lock:  # (no stream opens after this)
            self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with self._lock:
            connections = list(self._connections)
        if self._spare is not None:  # (the accepting thread has ended)
            connections.append(self._spare)
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


def _age(connection: _Connection) -> float:
    return time.monotonic() - connection.opened


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
            # The client's first bytes, when they come within FIRST_BYTES_WAIT_S,
            # go with the first message (the daemon sends them with its connect).
            first = pb.PortData()
            first.CopyFrom(self._first)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_BYTES_WAIT_S):
                    data = await reader.read(CHUNK_BYTES)  # (cancelled: nothing is lost)
                    first.data, first.eof = data, not data
            await call.write(first)
            if first.eof:
                return
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
