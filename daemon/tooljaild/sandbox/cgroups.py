"""Per-sandbox cgroups: find and kill every process a tool started, and bound them.

A process cannot leave its cgroup without write access to the cgroup tree, so a
sandbox's cgroup holds every descendant, however it forked, setsid'd or
daemonized. The same cgroup bounds the whole tree at once: memory, number of
processes and CPU time are limits on the sandbox, not on each process (an rlimit
is per process, so a tool could fork its way around it).

This works where the daemon may create cgroups: as root, or under systemd with
`Delegate=yes`.

- cgroup v2 (a unified tree at the root): sandboxes live in the daemon's own
  subtree, `<own>/<name>/<sandbox id>`. Controllers can only be enabled for
  children of a cgroup that holds no processes itself ("no internal processes"),
  so when the daemon's cgroup still holds processes, they (the daemon) are moved
  into a leaf `<own>/daemon` first. When any step of that fails the tracker
  still tracks and kills, without limits (`controllers` is then empty), and says
  why in a WARNING.
- cgroup v1 and hybrid hosts: one directory per hierarchy,
  `<mount>/<own path in that hierarchy>/<name>/<sandbox id>`: `pids` (required,
  it tracks), and `memory`, `cpu` and `freezer` where they are mounted and
  writable.

A sandbox joins its cgroup through file descriptors the daemon opened: see
`SandboxCgroup.open_procs`. Every method here blocks on the cgroup filesystem
(and `kill_and_remove` polls): the daemon calls them from a thread, never from
the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")

LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
"""The controllers a sandbox can be limited by, in the order they are enabled."""

_DAEMON_LEAF = "daemon"
"""On v2, the leaf the daemon's own processes move into (see the module docstring)."""

_UNIFIED = "unified"
"""The key of the single v2 directory in the per-role maps below."""

_V1_ROLES = {
    # role: a file every cgroup of that hierarchy has when the role is usable.
    "pids": "pids.max",
    "memory": "memory.limit_in_bytes",
    "cpu": "cpu.cfs_quota_us",
    "freezer": "freezer.state",
}

_CPU_PERIOD_US = 100_000
_CPU_MIN_QUOTA_US = 1_000  # The kernel refuses a smaller quota.
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_FREEZE_WAIT_S = 0.5


@dataclass(frozen=True)
class CgroupLimits:
    """Limits on a whole sandbox (all its processes together). None means no limit."""

    memory_bytes: int | None = None
    """Memory of the sandbox, swap excluded: v2 `memory.max` (and `memory.swap.max`
    = 0 where present); v1 `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes`
    to the same value where present, so swap does not extend it)."""
    pids: int | None = None
    """How many processes and threads the sandbox may hold at once (`pids.max`)."""
    cpu_cores: float | None = None
    """CPU time per wall-clock time, in cores (0.5 = half of one core): v2 `cpu.max`,
    v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`."""

    def __post_init__(self) -> None:
        for field, value in (
            ("memory_bytes", self.memory_bytes),
            ("pids", self.pids),
            ("cpu_cores", self.cpu_cores),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"CgroupLimits.{field} must be positive or None, not {value!r}")


def cgroup_name_for(state_dir: Path) -> str:
    """The cgroup directory name of the daemon that owns `state_dir`.

    One state directory has one daemon at a time, so a daemon starting on it may
    sweep whatever a killed predecessor left under this name, and never touches
    another daemon's sandboxes.
    """
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"tooljail-{digest}"


class CgroupTracker:
    """Creates, limits, empties and removes one cgroup per sandbox.

    Build it with `detect`. Its methods block on the cgroup filesystem: call them
    from a thread.

    Attributes:
        version: 1 or 2, the cgroup version in use.
        controllers: Those of "memory", "pids" and "cpu" that `create` can set
            limits with. Empty when the host only lets the daemon track and kill.
    """

    def __init__(
        self,
        version: int,
        bases: Mapping[str, Path],
        controllers: frozenset[str],
        *,
        max_spares: int = 16,
    ):
        self.version = version
        self.controllers = controllers
        # role ("unified" on v2; "pids", "memory", "cpu", "freezer" on v1) -> base dir.
        self._bases = dict(bases)
        # Emptied cgroups kept for reuse, by the limits they already carry, each
        # with the OOM-kill count it had when it was given back.
        self._spares: dict[CgroupLimits | None, list[tuple[dict[str, Path], int]]] = {}
        self._spare_count = 0
        self.max_spares = max_spares
        """How many emptied cgroups are kept for reuse (the rest are removed)."""
        self._lock = threading.Lock()

    @property
    def bases(self) -> tuple[Path, ...]:
        """The directories sandbox cgroups are made in (one on v2, one per hierarchy on v1)."""
        return tuple(self._bases.values())

    def __repr__(self) -> str:
        return (
            f"CgroupTracker(version={self.version}, bases={self.bases!r}, "
            f"controllers={sorted(self.controllers)!r})"
        )

    @classmethod
    def detect(
        cls,
        name: str = "tooljail",
        root: Path = CGROUP_ROOT,
        proc_self_cgroup: Path = PROC_SELF_CGROUP,
    ) -> CgroupTracker | None:
        """Find a cgroup tree this process may create children in, and prepare it.

        On v2 this may move the calling process (and every other process of its
        cgroup) into the leaf `<own>/daemon`, and enables the memory, pids and cpu
        controllers for `<own>/<name>`: see the module docstring. It creates and
        removes a probe directory to prove the tree is writable.

        Args:
            name: The directory, under the daemon's own cgroup, that holds the
                sandboxes. Two daemons in the same cgroup need different names,
                since `sweep_stale` removes whatever it finds there.
            root: Where the cgroup filesystems are mounted (a fake tree in tests).
            proc_self_cgroup: This process's cgroup membership file.

        Returns:
            A tracker, or None when the host gives this process no writable
            cgroup tree (the runner's subreaper sweep is then the only guard).

        Raises:
            ValueError: When `name` is not a plain directory name.
        """
        _check_name("cgroup name", name)
        if name == _DAEMON_LEAF:
            raise ValueError(f"cgroup name {name!r} is reserved for the daemon's own leaf")
        try:
            lines = proc_self_cgroup.read_text().splitlines()
        except OSError as exc:
            log.debug("cannot read %s: %s", proc_self_cgroup, exc)
            return None
        memberships = _parse_proc_cgroup(lines)
        if (root / "cgroup.controllers").exists():
            own = memberships.get(_UNIFIED)
            if own is None:
                log.debug("no cgroup v2 line in %s", proc_self_cgroup)
                return None
            return cls._detect_v2(root, own, name)
        return cls._detect_v1(root, memberships, name)

    @classmethod
    def _detect_v2(cls, root: Path, own: str, name: str) -> CgroupTracker | None:
        own_dir = _own_dir(root, own)
        # A second detect() in a daemon that an earlier one moved into its leaf
        # must reuse the tree above, not nest another one inside the leaf.
        if own_dir.name == _DAEMON_LEAF and (own_dir.parent / name).is_dir():
            own_dir = own_dir.parent
        base = own_dir / name
        try:
            controllers = _enable_v2(own_dir, base)
        except OSError as exc:
            log.warning(
                "cgroup v2: cannot enable controllers for %s (%s); sandboxes are tracked "
                "and killed but get no cgroup limits",
                base,
                exc,
            )
            controllers = frozenset()
        if not _probe(base, None):
            return None
        if not controllers:
            log.warning(
                "cgroup v2: no memory, pids or cpu controller for %s; sandboxes are tracked "
                "and killed but get no cgroup limits",
                base,
            )
        return cls(2, {_UNIFIED: base}, controllers)

    @classmethod
    def _detect_v1(
        cls, root: Path, memberships: Mapping[str, str], name: str
    ) -> CgroupTracker | None:
        bases: dict[str, Path] = {}
        for role, marker in _V1_ROLES.items():
            own = memberships.get(role)
            mount = _v1_mount(root, memberships, role)
            if own is None or mount is None:
                continue
            base = _own_dir(mount, own) / name
            if _probe(base, marker):
                bases[role] = base
            elif role == "pids":
                # Without the pids hierarchy nothing tracks the tree; do not
                # leave half a setup behind in the others.
                return None
        if "pids" not in bases:
            return None
        controllers = frozenset(role for role in LIMIT_CONTROLLERS if role in bases)
        return cls(1, bases, controllers)

    def take_spare(self, limits: CgroupLimits | None = None) -> SandboxCgroup | None:
        """A cgroup an earlier sandbox emptied and gave back, already limited so; or None.

        Making and removing cgroups is most of what they cost (on v1, four
        directories each way): the pool reuses them instead. Touches no file, so
        it may be called from the event loop.
        """
        with self._lock:
            spares = self._spares.get(limits)
            if not spares:
                return None
            dirs, oom_base = spares.pop()
            self._spare_count -= 1
        return SandboxCgroup(self.version, dirs, tracker=self, limits=limits, oom_base=oom_base)

    def _give_back(self, limits: CgroupLimits | None, dirs: dict[str, Path], oom_base: int) -> bool:
        with self._lock:
            if self._spare_count >= self.max_spares:
                return False
            self._spares.setdefault(limits, []).append((dirs, oom_base))
            self._spare_count += 1
            return True

    def remove_spares(self) -> None:
        """Remove the cgroups kept for reuse (at shutdown)."""
        with self._lock:
            spares = [dirs for kept in self._spares.values() for dirs, _ in kept]
            self._spares.clear()
            self._spare_count = 0
        for dirs in spares:
            SandboxCgroup(self.version, dirs).kill_and_remove()

    def close(self) -> None:
        """At shutdown: remove the spare cgroups, then the directories that held them.

        A directory that still holds a sandbox's cgroup (one that could not be
        emptied) stays, for the next daemon's `sweep_stale`; without this, every
        daemon that ever ran with a state directory of its own would leave an
        empty one behind in each hierarchy.
        """
        self.remove_spares()
        for base in self.bases:
            with contextlib.suppress(OSError):  # not empty, or already gone
                base.rmdir()

    def create(self, sandbox_id: str, limits: CgroupLimits | None = None) -> SandboxCgroup:
        """Make (or reuse) the cgroup of one sandbox and set its limits.

        A limit whose controller is not in `controllers` is skipped with a WARNING:
        the host does not allow it, and the sandbox's rlimits still apply.

        Args:
            sandbox_id: The sandbox's name, `[A-Za-z0-9_.-]{1,64}`.
            limits: What to bound the sandbox by; None for no limits.

        Returns:
            The sandbox's cgroup. Nothing has joined it yet: see `open_procs`.

        Raises:
            ValueError: When `sandbox_id` is not a plain directory name.
            OSError: When a directory or a limit cannot be written (anything made
                is removed again).
        """
        _check_name("sandbox id", sandbox_id)
        dirs = {role: base / sandbox_id for role, base in self._bases.items()}
        made: list[Path] = []
        try:
            for path in dirs.values():
                if not path.is_dir():
                    path.mkdir()
                    made.append(path)
            if limits is not None:
                self._apply(dirs, limits)
        except OSError:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    _rmdir(path)
            raise
        return SandboxCgroup(self.version, dirs, tracker=self, limits=limits)

    def _apply(self, dirs: Mapping[str, Path], limits: CgroupLimits) -> None:
        wanted = {
            "memory": limits.memory_bytes,
            "pids": limits.pids,
            "cpu": limits.cpu_cores,
        }
        missing = [c for c, v in wanted.items() if v is not None and c not in self.controllers]
        if missing:
            log.warning("cgroup limits on %s not available here; skipped", ", ".join(missing))
        mem_dir: Path | None
        cpu_dir: Path | None
        if self.version == 2:
            mem_dir = pids_dir = cpu_dir = dirs[_UNIFIED]
        else:
            mem_dir, pids_dir, cpu_dir = dirs.get("memory"), dirs["pids"], dirs.get("cpu")
        if limits.memory_bytes is not None and mem_dir is not None and "memory" in self.controllers:
            value = str(limits.memory_bytes)
            if self.version == 2:
                _write(mem_dir / "memory.max", value)
                # Without this, swap lets the sandbox use far more than memory.max.
                _write_if_present(mem_dir / "memory.swap.max", "0")
            else:
                # memsw must stay >= the memory limit, so the memory limit goes first.
                _write(mem_dir / "memory.limit_in_bytes", value)
                _write_if_present(mem_dir / "memory.memsw.limit_in_bytes", value)
        if limits.pids is not None and "pids" in self.controllers:
            _write(pids_dir / "pids.max", str(limits.pids))
        if limits.cpu_cores is not None and cpu_dir is not None and "cpu" in self.controllers:
            if self.version == 2:
                quota = _cpu_quota(limits.cpu_cores, _CPU_PERIOD_US)
                _write(cpu_dir / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
            else:
                period = _read_int(cpu_dir / "cpu.cfs_period_us") or _CPU_PERIOD_US
                _write(cpu_dir / "cpu.cfs_quota_us", str(_cpu_quota(limits.cpu_cores, period)))

    def sweep_stale(self, keep: Collection[str] = ()) -> int:
        """Kill and remove sandbox cgroups a dead daemon left behind.

        Call it once at start-up, before creating sandboxes: it removes every
        cgroup under this tracker's bases whose name is not in `keep`.

        Args:
            keep: Sandbox ids to leave alone (sandboxes this daemon still runs).

        Returns:
            How many stale sandbox cgroups were removed.
        """
        names: set[str] = set()
        for base in self._bases.values():
            with contextlib.suppress(OSError):
                names.update(entry.name for entry in base.iterdir() if entry.is_dir())
        removed = 0
        for sandbox_id in sorted(names):
            if sandbox_id in keep or not _is_name(sandbox_id):
                continue
            dirs = {
                role: base / sandbox_id
                for role, base in self._bases.items()
                if (base / sandbox_id).is_dir()
            }
            stale = SandboxCgroup(self.version, dirs)
            if stale.procs():
                log.warning("killing processes left in stale cgroup %s", sandbox_id)
            if stale.kill_and_remove():
                removed += 1
        return removed


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
        tracker: CgroupTracker | None = None,
        limits: CgroupLimits | None = None,
        oom_base: int = 0,
    ):
        self.version = version
        order = [_UNIFIED, *_V1_ROLES]
        self._dirs = {role: dirs[role] for role in order if role in dirs}
        self.paths: tuple[Path, ...] = tuple(self._dirs.values())
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
            found.update(_read_pids(path))
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
        if self._tracker is None or _read_pids(self.paths[0]):
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
                        _rmdir(path)
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
        unified = self._dirs.get(_UNIFIED)
        kill_file = None if unified is None else unified / "cgroup.kill"
        if kill_file is not None and kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
            # cgroup.kill reaches every process, even those forked meanwhile; the
            # caller's loop only needs to know whether any still exist.
            return _sigkill(pids)
        thaw = self._freeze(deadline)
        try:
            # Read again: frozen, the list cannot grow any more.
            return _sigkill(set(pids) | set(self.procs()))
        finally:
            thaw()

    def _freeze(self, deadline: float) -> Callable[[], None]:
        """Freeze the sandbox if a freezer is there; return what thaws it."""
        if self.version == 2:
            path = self._dirs[_UNIFIED]
            state_file, frozen, thawed = path / "cgroup.freeze", "1", "0"
        elif "freezer" in self._dirs:
            path = self._dirs["freezer"]
            state_file, frozen, thawed = path / "freezer.state", "FROZEN", "THAWED"
        else:
            return _no_thaw
        if not state_file.exists():
            return _no_thaw
        try:
            _write(state_file, frozen)
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
                _write(state_file, thawed)

        return thaw

    def _is_frozen(self, path: Path) -> bool:
        try:
            if self.version == 2:
                return _read_keyed(path / "cgroup.events").get("frozen") == 1
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
                return _read_keyed(self._dirs[_UNIFIED] / "memory.events").get("oom_kill", 0)
            mem = self._dirs.get("memory")
            if mem is None:
                return 0
            control = _read_keyed(mem / "memory.oom_control")
            if "oom_kill" in control:
                return control["oom_kill"]
            return _read_int(mem / "memory.failcnt") or 0
        except OSError:
            return 0

    def memory_peak(self) -> int | None:
        """The most memory the sandbox used at once, in bytes; None if unknown.

        v2: `memory.peak` (Linux 5.19+). v1: `memory.max_usage_in_bytes`.
        """
        if self.version == 2:
            return _read_int(self._dirs[_UNIFIED] / "memory.peak")
        mem = self._dirs.get("memory")
        return None if mem is None else _read_int(mem / "memory.max_usage_in_bytes")


def _no_thaw() -> None:
    pass


def _enable_v2(own_dir: Path, base: Path) -> frozenset[str]:
    """Enable the limit controllers for `base`'s children; return those enabled.

    Raises:
        OSError: When the daemon's processes cannot be moved to their leaf, or
            `base` cannot be made.
    """
    available = [c for c in LIMIT_CONTROLLERS if c in _read_words(own_dir / "cgroup.controllers")]
    if not available:
        base.mkdir(exist_ok=True)
        return frozenset()
    enabled_above = {w.lstrip("+") for w in _read_words(own_dir / "cgroup.subtree_control")}
    if not set(available) <= enabled_above:
        # The real root cgroup has no cgroup.type and is exempt from the rule; a
        # cgroup namespace's root is not, and has one.
        must_empty = (own_dir / "cgroup.type").exists()
        leaf = own_dir / _DAEMON_LEAF
        for attempt in range(3):
            if must_empty and _read_pids(own_dir):
                leaf.mkdir(exist_ok=True)
                _move_procs(own_dir, leaf)
            try:
                available = _enable(own_dir, available)
                break
            except OSError as exc:
                # EBUSY: a process (a child forked meanwhile) is still in own_dir.
                if exc.errno != errno.EBUSY or attempt == 2:
                    raise
    base.mkdir(exist_ok=True)
    return frozenset(_enable(base, available))


def _enable(path: Path, controllers: list[str]) -> list[str]:
    """Write `+c` for each controller to `path`'s subtree_control; return those enabled.

    All at once first; if the kernel refuses that, one by one, so one controller
    it will not enable (cpu with realtime threads, say) does not cost the others.

    Raises:
        OSError: When none can be enabled (EBUSY is raised as is, for a retry).
    """
    control = path / "cgroup.subtree_control"
    try:
        _write(control, " ".join(f"+{c}" for c in controllers))
        return controllers
    except OSError as exc:
        if exc.errno == errno.EBUSY or len(controllers) == 1:
            raise
        first_error = exc
    done: list[str] = []
    for c in controllers:
        try:
            _write(control, f"+{c}")
        except OSError as exc:
            log.warning("cgroup v2: cannot enable %s in %s: %s", c, path, exc)
        else:
            done.append(c)
    if not done:
        raise first_error
    return done


def _move_procs(src: Path, dst: Path) -> None:
    """Move every process listed in `src` into `dst`, one pid per write."""
    # One open file and one write per pid: the kernel takes one pid per write.
    with open(dst / "cgroup.procs", "wb", buffering=0) as f:
        for pid in _read_pids(src):
            with contextlib.suppress(ProcessLookupError):  # It exited meanwhile.
                f.write(b"%d\n" % pid)


def _probe(base: Path, marker: str | None) -> bool:
    """Make `base` and prove children can be made in it (with `marker`, if given)."""
    probe = base / f"probe-{os.getpid()}"
    try:
        base.mkdir(exist_ok=True)
        probe.mkdir(exist_ok=True)
        try:
            usable = marker is None or (probe / marker).exists()
        finally:
            _rmdir(probe)
    except OSError as exc:
        log.debug("cgroup tree %s not usable: %s", base, exc)
        return False
    if not usable:
        log.debug("cgroup tree %s lacks %s", base, marker)
    return usable


def _parse_proc_cgroup(lines: Iterable[str]) -> dict[str, str]:
    """Map each v1 controller (and "unified" for the v2 line) to this process's path.

    A combined v1 hierarchy such as `cpu,cpuacct` is also listed under that
    combined name, which is how its mount point is often called.
    """
    found: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, own = parts
        if hier == "0" and controllers == "":
            found[_UNIFIED] = own
            continue
        names = [c for c in controllers.split(",") if c and not c.startswith("name=")]
        for c in names:
            found[c] = own
        if len(names) > 1:
            found[",".join(names)] = own
    return found


def _v1_mount(root: Path, memberships: Mapping[str, str], role: str) -> Path | None:
    """The mount point of the v1 hierarchy that holds `role`, or None."""
    candidates = [root / role]
    candidates += [root / key for key in memberships if "," in key and role in key.split(",")]
    for mount in candidates:
        if (mount / "cgroup.procs").exists():
            return mount
    return None


def _own_dir(mount: Path, own: str) -> Path:
    """This process's cgroup directory under `mount`.

    Without a cgroup namespace, a container may see its host path in
    /proc/self/cgroup while its own cgroup is mounted at the root: use the
    mount then.
    """
    path = mount / own.lstrip("/")
    if path.is_dir():
        return path
    log.debug("cgroup %s not found under %s; using the mount itself", own, mount)
    return mount


def _check_name(kind: str, value: str) -> None:
    if not _is_name(value):
        raise ValueError(f"{kind} must match [A-Za-z0-9_.-]{{1,64}} and not be . or ..: {value!r}")


def _is_name(value: str) -> bool:
    return bool(_NAME_RE.fullmatch(value)) and value not in {".", ".."}


def _cpu_quota(cores: float, period_us: int) -> int:
    return max(_CPU_MIN_QUOTA_US, round(cores * period_us))


def _sigkill(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid; return those that still existed."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def _rmdir(path: Path) -> None:
    """Remove a cgroup directory (tests replace this to fake the kernel's rmdir)."""
    path.rmdir()


def _write(path: Path, text: str) -> None:
    """Write one value to a cgroup file in a single write call."""
    with open(path, "w") as f:
        f.write(text)


def _write_if_present(path: Path, text: str) -> None:
    # Optional files (swap accounting) exist only with some kernel configs.
    if path.exists():
        _write(path, text)


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _read_text(path: Path) -> str:
    """A cgroup file's text: os-level calls, as the daemon's loop reads a few per sandbox.

    Raises:
        OSError: When the file cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _read_int(path: Path) -> int | None:
    try:
        return int(_read_text(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path) -> dict[str, int]:
    """Parse a flat keyed file (`key value` per line), such as memory.events.

    Raises:
        OSError: When the file cannot be read.
    """
    values: dict[str, int] = {}
    for line in _read_text(path).splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            values[key] = int(value)
    return values


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in _read_text(path / "cgroup.procs").split()]
    except OSError:
        return []
