"""Per-sandbox cgroups, used to find and kill every process a tool started.

A process cannot leave its cgroup without write access to the cgroup tree, so a
sandbox's cgroup holds every descendant, however it forked, setsid'd or
daemonized. This works where the daemon may create cgroups: as root, or under
systemd with `Delegate=yes`. On cgroup v2 it uses the daemon's own subtree; on
v1 (and hybrid) hosts the `pids` hierarchy. Resource limits through cgroups
come with the isolation work; this module only tracks and kills.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupTracker:
    """Creates, empties and removes one cgroup per sandbox under `base`."""

    base: Path
    version: int

    @classmethod
    def detect(cls, name: str = "tooljail") -> CgroupTracker | None:
        """Find a cgroup tree this process may create children in.

        Returns:
            A tracker, or None when the host gives this process no writable
            cgroup tree (the runner's subreaper sweep is then the only guard).
        """
        for version, mount, own in _candidates():
            base = mount / own.lstrip("/") / name
            try:
                base.mkdir(exist_ok=True)
                probe = base / f"probe-{os.getpid()}"
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError as exc:
                log.debug("cgroup tree %s not usable: %s", base, exc)
                continue
            return cls(base=base, version=version)
        return None

    def create(self, sandbox_id: str) -> Path:
        """Make the cgroup for one sandbox; the runner joins it itself."""
        path = self.base / sandbox_id
        path.mkdir(exist_ok=True)
        return path

    def kill_and_remove(self, path: Path, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup, then remove it.

        Blocking (it polls the cgroup until it is empty): call it from a thread.

        Args:
            path: A cgroup made by `create`.
            timeout_s: How long to keep killing before giving up.

        Returns:
            True when the cgroup was emptied and removed.
        """
        kill_file = path / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = _read_pids(path)
            if not pids:
                with contextlib.suppress(FileNotFoundError):
                    path.rmdir()
                    return True
                if not path.exists():
                    return True
            elif kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        log.warning("cgroup %s still busy after %.1fs", path, timeout_s)
        return False


def _read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []
    except OSError:
        return []


def _candidates() -> list[tuple[int, Path, str]]:
    """(version, mount point, this process's path in it), best first."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found: list[tuple[int, Path, str]] = []
    for line in lines:
        hier, controllers, own = line.split(":", 2)
        if hier == "0" and controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            found.insert(0, (2, CGROUP_ROOT, own))
        elif "pids" in controllers.split(","):
            found.append((1, CGROUP_ROOT / "pids", own))
    return found
