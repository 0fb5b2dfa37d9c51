"""`SandboxCgroup`: one sandbox's cgroup(s): joining, killing everything, freezing, OOM.

v1 and v2 differ here only in which file says a thing (`cgroup.freeze` or
`freezer.state`, `memory.events` or `memory.oom_control`), so each method
holds both spellings side by side rather than two classes repeating the steps.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from tooljaild.sandbox.cgroups import _fs as fs
from tooljaild.sandbox.cgroups._limits import CgroupLimits

log = logging.getLogger(__name__)

_FREEZE_WAIT_S = 0.5


class SpareKeeper(Protocol):
    """Where an emptied cgroup goes back for another sandbox: the `CgroupTracker`.

    A protocol, not the class, so that this module does not import the tracker's
    (which imports this one to make its cgroups).
    """

    def _give_back(
        self, limits: CgroupLimits | None, dirs: dict[str, Path], oom_base: int
    ) -> bool: ...


class SandboxCgroup:
    """The cgroup (v2) or cgroups (v1, one per hierarchy) of one sandbox.

    Attributes:
        version: 1 or 2.
        paths: The directories, `pids` first on v1. A process belongs to the
            sandbox once it has joined all of them.
    """

    def __init__(
        self,
        version: int,
        dirs: Mapping[str, Path],
        *,
        tracker: SpareKeeper | None = None,
        limits: CgroupLimits | None = None,
        oom_base: int = 0,
    ):
        self.version = version
        order = [fs.UNIFIED, *fs.V1_ROLES]
        self._dirs = {role: dirs[role] for role in order if role in dirs}
        self.paths: tuple[Path, ...] = tuple(self._dirs.values())
        # The usage files a session reads (and v1 resets) at each call's start
        # and end, joined once: a Path join per read cost as much as the read.
        unified, cpu, mem = (self._dirs.get(role) for role in (fs.UNIFIED, "cpu", "memory"))
        if version == 2:
            self._cpu_file = None if unified is None else f"{unified}/cpu.stat"
            self._peak_file = None if unified is None else f"{unified}/memory.peak"
        else:
            self._cpu_file = None if cpu is None else f"{cpu}/cpuacct.usage"
            self._peak_file = None if mem is None else f"{mem}/memory.max_usage_in_bytes"
        self._tracker = tracker
        self._limits = limits
        self._oom_base = oom_base
        # "active" -> "given back" (to the tracker, for another sandbox) or "removed".
        self._state = "active"

    def __repr__(self) -> str:
        return f"SandboxCgroup(version={self.version}, paths={self.paths!r})"

    def open_procs(self) -> list[int]:
        """Open each directory's `cgroup.procs` for writing, to hand to the sandbox.

        The sandbox's first process joins by writing `b"0"` (itself) to each
        descriptor in one `write` call each, before it forks. This works from
        inside a pid or user namespace: the kernel checks the permission against
        the opener (the daemon) at open time (Linux >= 5.16; older kernels check
        the writer). The descriptors are close-on-exec: pass them with `pass_fds`
        and close them in the daemon once the sandbox has started.

        Returns:
            The descriptors, in the order of `paths`.

        Raises:
            OSError: When one cannot be opened (none stays open then).
        """
        fds: list[int] = []
        try:
            for path in self.paths:
                fds.append(os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def procs(self) -> list[int]:
        """The ids of the processes in the sandbox's cgroups, sorted.

        Zombies are not listed (the kernel drops them from `cgroup.procs`).
        """
        found: set[int] = set()
        for path in self.paths:
            found.update(fs.read_pids(path))
        return sorted(found)

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the sandbox's cgroups until none is left.

        The same killing as `kill_and_remove`, without removing anything.

        Returns:
            True when the cgroups are empty.
        """
        if self._state == "given back":
            return True  # another sandbox's now: not ours to touch
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while True:
            pids = self.procs()
            if not pids:
                return True
            self._kill(pids, deadline)
            if time.monotonic() >= deadline:
                log.warning("cgroup %s still busy after %.1fs", self.paths[0], timeout_s)
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def release_if_empty(self) -> bool:
        """Give the cgroup back at once if no process is left in it; never waits.

        One read: every process of a sandbox joins the first of `paths` (pids
        on v1) before any other, so when that one is empty, all are. For the
        event loop's common case (a sandbox that ended cleanly); otherwise call
        `release` from a thread.

        Returns:
            True when the cgroup was given back (or removed): nothing left to do.
        """
        if self._state != "active":
            return True
        if self._tracker is None or fs.read_pids(self.paths[0]):
            return False
        if self._tracker._give_back(self._limits, dict(self._dirs), self._oom_count()):
            self._state = "given back"
            return True
        return False

    def release(self, timeout_s: float = 5.0) -> None:
        """The sandbox is over: kill what is left, then hand the cgroup back for reuse.

        The tracker keeps a bounded number of emptied cgroups, limits and all; the
        rest are removed. A cgroup is reused only once no process is left in it,
        and its OOM-kill count is remembered so that the next sandbox reports
        only its own. Calling it again, or after `kill_and_remove`, does nothing:
        once given back, this object no longer touches the cgroup.
        """
        if self._state != "active":
            return
        tracker = self._tracker
        if (
            tracker is not None
            and self.kill_all(timeout_s)
            and tracker._give_back(self._limits, dict(self._dirs), self._oom_count())
        ):
            self._state = "given back"
            return
        self.kill_and_remove(timeout_s)

    def kill_and_remove(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the sandbox's cgroups, then remove them.

        On v2 this writes `cgroup.kill` where the kernel has it (5.14+). Without
        it, the cgroup is frozen first (v2 `cgroup.freeze`, or the v1 freezer
        where mounted), so a fork bomb cannot add processes between reading
        `cgroup.procs` and killing them; then every listed process is SIGKILLed
        and the cgroup thawed, so the killed ones can die. Blocking: it polls
        until the cgroups are empty and removed.

        Args:
            timeout_s: How long to keep killing and removing before giving up.

        Returns:
            True when every directory is gone.
        """
        if self._state == "given back":
            return True  # another sandbox's now: not ours to touch
        deadline = time.monotonic() + timeout_s
        remaining = list(self.paths)
        pause = 0.001
        while True:
            pids = self.procs()
            alive = self._kill(pids, deadline) if pids else []
            if not alive:
                # Every listed process is gone or dying: the directories can go,
                # though the kernel may say EBUSY for a moment while they exit.
                for path in list(remaining):
                    try:
                        fs.rmdir(path)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        if exc.errno != errno.EBUSY:
                            log.warning("cannot remove cgroup %s: %s", path, exc)
                        continue
                    remaining.remove(path)
                if not remaining:
                    self._state = "removed"
                    return True
            if time.monotonic() >= deadline:
                log.warning("cgroup %s still busy after %.1fs", self.paths[0], timeout_s)
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _kill(self, pids: Iterable[int], deadline: float) -> list[int]:
        """SIGKILL `pids` (frozen if possible); return those that still exist."""
        unified = self._dirs.get(fs.UNIFIED)
        kill_file = None if unified is None else unified / "cgroup.kill"
        if kill_file is not None and kill_file.exists():
            with contextlib.suppress(OSError):
                fs.write(kill_file, "1")
            # cgroup.kill reaches every process, even those forked meanwhile; the
            # caller's loop only needs to know whether any still exist.
            return fs.sigkill(pids)
        thaw = self._freeze(deadline)
        try:
            # Read again: frozen, the list cannot grow any more.
            return fs.sigkill(set(pids) | set(self.procs()))
        finally:
            thaw()

    def _freeze(self, deadline: float) -> Callable[[], None]:
        """Freeze the sandbox if a freezer is there; return what thaws it."""
        if self.version == 2:
            path = self._dirs[fs.UNIFIED]
            state_file, frozen, thawed = path / "cgroup.freeze", "1", "0"
        elif "freezer" in self._dirs:
            path = self._dirs["freezer"]
            state_file, frozen, thawed = path / "freezer.state", "FROZEN", "THAWED"
        else:
            return _no_thaw
        if not state_file.exists():
            return _no_thaw
        try:
            fs.write(state_file, frozen)
        except OSError as exc:
            log.debug("cannot freeze %s: %s", path, exc)
            return _no_thaw
        # Freezing is asynchronous; wait a little for it, but kill anyway if a
        # process will not freeze (one stuck in the kernel, say).
        until = min(deadline, time.monotonic() + _FREEZE_WAIT_S)
        while time.monotonic() < until and not self._is_frozen(path):
            time.sleep(0.001)

        def thaw() -> None:
            with contextlib.suppress(OSError):
                fs.write(state_file, thawed)

        return thaw

    def _is_frozen(self, path: Path) -> bool:
        try:
            if self.version == 2:
                return fs.read_keyed(path / "cgroup.events").get("frozen") == 1
            return (path / "freezer.state").read_text().strip() == "FROZEN"
        except OSError:
            return True  # Gone: nothing left to wait for.

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this sandbox for lack of memory.

        v2: `oom_kill` in `memory.events`. v1: `oom_kill` in `memory.oom_control`
        (Linux 4.13+), else whether the limit was ever hit (`memory.failcnt`).
        Counted since this sandbox got the cgroup (a reused one starts from the
        count its last user left). False when there is no memory controller.
        """
        return self._oom_count() > self._oom_base

    def _oom_count(self) -> int:
        try:
            if self.version == 2:
                return fs.read_keyed(self._dirs[fs.UNIFIED] / "memory.events").get("oom_kill", 0)
            mem = self._dirs.get("memory")
            if mem is None:
                return 0
            control = fs.read_keyed(mem / "memory.oom_control")
            if "oom_kill" in control:
                return control["oom_kill"]
            return fs.read_int(mem / "memory.failcnt") or 0
        except OSError:
            return 0

    def memory_peak(self) -> int | None:
        """The most memory the sandbox used at once, in bytes; None if unknown.

        v2: `memory.peak` (Linux 5.19+). v1: `memory.max_usage_in_bytes`.
        """
        return None if self._peak_file is None else fs.read_int(self._peak_file)

    def cpu_s(self) -> float | None:
        """CPU seconds the sandbox's processes used since the cgroup was made; None if unknown.

        v2: `usage_usec` in `cpu.stat`. v1: `cpuacct.usage`, found where the
        cpuacct controller is mounted together with cpu (`cpu,cpuacct`).
        """
        if self._cpu_file is None:
            return None
        if self.version == 2:
            try:
                usec = fs.read_keyed(self._cpu_file).get("usage_usec")
            except OSError:
                return None
            return None if usec is None else usec / 1e6
        try:
            ns = int(fs.read_text(self._cpu_file).split()[0])
        except FileNotFoundError:
            # cpuacct mounted apart from cpu (`cpu` and `cpuacct`, not
            # `cpu,cpuacct`): the file is never there, so stop asking (a session
            # asked twice per call, each a failed open and an exception).
            self._cpu_file = None
            return None
        except (OSError, ValueError, IndexError):
            return None
        return ns / 1e9

    def reset_memory_peak(self) -> bool:
        """Start `memory_peak` afresh; False where it cannot be.

        v1 resets `memory.max_usage_in_bytes` on a write. v2's `memory.peak`
        resets only for the file descriptor written to (Linux 6.12+), so a
        reused cgroup's peak there is an earlier sandbox's: False.
        """
        if self.version == 2 or self._peak_file is None:
            return False
        try:
            fs.write(self._peak_file, "0")
        except OSError:
            return False
        return True


def _no_thaw() -> None:
    pass
