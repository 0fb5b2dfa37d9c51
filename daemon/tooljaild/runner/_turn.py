"""Inside a session's interpreter: who may speak for the call that runs now.

A session's interpreter runs its calls one at a time, but code of an earlier
call may still run in it: a thread it started that outlived it (a kept
process writes to the relay pipe instead: the supervisor cuts that, see
_session.py). Such a thread must not speak for a later call: neither print
into its output nor send a frame (a yield, an artifact, a result) for it.

`Turn` is one call's turn. At its start it notes the threads already alive
(the kernel's list, /proc/self/task: a thread cannot hide from it); while it
is open, a write from the main thread or from a thread born during the call
goes through, and one from a thread of an earlier call is dropped (counted);
once it is closed every write is dropped. ``sys.stdout`` and ``sys.stderr``
are fresh guards per call (`Turn.streams`), which code of an earlier call did
not see; the runner's frame writer is one that tags frames with the call's
nonce and speaks only for the turn's own threads (`Turn.frame_writer`).

What this cannot do: code in the interpreter shares its memory with the
runner, so a thread that reads the nonce out of the interpreter's memory,
writes to the descriptors directly or patches the runner can still speak
falsely for a later call, or lie about them. That is why such threads are
counted and told: here, Python's own list of thread states (read through
references taken before any tool code ran: the interpreter's word), and by
the supervisor, the kernel's count of the interpreter's threads (which no
code in it can change, but which counts a library's worker threads too).
Every result says when threads of earlier calls were alive while the call
ran: a result made then is one that code of an earlier call could have
touched.

stdlib only, as the rest of the runner.
"""

from __future__ import annotations

import _thread
import os
import sys
from collections.abc import Callable
from typing import Any

_native_id = _thread.get_native_id
_current_frames = sys._current_frames
"""Taken at import, before any tool code runs: patching ``sys`` does not blind it."""


def os_threads() -> set[int]:
    """The interpreter's threads as the kernel lists them (their native ids)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:  # no /proc: only the caller, whose id is the main thread's
        return {_native_id()}


RUNNER_THREADS: set[int] = set()
"""Idents of the runner's own threads in the interpreter (the egress relay:
_egress.py), which run no tool code: not counted as a call's threads."""


def python_threads() -> int:
    """Threads that run Python code in this interpreter, the main one included
    (the runner's own, `RUNNER_THREADS`, aside)."""
    return len(_current_frames().keys() - RUNNER_THREADS)


class Turn:
    """One call's turn in the interpreter: open from its start to its end.

    Args:
        nonce: The call's nonce, chosen by the supervisor for this call only.
    """

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce
        self.open = True
        self.main = _native_id()
        self.earlier = os_threads() - {self.main}
        """Threads alive at the call's start (other than the one that runs it):
        earlier calls' (or the interpreter's own, which never write)."""
        self.earlier_threads = python_threads() - 1
        """Of them, the ones that run Python code: what the result reports."""
        self.dropped_bytes = 0
        """Output of threads of earlier calls, and of any thread after the end."""
        self.dropped_frames = 0
        self.reported = 0
        """dropped_bytes as the result told it: the rest is the next call's to tell."""

    def speaks(self) -> bool:
        """Whether the thread calling this may speak for the call now."""
        return self.open and _native_id() not in self.earlier

    def close(self) -> dict[str, int]:
        """End the turn: no thread speaks for the call any more. What it left."""
        self.open = False
        self.reported = self.dropped_bytes
        return {
            "threads": python_threads() - 1,
            "earlier_threads": self.earlier_threads,
            "dropped_bytes": self.dropped_bytes,
            "dropped_frames": self.dropped_frames,
        }

    def streams(self, stdout: Any, stderr: Any) -> tuple[_Guard, _Guard]:
        """The call's own ``sys.stdout`` and ``sys.stderr``, over the real streams."""
        return _Guard(stdout, self), _Guard(stderr, self)

    def frame_writer(
        self, write: Callable[[dict[str, Any]], None]
    ) -> Callable[[dict[str, Any]], None]:
        """The runner's frame writer for this call: tagged with its nonce, and
        silent for threads that do not speak for it."""

        def write_frame(frame: dict[str, Any]) -> None:
            if self.speaks():
                write({**frame, "n": self.nonce})
            else:
                self.dropped_frames += 1

        return write_frame


class _Guard:
    """A text stream that passes writes on only while its turn speaks for them."""

    def __init__(self, stream: Any, turn: Turn) -> None:
        self._stream = stream
        self._turn = turn

    def write(self, text: str) -> int:
        if self._turn.speaks():
            return int(self._stream.write(text))
        self._turn.dropped_bytes += len(text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> _BinaryGuard:
        return _BinaryGuard(self._stream.buffer, self._turn, self._stream)

    def __getattr__(self, name: str) -> Any:
        # flush, fileno, encoding, isatty, ...: as the real stream's.
        return getattr(self._stream, name)


class _BinaryGuard:
    """``sys.stdout.buffer`` under the same rule (the text layer is flushed first)."""

    def __init__(self, buffer: Any, turn: Turn, text: Any) -> None:
        self._buffer = buffer
        self._turn = turn
        self._text = text

    def write(self, data: bytes) -> int:
        if self._turn.speaks():
            self._text.flush()
            return int(self._buffer.write(data))
        self._turn.dropped_bytes += len(data)
        return len(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)
