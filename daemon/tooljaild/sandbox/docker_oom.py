"""Whether a container ran out of memory, read from its memory cgroup on this host.

The kernel counts OOM kills per cgroup (v1: `memory.oom_control`, v2:
`memory.events`); while a container's cgroup exists that count is the truth,
before the engine's own record (`State.OOMKilled`) is set.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["memory_cgroup", "oom_count"]


def memory_cgroup(pid: int) -> tuple[int, Path] | None:
    """(cgroup version, directory) of the process's memory cgroup, seen from this host."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified: str | None = None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            unified = path
        elif "memory" in controllers.split(","):
            directory = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            return (1, directory) if directory.is_dir() else None
    if unified is not None:
        directory = Path("/sys/fs/cgroup") / unified.lstrip("/")
        if (directory / "memory.events").exists():
            return 2, directory
    return None


def oom_count(version: int, directory: Path) -> int | None:
    """OOM kills in the cgroup so far; None when it is gone or says nothing."""
    name = "memory.events" if version == 2 else "memory.oom_control"
    try:
        text = (directory / name).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return None
