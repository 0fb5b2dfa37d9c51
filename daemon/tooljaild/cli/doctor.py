"""`tooljail doctor`: what this host provides for sandboxes, feature by feature."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Literal

from tooljaild.sandbox.isolation import (
    Feature,
    Isolation,
    IsolationError,
    Level,
    resolve,
    sandbox_identity,
    sandbox_python,
)
from tooljaild.settings.sandbox import default_python


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
    features[1:1] = python_features(python or default_python(), iso)
    features += iso.features
    features.append(zygote_feature(iso.namespaces, platform.machine(), platform.release()))
    if os.geteuid() != 0:
        features.append(Feature("running as", "active", f"uid {os.geteuid()}", required=False))
    return features


def python_features(configured: str, iso: Isolation) -> list[Feature]:
    """The sandbox's interpreter: which, a venv or not, its version, whether the
    sandbox uid reaches it, and the notable packages it has. Blocks (starts it once,
    as the sandbox uid, outside bubblewrap)."""
    from tooljaild.sandbox import interpreter

    try:
        chosen = sandbox_python(configured, iso)
        interp = interpreter.inspect(chosen)
        identity = sandbox_identity(iso)
        answer = interpreter.probe(interp, identity[0] if identity else None, iso.gid)
    except (IsolationError, interpreter.InterpreterError) as exc:
        return [
            Feature("sandbox python", "missing", str(exc)),
            Feature("sandbox packages", "n/a", "needs the sandbox python", required=False),
        ]
    who = identity[2] if identity else "root"
    detail = f"{interp.describe()}: Python {answer['version']}, reachable by {who}"
    if chosen != configured:
        detail += f" (the sandbox uid cannot reach {configured})"
    status: Literal["active", "missing"] = "active"
    if interp.venv is not None and os.path.realpath(answer["prefix"]) != os.path.realpath(
        interp.venv
    ):
        status = "missing"
        detail += f"; but it runs with sys.prefix {answer['prefix']}, not its venv"
    packages: dict[str, str] = answer["packages"]
    found = ", ".join(f"{name} {version}" for name, version in sorted(packages.items()))
    wanted = ", ".join(interpreter.NOTABLE_PACKAGES)
    return [
        Feature("sandbox python", status, detail),
        Feature(
            "sandbox packages",
            "active" if found else "n/a",
            found
            or f"none of {wanted}: set sandbox.python to a virtualenv's bin/python to add "
            "packages (README: Packages in the sandbox)",
            required=False,
        ),
    ]


ZYGOTE_MIN_KERNEL = (5, 8)
"""setns() on a pidfd, which the zygote forks each worker into its sandbox by."""


def zygote_feature(namespaces: bool, machine: str, release: str) -> Feature:
    """Whether sandboxes can be cloned from a warm zygote (decisions 16 and 29).

    Judged from the kernel and the architecture, not by starting one: a zygote
    that fails to start anyway says why in the daemon's log ("no zygote").
    Without it every sandbox starts its own bubblewrap and interpreter.
    """
    slow = "each sandbox starts its own bubblewrap and interpreter (~50 ms, not ~5)"
    if not namespaces:
        return Feature("sandbox zygote", "n/a", "needs namespaces", required=False)
    if machine != "x86_64":
        return Feature("sandbox zygote", "missing", f"x86_64 only: {slow}", required=False)
    numbers = [int(part) for part in release.split("-")[0].split(".")[:2] if part.isdigit()]
    if tuple(numbers) < ZYGOTE_MIN_KERNEL:
        wanted = ".".join(map(str, ZYGOTE_MIN_KERNEL))
        return Feature(
            "sandbox zygote",
            "missing",
            f"Linux {release} is older than {wanted}: {slow}",
            required=False,
        )
    return Feature(
        "sandbox zygote", "active", "sandboxes are cloned from a warm interpreter", required=False
    )


def check_docker(
    docker_host: str | None = None, *, backend: str | None = None, image: str | None = None
) -> list[Feature]:
    """The docker backend's needs: an engine that answers, and current sandbox images.

    Neither is required by `strict` (that is about the process backend). Each
    request to the engine times out after about 2 s, so a hung or absent engine
    makes this slow by at most that much, and never makes it fail.

    Args:
        docker_host: The engine (the config's `docker.docker_host`); None:
            DOCKER_HOST, else the local socket.
        backend: The daemon's default backend; when given, a "default backend"
            row says it, and what `serve` does without an engine.
        image: The configured `docker.image`; when given, a "docker image" row
            says whether the engine has it.
    """
    from docker.errors import DockerException

    from tooljaild.sandbox.docker_engine import (
        DEFAULT_DOCKER_HOST,
        EngineUnavailableError,
        connect_client,
    )
    from tooljaild.sandbox.images import build as images

    where = docker_host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    head: list[Feature] = []
    if backend is not None:
        head.append(
            Feature(
                "default backend",
                "active",
                backend if backend != "docker" else f"docker ({image or 'its default image'})",
                required=False,
            )
        )
    consequence = (
        "; `serve` refuses to start with backend docker, and docker-backed tools fail"
        if backend == "docker"
        else "; docker-backed tools fail until it answers (process-backed ones work)"
        if backend is not None
        else ""
    )
    no_images = [Feature("sandbox images", "n/a", "need the Docker engine", required=False)]
    if image is not None:
        no_images.append(Feature("docker image", "n/a", "needs the Docker engine", required=False))
    try:
        client = connect_client(
            docker_host, timeout=images.ENGINE_TIMEOUT_S, request_timeout=images.ENGINE_TIMEOUT_S
        )
    except EngineUnavailableError as exc:
        missing = Feature("docker engine", "missing", f"{exc}{consequence}", required=False)
        return [*head, missing, *no_images]
    try:
        version = client.version()["Version"]
        engine = Feature("docker engine", "active", f"Docker {version} at {where}", required=False)
        statuses = [images.image_status(client, name) for name in sorted(images.IMAGES)]
        configured = _image_feature(client, image) if image is not None else None
    except (DockerException, OSError, images.ImageError) as exc:
        failed = f"the engine at {where} failed: {exc}{consequence}"
        return [*head, Feature("docker engine", "missing", failed, required=False), *no_images]
    finally:
        client.close()
    detail = ", ".join(f"{s.name} {s.state.value} ({s.tag})" for s in statuses)
    tail = [configured] if configured is not None else []
    if all(s.state is images.State.CURRENT for s in statuses):
        return [*head, engine, Feature("sandbox images", "active", detail, required=False), *tail]
    detail += "; build with `tooljail images build`"
    return [*head, engine, Feature("sandbox images", "missing", detail, required=False), *tail]


def _image_feature(client: Any, image: str) -> Feature:
    """Whether the engine has the configured image. Blocks (one request)."""
    from docker.errors import ImageNotFound

    from tooljaild.sandbox.docker_engine import image_missing_message

    try:
        found = client.images.get(image)
    except ImageNotFound as exc:
        return Feature("docker image", "missing", image_missing_message(image, exc), required=False)
    return Feature("docker image", "active", f"{image} ({found.short_id})", required=False)


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
