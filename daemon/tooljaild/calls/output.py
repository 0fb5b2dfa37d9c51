"""A call's output: the bounded head-and-tail kept for its result, and the
bounded, ordered event log that streams it to any number of readers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tooljail.types import StreamKind


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
    def capacity(self) -> int:
        """Bytes kept at most: a stream longer than this loses its middle."""
        return self._head_limit + self._tail_limit

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def whole(self) -> bytes:
        """The kept bytes, head then tail: all of the stream while not `truncated`."""
        return bytes(self._head + self._tail)

    def text(self) -> str:
        """The kept bytes as text, with a marker where bytes were dropped."""
        if not self.truncated:
            # Decode as one: a character may straddle the head/tail split.
            return (self._head + self._tail).decode("utf-8", "replace")
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        dropped = self.total - len(self._head) - len(self._tail)
        return f"{head}\n[... {dropped} bytes truncated ...]\n{tail}"


@dataclass(frozen=True)
class Event:
    seq: int
    stream: StreamKind
    data: bytes


EVENT_OVERHEAD_BYTES = 160
"""What keeping one chunk costs besides its bytes (the Event, the bytes object's
header, the list slot: ~140 bytes measured with tracemalloc). Charged to the
log's budget so that a tool writing one byte at a time cannot grow the daemon
past `max_bytes` with bookkeeping."""

_DROPPED = Event(0, StreamKind.NOTICE, b"")
"""Stands in for a chunk dropped from the front until the list is compacted."""


class EventLog:
    """The ordered output chunks of one call, bounded in bytes (each chunk's data
    plus `EVENT_OVERHEAD_BYTES`).

    Appends never wait for readers: a reader that falls behind by more than
    `max_bytes` gets a NOTICE chunk (seq 0: not part of the sequence) saying how
    many chunks it missed, and goes on from the oldest chunk still kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        # A list with a moving start: O(1) lookup by sequence number and O(1)
        # amortised dropping from the front (a deque indexes in O(n)).
        self._events: list[Event] = []
        self._start = 0
        self._bytes = 0
        self._next_seq = 1
        self._closed = False
        self._waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still kept (last_seq + 1 when none is)."""
        if self._start < len(self._events):
            return self._events[self._start].seq
        return self._next_seq

    def append(self, stream: StreamKind, data: bytes) -> None:
        if self._closed or not data:
            return
        self._events.append(Event(self._next_seq, stream, data))
        self._next_seq += 1
        self._bytes += len(data) + EVENT_OVERHEAD_BYTES
        while self._bytes > self._max_bytes and len(self._events) - self._start > 1:
            self._bytes -= len(self._events[self._start].data) + EVENT_OVERHEAD_BYTES
            # Free the chunk now, not at the next compaction below.
            self._events[self._start] = _DROPPED
            self._start += 1
        if self._start > 1024 and self._start * 2 > len(self._events):
            del self._events[: self._start]
            self._start = 0
        self._wake()

    def close(self) -> None:
        """No more chunks will come; readers end once they have read the rest."""
        self._closed = True
        self._wake()

    def release(self) -> None:
        """Forget the kept chunks (the call is long over)."""
        self._events.clear()
        self._start = 0
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
            # Every yield suspends this reader while appends go on: recompute
            # where the log stands after each one.
            if stop_at is None and until is not None and until.done():
                # Chunks printed after the caller's result belong to no reader.
                stop_at = self.last_seq
            first = self.first_seq
            if seq < first:
                note = f"[{first - seq} output chunks dropped: the reader fell behind]\n"
                seq = first
                yield Event(0, StreamKind.NOTICE, note.encode())
                continue
            end = self.last_seq if stop_at is None else min(stop_at, self.last_seq)
            if seq <= end:
                event = self._events[self._start + (seq - first)]
                seq += 1
                yield event
                continue
            if self._closed or stop_at is not None:
                return
            waiter = self._waiter
            if until is None:
                await asyncio.shield(waiter)
            else:
                await asyncio.wait({waiter, until}, return_when=asyncio.FIRST_COMPLETED)
