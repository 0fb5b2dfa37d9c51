"""A session's background processes, terminals and port connections, in its supervisor.

The supervisor (_session.py) forks them itself, reads and writes their
descriptors in its own poll loop, and moves their bytes over the session's
existing pipes: ops on the request pipe from the daemon, frames on the frame
pipe to it (the daemon's side, and the whole protocol: the docstring of
tooljaild/sandbox/session_streams.py). No tool code runs here: the
interpreter never holds these descriptors (they are opened after its fork,
and a later interpreter sheds every descriptor of the supervisor's at its
start), and a spawned process closes all but its own three before it execs.

Flow control both ways, per stream, in bytes: the supervisor reads a
process's output (or a socket) only while the daemon has granted it credit
(`WINDOW` at the start, more as the daemon's reader consumes), so a reader
that stops stops the supervisor reading, and the writer blocks on a full
pipe or PTY, as a real one does. Input is bounded the other way: the daemon
sends at most `WINDOW` bytes the supervisor has not yet said it wrote
("room" frames).

Every op is checked here: the daemon is trusted, but no malformed line may
crash the supervisor (it would end the session).

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import os
import select
import socket
import termios
import types
from collections.abc import Callable
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._streams
    from . import _frames, _procs, _spawn, _watch, _workspace_paths
except ImportError:  # a sandbox: top-level modules beside _runner.py, on the path it set
    import _frames  # type: ignore[import-not-found, no-redef]
    import _procs  # type: ignore[import-not-found, no-redef]
    import _spawn  # type: ignore[import-not-found, no-redef]
    import _watch  # type: ignore[import-not-found, no-redef]
    import _workspace_paths  # type: ignore[import-not-found, no-redef]

CHUNK = 64 * 1024
"""The most raw bytes in one frame's or op's payload (base64 in the JSON line)."""
WINDOW = 256 * 1024
"""Credit per stream, each way: bytes sent the other side has not yet consumed
(output) or the supervisor has not yet written (input). The daemon's side
holds the same constant (sandbox/session_streams.py)."""
MAX_STREAMS = 4096
"""Processes and connections tracked at once; past it a spawn or connect is refused."""
OPS = frozenset(
    {"spawn", "connect", "stats", "write", "credit", "eof", "signal", "resize", "close"} | {"watch"}
)
"""The request ops this module serves (they carry an "id", no "seq")."""
_SIGNALS = range(1, 65)

Write = Callable[[dict[str, Any]], None]


class _Stream:
    """One process (its pipes or its PTY) or one TCP connection."""

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.pid = 0
        self.out: dict[int, str] = {}
        """Readable descriptors, each with its stream name (stdout, stderr, pty, sock)."""
        self.infd = -1
        """Where input goes (stdin's pipe, the PTY master, the socket); -1: none/closed."""
        self.pending = b""
        """Input not yet written."""
        self.eof_asked = False
        """Close the input once `pending` is written."""
        self.credit = WINDOW
        """Output bytes the daemon will take now."""
        self.written = 0
        """Input written since the last "room" frame."""
        self.master = -1
        self.sock: socket.socket | None = None
        self.connecting = False
        self.status: int | None = None
        """The wait status once reaped."""
        self.killed = False
        """Ended by the supervisor's sweep of everything (reset, close)."""
        self.told_exit = False
        self.port = 0


class Streams:
    """The supervisor's streams, and what it does with each op about them.

    Args:
        poll: The supervisor's poll object; every descriptor here is watched there.
        root: The session's workspace (cwd of a spawn is relative to it).
        session: The "session" request: its env (a spawn's own is added on
            top) and limits (a spawned process gets them, but cpu_s).
        runner: The _runner module (its limits and prctl, as they are).
        write: Writes one frame to the daemon.
    """

    def __init__(
        self,
        poll: Any,
        root: str,
        session: dict[str, Any],
        runner: types.ModuleType,
        write: Write = _frames.write_frame,
    ) -> None:
        self.poll = poll
        self.root = os.path.realpath(root)
        self.env = {str(k): str(v) for k, v in dict(session.get("env") or {}).items()}
        limits = dict(session.get("limits") or {})
        self.limits = {k: v for k, v in limits.items() if k != "cpu_s"}
        self.runner = runner
        self.write = write
        self.streams: dict[int, _Stream] = {}
        self.fds: dict[int, _Stream] = {}
        """Every descriptor watched, with its stream."""
        self.by_pid: dict[int, _Stream] = {}
        self._masks: dict[int, int] = {}
        self.watches = _watch.Watches(
            self._set_mask, self.root, lambda: self.write, WINDOW, CHUNK, self._resolve
        )
        """Workspace watches (_watch.py): streams of their own, with the same credit."""

    def _resolve(self, path: Any) -> str:
        """A watch's directory, resolved and checked as a workspace tool's path is."""
        try:
            return _workspace_paths.Workspace(self.root, 0).resolve(path, "path", allow_root=True)
        except _workspace_paths.WorkspaceError as exc:
            raise _watch.Refused(exc.message) from None

    def owns(self, fd: int) -> bool:
        """Whether `fd` is one of this module's (the loop hands it to `on_event`)."""
        return fd in self.fds or fd in self.watches.fds

    # ------------------------------------------------------------ what the sweep spares

    def sessions(self) -> set[int]:
        """The session ids of the background processes (each one's pid): the
        end-of-call sweep spares their members."""
        return {s.pid for s in self.streams.values() if s.pid}

    # ------------------------------------------------------------ ops

    def on_op(self, op: str, message: dict[str, Any]) -> None:
        """One op from the daemon; a malformed one is dropped (or answered with a failure)."""
        sid = message.get("id")
        if not isinstance(sid, int) or isinstance(sid, bool):
            return
        try:
            if op == "spawn":
                self._spawn(sid, message)
            elif op == "connect":
                self._connect(sid, message)
            elif op == "stats":
                self._stats(sid, message.get("pids"))
            elif op == "watch":
                self.watches.start(sid, message)
            elif sid in self.watches.watches:
                self.watches.on_op(sid, op, message)
            else:
                stream = self.streams.get(sid)
                if stream is not None:
                    self._on_stream_op(stream, op, message)
        except Exception as exc:  # a malformed op must never end the supervisor
            if op == "watch" and sid not in self.watches.watches:
                self.write({"t": "watch_failed", "id": sid, "message": f"bad request: {exc}"})
            if op in ("spawn", "connect") and sid not in self.streams:
                self.write({"t": f"{op}_failed", "id": sid, "message": f"bad request: {exc}"})

    def _on_stream_op(self, stream: _Stream, op: str, message: dict[str, Any]) -> None:
        if op == "write":
            data = base64.b64decode(str(message.get("d") or ""), validate=True)
            if stream.infd < 0 or stream.eof_asked:
                self.write({"t": "in_closed", "id": stream.id})
                return
            if len(stream.pending) + len(data) > WINDOW + CHUNK:
                return  # past the credit the daemon was given: it never sends that
            stream.pending += data
            self._flush(stream)
        elif op == "credit":
            n = message.get("n")
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= WINDOW:
                stream.credit = min(stream.credit + n, WINDOW)
                self._watch_all(stream)
        elif op == "eof":
            if stream.master >= 0:
                return  # a terminal's input has no end of its own
            stream.eof_asked = True
            self._flush(stream)
        elif op == "signal":
            self._signal(stream, message.get("sig"), message.get("fg") is True)
        elif op == "resize":
            rows, cols = message.get("rows"), message.get("cols")
            if stream.master >= 0 and isinstance(rows, int) and isinstance(cols, int):
                if not _spawn.dims(rows, cols):
                    return
                with contextlib.suppress(OSError):
                    # The kernel sends SIGWINCH to the terminal's foreground group.
                    fcntl.ioctl(stream.master, termios.TIOCSWINSZ, _spawn.winsize(rows, cols))
        elif op == "close" and stream.sock is not None:  # (a process is not closed)
            self._forget(stream)

    # ------------------------------------------------------------ spawn

    def _spawn(self, sid: int, message: dict[str, Any]) -> None:
        if sid in self.streams:
            return
        try:
            if len(self.streams) >= MAX_STREAMS:
                raise _spawn.Refused(f"more than {MAX_STREAMS} processes", limit=True)
            spec = _spawn.read_spec(message, self.root, self.env)
            started = _spawn.start(spec, self.limits, self.runner)
        except _spawn.Refused as exc:
            self.write({"t": "spawn_failed", "id": sid, "message": exc.why, "limit": exc.limit})
            return
        stream = _Stream(sid)
        stream.pid, stream.out, stream.infd = started.pid, started.out, started.infd
        stream.master = started.master
        self.streams[sid] = stream
        self.by_pid[stream.pid] = stream
        for fd in {*stream.out, stream.infd} - {-1}:
            os.set_blocking(fd, False)
            self.fds[fd] = stream
        self._watch_all(stream)
        self.write({"t": "spawned", "id": sid, "pid": stream.pid})

    # ------------------------------------------------------------ connect

    def _connect(self, sid: int, message: dict[str, Any]) -> None:
        if sid in self.streams:
            return
        port = message.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError("port must be 1..65535")
        first = base64.b64decode(str(message.get("d") or ""), validate=True)
        if len(first) > CHUNK:
            raise ValueError(f"more than {CHUNK} bytes with a connect")
        if len(self.streams) >= MAX_STREAMS:
            self.write({"t": "connect_failed", "id": sid, "message": "too many connections"})
            return
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:
            self.write({"t": "connect_failed", "id": sid, "message": f"no socket: {exc}"})
            return
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.write({"t": "connect_failed", "id": sid, "message": _refused(port, code)})
            return
        # Nagle's wait (with the peer's delayed ACK, 40 ms) would hold back a
        # small write behind one not yet acknowledged: the daemon's chunks are
        # already whole messages, so they go at once.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = _Stream(sid)
        stream.sock, stream.port = sock, port
        # The client's first bytes may come with the connect: written the
        # moment the socket is connected, no round trip to the daemon first.
        # They count against the input credit as a "write" would.
        stream.pending = first
        fd = sock.fileno()
        stream.infd = fd
        stream.out = {fd: "sock"}
        stream.connecting = True
        self.streams[sid] = stream
        self.fds[fd] = stream
        self._set_mask(fd, select.POLLOUT)
        if code == 0:
            self._connected(stream)

    def _connected(self, stream: _Stream) -> None:
        assert stream.sock is not None
        code = stream.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        stream.connecting = False
        if code:
            message = _refused(stream.port, code)
            self.write({"t": "connect_failed", "id": stream.id, "message": message})
            self._forget(stream)
            return
        self.write({"t": "connected", "id": stream.id})
        if stream.pending:
            self._flush(stream)  # (watches what it must)
        self._watch_all(stream)

    # ------------------------------------------------------------ stats

    def _stats(self, sid: int, pids: Any) -> None:
        values: dict[str, list[float]] = {}
        if isinstance(pids, list):
            for pid in pids[:MAX_STREAMS]:
                # Only processes started here: with no pid namespace (isolation
                # "none") /proc shows the host's.
                stream = self.by_pid.get(pid) if isinstance(pid, int) else None
                if stream is None or stream.status is not None:
                    continue
                figures = _procs.tree_usage(pid)
                if figures is not None:
                    values[str(pid)] = list(figures)
        self.write({"t": "stats", "id": sid, "v": values})

    # ------------------------------------------------------------ signals

    def _signal(self, stream: _Stream, sig: Any, foreground: bool) -> None:
        if not isinstance(sig, int) or isinstance(sig, bool) or sig not in _SIGNALS:
            return
        if not stream.pid or stream.status is not None:
            return  # ended: its pid may be anyone's
        group = stream.pid
        if foreground and stream.master >= 0:
            with contextlib.suppress(OSError):
                group = os.tcgetpgrp(stream.master)
        with contextlib.suppress(OSError):
            os.killpg(group, sig)

    # ------------------------------------------------------------ the loop's events

    def on_event(self, fd: int, event: int) -> None:
        """`fd` (one of `fds`, or a watch's) is ready."""
        if fd in self.watches.fds:
            self.watches.on_event(fd)
            return
        stream = self.fds.get(fd)
        if stream is None:
            return
        if stream.connecting:
            if event & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                self._connected(stream)
            return
        # POLLHUP too: poll reports it whatever the mask, and a flush is what
        # settles a hung-up input (written, or EPIPE/EIO: closed), so no spin.
        if fd == stream.infd and event & (select.POLLOUT | select.POLLERR | select.POLLHUP):
            self._flush(stream)
        if fd in stream.out and event & (select.POLLIN | select.POLLHUP | select.POLLERR):
            self._read(stream, fd)

    def _read(self, stream: _Stream, fd: int) -> None:
        if stream.credit <= 0:
            self._watch(stream, fd)
            return
        try:
            data = os.read(fd, min(CHUNK, stream.credit))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO: a PTY whose every slave is closed; ECONNRESET
            data = b""
        name = stream.out[fd]
        if not data:
            self._end_output(stream, fd)
            return
        stream.credit -= len(data)
        self.write(
            {"t": "out", "id": stream.id, "s": name, "d": base64.b64encode(data).decode("ascii")}
        )
        if stream.credit <= 0:
            self._watch(stream, fd)

    def _end_output(self, stream: _Stream, fd: int) -> None:
        name = stream.out.pop(fd)
        self.write({"t": "eof", "id": stream.id, "s": name})
        if stream.sock is not None:
            # Its read side is at its end; writing may go on (a half close).
            self._watch(stream, fd)
        elif fd == stream.infd:  # a PTY's master: its input is over too
            stream.infd = -1
            stream.pending = b""
            self._drop_fd(fd)
        else:
            self._drop_fd(fd)
        self._maybe_done(stream)

    def _flush(self, stream: _Stream) -> None:
        fd = stream.infd
        if fd < 0:
            return
        before = len(stream.pending)
        while stream.pending:
            try:
                n = os.write(fd, stream.pending[:CHUNK])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # EPIPE: its stdin's reader is gone
                stream.pending = b""
                self._close_input(stream)
                self.write({"t": "in_closed", "id": stream.id})
                return
            stream.pending = stream.pending[n:]
        stream.written += before - len(stream.pending)
        # Room is told in batches of CHUNK, and only then (no frame per write
        # while the window is far from spent): the daemon waits for room only
        # with more than WINDOW - CHUNK bytes unacknowledged, so then at least
        # WINDOW - 2 * CHUNK are still pending here, and writing them tells it.
        if stream.written >= CHUNK:
            self.write({"t": "room", "id": stream.id, "n": stream.written})
            stream.written = 0
        if not stream.pending and stream.eof_asked:
            self._close_input(stream)
        else:
            self._watch(stream, fd)

    def _close_input(self, stream: _Stream) -> None:
        fd = stream.infd
        if fd < 0:
            return
        stream.infd = -1
        if stream.sock is not None:
            with contextlib.suppress(OSError):
                stream.sock.shutdown(socket.SHUT_WR)
            self._watch(stream, stream.sock.fileno())
            self._maybe_done(stream)
            return
        if fd in stream.out:  # a PTY master is output as well
            self._watch(stream, fd)
            return
        self._drop_fd(fd)

    # ------------------------------------------------------------ ends

    def reaped(self, pid: int, status: int) -> None:
        """`pid` was reaped by the supervisor with `status`."""
        stream = self.by_pid.get(pid)
        if stream is None or stream.status is not None:
            return
        stream.status = status
        self._maybe_done(stream)

    def sweep(self, me: int, interpreter: int, children: Any, reap: Any, everything: bool) -> None:
        """The supervisor's sweep (_procs.sweep): of a call's processes, sparing
        the background processes' sessions; or of everything (reset, the
        interpreter's death, the end), after which each background process is
        told ended as killed. (Connections stay: their server's end tells them.)"""
        if not everything:
            _procs.sweep(me, interpreter, children, reap, self.sessions())
            return
        for stream in self.streams.values():
            if stream.pid and stream.status is None:
                stream.killed = True
        _procs.sweep(me, None, children, reap)
        # What they wrote before they died is read (within credit), then their end told.
        for stream in list(self.streams.values()):
            for fd in list(stream.out):
                # Whatever it wrote before it died, up to its credit; the rest is dropped.
                while fd in stream.out and stream.credit > 0:
                    before = stream.credit
                    self._read(stream, fd)
                    if stream.credit == before:
                        break
                if fd in stream.out:
                    self._end_output(stream, fd)
            self._maybe_done(stream)

    def _maybe_done(self, stream: _Stream) -> None:
        """Tell its end once it is reaped (a process), or closed both ways (a socket)."""
        if stream.sock is not None:
            if not stream.out and stream.infd < 0:
                self._forget(stream)
            return
        if stream.status is None:
            return
        if not stream.told_exit:
            stream.told_exit = True
            status = stream.status
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            self.write(
                {"t": "exited", "id": stream.id, "code": code, "signal": sig,
                 "killed": stream.killed}
            )  # fmt: skip
        if not stream.out:
            self._forget(stream)

    def _forget(self, stream: _Stream) -> None:
        """Close every descriptor of `stream` and drop it (the daemon knows why)."""
        fds = {*stream.out, stream.infd} - {-1}
        if stream.sock is not None:
            fds = {stream.sock.detach()}  # a socket's one descriptor: closed here only
        for fd in fds:
            self._drop_fd(fd)
        stream.out, stream.infd = {}, -1
        self.streams.pop(stream.id, None)
        if stream.pid:
            self.by_pid.pop(stream.pid, None)

    # ------------------------------------------------------------ poll masks

    def _watch_all(self, stream: _Stream) -> None:
        for fd in {*stream.out, stream.infd} - {-1}:
            self._watch(stream, fd)

    def _watch(self, stream: _Stream, fd: int) -> None:
        mask = 0
        if fd in stream.out and stream.credit > 0:
            mask |= select.POLLIN
        if fd == stream.infd and stream.pending:
            mask |= select.POLLOUT
        self._set_mask(fd, mask)

    def _set_mask(self, fd: int, mask: int) -> None:
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if mask:
            if old:
                self.poll.modify(fd, mask)
            else:
                self.poll.register(fd, mask)
            self._masks[fd] = mask
        else:
            with contextlib.suppress(KeyError, ValueError):
                self.poll.unregister(fd)
            self._masks.pop(fd, None)

    def _drop_fd(self, fd: int) -> None:
        self._set_mask(fd, 0)
        self.fds.pop(fd, None)
        with contextlib.suppress(OSError):
            os.close(fd)


def _refused(port: int, code: int) -> str:
    if code == errno.ECONNREFUSED:
        return f"nothing listens on port {port} in the session"
    return f"port {port} in the session: {os.strerror(code)}"


def quiet(frame: dict[str, Any]) -> None:
    """Writes no frame: once the daemon is gone, nobody reads them."""
