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
import logging
import os
from collections.abc import Callable
from typing import Any

from tooljail._types import StreamKind
from tooljaild.sandbox.base import OutputSink

log = logging.getLogger(__name__)

Frame = dict[str, Any]


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
        self._early = bytearray()
        self._keep = keep

    def attach(self, sink: OutputSink) -> None:
        """Send what arrives from now on (and anything kept so far) to `sink`."""
        self._sink = sink
        if self._early:
            sink(self.kind, bytes(self._early))
            self._early.clear()

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


class FrameChannel(asyncio.Protocol):
    """The runner's frame pipe: one JSON object per line, each given to `on_frame`.

    Lines that are not a JSON object (tool code may write into the pipe) are
    skipped, and so is a line longer than `max_bytes`. At end-of-file
    `on_frame(None)` is called once.
    """

    def __init__(self, on_frame: Callable[[Frame | None], None], max_bytes: int) -> None:
        self.on_frame = on_frame
        """Where frames go; the sandbox swaps it as it moves from start-up to its call."""
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        self._skipping = False  # inside an oversized line, until its end
        self._ended = False

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > self._max_bytes:
                    log.warning("a sandbox sent an oversized frame; skipped")
                    self._buffer.clear()
                    self._skipping = True
                return
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if self._skipping:
                self._skipping = False
                continue
            if not line.strip():
                continue
            try:
                frame = json.loads(line)
            except ValueError:
                continue
            if isinstance(frame, dict):
                self.on_frame(frame)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ended:
            self._ended = True
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
        try:
            data = os.read(self._fd, self._chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end(exc)
            return
        if data:
            self._protocol.data_received(data)
        else:
            self._end(None)

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
    """Writes one message into a pipe, then closes it: a sandbox's request.

    The message goes in with one `write` when the pipe has room (a request
    under 64 KiB, nearly always); the rest as the reader makes room. A reader
    that is gone (EPIPE) loses the rest: the sandbox's end reports why.

    Args:
        fd: The pipe's write end; this object owns it (non-blocking from now on).
    """

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._pending = memoryview(b"")  # a view: each write's rest is sliced, never copied
        os.set_blocking(fd, False)

    def is_closing(self) -> bool:
        """Whether the pipe is closed, or closes once what is pending is written."""
        return self._fd < 0 or bool(self._pending)

    def write_and_close(self, data: bytes) -> None:
        """Write `data`, then close the pipe (at once, or once all is written)."""
        if self.is_closing():
            return
        self._pending = memoryview(data)
        self._on_writable()
        if self._fd >= 0:
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            written = os.write(self._fd, self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            written = len(self._pending)  # EPIPE: no reader left; nothing more to do
        self._pending = self._pending[written:]
        if not self._pending:
            self.close()

    def close(self) -> None:
        """Close the pipe now, dropping anything not yet written."""
        if self._fd < 0:
            return
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.remove_writer(self._fd)  # none registered, or the loop is closed
        os.close(self._fd)
        self._fd = -1
        self._pending = memoryview(b"")
