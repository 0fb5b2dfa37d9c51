"""A session call at its deadline: what the supervisor does at once.

Only the interpreter needs a grace (its KeyboardInterrupt may unwind ``with``
blocks and ``finally`` clauses, and the session keeps its variables). So at
the deadline (the daemon's "interrupt" op, see _session.py):

1. the interpreter is stopped (SIGSTOP: it starts nothing more meanwhile);
2. every process below it (its descendants: what the call started and did
   not orphan) is stopped, walk after walk until no new one appears, then
   killed (SIGKILL) — at once, not after the grace. Processes that are not
   the interpreter's descendants are spared: the session's background
   processes (children of the supervisor, in sessions of their own) and
   what earlier calls orphaned (re-parented to the supervisor);
3. an interpreter whose SIGINT is ignored or blocked (``SigIgn`` or
   ``SigBlk`` in /proc/PID/status: it would never see the KeyboardInterrupt)
   is reset at once, with no grace (`deadline` says so; the supervisor
   restarts it); any other gets SIGINT, then SIGCONT, and the daemon's grace
   (`interrupt_grace_s`) starts.

Within the grace only the interpreter runs: Python code of the call (a
``finally``, an ``except KeyboardInterrupt``, a handler of its own for SIGINT
that does not raise) may still act, in the interpreter itself, until the
grace ends; then it is reset. No process the call started runs on.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

WALKS = 1000
"""Walks of the interpreter's tree at most before its processes are killed
(each walk stops what the last one missed: a fork in flight)."""

_SIGINT_BIT = 1 << (int(signal.SIGINT) - 1)


def deadline(interpreter: int, children: Callable[..., list[int]]) -> bool:
    """Kill every process below `interpreter` now; then interrupt it if it can
    take the interrupt.

    Args:
        interpreter: The interpreter's pid (a child of the caller, not reaped).
        children: How to list a process's children (`_procs.children_reader`).

    Returns:
        True when the interpreter was sent SIGINT (it gets its grace); False
        when its SIGINT is ignored or blocked: the caller resets it now.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(interpreter, signal.SIGSTOP)
    try:
        kill_below(interpreter, children)
        if sigint_refused(interpreter):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(interpreter, signal.SIGINT)
        return True
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(interpreter, signal.SIGCONT)


def kill_below(root: int, children: Callable[..., list[int]]) -> list[int]:
    """Stop, then SIGKILL, every descendant of `root` (not `root`); what was killed."""
    stopped: list[int] = []
    seen: set[int] = set()
    for _ in range(WALKS):
        new = [pid for pid in descendants(root, children) if pid not in seen]
        if not new:
            break
        for pid in new:
            seen.add(pid)
            stopped.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def descendants(root: int, children: Callable[..., list[int]]) -> list[int]:
    """Every process below `root` (the children lists of all its threads, down)."""
    found: list[int] = []
    stack = children(root)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children(pid)
    return found


def sigint_refused(pid: int) -> bool:
    """Whether `pid` ignores or blocks SIGINT (its /proc status); False when unknown."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith((b"SigIgn:", b"SigBlk:")):
            with contextlib.suppress(ValueError):
                if int(line.split(b":", 1)[1].strip(), 16) & _SIGINT_BIT:
                    return True
    return False
