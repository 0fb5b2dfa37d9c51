"""The public Unix socket: each connection relayed to gRPC, naming its caller's uid.

gRPC's Python server cannot tell who is on the other end of a Unix socket
(see `tooljaild.auth.peer`), so gRPC listens on a private socket (in a 0700
directory only the daemon's uid reaches) and `PeerRelay` listens on the public
one. For each connection it accepts, it reads the caller's uid from the kernel
(`SO_PEERCRED`), connects to the private socket from an abstract address that
names that uid (`peer.relay_address`), and copies bytes both ways.

It runs on the daemon's event loop with asyncio's transports: nothing in it
blocks (every socket is non-blocking, the connect too), each read is one
recv of up to 256 KiB handed straight to the other side's transport, and a
side whose peer does not read pauses reading (each direction buffers at most
`HIGH_WATER` bytes). A side that closes closes the other: an end of file is
passed on as one (gRPC half-closes rarely, but a shutdown(SHUT_WR) must not
hang), a reset or error aborts both.

Connections are bounded, in all and per uid: past either bound a new
connection is closed at once, before anything is relayed (the caller's gRPC
channel sees UNAVAILABLE; the log says which bound). The per-uid bound keeps
one user from taking every connection from the others.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path

from tooljaild.auth.peer import relay_address

log = logging.getLogger(__name__)

__all__ = ["HIGH_WATER", "PeerRelay", "peer_credentials"]

HIGH_WATER = 256 * 1024
"""Bytes one direction of one connection buffers before it stops reading its source."""

CONNECT_TIMEOUT_S = 5.0
"""How long connecting to gRPC's private socket may take (it is local: a stall is a bug)."""

LOG_EVERY_S = 10.0
"""Refused connections are logged at most once in this many seconds."""

_UCRED = struct.Struct("3i")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process that connected `sock` (a Unix socket), as
    the kernel recorded them at connect time."""
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


class _Side(asyncio.Protocol):
    """One side of a relayed connection; what it receives goes to the other side."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        self.eof = False
        self.early: list[bytes] = []
        """Read before the other side was connected (at most one read: reading is
        paused until then, but some Pythons read once anyway)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)

    def data_received(self, data: bytes) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.write(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        other = self.other
        if other is None or other.transport is None:
            return True  # passed on once the other side is connected
        if other.eof:
            self.link.close()
            return False
        if other.transport.can_write_eof():
            other.transport.write_eof()
        return True  # the other direction may still talk

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.close(abort=exc is not None)

    # The other side's writes are buffered past HIGH_WATER: stop feeding them.
    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class _Link:
    """A caller's connection and the daemon's to gRPC: closing one closes both."""

    def __init__(self, relay: PeerRelay, uid: int) -> None:
        self.relay = relay
        self.uid = uid
        self.caller = _Side(self)
        self.grpc = _Side(self)
        self.caller.other, self.grpc.other = self.grpc, self.caller
        self.closed = False

    def close(self, *, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.relay._count_out(self)
        for side in (self.caller, self.grpc):
            if side.transport is not None:
                # close() sends what is buffered first; abort() (after an error) does not.
                side.transport.abort() if abort else side.transport.close()


class _Caller(asyncio.Protocol):
    """Accepts a caller's connection: checks its bounds, then links it to gRPC."""

    def __init__(self, relay: PeerRelay) -> None:
        self.relay = relay
        self.link: _Link | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        sock = transport.get_extra_info("socket")
        try:
            _pid, uid, _gid = peer_credentials(sock)
        except OSError as exc:  # gone already
            log.info("relay: cannot read a new connection's credentials: %s", exc)
            transport.abort()
            return
        link = self.relay._count_in(uid)
        if link is None:
            transport.abort()
            return
        # Nothing is read until gRPC's side is connected: then it has somewhere to go.
        transport.pause_reading()
        link.caller.connection_made(transport)
        self.link = link
        self.relay._spawn(self.relay._connect(link))

    # Each event goes to the caller's side of the link (there is none when refused).

    def data_received(self, data: bytes) -> None:
        if self.link is not None:
            self.link.caller.data_received(data)

    def eof_received(self) -> bool:
        return False if self.link is None else self.link.caller.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.link is not None:
            self.link.caller.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.link is not None:
            self.link.caller.pause_writing()

    def resume_writing(self) -> None:
        if self.link is not None:
            self.link.caller.resume_writing()


class PeerRelay:
    """Serves the public socket by relaying to gRPC's private one (see the module doc).

    Args:
        target: gRPC's private socket.
        max_connections: Open connections at most, in all.
        max_per_uid: Open connections at most from one uid.
    """

    def __init__(self, target: Path, *, max_connections: int, max_per_uid: int) -> None:
        self._target = str(target)
        self._max = max_connections
        self._max_per_uid = max_per_uid
        self._by_uid: Counter[int] = Counter()
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._links)

    async def start(self, listening: socket.socket) -> None:
        """Serve `listening`, a bound and listening Unix socket (the public one)."""
        loop = asyncio.get_running_loop()
        listening.setblocking(False)
        self._server = await loop.create_unix_server(lambda: _Caller(self), sock=listening)

    def stop_accepting(self) -> None:
        """Accept no new connection; those open stay relayed. Idempotent.

        The daemon calls it as gRPC's server stops, which is when gRPC stopped
        listening before the relay stood in front of it: a client that
        reconnects then finds no listener (and tries another daemon) instead of
        a connection that is accepted and then closed under it.
        """
        if self._server is not None:
            self._server.close()
            self._server = None

    async def close(self) -> None:
        """Stop accepting and close every relayed connection. Idempotent."""
        self.stop_accepting()
        for link in list(self._links):
            link.close(abort=True)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _count_in(self, uid: int) -> _Link | None:
        if len(self._links) >= self._max:
            self._refused(uid, f"{len(self._links)} connections are open (socket_max_connections)")
            return None
        if self._by_uid[uid] >= self._max_per_uid:
            self._refused(uid, f"it holds {self._by_uid[uid]} (socket_max_connections_per_uid)")
            return None
        link = _Link(self, uid)
        self._links.add(link)
        self._by_uid[uid] += 1
        return link

    def _refused(self, uid: int, why: str) -> None:
        """Log a refusal; at most one line per `LOG_EVERY_S` (a flood of
        connections must not become a flood of log lines)."""
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last line)" if self._unlogged else ""
        log.warning("relay: refused a connection from uid %d: %s%s", uid, why, more)
        self._logged_at, self._unlogged = now, 0

    def _count_out(self, link: _Link) -> None:
        if link in self._links:
            self._links.discard(link)
            self._by_uid[link.uid] -= 1
            if not self._by_uid[link.uid]:
                del self._by_uid[link.uid]

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, link: _Link) -> None:
        """Connect `link` to gRPC from an address naming its uid; close it if that fails."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            # Anyone may bind an abstract name: a nonce taken by someone already is
            # retried with another (only the daemon can connect to the target anyway).
            for _ in range(3):
                try:
                    sock.bind(relay_address(link.uid))
                    break
                except OSError:
                    continue
            else:
                raise OSError("no free abstract address to relay from")
            await asyncio.wait_for(loop.sock_connect(sock, self._target), CONNECT_TIMEOUT_S)
            if link.closed:  # the caller went away meanwhile
                sock.close()
                return
            await loop.create_unix_connection(lambda: link.grpc, sock=sock)
        except (OSError, TimeoutError) as exc:
            log.warning("relay: cannot reach the gRPC server's socket: %s", exc)
            sock.close()
            link.close(abort=True)
            return
        except asyncio.CancelledError:
            sock.close()
            raise
        if link.closed:
            return
        assert link.grpc.transport is not None and link.caller.transport is not None
        for data in link.caller.early:
            link.grpc.transport.write(data)
        link.caller.early.clear()
        if link.caller.eof:
            link.caller.eof_received()
        link.caller.transport.resume_reading()
