"""Starting one of a session's background processes, in its supervisor (_streams.py).

What a spawn op asks is checked here (`read_spec`), its descriptors made
(pipes, or a PTY whose slave becomes its controlling terminal), and the child
forked under the session's process limit (`start`). The child becomes the
leader of a session of its own (the end-of-call sweep spares it by its session
id, _procs.py), sheds every descriptor but its own three, gets default signal
dispositions, the session's limits and PDEATHSIG, and execs; a failure before
the exec comes back on a close-on-exec pipe, so a missing program is refused
with its reason rather than started as a process that exits 127.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource
import signal
import struct
import termios
import types
from dataclasses import dataclass
from typing import Any

MAX_ARGV = 4096
"""The most arguments of a spawned program."""
MAX_ENV = 4096
"""The most variables a spawn adds."""


class Refused(Exception):
    """The spawn cannot be: `why`, and whether a limit refused it."""

    def __init__(self, why: str, *, limit: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.limit = limit


@dataclass(frozen=True)
class Spec:
    argv: list[str]
    env: dict[str, str]
    """The whole environment (the session's and the spawn's own)."""
    cwd: str
    """Absolute, inside the workspace."""
    terminal: tuple[int, int] | None
    stdin: bool


@dataclass(frozen=True)
class Started:
    pid: int
    out: dict[int, str]
    """Its output's read ends, each with its stream name (stdout, stderr, pty)."""
    infd: int
    """Its input's write end (the PTY master for a terminal); -1: /dev/null."""
    master: int
    """The PTY master; -1 without a terminal."""


def read_spec(message: dict[str, Any], root: str, env: dict[str, str]) -> Spec:
    """The spawn op, checked.

    Raises:
        ValueError: A malformed op (the daemon sends none such).
        Refused: A cwd that leaves the workspace or is no directory there.
    """
    argv = message.get("argv")
    if (
        not isinstance(argv, list)
        or not 0 < len(argv) <= MAX_ARGV
        or not all(isinstance(a, str) and "\0" not in a for a in argv)
        or not argv[0]
    ):
        raise ValueError("argv must be a non-empty list of strings")
    added = message.get("env") or {}
    if not isinstance(added, dict) or len(added) > MAX_ENV:
        raise ValueError("env must be an object of strings")
    for key, value in added.items():
        if not isinstance(value, str) or not key or "=" in key or "\0" in key + value:
            raise ValueError(f"env {key[:40]!r} is not a variable")
    terminal = message.get("terminal")
    if terminal is not None and not (
        isinstance(terminal, list) and len(terminal) == 2 and dims(*terminal)
    ):
        raise ValueError("terminal must be [rows, cols], each 1..65535")
    rel = message.get("cwd") or ""
    if not isinstance(rel, str) or "\0" in rel:
        raise ValueError("cwd must be a path relative to the workspace")
    cwd = os.path.realpath(os.path.join(root, rel))
    if cwd != root and not cwd.startswith(root + os.sep):
        raise Refused(f"cwd {rel!r} leaves the workspace")
    if not os.path.isdir(cwd):
        raise Refused(f"cwd {rel!r} is not a directory in the workspace")
    size = None if terminal is None else (terminal[0], terminal[1])
    stdin = message.get("stdin") is not False
    return Spec(list(argv), {**env, **added}, cwd, size, stdin)


def start(spec: Spec, limits: dict[str, int], runner: types.ModuleType) -> Started:
    """Fork and exec `spec`'s program; its descriptors, the daemon's side.

    Raises:
        Refused: No descriptors, the process limit (fork's EAGAIN: ``limit``),
            or the exec failed (its reason).
    """
    opened: list[int] = []  # every descriptor made here, until it is handed on
    theirs: list[int] = []  # the child's ends, closed here once it has them
    try:
        if spec.terminal is not None:
            master, slave = os.openpty()  # both close-on-exec
            opened += [master, slave]
            theirs.append(slave)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize(*spec.terminal))
            stdio = (slave, slave, slave)
            started = Started(0, {master: "pty"}, master, master)
        else:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            opened += [out_r, out_w, err_r, err_w]
            if spec.stdin:
                in_r, in_w = os.pipe2(os.O_CLOEXEC)
                opened += [in_r, in_w]
            else:
                in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), -1
                opened.append(in_r)
            theirs += [in_r, out_w, err_w]
            stdio = (in_r, out_w, err_w)
            started = Started(0, {out_r: "stdout", err_r: "stderr"}, in_w, -1)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
    except OSError as exc:
        _close(opened)
        raise Refused(f"no descriptors for it: {exc}", limit=True) from None
    try:
        pid = _fork(limits.get("nproc"))
    except OSError as exc:
        _close([*opened, report_r, report_w])
        if exc.errno in (errno.EAGAIN, errno.ENOMEM):
            raise Refused(
                "the sandbox's process limit (pids) refused a new process "
                f"(fork: {os.strerror(exc.errno)})",
                limit=True,
            ) from None
        raise Refused(f"fork failed: {exc}") from None
    if pid == 0:  # the child: never returns
        _child(spec, stdio, report_w, limits, runner)
    os.close(report_w)
    _close(theirs)
    why = _read_all(report_r)
    os.close(report_r)
    if why:  # it could not exec: reaped at once, nothing registered
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        _close([fd for fd in opened if fd not in theirs])
        raise Refused(why.decode("utf-8", "replace"))
    return Started(pid, started.out, started.infd, started.master)


def _fork(nproc: int | None) -> int:
    """fork(), under the session's process limit (RLIMIT_NPROC) as the
    interpreter's forks are: EAGAIN past it. For this fork only: the
    supervisor's own (a fresh interpreter) must not fail for it."""
    if not nproc:
        return os.fork()
    before = resource.getrlimit(resource.RLIMIT_NPROC)
    soft = nproc if before[1] == resource.RLIM_INFINITY else min(nproc, before[1])
    resource.setrlimit(resource.RLIMIT_NPROC, (soft, before[1]))
    try:
        return os.fork()
    finally:  # (the child sets the session's limits again before it execs)
        resource.setrlimit(resource.RLIMIT_NPROC, before)


def _child(
    spec: Spec,
    stdio: tuple[int, int, int],
    report: int,
    limits: dict[str, int],
    runner: types.ModuleType,
) -> None:
    """In the forked child: lead a new session, then exec. Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        # Ignored dispositions survive exec (the supervisor ignores SIGINT,
        # Python SIGPIPE and SIGXFSZ): a program starts with the defaults.
        for sig in (signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.setsid()
        if spec.terminal is not None:
            fcntl.ioctl(stdio[0], termios.TIOCSCTTY, 0)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)  # (dup2 leaves 0..2 inheritable)
        # Nothing of the supervisor's may reach it: the daemon's pipes, other
        # processes' PTY masters and sockets. Close-on-exec alone would do for
        # most, but not for a descriptor someone made inheritable.
        for fd in _open_fds():
            if fd not in (0, 1, 2, report):
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.chdir(spec.cwd)
        with contextlib.suppress(ValueError, OSError):
            runner._apply_limits(limits)
        # SIGKILL when the supervisor dies (with no pid namespace nothing else would).
        runner._prctl(runner.PR_SET_PDEATHSIG, int(signal.SIGKILL))
        os.execvpe(spec.argv[0], spec.argv, spec.env)
    except BaseException as exc:
        why = f"{spec.argv[0]}: {exc.strerror if isinstance(exc, OSError) else exc}"
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


def dims(rows: Any, cols: Any) -> bool:
    """Whether (rows, cols) is a terminal's size."""
    return all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65535 for v in (rows, cols)
    )


def winsize(rows: int, cols: int) -> bytes:
    """A struct winsize for TIOCSWINSZ."""
    return struct.pack("HHHH", rows, cols, 0, 0)
