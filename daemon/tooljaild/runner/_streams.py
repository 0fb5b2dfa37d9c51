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
import resource
import select
import signal
import socket
import struct
import termios
import types
from collections.abc import Callable
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._streams
    from . import _frames, _procs
except ImportError:  # a sandbox: top-level modules beside _runner.py, on the path it set
    import _frames  # type: ignore[import-not-found, no-redef]
    import _procs  # type: ignore[import-not-found, no-redef]

CHUNK = 64 * 1024
"""The most raw bytes in one frame's or op's payload (base64 in the JSON line)."""
WINDOW = 256 * 1024
"""Credit per stream, each way: bytes sent the other side has not yet consumed
(output) or the supervisor has not yet written (input). The daemon's side
holds the same constant (sandbox/session_streams.py)."""
MAX_ARGV = 4096
"""The most arguments of a spawned program."""
MAX_ENV = 4096
"""The most variables a spawn adds."""
MAX_STREAMS = 4096
"""Processes and connections tracked at once; past it a spawn or connect is refused."""
OPS = frozenset(
    {"spawn", "connect", "stats", "write", "credit", "eof", "signal", "resize", "close"}
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
        env: The session's environment (a spawn's own is added on top).
        limits: The session's rlimits (a spawned process gets them, but cpu_s).
        runner: The _runner module (its limits and prctl, as they are).
        write: Writes one frame to the daemon.
    """

    def __init__(
        self,
        poll: Any,
        root: str,
        env: dict[str, str],
        limits: dict[str, int],
        runner: types.ModuleType,
        write: Write = _frames.write_frame,
    ) -> None:
        self.poll = poll
        self.root = os.path.realpath(root)
        self.env = {str(k): str(v) for k, v in env.items()}
        self.limits = {k: v for k, v in limits.items() if k != "cpu_s"}
        self.runner = runner
        self.write = write
        self.streams: dict[int, _Stream] = {}
        self.fds: dict[int, _Stream] = {}
        """Every descriptor watched, with its stream."""
        self.by_pid: dict[int, _Stream] = {}
        self._masks: dict[int, int] = {}

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
            else:
                stream = self.streams.get(sid)
                if stream is not None:
                    self._on_stream_op(stream, op, message)
        except Exception as exc:  # a malformed op must never end the supervisor
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
                if not _dims(rows, cols):
                    return
                with contextlib.suppress(OSError):
                    # The kernel sends SIGWINCH to the terminal's foreground group.
                    fcntl.ioctl(stream.master, termios.TIOCSWINSZ, _winsize(rows, cols))
        elif op == "close":
            self._forget(stream)

    # ------------------------------------------------------------ spawn

    def _spawn(self, sid: int, message: dict[str, Any]) -> None:
        if sid in self.streams:
            return
        argv = message.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or len(argv) > MAX_ARGV
            or not all(isinstance(a, str) and "\0" not in a for a in argv)
            or not argv[0]
        ):
            raise ValueError("argv must be a non-empty list of strings")
        env_add = message.get("env") or {}
        if not isinstance(env_add, dict) or len(env_add) > MAX_ENV:
            raise ValueError("env must be an object of strings")
        for key, value in env_add.items():
            if not isinstance(value, str) or not key or "=" in key or "\0" in key + value:
                raise ValueError(f"env {key[:40]!r} is not a variable")
        terminal = message.get("terminal")
        if terminal is not None and not (
            isinstance(terminal, list) and len(terminal) == 2 and _dims(*terminal)
        ):
            raise ValueError("terminal must be [rows, cols], each 1..65535")
        if len(self.streams) >= MAX_STREAMS:
            return self._spawn_failed(sid, f"more than {MAX_STREAMS} processes", limit=True)
        cwd = self._cwd(message.get("cwd"))
        if isinstance(cwd, tuple):
            return self._spawn_failed(sid, cwd[0], limit=False)
        env = {**self.env, **env_add}
        stream = _Stream(sid)
        opened: list[int] = []  # every descriptor made here, until it is handed on
        child_ends: list[int] = []
        try:
            if terminal is not None:
                master, slave = os.openpty()  # both close-on-exec
                opened += [master, slave]
                child_ends.append(slave)
                fcntl.ioctl(slave, termios.TIOCSWINSZ, _winsize(*terminal))
                stdio = (slave, slave, slave)
                stream.master = stream.infd = master
                stream.out = {master: "pty"}
            else:
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                opened += [out_r, out_w, err_r, err_w]
                child_ends += [out_w, err_w]
                if message.get("stdin") is False:
                    in_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                    opened.append(in_r)
                    in_w = -1
                else:
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    opened += [in_r, in_w]
                child_ends.append(in_r)
                stdio = (in_r, out_w, err_w)
                stream.infd = in_w
                stream.out = {out_r: "stdout", err_r: "stderr"}
            report_r, report_w = os.pipe2(os.O_CLOEXEC)
            opened += [report_r, report_w]
        except OSError as exc:
            _close(opened)
            return self._spawn_failed(sid, f"no descriptors for it: {exc}", limit=True)
        try:
            pid = self._fork()
        except OSError as exc:
            _close(opened)
            if exc.errno in (errno.EAGAIN, errno.ENOMEM):
                return self._spawn_failed(
                    sid,
                    "the sandbox's process limit (pids) refused a new process "
                    f"(fork: {os.strerror(exc.errno)})",
                    limit=True,
                )
            return self._spawn_failed(sid, f"fork failed: {exc}", limit=False)
        if pid == 0:  # the child: never returns
            _child(argv, env, cwd, stdio, terminal is not None, report_w, self.limits, self)
        os.close(report_w)
        _close(child_ends)
        why = _read_all(report_r)
        os.close(report_r)
        if why:  # it could not exec: reaped at once, nothing registered
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            _close([fd for fd in opened if fd not in child_ends and fd not in (report_r, report_w)])
            return self._spawn_failed(sid, why.decode("utf-8", "replace"), limit=False)
        stream.pid = pid
        self.streams[sid] = stream
        self.by_pid[pid] = stream
        for fd in stream.out:
            os.set_blocking(fd, False)
            self.fds[fd] = stream
        if stream.infd >= 0:
            os.set_blocking(stream.infd, False)
            self.fds[stream.infd] = stream
        self._watch_all(stream)
        self.write({"t": "spawned", "id": sid, "pid": pid})

    def _fork(self) -> int:
        """fork(), under the session's process limit (RLIMIT_NPROC) as the
        interpreter's forks are: EAGAIN past it. Only for this fork: the
        supervisor's own (a fresh interpreter) must not fail for it."""
        nproc = self.limits.get("nproc")
        if not nproc:
            return os.fork()
        before = resource.getrlimit(resource.RLIMIT_NPROC)
        soft = nproc if before[1] == resource.RLIM_INFINITY else min(nproc, before[1])
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, before[1]))
        try:
            return os.fork()
        finally:  # (the child sets the session's limits again before it execs)
            resource.setrlimit(resource.RLIMIT_NPROC, before)

    def _spawn_failed(self, sid: int, message: str, *, limit: bool) -> None:
        self.write({"t": "spawn_failed", "id": sid, "message": message, "limit": limit})

    def _cwd(self, given: Any) -> str | tuple[str]:
        """The spawn's directory, absolute; (why,) when it is refused."""
        rel = "" if given is None else given
        if not isinstance(rel, str) or "\0" in rel:
            return ("cwd must be a path relative to the workspace",)
        path = os.path.realpath(os.path.join(self.root, rel))
        if path != self.root and not path.startswith(self.root + os.sep):
            return (f"cwd {rel!r} leaves the workspace",)
        if not os.path.isdir(path):
            return (f"cwd {rel!r} is not a directory in the workspace",)
        return path

    # ------------------------------------------------------------ connect

    def _connect(self, sid: int, message: dict[str, Any]) -> None:
        if sid in self.streams:
            return
        port = message.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError("port must be 1..65535")
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
        stream = _Stream(sid)
        stream.sock, stream.port = sock, port
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
                figures = _tree_usage(pid)
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
        """`fd` (one of `fds`) is ready."""
        stream = self.fds.get(fd)
        if stream is None:
            return
        if stream.connecting:
            if event & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                self._connected(stream)
            return
        if fd == stream.infd and event & (select.POLLOUT | select.POLLERR):
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
        # Room is told in batches (a frame per byte would cost more than the bytes).
        if stream.written and (stream.written >= CHUNK or not stream.pending):
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

    def kill_all(self) -> None:
        """Before the supervisor sweeps everything (reset, close): what dies now
        was killed. (Connections stay: their server's end tells them.)"""
        for stream in self.streams.values():
            if stream.pid and stream.status is None:
                stream.killed = True

    def after_sweep(self) -> None:
        """After a sweep of everything: what is dead is told; its output is read to its end."""
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

    def child_fds(self) -> list[int]:
        """Every descriptor held here: a process forked from the supervisor closes them."""
        return list(self.fds)


def _child(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
    terminal: bool,
    report: int,
    limits: dict[str, int],
    streams: Streams,
) -> None:
    """In the forked child: become the leader of a new session and exec. Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # A session of its own: the end-of-call sweep spares it by its session id,
        # and its signals go to its group (its pid).
        os.setsid()
        if terminal:
            fcntl.ioctl(stdio[0], termios.TIOCSCTTY, 0)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)  # (dup2 leaves 0..2 inheritable)
        # Nothing of the supervisor's may reach it: the daemon's pipes, other
        # processes' PTY masters and sockets. Close-on-exec alone would do for
        # most, but not for descriptors inherited without it.
        keep = {0, 1, 2, report}
        for fd in _open_fds():
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.chdir(cwd)
        runner = streams.runner
        with contextlib.suppress(ValueError, OSError):
            runner._apply_limits(limits)
        # SIGKILL when the supervisor dies (with no pid namespace nothing else would).
        runner._prctl(runner.PR_SET_PDEATHSIG, int(signal.SIGKILL))
        os.execvpe(argv[0], argv, env)
    except BaseException as exc:
        why = f"{argv[0]}: {exc.strerror if isinstance(exc, OSError) else exc}"
        with contextlib.suppress(BaseException):
            os.write(report, why.encode("utf-8", "replace")[:4000])
    finally:
        os._exit(127)


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1 << 16))


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _dims(rows: Any, cols: Any) -> bool:
    return all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65535 for v in (rows, cols)
    )


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


def _refused(port: int, code: int) -> str:
    if code == errno.ECONNREFUSED:
        return f"nothing listens on port {port} in the session"
    return f"port {port} in the session: {os.strerror(code)}"


def _tree_usage(pid: int) -> tuple[float, int] | None:
    """(cpu_s, rss_bytes) of `pid` and its descendants; None when it is gone."""
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    stack, cpu, rss, seen = [pid], 0, 0, False
    while stack:
        p = stack.pop()
        fields = _procs._stat(p)
        if len(fields) < 22:
            continue
        seen = True
        # After the name: state ppid pgrp session tty tpgid flags minflt cminflt
        # majflt cmajflt utime(11) stime(12) cutime(13) cstime(14) ... rss(21)
        cpu += sum(int(fields[i]) for i in (11, 12, 13, 14))
        rss += int(fields[21]) * page
        stack += _procs._children(p)
    if not seen:
        return None
    return cpu / ticks, rss
