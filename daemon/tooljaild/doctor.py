"""`tooljail doctor`: what this host provides for sandboxes, feature by feature."""

from __future__ import annotations

import os
import platform
import sys

from tooljaild.sandbox.isolation import Feature, Level, resolve
from tooljaild.sandbox.process import default_python


def check_host(
    level: Level = "best-effort",
    *,
    bwrap: str = "bwrap",
    sandbox_user: str = "nobody",
    python: str | None = None,
) -> list[Feature]:
    """Every isolation feature with its status, as `serve` would find them.

    Never raises for a missing feature: that is what it reports.
    """
    from tooljaild.sandbox.isolation import IsolationError

    features = [
        Feature(
            "platform",
            "active" if sys.platform == "linux" else "missing",
            f"{platform.system()} {platform.release()} ({platform.machine()})",
        ),
        Feature(
            "rlimits",
            "active",
            "cpu, address space, processes, file size, open files, no core dumps",
        ),
    ]
    try:
        iso = resolve(
            "best-effort" if level == "strict" else level, bwrap=bwrap, sandbox_user=sandbox_user
        )
    except IsolationError:  # pragma: no cover - best-effort never raises
        raise
    from tooljaild.sandbox.isolation import sandbox_python

    configured = python or default_python()
    try:
        chosen = sandbox_python(configured, iso)
        features.insert(
            1,
            Feature(
                "sandbox python",
                "active",
                chosen
                if chosen == configured
                else f"{chosen} (the sandbox uid cannot reach {configured})",
            ),
        )
    except IsolationError as exc:
        features.insert(1, Feature("sandbox python", "missing", str(exc)))
    features += iso.features
    if os.geteuid() != 0:
        features.append(Feature("running as", "active", f"uid {os.geteuid()}", required=False))
    return features


def strict_ready(features: list[Feature]) -> list[Feature]:
    """The features whose absence makes `isolation = strict` refuse to start."""
    return [f for f in features if f.status == "missing" and f.required]


def render(features: list[Feature], level: Level) -> str:
    width = max(len(f.name) for f in features)
    lines = [f"{'feature':{width}}  {'status':8}  detail", "-" * (width + 60)]
    lines += [f"{f.name:{width}}  {f.status:8}  {f.detail}" for f in features]
    missing = strict_ready(features)
    lines.append("")
    if missing:
        lines.append(
            "isolation = strict would refuse to start: missing "
            + ", ".join(f.name for f in missing)
        )
        if level != "strict":
            lines.append(f"isolation = {level}: runs with what is active above")
    else:
        lines.append("isolation = strict: every feature is active")
    return "\n".join(lines)
