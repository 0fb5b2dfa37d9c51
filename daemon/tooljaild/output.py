"""A call's output: the bounded head-and-tail kept for its result, and the
bounded, ordered event log that streams it to any number of readers."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tooljail._types import StreamKind


class HeadTail:
    """Keeps the first and last bytes of a stream; counts the rest.

    Args:
        limit: Bytes kept at most: half from the start, half from the end.
    """

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data[-self._tail_limit :]
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        """The kept bytes as text, with a marker where bytes were dropped."""
        head = self._head.decode("utf-8", "replace")
        if not self._tail:
            return head
        tail = self._tail.decode("utf-8", "replace")
        if not self.truncated:
            return head + tail
        dropped = self.total - len(self._head) - len(self._tail)
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}"


@dataclass(frozen=True)
class Event:
    seq: int
    stream: StreamKind
    data: bytes


class EventLog:
    """The ordered output chunks of one call, bounded in bytes.

    Appends never wait for readers: a reader that falls behind by more than
    `max_bytes` gets a NOTICE chunk saying how many chunks it missed, and goes
    on from the oldest chunk still kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._events: deque[Event] = deque()
        self._bytes = 0
        self._next_seq = 1
        self._closed = False
        self._waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def append(self, stream: StreamKind, data: bytes) -> None:
        if self._closed or not data:
            return
        self._events.append(Event(self._next_seq, stream, data))
        self._next_seq += 1
        self._bytes += len(data)
        while self._bytes > self._max_bytes and len(self._events) > 1:
            self._bytes -= len(self._events.popleft().data)
        self._wake()

    def close(self) -> None:
        """No more chunks will come; readers end once they have read the rest."""
        self._closed = True
        self._wake()

    def release(self) -> None:
        """Forget the kept chunks (the call is long over)."""
        self._events.clear()
        self._bytes = 0

    def _wake(self) -> None:
        if not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = asyncio.get_running_loop().create_future()

    async def follow(
        self, from_seq: int = 1, until: asyncio.Future[Any] | None = None
    ) -> AsyncIterator[Event]:
        """Yield chunks from `from_seq` on, live, until the log closes or `until` is done.

        Args:
            from_seq: The first sequence number wanted.
            until: When it completes, the reader stops after the chunks already
                in the log (used when a caller's result comes before the call ends).
        """
        seq = from_seq
        stop_at: int | None = None
        while True:
            if stop_at is None and until is not None and until.done():
                # Chunks printed after the caller's result belong to no reader.
                stop_at = self.last_seq
            end = self.last_seq if stop_at is None else min(stop_at, self.last_seq)
            if self._events and seq < self._events[0].seq:
                first = self._events[0].seq
                note = f"[{first - seq} output chunks dropped: the reader fell behind]\n"
                yield Event(0, StreamKind.NOTICE, note.encode())
                seq = first
            if self._events and seq <= end:
                start = seq - self._events[0].seq
                # Copy the slice: appends may happen while the reader is suspended.
                batch = [self._events[i] for i in range(start, end - self._events[0].seq + 1)]
                for event in batch:
                    if event.seq >= seq:
                        yield event
                        seq = event.seq + 1
                continue
            if self._closed or stop_at is not None:
                return
            waiter = self._waiter
            if until is None:
                await asyncio.shield(waiter)
            else:
                await asyncio.wait({waiter, until}, return_when=asyncio.FIRST_COMPLETED)
