"""A session's output relay: the interpreter's stdout and stderr, read by the
supervisor, passed on to the daemon only for the call they belong to.

The interpreter writes into pipes the supervisor reads (the supervisor's own
fds 1 and 2 are the daemon's output pipes). Each call that runs in the
interpreter gets pipes of its own (`Relay.next_call`: the supervisor makes
them and hands their write ends over with the call's request, SCM_RIGHTS on
the request socket; the interpreter moves them to its fds 1 and 2 before the
call's code runs). So a process a call started, and the session keeps
(keep_processes), writes into its own call's pipe for good: what it prints
during a later call is not that call's.

Only the running call's pipes are passed on. The rest (earlier calls' pipes,
and the last call's once it ended) is nobody's: dropped here, counted, and
never sent to the daemon (it cost the daemon a share of a core per chatty
session when it was). Dropping costs this process a read per chunk, so it is
bounded too: past `rate` bytes a second (a second's worth at once) those pipes
are not read until the rate allows it or the next call starts, and their
writers wait on a full pipe, costing nothing.

stdlib only, as the rest of the runner.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import time
from typing import Any

_CHUNK = 1 << 20
_DRAIN_READS = 64
"""Reads per pipe at a call's end at most (a writer may keep a pipe full)."""
MAX_OLD_PIPES = 128
"""Pipes of earlier calls kept open (kept processes write into them); past it
the oldest is closed, and a process still writing there gets EPIPE."""


class Relay:
    """The interpreter's output pipes, as the supervisor's loop reads them.

    Args:
        poll: The supervisor's poll object: the pipes are registered there
            while they are to be read.
        rate: Bytes a second dropped before the dropped pipes are left unread;
            0: they are not read at all until the next call starts.
    """

    def __init__(self, poll: Any, rate: int) -> None:
        self.rate = rate
        self.fds: dict[int, int] = {}
        """Every pipe's read end, with the daemon's descriptor it would feed."""
        self.current: set[int] = set()
        """The pipes of the last call that started (or of the interpreter's start)."""
        self.old: list[int] = []
        """Pipes of earlier calls, oldest first."""
        self.dropped = 0
        self._poll = poll
        self._watched: set[int] = set()
        self._tokens = float(rate)
        self._stamp = time.monotonic()
        self._paused_until: float | None = None

    def start(self, stdout_r: int, stderr_r: int) -> None:
        """A fresh interpreter's pipes: the current ones."""
        self._add(stdout_r, stderr_r)

    def next_call(self, sock: socket.socket, outgoing: bool) -> None:
        """Give the call that starts pipes of its own (sent on `sock` to the
        interpreter ahead of the call's request); read everything again.

        Args:
            outgoing: Bytes for the interpreter are still unsent: the pipes
                would arrive out of order, so the call keeps the current ones.
        """
        self.resume()
        if outgoing:
            return
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            socket.send_fds(sock, [b"\n"], [out_w, err_w])
        except OSError:  # (a full socket: cannot happen between calls) the current ones
            os.close(out_r)
            os.close(err_r)
            return
        finally:
            os.close(out_w)
            os.close(err_w)
        self.old += sorted(self.current)
        self.current = set()
        while len(self.old) > MAX_OLD_PIPES:
            self._close(self.old.pop(0))
        self._add(out_r, err_r)

    def read(self, fd: int, *, running: bool) -> None:
        """Take what `fd` holds now: passed on if it is the running call's, else dropped."""
        data = self._read(fd, closing=True)
        if not data:
            return
        if running and fd in self.current:
            _write_all(self.fds[fd], data)
            return
        self.dropped += len(data)
        now = time.monotonic()
        self._tokens = min(float(self.rate), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= len(data)
        if self._tokens < 0:  # past the rate: the writers wait on full pipes
            wait = -self._tokens / self.rate if self.rate else math.inf
            self._paused_until = now + wait
            self._unwatch(running)

    def drain(self, *, forward: bool) -> None:
        """Take what the current pipes hold now (at a call's end, or an interpreter's):
        passed on when `forward`."""
        for fd in sorted(self.current):
            for _ in range(_DRAIN_READS):
                data = self._read(fd, closing=False)
                if not data:
                    break
                if forward:
                    _write_all(self.fds[fd], data)
                else:
                    self.dropped += len(data)

    def take_dropped(self) -> int:
        """Bytes dropped since the last time this was asked (the last call's end)."""
        dropped, self.dropped = self.dropped, 0
        return dropped

    def paused_ms(self) -> int | None:
        """How long the loop may sleep before the pipes are to be read again (None: any)."""
        if self._paused_until is None or self._paused_until == math.inf:
            return None
        return max(0, math.ceil((self._paused_until - time.monotonic()) * 1000))

    def resume_if_due(self) -> None:
        if self._paused_until is not None and time.monotonic() >= self._paused_until:
            self.resume()

    def resume(self) -> None:
        """Read every pipe again now."""
        self._paused_until = None
        for fd in self.fds:
            if fd not in self._watched:
                self._poll.register(fd, select.POLLIN)
                self._watched.add(fd)

    def close(self) -> None:
        """Close every pipe (the interpreter and every process of the session are gone)."""
        for fd in list(self.fds):
            self._close(fd)
        self.old = []

    def _add(self, stdout_r: int, stderr_r: int) -> None:
        for fd, target in ((stdout_r, 1), (stderr_r, 2)):
            os.set_blocking(fd, False)
            self.fds[fd] = target
            self.current.add(fd)
        if self._paused_until is None:
            self.resume()

    def _unwatch(self, running: bool) -> None:
        """Stop reading the dropped pipes (a running call's own are still read)."""
        for fd in list(self._watched):
            if not (running and fd in self.current):
                self._poll.unregister(fd)
                self._watched.discard(fd)

    def _read(self, fd: int, *, closing: bool) -> bytes:
        try:
            data = os.read(fd, _CHUNK)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError:
            data = b""
        if not data and closing:  # every writer is gone: nothing more comes
            self._close(fd)
            with contextlib.suppress(ValueError):
                self.old.remove(fd)
        return data

    def _close(self, fd: int) -> None:
        if fd in self._watched:
            self._poll.unregister(fd)
            self._watched.discard(fd)
        self.fds.pop(fd, None)
        self.current.discard(fd)
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the daemon's pipe `fd` (waiting while it is full)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except (BlockingIOError, InterruptedError):
            select.select([], [fd], [], 1.0)
        except OSError:
            return  # the daemon is gone: nobody to tell
