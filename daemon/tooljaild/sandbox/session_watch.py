"""A workspace watch of a session: the daemon's side (`SessionSandbox.watch`).

The supervisor (runner/_watch.py) watches the directory with inotify and
writes one compact JSON line per event on the watch's stream, under the same
credit as a process's output (sandbox/session_streams.py): a reader that
stops, stops the supervisor reading inotify, and the kernel's overflow comes
back as a "dropped" event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.stream_flow import Inbound


class StreamMux(Protocol):
    """What a watch needs of `session_streams.StreamMux` (which imports this module)."""

    def send(self, op: dict[str, Any]) -> None: ...

    def forget(self, sid: int) -> None: ...


__all__ = ["MAX_WATCH_LINE", "SandboxWatch", "WatchError", "WatchEvent", "WatchKind"]


class WatchError(SandboxError):
    """The supervisor could not watch that directory; the message says why.

    Attributes:
        limit: A bound refused it (watches or watched directories per session,
            the host's inotify limits).
        bad_path: The path is no directory of the workspace (or leaves it).
    """

    def __init__(self, message: str, *, limit: bool = False, bad_path: bool = False) -> None:
        super().__init__(message)
        self.limit = limit
        self.bad_path = bad_path


WatchKind = Literal["created", "modified", "deleted", "moved", "dropped"]
_KINDS: dict[str, WatchKind] = {
    "c": "created",
    "m": "modified",
    "r": "deleted",
    "v": "moved",
    "x": "dropped",
}
MAX_WATCH_LINE = 16 * 1024
"""The longest event line the daemon keeps (a path is < 4 KiB; longer is no line of ours)."""


@dataclass(frozen=True)
class WatchEvent:
    """One change in a watched directory, as the supervisor saw it."""

    kind: WatchKind
    path: str = ""
    """Relative to the workspace ("" for the workspace itself; none when dropped)."""
    old_path: str = ""
    """A move's former path."""
    is_dir: bool = False
    hint: str = ""
    """For "dropped": what was lost and why."""


class SandboxWatch:
    """A watch of a workspace directory (`SessionSandbox.watch`)."""

    def __init__(self, mux: StreamMux, sid: int, dirs: int) -> None:
        self.dirs = dirs
        """Directories watched at its start."""
        self._mux = mux
        self._sid = sid
        self._in = Inbound(mux.send, sid, ("watch",))
        self._rest = b""
        self._closed = False

    @property
    def buffered(self) -> int:
        return self._in.buffered + len(self._rest)

    async def events(self) -> AsyncIterator[WatchEvent]:
        """The events in order, until the watch ends (its directory went, the
        sandbox ended, `close`). Reading grants the supervisor credit: a reader
        that stops, stops it reading inotify, and the kernel then drops events
        (a "dropped" event says so once read again)."""
        while not self._closed:
            chunk = await self._in.next()
            if chunk is None:
                return
            lines = (self._rest + chunk[1]).split(b"\n")
            self._rest = lines.pop()
            if len(self._rest) > MAX_WATCH_LINE:
                self._rest = b""
                yield WatchEvent("dropped", hint="an event line too long was dropped")
            for line in lines:
                event = _event(line)
                if event is not None:
                    yield event

    def close(self) -> None:
        """Stop watching (the supervisor closes its inotify instance); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._in.end()
        self._mux.forget(self._sid)
        self._mux.send({"op": "close", "id": self._sid})

    def _gone(self) -> None:
        self._in.end()


def _event(line: bytes) -> WatchEvent | None:
    with contextlib.suppress(ValueError):
        value = json.loads(line)
        kind = _KINDS.get(str(value.get("k"))) if isinstance(value, dict) else None
        if kind is None:
            return None
        return WatchEvent(
            kind,
            path=_text(value.get("p")),
            old_path=_text(value.get("o")),
            is_dir=value.get("d") == 1,
            hint=_text(value.get("h")),
        )
    return None


def _text(value: Any) -> str:
    """A path as a protobuf string takes it (bytes not UTF-8 shown as U+FFFD)."""
    if not isinstance(value, str):
        return ""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
