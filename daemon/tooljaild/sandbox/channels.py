"""The daemon's ends of a sandbox's pipes, handled as data arrives.

Each is an asyncio protocol: a chunk of output goes straight from the event
loop's read callback to the call's sink, and a frame to its handler, with no
task per pipe to wake and no stream buffer in between. On the call path that
saves a few task switches per chunk; in the refill, a few tasks per sandbox.

The pipes themselves are read by `PipeReader` and written by `PipeWriter`,
plain readiness callbacks on the loop: asyncio's pipe transports schedule
callbacks to start and to end each pipe, a few turns of the loop per sandbox
started and per call ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tooljail.types import StreamKind
from tooljaild.sandbox.base import OutputSink

Frame = dict[str, Any]
"""One decoded frame of the runner's (see runner_channel for the protocol)."""


class OutputChannel(asyncio.Protocol):
    """A sandbox's stdout or stderr.

    Until a call attaches its sink, the first `keep` bytes are kept: all a
    sandbox prints before its call is why it failed to start, if it did.
    """

    def __init__(self, kind: StreamKind, keep: int = 4096) -> None:
        self.kind = kind
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done at end-of-file: every process holding the pipe's other end is gone."""
        self._sink: OutputSink | None = None
        self.dropped = 0
        """Bytes dropped since `drop()`."""
        self._early = bytearray()
        self._keep = keep

    def attach(self, sink: OutputSink) -> None:
        """Send what arrives from now on (and anything kept so far) to `sink`."""
        self._sink = sink
        if self._early:
            sink(self.kind, bytes(self._early))
            self._early.clear()

    def drop(self) -> None:
        """Keep nothing of what arrives from now on: count it (`dropped`) only.

        A session's pipes between its calls: what a process left running
        writes then belongs to no call.
        """
        self._sink = self._count
        self._early.clear()

    def _count(self, kind: StreamKind, data: bytes) -> None:
        self.dropped += len(data)

    def said(self) -> str:
        """What arrived before any sink was attached (first `keep` bytes), as text."""
        return self._early.decode("utf-8", "replace").strip()

    def data_received(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(self.kind, data)
        elif len(self._early) < self._keep:
            self._early += data[: self._keep - len(self._early)]

    def eof_received(self) -> bool:
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass(frozen=True)
class Malformed:
    """A line on the frame pipe that is no frame (only tool code writes those), or
    a pipe that went past its byte budget (`fatal`): why, in a few words."""

    reason: str
    fatal: bool = False


FrameItem = Frame | Malformed | None
"""What a frame pipe delivers: a frame, a line that is none, or None at end-of-file."""

_DEEP_CHECK_BYTES = 256 * 1024
"""Lines longer than this have their brackets counted before they are parsed."""


class FrameChannel(asyncio.Protocol):
    """The runner's frame pipe: one JSON object per line, each given to `on_frame`.

    Bounded, whatever the sandbox writes: at most `max_bytes` of a line are held
    (a longer one is `Malformed`, and the rest of it is dropped unread); a line
    with more than `max_containers` brackets is refused before it is parsed
    (each becomes a Python object: 16 MiB of ``[]`` would be 300 MB of lists);
    text that is not UTF-8, not JSON, nested too deep or not an object is
    `Malformed`. Empty lines are skipped. At end-of-file `on_frame(None)` is
    called once. After `discard()` nothing more is parsed or delivered.

    Args:
        on_frame: Where frames go; the sandbox swaps it as it moves from
            start-up to its call.
        max_bytes: The longest line accepted.
        max_containers: The most ``[`` and ``{`` bytes a line may hold.
    """

    def __init__(
        self, on_frame: Callable[[FrameItem], None], max_bytes: int, max_containers: int
    ) -> None:
        self.on_frame = on_frame
        self.received = 0
        """Bytes read so far, frames and anything else."""
        self.ended = False
        """End-of-file was seen: nothing in the sandbox can write a frame any more."""
        self._max_bytes = max_bytes
        self._max_containers = max_containers
        self._buffer = bytearray()
        self._skipping = False  # inside an oversized line, until its end
        self._discarding = False
        self._budget: int | None = None
        self.unbudgeted: frozenset[str] = frozenset()
        """Frame types ("t") whose lines do not count against `limit`'s budget
        (a session's streams: bounded by their own credit)."""

    def discard(self) -> None:
        """Parse and deliver nothing more (the pipe is still read to its end)."""
        self._discarding = True
        self._buffer = bytearray()

    def limit(self, max_bytes: int) -> None:
        """Deliver `Malformed` once, and discard the rest, past `max_bytes` more bytes."""
        self._budget = self.received + max_bytes

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self._discarding:
            return
        if self._budget is not None and self.received > self._budget:
            self.discard()
            self.on_frame(Malformed("more frame bytes than one call may send", fatal=True))
            return
        # split() runs in C: a flood of empty lines costs no Python loop per byte.
        lines = data.split(b"\n")
        rest = lines.pop()
        for i, line in enumerate(lines):
            if i == 0 and (self._buffer or self._skipping):
                if self._skipping:  # the end of an oversized line: dropped
                    self._skipping = False
                    continue
                self._buffer += line
                line, self._buffer = bytes(self._buffer), bytearray()
            if line:
                self._line(line)
                if self._discarding:
                    return
        self._hold(rest)

    def _hold(self, part: bytes) -> None:
        """Keep the start of a line until its end comes, up to `max_bytes`."""
        if self._skipping or not part:
            return
        if len(self._buffer) + len(part) > self._max_bytes:
            self._buffer = bytearray()
            self._skipping = True
            self.on_frame(Malformed(f"a line longer than {self._max_bytes} bytes"))
            return
        self._buffer += part

    def _line(self, line: bytes) -> None:
        if len(line) > self._max_bytes:
            self.on_frame(Malformed(f"a line longer than {self._max_bytes} bytes"))
            return
        if not line.strip():
            return
        if len(line) > _DEEP_CHECK_BYTES and (
            line.count(b"[") + line.count(b"{") > self._max_containers
        ):
            self.on_frame(Malformed(f"more than {self._max_containers} JSON arrays and objects"))
            return
        try:
            frame = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            self.on_frame(Malformed("a line that is not UTF-8"))
            return
        except (ValueError, RecursionError):  # int digits past the limit raise ValueError too
            self.on_frame(Malformed("a line that is not JSON"))
            return
        if not isinstance(frame, dict):
            self.on_frame(Malformed("a JSON line that is not an object"))
            return
        if self._budget is not None and frame.get("t") in self.unbudgeted:
            self._budget += len(line) + 1
        self.on_frame(frame)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ended:
            self.ended = True
            self._buffer = bytearray()
            self.on_frame(None)


class PipeReader:
    """Reads one pipe on the event loop into a protocol.

    What arrives goes to `protocol.data_received`; end-of-file (or a read
    error) to `protocol.connection_lost`, once, and the descriptor is closed.

    Args:
        fd: The pipe's read end; this object owns it (non-blocking from now on).
        protocol: Where the data goes.
        chunk: The most read at once (as asyncio's pipe transports: 256 KiB).
    """

    def __init__(self, fd: int, protocol: asyncio.Protocol, chunk: int = 256 * 1024) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._protocol = protocol
        self._chunk = chunk
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        self._read_once()

    def _read_once(self) -> bool:
        """One read into the protocol; True when it got data (more may be there)."""
        try:
            data = os.read(self._fd, self._chunk)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            self._end(exc)
            return False
        if not data:
            self._end(None)
            return False
        self._protocol.data_received(data)
        return True

    def read_now(self) -> None:
        """Read what the pipe holds now, until it would block, into the protocol.

        Whatever a process wrote before it said something on another pipe is
        then delivered before that is acted on: a session's output is cut
        exactly at its call's result frame.
        """
        while self._fd >= 0 and self._read_once():
            pass

    def close(self) -> None:
        """Stop reading; the protocol hears `connection_lost(None)` unless it has."""
        self._end(None)

    def _end(self, exc: Exception | None) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        self._protocol.connection_lost(exc)


class PipeWriter:
    """Writes messages into a pipe: a sandbox's request (then closes it), or a
    session's requests, one line after another (`write`).

    A message goes in with one `write` when the pipe has room (a request
    under 64 KiB, nearly always); the rest as the reader makes room. A reader
    that is gone (EPIPE) loses the rest: the sandbox's end reports why.

    Args:
        fd: The pipe's write end; this object owns it (non-blocking from now on).
    """

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._pending = memoryview(b"")  # a view: each write's rest is sliced, never copied
        self._closing = False
        self._watching = False
        os.set_blocking(fd, False)

    def is_closing(self) -> bool:
        """Whether the pipe is closed, or closes once what is pending is written."""
        return self._fd < 0 or self._closing

    def write_and_close(self, data: bytes) -> None:
        """Write `data`, then close the pipe (at once, or once all is written)."""
        if self.is_closing():
            return
        self._closing = True
        self.write(data)

    def write(self, data: bytes) -> None:
        """Write `data` after anything still pending; the pipe stays open."""
        if self._fd < 0:
            return
        if self._pending:
            self._pending = memoryview(bytes(self._pending) + data)
            return  # the writer is watching already
        self._pending = memoryview(data)
        self._on_writable()
        if self._fd >= 0 and self._pending and not self._watching:
            self._watching = True
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            written = len(self._pending)  # EPIPE: no reader left; nothing more to do
        self._pending = self._pending[written:]
        if self._pending:
            return
        if self._closing:
            self.close()
        elif self._watching:
            self._watching = False
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        """Close the pipe now, dropping anything not yet written."""
        if self._fd < 0:
            return
        self._watching = False
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.remove_writer(self._fd)  # none registered, or the loop is closed
        os.close(self._fd)
        self._fd = -1
        self._pending = memoryview(b"")
