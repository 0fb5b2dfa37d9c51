"""What a sandbox may use (`CgroupLimits`), and how each limit is written on v1 and v2.

One function writes them all: the two versions differ only in file names and
in v1's swap rule, so each limit's two spellings stand side by side.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from tooljaild.sandbox.cgroups import _fs as fs

log = logging.getLogger(__name__)

_CPU_PERIOD_US = 100_000
_CPU_MIN_QUOTA_US = 1_000  # The kernel refuses a smaller quota.


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


def apply_limits(
    version: int, dirs: Mapping[str, Path], controllers: Collection[str], limits: CgroupLimits
) -> None:
    """Write `limits` into a sandbox's cgroup directories (`dirs`, by role).

    A limit whose controller is not in `controllers` is skipped with a WARNING:
    the host does not allow it, and the sandbox's rlimits still apply.

    Raises:
        OSError: When a limit cannot be written.
    """
    wanted = {
        "memory": limits.memory_bytes,
        "pids": limits.pids,
        "cpu": limits.cpu_cores,
    }
    missing = [c for c, v in wanted.items() if v is not None and c not in controllers]
    if missing:
        log.warning("cgroup limits on %s not available here; skipped", ", ".join(missing))
    mem_dir: Path | None
    cpu_dir: Path | None
    if version == 2:
        mem_dir = pids_dir = cpu_dir = dirs[fs.UNIFIED]
    else:
        mem_dir, pids_dir, cpu_dir = dirs.get("memory"), dirs["pids"], dirs.get("cpu")
    if limits.memory_bytes is not None and mem_dir is not None and "memory" in controllers:
        value = str(limits.memory_bytes)
        if version == 2:
            fs.write(mem_dir / "memory.max", value)
            # Without this, swap lets the sandbox use far more than memory.max.
            fs.write_if_present(mem_dir / "memory.swap.max", "0")
        else:
            # memsw must stay >= the memory limit, so the memory limit goes first.
            fs.write(mem_dir / "memory.limit_in_bytes", value)
            fs.write_if_present(mem_dir / "memory.memsw.limit_in_bytes", value)
    if limits.pids is not None and "pids" in controllers:
        fs.write(pids_dir / "pids.max", str(limits.pids))
    if limits.cpu_cores is not None and cpu_dir is not None and "cpu" in controllers:
        if version == 2:
            quota = cpu_quota(limits.cpu_cores, _CPU_PERIOD_US)
            fs.write(cpu_dir / "cpu.max", f"{quota} {_CPU_PERIOD_US}")
        else:
            period = fs.read_int(cpu_dir / "cpu.cfs_period_us") or _CPU_PERIOD_US
            fs.write(cpu_dir / "cpu.cfs_quota_us", str(cpu_quota(limits.cpu_cores, period)))


def cpu_quota(cores: float, period_us: int) -> int:
    """The CFS quota, in µs per `period_us`, for `cores` (at least the kernel's minimum)."""
    return max(_CPU_MIN_QUOTA_US, round(cores * period_us))
