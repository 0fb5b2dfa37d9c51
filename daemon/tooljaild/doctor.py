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


def check_docker() -> list[Feature]:
    """The docker backend's needs: an engine that answers, and current sandbox images.

    Neither is required by `strict` (that is about the process backend). Each
    request to the engine times out after about 2 s, so a hung or absent engine
    makes this slow by at most that much, and never makes it fail.
    """
    from docker.errors import DockerException

    from tooljaild import images

    where = os.environ.get("DOCKER_HOST", "the local socket")
    no_images = Feature("sandbox images", "n/a", "need the Docker engine", required=False)
    try:
        client = images.connect(request_timeout=images.ENGINE_TIMEOUT_S)
    except images.EngineUnavailableError as exc:
        return [Feature("docker engine", "missing", str(exc), required=False), no_images]
    try:
        version = client.version()["Version"]
        engine = Feature("docker engine", "active", f"Docker {version} at {where}", required=False)
        statuses = [images.image_status(client, name) for name in sorted(images.IMAGES)]
    except (DockerException, OSError, images.ImageError) as exc:
        failed = f"the engine at {where} failed: {exc}"
        return [Feature("docker engine", "missing", failed, required=False), no_images]
    finally:
        client.close()
    detail = ", ".join(f"{s.name} {s.state.value} ({s.tag})" for s in statuses)
    if all(s.state is images.State.CURRENT for s in statuses):
        return [engine, Feature("sandbox images", "active", detail, required=False)]
    detail += "; build with `tooljail images build`"
    return [engine, Feature("sandbox images", "missing", detail, required=False)]


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
