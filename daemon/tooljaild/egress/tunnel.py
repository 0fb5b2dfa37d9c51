"""A CONNECT tunnel passed through: bytes copied both ways by transports, not tasks.

Once the proxy has checked a tunnel's destination and its ClientHello, it has
nothing more to read in it. Each side's protocol writes what it receives
straight to the other side's transport, in the loop's read callback: no task
wakes up per piece, which is most of what a tunnel costs per round trip.

Flow control is the transports': when one side's write buffer passes its high
mark, the other side stops reading until it drains. A half-close (EOF) is
passed on; the tunnel ends when both sides are closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast


class _Side(asyncio.Protocol):
    """One end of a tunnel: what it reads goes to the other end."""

    def __init__(self, count: Callable[[int], None], ended: asyncio.Future[None]) -> None:
        self.count = count
        self.ended = ended
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A socket's transport (uvloop's are not subclasses of asyncio.Transport).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None or peer.transport.is_closing():
            return
        peer.transport.write(data)
        self.count(len(data))

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            if peer.eof or not peer.transport.can_write_eof():
                peer.transport.close()
            else:
                peer.transport.write_eof()
        if peer is not None and peer.eof and self.transport is not None:
            self.transport.close()
        # Keep this side open: the other way may still have bytes to send.
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        peer = self.peer
        if peer is not None and peer.transport is not None:
            if exc is not None:
                peer.transport.abort()
            else:
                peer.transport.close()
        if (peer is None or peer.lost) and not self.ended.done():
            self.ended.set_result(None)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class Tunnel:
    """Both ends of one passed-through tunnel.

    Args:
        count_out: called with the size of each piece the client sends upstream.
        count_in: called with the size of each piece the upstream sends back.
    """

    def __init__(self, count_out: Callable[[int], None], count_in: Callable[[int], None]) -> None:
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.client = _Side(count_out, self.ended)
        self.upstream = _Side(count_in, self.ended)
        self.client.peer, self.upstream.peer = self.upstream, self.client

    async def connect(self, address: str, port: int) -> None:
        """Connect the upstream end (the caller bounds the wait).

        Raises:
            OSError: it could not connect.
        """
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: self.upstream, address, port)

    async def run(self, client: asyncio.Transport, first: bytes, client_ended: bool) -> None:
        """Take `client` over, send `first` upstream, copy until both ends close.

        Args:
            client: the client's transport; its protocol is replaced.
            first: bytes the client sent that were read before (the ClientHello).
            client_ended: the client had already half-closed.
        """
        upstream = self.upstream.transport
        assert upstream is not None
        client.set_protocol(self.client)
        self.client.connection_made(client)
        if first:
            upstream.write(first)
            self.client.count(len(first))
        if client.is_closing():
            # The client left while the upstream was dialled.
            upstream.close()
            return
        if client_ended:
            self.client.eof_received()
        client.resume_reading()
        try:
            await self.ended
        finally:
            if not self.ended.done():  # cancelled: the gate closes
                client.abort()
                upstream.abort()
