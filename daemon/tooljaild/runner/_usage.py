"""What one call of a session used: measured by the supervisor, from outside.

`CallUsage` counts a call's CPU and memory peak from the interpreter's /proc
files (`ProcView`) and what the supervisor reaped during the call: the
"usage" of the call's result frame, as a fresh worker's rusage
(`_runner._usage`) is for a call of its own. Tool code in the interpreter
cannot change these figures.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import os
import resource
from typing import Any


class CallUsage:
    """What one call in the interpreter used, from its start to its end: the
    result frame's "usage", as a fresh worker's rusage (`_runner._usage`) is.

    Read by the supervisor, never by the interpreter: tool code can no more
    change these figures than the daemon's cgroup (which, where the sandbox
    has one, the daemon prefers: it also counts processes nobody waited for).

    CPU: the interpreter's and its waited-for children's (/proc/PID/stat's
    utime, stime, cutime, cstime; clock ticks, 10 ms on most kernels), plus
    what the supervisor reaped during the call (orphans the sweep killed; an
    interpreter that died, whose whole life is then counted, less its CPU at
    the call's start). Children the interpreter reaps only at the next call's
    start (those the sweep killed) count there.

    Memory: the interpreter's resident peak (VmHWM) during the call: it is
    reset to the current resident size at the call's start (/proc/PID/clear_refs,
    "5", Linux 4.0+). Where it cannot be, the figure is the peak since the
    interpreter started (the session's start or its last reset). Processes
    the interpreter starts are not in it (only a cgroup sees them all). A dead
    interpreter's is wait4's ru_maxrss: its own peak since the call's start,
    or more when a thread of it or a child it waited for peaked higher before.
    """

    def __init__(self, interpreter: ProcView) -> None:
        self.interpreter = interpreter
        self.own = interpreter.cpu_s() or 0.0
        self.children = cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
        interpreter.reset_peak()

    def end(
        self, interpreter: int, status: int | None, reaped_last: tuple[int, Any] | None
    ) -> dict[str, float]:
        """The usage so far.

        Args:
            interpreter: The supervisor's interpreter now (a new one after a restart).
            status: Its wait status once reaped; None while it lives.
            reaped_last: (pid, rusage from wait4) of the last interpreter reaped.
        """
        reaped = cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - self.children
        pid = self.interpreter.pid
        alive = interpreter == pid and status is None
        own = self.interpreter.cpu_s() if alive else None
        if own is not None:
            cpu, peak = own - self.own + reaped, self.interpreter.peak_rss()
        else:  # reaped: its whole life is in `reaped`, less what it had used before
            cpu = reaped - self.own
            last = reaped_last
            peak = last[1].ru_maxrss * 1024 if last and last[0] == pid else 0
        return {"cpu_s": max(cpu, 0.0), "memory_peak_bytes": peak}


class ProcView:
    """The interpreter's /proc files that `CallUsage` reads, each opened once
    (on first use: right after its fork the interpreter is not yet dumpable,
    and its files are not the session uid's) and then read with pread, which
    costs half of an open and a read at every call. A descriptor stays with
    its process: a reused pid never answers for a dead interpreter."""

    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
    """Seconds in one clock tick, the unit of /proc/PID/stat's times."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fds: dict[str, int] = {}

    def cpu_s(self) -> float | None:
        """CPU seconds it and the children it waited for used so far; None when gone."""
        stat = self._read("stat")
        # After the command name (which may hold spaces and parentheses), from
        # field 3 (state) on: utime, stime, cutime and cstime are fields 14-17.
        ticks = stat[stat.rfind(b")") + 2 :].split()[11:15]
        if len(ticks) < 4:
            return None  # gone (nothing read)
        return sum(int(tick) for tick in ticks) * self._TICK_S

    def peak_rss(self) -> int:
        """Its resident peak in bytes (VmHWM); 0 when it is gone."""
        for line in self._read("status").splitlines():
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024  # in kB
        return 0

    def reset_peak(self) -> bool:
        """Start its VmHWM afresh (from its current resident size); False if it cannot be."""
        fd = self._fd("clear_refs", os.O_WRONLY)
        try:
            return fd is not None and os.write(fd, b"5") == 1
        except OSError:
            return False

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _read(self, name: str) -> bytes:
        fd = self._fd(name, os.O_RDONLY)
        try:
            return b"" if fd is None else os.pread(fd, 16384, 0)
        except OSError:
            return b""

    def _fd(self, name: str, flags: int) -> int | None:
        fd = self._fds.get(name)
        if fd is None:
            try:
                fd = os.open(f"/proc/{self.pid}/{name}", flags | os.O_CLOEXEC)
            except OSError:
                return None
            self._fds[name] = fd
        return fd


def own_usage() -> Any:
    return resource.getrusage(resource.RUSAGE_SELF)


def cpu_s(usage: Any) -> float:
    """User and system CPU seconds of a getrusage/wait4 result."""
    return float(usage.ru_utime + usage.ru_stime)
