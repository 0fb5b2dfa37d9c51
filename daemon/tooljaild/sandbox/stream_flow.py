"""Flow control of a session's streams, the daemon's side: credit both ways.

One `Inbound` and one `Outbound` per stream (a background process, a terminal,
a connection; session_streams). The supervisor sends a stream's output only
within the credit the daemon granted it (`WINDOW` at the start), and the
daemon grants it back as its reader consumes; the daemon sends input only
within the room the supervisor reported. So neither side holds more than
about a window per stream, whatever the other does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, TypeGuard

CHUNK = 64 * 1024
"""The most raw bytes in one frame's or op's payload (base64 in its JSON line)."""
WINDOW = 256 * 1024
"""Credit per stream, each way, in bytes: output the supervisor sent that the
reader has not consumed, and input the daemon sent that the supervisor has
not yet written. The runner holds the same constant (runner/_streams.py). The
bytes held in the daemon per stream stay under WINDOW + CHUNK."""
GRANT_AT = WINDOW // 4
"""Consumed bytes are granted back in batches of at least this much, and only
then: no op per chunk while the window is far from spent. A supervisor never
waits for a grant that does not come: it is out of credit only once WINDOW
bytes are unconsumed or ungranted here, and less than GRANT_AT are ever
consumed and not yet granted, so the rest are in the queue, and reading them
sends the grant."""

Send = Callable[[dict[str, Any]], None]
"""Sends one op to the supervisor."""


class Inbound:
    """Bytes coming from the supervisor for one stream, with the credit they use.

    Args:
        send: Sends an op (the credit grants).
        sid: The stream's id.
        names: Its output streams ("stdout" and "stderr", "pty" or "sock").
    """

    def __init__(self, send: Send, sid: int, names: Collection[str]) -> None:
        self._send = send
        self._sid = sid
        self.chunks: deque[tuple[str, bytes]] = deque()
        self.open: set[str] = set(names)
        """Output streams not yet at their end."""
        self.buffered = 0
        """Bytes held here, not yet consumed."""
        self.overrun = 0
        """Bytes dropped because the supervisor sent past its credit (never, from ours)."""
        self._consumed = 0  # consumed since the last grant
        self.changed = asyncio.Event()

    def add(self, name: str, data: bytes) -> None:
        """Bytes of output stream `name`; past the window they are dropped (`overrun`)."""
        if name not in self.open:
            return
        if self.buffered + len(data) > WINDOW + CHUNK:
            self.overrun += len(data)
            return
        self.chunks.append((name, data))
        self.buffered += len(data)
        self.changed.set()

    def eof(self, name: str) -> None:
        self.open.discard(name)
        self.changed.set()

    def end(self) -> None:
        """Every output stream is over (the sandbox ended): what is held is still read."""
        self.open.clear()
        self.changed.set()

    async def next(self) -> tuple[str, bytes] | None:
        """The next chunk, granting its bytes back; None once all is over and read."""
        while not self.chunks:
            if not self.open:
                return None
            self.changed.clear()
            await self.changed.wait()
        name, data = self.chunks.popleft()
        self.buffered -= len(data)
        self._consumed += len(data)
        if self._consumed >= GRANT_AT:
            self._send({"op": "credit", "id": self._sid, "n": self._consumed})
            self._consumed = 0
        return name, data


class Outbound:
    """Bytes going to the supervisor for one stream, within the room it reported.

    Args:
        send: Sends an op (the writes).
        sid: The stream's id.
        is_open: Whether the stream takes input at all.
    """

    def __init__(self, send: Send, sid: int, is_open: bool) -> None:
        self._send = send
        self._sid = sid
        self.credit = WINDOW
        self.closed = not is_open
        self.room = asyncio.Event()
        self._lock = asyncio.Lock()

    def add_room(self, n: int) -> None:
        self.credit = min(self.credit + n, WINDOW)
        self.room.set()

    def close(self) -> None:
        """No more input: a waiting `write` returns False."""
        self.closed = True
        self.room.set()

    async def write(self, data: bytes) -> bool:
        """Send `data` in chunks, each once there is room for it.

        Returns:
            False when the stream was closed first (what was sent is sent).
        """
        async with self._lock:  # one writer at a time: its chunks stay in order
            view = memoryview(data)
            while view:
                piece = view[:CHUNK]
                while not self.closed and self.credit < len(piece):
                    self.room.clear()
                    await self.room.wait()
                if self.closed:
                    return False
                self.credit -= len(piece)
                payload = base64.b64encode(piece).decode("ascii")
                self._send({"op": "write", "id": self._sid, "d": payload})
                view = view[len(piece) :]
        return True


def is_int(value: Any) -> TypeGuard[int]:
    """An int of JSON's, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_signal(signum: int) -> None:
    """Raise ValueError unless `signum` is a signal number (1-64)."""
    if not is_int(signum) or not 1 <= signum <= 64:
        raise ValueError(f"{signum!r} is not a signal number (1-64)")


def payload_of(data: Any) -> bytes | None:
    """A frame's base64 payload of at most `CHUNK` bytes; None: not one."""
    if not isinstance(data, str) or len(data) > (CHUNK // 3 + 1) * 4:
        return None
    with contextlib.suppress(binascii.Error, ValueError):
        return base64.b64decode(data, validate=True)
    return None


def figures_of(values: Any) -> dict[int, tuple[float, int]]:
    """A "stats" frame's {pid: [cpu_s, rss_bytes]}, what of it is well formed."""
    figures: dict[int, tuple[float, int]] = {}
    if not isinstance(values, dict):
        return figures
    for key, value in values.items():
        with contextlib.suppress(ValueError, TypeError):
            cpu, rss = value
            if isinstance(cpu, int | float) and is_int(rss):
                figures[int(key)] = (float(cpu), rss)
    return figures
