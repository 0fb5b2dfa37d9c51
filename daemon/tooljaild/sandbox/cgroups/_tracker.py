"""`CgroupTracker`: one cgroup per sandbox, made, limited, reused and swept."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Collection, Mapping
from pathlib import Path

from tooljaild.sandbox.cgroups import _fs as fs
from tooljaild.sandbox.cgroups._detect import CGROUP_ROOT, PROC_SELF_CGROUP, find_tree
from tooljaild.sandbox.cgroups._limits import CgroupLimits, apply_limits
from tooljaild.sandbox.cgroups._sandbox import SandboxCgroup

log = logging.getLogger(__name__)


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
        """A tracker of the cgroup tree `find_tree` finds and prepares; None without one.

        Its arguments, what it does to this process (on v2 it may move it into a
        leaf) and what it raises are `find_tree`'s. None means the host gives
        this process no writable cgroup tree: the runner's subreaper sweep is
        then the only guard.
        """
        tree = find_tree(name, root, proc_self_cgroup)
        return None if tree is None else cls(tree.version, tree.bases, tree.controllers)

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
        fs.check_name("sandbox id", sandbox_id)
        dirs = {role: base / sandbox_id for role, base in self._bases.items()}
        made: list[Path] = []
        try:
            for path in dirs.values():
                if not path.is_dir():
                    path.mkdir()
                    made.append(path)
            if limits is not None:
                apply_limits(self.version, dirs, self.controllers, limits)
        except OSError:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    fs.rmdir(path)
            raise
        return SandboxCgroup(self.version, dirs, tracker=self, limits=limits)

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
            if sandbox_id in keep or not fs.is_name(sandbox_id):
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
