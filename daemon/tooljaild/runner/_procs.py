"""A session's processes as the kernel shows them, and the sweep that ends them.

The supervisor is a child subreaper: whatever a call's code starts, and
orphans, is re-parented to it. It finds them all through the kernel's
children lists, from itself down (`below`), and ends them (`sweep`) before it
reports a call's end; it counts those a call left (`alive`). The session's
background processes (_streams.py) each lead a session of their own, and the
end-of-call sweep spares those sessions' members (`session_of`); what they
use is `tree_usage`.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection

SWEEP_ROUNDS = 2000
"""Passes of the end-of-call sweep before it gives up (a process stuck in the
kernel); after the first few it sleeps a millisecond per pass."""

Children = Callable[..., list[int]]
"""children(pid, single=False): a process's children (see `children_reader`)."""


def sweep(
    me: int,
    spare: int | None,
    children: Children,
    reap: Callable[[], None],
    sessions: Collection[int] = (),
) -> None:
    """SIGKILL every process below `me` (but `spare`, when given, and the members
    of `sessions`) until none is left.

    They are found through the kernel's children lists, from `me` down: an
    orphan is re-parented to this subreaper, so nothing the tool started
    escapes the walk, and no /proc scan of the host is needed (with no pid
    namespace, isolation "none", kill(-1) would reach the host's processes
    of this uid: never used). Stopping before killing keeps a fork loop
    from outrunning the sweep.

    Args:
        me: The supervisor, a subreaper with one thread.
        spare: A child to leave alive (the interpreter), None: none.
        children: How to list a process's children (`children_reader`).
        reap: Reaps whatever died (the supervisor's own bookkeeping).
        sessions: Session ids (field 6 of /proc/PID/stat) whose members are
            spared: the session's background processes (_streams.py), each
            the leader of a session of its own. Code cannot join a session
            it did not create (setsid makes a new one, setpgid stays in its
            own), so no process of a call can hide in one.
    """
    for round_ in range(SWEEP_ROUNDS):
        pids = [pid for pid in below(me, spare, children, sessions) if alive(pid)]
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        reap()
        if round_ > 10:
            time.sleep(0.001)
    reap()


def below(
    me: int, spare: int | None, children: Children, sessions: Collection[int] = ()
) -> list[int]:
    """Every process below `me` (a process with one thread), but `spare` and
    the members of `sessions` (their children of other sessions are in)."""
    found: list[int] = []
    # The supervisor has one thread: its own children list is all of them.
    stack = children(me, single=True)
    while stack:
        pid = stack.pop()
        if pid != spare and not (sessions and session_of(pid) in sessions):
            found.append(pid)
        stack += children(pid)
    return found


def session_of(pid: int) -> int:
    """The session id of `pid` (field 6 of /proc/PID/stat); 0 when it is gone."""
    fields = _stat(pid)
    return int(fields[3]) if len(fields) > 3 else 0


def children_reader(me: int) -> Children:
    """How to list a process's children: the kernel's lists where it keeps them
    (/proc/PID/task/TID/children), else one walk of /proc (slower, same answer)."""
    if os.path.exists(f"/proc/{me}/task/{me}/children"):
        return _children
    return _children_by_scan


def _children(pid: int, single: bool = False) -> list[int]:
    """The children of `pid`, from each of its threads' lists (the one thread's
    when `single`). Read with bare system calls: this runs at every call's end."""
    try:
        tasks = [str(pid)] if single else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            found += [int(child) for child in text.split()]
    return found


def _children_by_scan(pid: int, single: bool = False) -> list[int]:
    parent = str(pid).encode()
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _stat(int(entry))[1:2] == [parent]
    ]


def read_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> bytes:
    """A small /proc file's content; b"" when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command name: [state, ppid, ...]; [] if gone."""
    stat = _read(f"/proc/{pid}/stat")
    # The command name may hold spaces and parentheses: split after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split() if stat else []


def alive(pid: int) -> bool:
    """Whether `pid` is a process not yet dead (zombies are)."""
    return _stat(pid)[:1] not in ([], [b"Z"], [b"X"])


def tree_usage(pid: int) -> tuple[float, int] | None:
    """(cpu_s, rss_bytes) of `pid` and its descendants (with the children they
    waited for); None when it is gone."""
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    stack, cpu, rss, seen = [pid], 0, 0, False
    while stack:
        current = stack.pop()
        fields = _stat(current)
        if len(fields) < 22:
            continue
        seen = True
        # After the name: state(0) ppid pgrp session ... utime(11) stime(12)
        # cutime(13) cstime(14) ... rss(21), in pages.
        cpu += sum(int(fields[i]) for i in (11, 12, 13, 14))
        rss += int(fields[21]) * page
        stack += _children(current)
    return (cpu / ticks, rss) if seen else None
