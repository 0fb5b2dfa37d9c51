"""`tooljail doctor`: what this host provides for sandboxes, feature by feature."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from dataclasses import dataclass

from tooljaild.sandbox.cgroups import CgroupTracker
from tooljaild.sandbox.process import default_python


@dataclass(frozen=True)
class Check:
    feature: str
    status: str
    """"active", "missing" or "n/a"."""
    detail: str


def check_host() -> list[Check]:
    checks = [
        Check(
            "platform",
            "active" if sys.platform == "linux" else "missing",
            f"{platform.system()} {platform.release()} ({platform.machine()})",
        ),
        Check("sandbox python", "active", default_python()),
        Check(
            "running as",
            "active",
            f"uid {os.geteuid()}"
            + (" (root: rlimit on processes is not enforced)" if os.geteuid() == 0 else ""),
        ),
    ]
    tracker = CgroupTracker.detect()
    if tracker is not None:
        checks.append(
            Check(
                "cgroup tracking",
                "active",
                f"v{tracker.version} at {tracker.base}: every process of a call "
                "is found and killed",
            )
        )
    else:
        checks.append(
            Check(
                "cgroup tracking",
                "missing",
                "no writable cgroup tree: run as root or under systemd with "
                "Delegate=yes; the runner's subreaper sweep is used instead",
            )
        )
    checks.append(
        Check(
            "subreaper sweep",
            "active" if sys.platform == "linux" else "missing",
            "the runner adopts and kills orphaned processes (PR_SET_CHILD_SUBREAPER)",
        )
    )
    checks.append(
        Check(
            "rlimits",
            "active",
            "cpu, address space, processes, file size, open files, no core dumps",
        )
    )
    bwrap = shutil.which("bwrap")
    checks.append(
        Check(
            "bubblewrap",
            "active" if bwrap else "missing",
            bwrap
            or "not installed (apt-get install bubblewrap); namespaces "
            "are not used yet by this version",
        )
    )
    docker_sock = os.environ.get("DOCKER_HOST") or "/var/run/docker.sock"
    checks.append(
        Check(
            "docker engine",
            "n/a",
            f"the docker backend is not part of this version ({docker_sock})",
        )
    )
    return checks


def render(checks: list[Check]) -> str:
    width = max(len(c.feature) for c in checks)
    lines = [f"{'feature':{width}}  {'status':8}  detail", "-" * (width + 40)]
    lines += [f"{c.feature:{width}}  {c.status:8}  {c.detail}" for c in checks]
    return "\n".join(lines)
