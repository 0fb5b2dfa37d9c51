"""TLS toward the sandbox for interception: a server session run through memory BIOs.

Interception terminates the sandbox's TLS itself rather than through asyncio's
TLS transport, because the ClientHello must be read first (its server name is
checked against the CONNECT host before any TLS object sees it), and bytes the
proxy's reader already buffered must not be lost. `read_hello` reads the
hello, `same_host` checks it, and `TLSServer` finishes the handshake from the
bytes read and then carries the connection: decrypted bytes come out of its
`reader`, `write`/`drain` encrypt toward the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

from tooljaild.egress.tls import NeedMore, client_hello_sni

_PIECE = 64 * 1024
"""How much is read from the sandbox (or out of the TLS session) at once."""


class _Valve(asyncio.Transport):
    """Flow control for a StreamReader fed by hand: it pauses the feeder."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()

    def pause_reading(self) -> None:
        self.open.clear()

    def resume_reading(self) -> None:
        self.open.set()

    def is_reading(self) -> bool:
        return self.open.is_set()


class TLSServer:
    """A server-side TLS session over a plain stream pair, run through memory BIOs.

    `reader` yields the decrypted bytes (flow-controlled); `write`/`drain`
    encrypt toward the client.
    """

    def __init__(
        self,
        raw_reader: asyncio.StreamReader,
        raw_writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
    ) -> None:
        self._raw_reader = raw_reader
        self._raw_writer = raw_writer
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=True)
        self._valve = _Valve()
        self.reader = asyncio.StreamReader(limit=64 * 1024)
        self.reader.set_transport(self._valve)
        self._pump: asyncio.Task[None] | None = None

    def _flush(self) -> None:
        pending = self._out.read()
        if pending:
            self._raw_writer.write(pending)

    async def handshake(self, first: bytes) -> None:
        """Finish the handshake, `first` being the bytes already read (the hello).

        Raises:
            ssl.SSLError, ConnectionError: the handshake failed.
        """
        self._in.write(first)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                await self._raw_writer.drain()
                data = await self._raw_reader.read(_PIECE)
                if not data:
                    raise ConnectionResetError("the client closed during the handshake") from None
                self._in.write(data)
        self._flush()
        await self._raw_writer.drain()
        self._pump = asyncio.create_task(self._run_pump(), name="tooljail-egress-tls-pump")

    async def _run_pump(self) -> None:
        try:
            while True:
                while True:
                    try:
                        data = self._tls.read(_PIECE)
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        self.reader.feed_eof()
                        return
                    if not data:
                        self.reader.feed_eof()
                        return
                    self.reader.feed_data(data)
                    await self._valve.open.wait()
                # Post-handshake messages (TLS 1.3 tickets, alerts) go out too.
                self._flush()
                raw = await self._raw_reader.read(_PIECE)
                if not raw:
                    self.reader.feed_eof()
                    return
                self._in.write(raw)
        except (ssl.SSLError, OSError) as exc:
            self.reader.set_exception(ConnectionResetError(f"TLS from the sandbox failed: {exc}"))

    def write(self, data: bytes) -> None:
        """Encrypt `data` toward the client (buffered: `drain` waits for it)."""
        self._tls.write(data)
        self._flush()

    async def drain(self) -> None:
        """Wait until the client's side is ready for more."""
        await self._raw_writer.drain()

    async def close(self) -> None:
        """Stop reading and send the TLS close; the raw stream stays the caller's."""
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._tls.unwrap()
        with contextlib.suppress(OSError):
            self._flush()


def same_host(sni: str | None, host: str) -> bool:
    """Whether a ClientHello's SNI fits the CONNECT host (an IP literal has none)."""
    if sni is None:
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        except OSError:
            return False
        return True
    return sni == host.lower().rstrip(".")


async def read_hello(
    reader: asyncio.StreamReader, deny: Callable[[str, str], None]
) -> tuple[bytes, str | None] | None:
    """The ClientHello's bytes and its server name (None: no SNI).

    Returns None when the client closed first, or when what it sent is not TLS
    (then `deny` is called with "bad_request" and why). The caller bounds the
    wait: this function never times out by itself.
    """
    data = b""
    while True:
        try:
            return data, client_hello_sni(data)
        except NeedMore:
            piece = await reader.read(_PIECE)
            if not piece:
                return None
            data += piece
        except ValueError as exc:
            deny("bad_request", f"not TLS after CONNECT: {exc}")
            return None
