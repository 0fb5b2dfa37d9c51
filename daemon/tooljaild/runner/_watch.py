"""A session's workspace watches, in its supervisor: inotify, as JSON lines.

The supervisor (trusted: no tool code runs in it, so nothing a tool does can
forge an event) holds one inotify instance per watch, reads it in its own
poll loop, and sends what it reads as the watch stream's output: compact JSON
lines in "out" frames (stream "watch"), within the SAME credit as a process's
output (_streams.py). A daemon reader that stops stops the supervisor reading
the inotify descriptor; the kernel's queue then fills
(fs.inotify.max_queued_events) and overflows, and IN_Q_OVERFLOW becomes a
line with "k": "x" (events were dropped). Nothing here buffers past one read.

One line per event, paths relative to the workspace:

    {"k": "c", "p": path, "d": 0|1}               created
    {"k": "m", "p": path, "d": 0|1}               modified (written to)
    {"k": "r", "p": path, "d": 0|1}               removed (deleted, or moved out of the watch)
    {"k": "v", "p": new, "o": old, "d": 0|1}      moved (renamed) within the watch
    {"k": "x", "h": hint}                         events were dropped here

Moves: the kernel queues a rename's IN_MOVED_FROM and IN_MOVED_TO next to
each other with one cookie; they become one "v" line. A MOVED_FROM whose
partner is not in the same read (moved out of the watched tree) is a removal,
a lone MOVED_TO (moved in) a creation.

Recursive watches add a watch for every directory below, and for each one
created (or moved in) later; a directory's entries made before its watch was
added are reported by a scan right after (a "c" line may then repeat). Past
the session's bound of watched directories, the start is refused (a clear
message), and a directory made later is not watched: a "x" line says so.

stdlib only (ctypes), as _runner.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import struct
from collections.abc import Callable
from typing import Any

IN_MODIFY = 0x2
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
_MASK = (
    IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
    | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
)  # fmt: skip
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
READ_BYTES = 16 * 1024
"""One read of the inotify descriptor: the most events held here at once."""
SCAN_LINES = 1024
"""The most entries a new directory's scan reports (a tree moved in may hold
millions); past it, one "dropped" line says so."""

Write = Callable[[dict[str, Any]], None]


class Refused(Exception):
    """A watch could not start; `why` says so, `limit` when a bound refused it."""

    def __init__(self, why: str, *, limit: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.limit = limit


_libc: Any = None


def _inotify() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return _libc


class Watch:
    """One watch: an inotify instance and the directories it watches.

    Args:
        root: The workspace (real path); every path reported is relative to it.
        top: The watched directory (real path, inside `root`, checked).
        recursive: Watch the directories below as well.
        room: How many more directories this watch may watch (the session's bound).
    """

    def __init__(self, root: str, top: str, recursive: bool, room: int) -> None:
        self.root = root
        self.top = top
        self.recursive = recursive
        self.room = room
        self.dirs: dict[int, str] = {}
        """Each watch descriptor with its directory (real path)."""
        self.lines: list[bytes] = []
        """Encoded lines read but not yet sent (at most one read's worth)."""
        self.over = False
        """Its top directory is gone: once the lines are sent, the watch ends."""
        libc = _inotify()
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise Refused(
                f"no inotify instance: {os.strerror(code)}"
                + (" (the host's fs.inotify.max_user_instances)" if code == errno.EMFILE else ""),
                limit=code == errno.EMFILE,
            )
        self.fd = fd
        try:
            self._add(top, strict=True)
            if recursive:
                self._below(top, strict=True, announce=False)
        except BaseException:
            os.close(fd)
            raise

    # ------------------------------------------------------------ watches

    def _add(self, path: str, *, strict: bool) -> bool:
        """Watch directory `path`; False (or Refused when `strict`) past the bound."""
        if len(self.dirs) >= self.room:
            if strict:
                raise Refused(
                    f"{self._rel(self.top)!r} holds more than {self.room} directories, the "
                    "session's bound of watched directories: watch a smaller directory, "
                    "or without recursive",
                    limit=True,
                )
            return False
        wd = _inotify().inotify_add_watch(self.fd, os.fsencode(path), _MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if strict and code == errno.ENOSPC:
                raise Refused(
                    "the host's inotify watches are used up (fs.inotify.max_user_watches)",
                    limit=True,
                )
            if strict:
                raise Refused(f"{self._rel(path)!r} cannot be watched: {os.strerror(code)}")
            return code in (errno.ENOENT, errno.ENOTDIR)  # gone already: nothing to report
        self.dirs[wd] = path
        return True

    def _below(self, top: str, *, strict: bool, announce: bool) -> None:
        """Watch every directory below `top` (no symlink followed); with `announce`,
        report each entry found (made before its directory's watch was there),
        at most `SCAN_LINES` of them."""
        pending = [top]
        told = 0
        while pending:
            here = pending.pop()
            try:
                entries = list(os.scandir(here))
            except OSError:
                continue
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if announce and told < SCAN_LINES:
                    self._line({"k": "c", "p": self._rel(entry.path), "d": int(is_dir)})
                    told += 1
                    if told == SCAN_LINES:
                        self._dropped(
                            f"{self._rel(top)!r} holds more than {SCAN_LINES} entries made "
                            "before its watch: the rest are not reported (list it)"
                        )
                if is_dir:
                    if not self._add(entry.path, strict=strict):
                        self._dropped(
                            f"{self._rel(entry.path)!r} is not watched: past the session's "
                            f"bound of {self.room} watched directories"
                        )
                        continue
                    pending.append(entry.path)

    def _forget_below(self, path: str) -> None:
        """Stop watching `path` and below (moved out of the watch)."""
        for wd, where in list(self.dirs.items()):
            if where == path or where.startswith(path + os.sep):
                del self.dirs[wd]
                with contextlib.suppress(OSError):
                    _inotify().inotify_rm_watch(self.fd, wd)

    def _renamed(self, old: str, new: str) -> None:
        for wd, where in self.dirs.items():
            if where == old or where.startswith(old + os.sep):
                self.dirs[wd] = new + where[len(old) :]

    # ------------------------------------------------------------ events

    def read(self) -> None:
        """Read what the kernel queued (one read) into `lines`."""
        try:
            data = os.read(self.fd, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        events = list(_parse(data))
        if events and events[-1][1] & IN_MOVED_FROM:
            # Its MOVED_TO may be just past this read: one more, at once.
            with contextlib.suppress(BlockingIOError, InterruptedError):
                events += _parse(os.read(self.fd, READ_BYTES))
        moves: dict[int, tuple[str, bool]] = {}
        for i, (wd, mask, cookie, name) in enumerate(events):
            if mask & IN_Q_OVERFLOW:
                self._dropped("the kernel's event queue overflowed: the reader fell behind")
                continue
            where = self.dirs.get(wd)
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
                if where == self.top:
                    self.over = True
                continue
            if where is None:
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if where == self.top:
                    self._line({"k": "r", "p": self._rel(where), "d": 1})
                    self.over = True
                continue
            path = os.path.join(where, os.fsdecode(name)) if name else where
            is_dir = bool(mask & IN_ISDIR)
            if mask & IN_MOVED_FROM:
                nxt = events[i + 1] if i + 1 < len(events) else None
                if nxt is not None and nxt[1] & IN_MOVED_TO and nxt[2] == cookie:
                    moves[cookie] = (path, is_dir)
                    continue
                self._line({"k": "r", "p": self._rel(path), "d": int(is_dir)})
                if is_dir:
                    self._forget_below(path)
            elif mask & IN_MOVED_TO:
                moved = moves.pop(cookie, None)
                if moved is not None:
                    self._line(
                        {"k": "v", "p": self._rel(path), "o": self._rel(moved[0]),
                         "d": int(is_dir)}
                    )  # fmt: skip
                    if is_dir and moved[0] in self.dirs.values():
                        self._renamed(moved[0], path)
                    elif is_dir and self.recursive:
                        # Renamed before its watch was added (made and moved at
                        # once): watched now, under its new name.
                        self._new_dir(path)
                else:
                    self._line({"k": "c", "p": self._rel(path), "d": int(is_dir)})
                    if is_dir and self.recursive:
                        self._new_dir(path)
            elif mask & IN_CREATE:
                self._line({"k": "c", "p": self._rel(path), "d": int(is_dir)})
                if is_dir and self.recursive:
                    self._new_dir(path)
            elif mask & IN_DELETE:
                self._line({"k": "r", "p": self._rel(path), "d": int(is_dir)})
            elif mask & IN_MODIFY:
                line = {"k": "m", "p": self._rel(path), "d": int(is_dir)}
                if not self.lines or self.lines[-1] != _encode(line):  # a write in pieces
                    self._line(line)

    def _new_dir(self, path: str) -> None:
        if not self._add(path, strict=False):
            self._dropped(
                f"{self._rel(path)!r} is not watched: past the session's bound of "
                f"{self.room} watched directories"
            )
            return
        self._below(path, strict=False, announce=True)

    def _dropped(self, hint: str) -> None:
        self._line({"k": "x", "h": hint})

    def _line(self, line: dict[str, Any]) -> None:
        self.lines.append(_encode(line))

    def _rel(self, real: str) -> str:
        rel = os.path.relpath(real, self.root)
        return "" if rel == "." else rel

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _encode(line: dict[str, Any]) -> bytes:
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _parse(data: bytes) -> list[tuple[int, int, int, bytes]]:
    events = []
    at = 0
    while at + _HEADER.size <= len(data):
        wd, mask, cookie, length = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        name = data[at : at + length].split(b"\0", 1)[0]
        at += length
        events.append((wd, mask, cookie, name))
    return events


class Watches:
    """The supervisor's watches: the "watch" op, their credit, their close.

    Args:
        set_mask: Sets a descriptor's poll mask in the supervisor's loop (0: none).
        root: The workspace (real path).
        write: Writes one frame to the daemon.
        window: The credit each stream starts with (the process streams').
        chunk: The most bytes in one "out" frame.
        resolve: Resolves and checks a path in the workspace (raises with a message).
    """

    def __init__(
        self,
        set_mask: Callable[[int, int], None],
        root: str,
        write: Callable[[], Write],
        window: int,
        chunk: int,
        resolve: Callable[[Any], str],
    ) -> None:
        self._set_mask = set_mask
        self.root = root
        self._write = write
        self.window = window
        self.chunk = chunk
        self._resolve = resolve
        self.watches: dict[int, Watch] = {}
        self.fds: dict[int, int] = {}
        """Each inotify descriptor with its watch's id."""
        self.credit: dict[int, int] = {}

    def start(self, sid: int, message: dict[str, Any]) -> None:
        """The "watch" op: {"id", "path", "recursive", "max_dirs", "max_watches"}."""
        if sid in self.watches:
            return
        try:
            max_watches = _positive(message.get("max_watches"), 8)
            max_dirs = _positive(message.get("max_dirs"), 4096)
            if len(self.watches) >= max_watches:
                raise Refused(
                    f"the session has {len(self.watches)} watches open, its bound: close one first",
                    limit=True,
                )
            top = self._resolve(message.get("path") or "")
            if not os.path.isdir(top):
                raise Refused(f"{message.get('path')!r} is not a directory of the workspace")
            used = sum(len(w.dirs) for w in self.watches.values())
            watch = Watch(self.root, top, message.get("recursive") is True, max_dirs - used)
        except Refused as exc:
            self._write()({"t": "watch_failed", "id": sid, "message": exc.why, "limit": exc.limit})
            return
        self.watches[sid] = watch
        self.fds[watch.fd] = sid
        self.credit[sid] = self.window
        self._write()({"t": "watching", "id": sid, "dirs": len(watch.dirs)})
        self._pump(sid)

    def on_op(self, sid: int, op: str, message: dict[str, Any]) -> None:
        """ "credit" and "close" for watch `sid`."""
        if sid not in self.watches:
            return
        if op == "credit":
            n = message.get("n")
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= self.window:
                self.credit[sid] = min(self.credit[sid] + n, self.window)
                self._pump(sid)
        elif op == "close":
            self._end(sid, tell=False)

    def on_event(self, fd: int) -> None:
        sid = self.fds.get(fd)
        if sid is not None:
            self._pump(sid)

    def _pump(self, sid: int) -> None:
        """Send lines within the credit; read more only once all are sent."""
        watch = self.watches[sid]
        while self.credit[sid] > 0:
            if not watch.lines:
                if watch.over:
                    self._end(sid, tell=True)
                    return
                before = len(watch.lines)
                watch.read()
                if len(watch.lines) == before and not watch.over:
                    break  # nothing queued
                continue
            data = b""
            limit = min(self.credit[sid], self.chunk)
            while watch.lines and len(data) + len(watch.lines[0]) <= limit:
                data += watch.lines.pop(0)
            if not data:  # one line longer than the credit left: wait for more
                if self.credit[sid] < self.window:
                    break
                data = watch.lines.pop(0)[: self.chunk]  # (never: a path is < 4 KiB)
            self.credit[sid] -= len(data)
            self._write()({"t": "out", "id": sid, "s": "watch", "d": _b64(data)})
        # Read the kernel's queue only while there is credit: a reader that
        # stopped lets it overflow there, not here.
        ready = self.credit[sid] > 0 and not watch.lines
        self._set_mask(watch.fd, select.POLLIN if ready else 0)

    def _end(self, sid: int, *, tell: bool) -> None:
        watch = self.watches.pop(sid)
        self._set_mask(watch.fd, 0)
        self.fds.pop(watch.fd, None)
        self.credit.pop(sid, None)
        watch.close()
        if tell:
            self._write()({"t": "eof", "id": sid, "s": "watch"})


def _positive(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return default


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")
