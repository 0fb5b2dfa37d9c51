"""The sandbox settings: backend kinds, limits, each backend's table, a tool's profile.

Plain data. The backends (`tooljaild.sandbox.backends`) build sandboxes from
these; nothing here builds a live object or imports a backend, so the command
line can offer the kinds (`serve --backend`) without importing any backend (a
test keeps `KINDS` equal to the keys of `sandbox.backends.BACKENDS`).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tooljaild.settings.egress_rules import Rule, parse_rules

__all__ = [
    "DEFAULT_IMAGE",
    "KINDS",
    "TOOLJAIL_REPOSITORY",
    "BackendKind",
    "BackendSettings",
    "DockerSandboxConfig",
    "Limits",
    "ProcessSandboxConfig",
    "SandboxProfile",
    "default_python",
    "image_reference",
]

BackendKind = Literal["process", "docker"]
"""The sandbox backends a tool can run in."""

KINDS: tuple[str, ...] = get_args(BackendKind)

DEFAULT_IMAGE = "tooljail/python:latest"
TOOLJAIL_REPOSITORY = "tooljail"
"""Where `tooljail images build NAME` tags its images: `tooljail/NAME:latest`."""
_IMAGE_REFERENCE = re.compile(r"^[a-z0-9][a-z0-9._/:@+-]{0,254}$", re.IGNORECASE)


class Limits(BaseModel):
    """Resource limits of one sandbox. Zero means "no limit of this kind".

    Unknown keys are rejected (a `[limits]` typo is refused at start, by name).
    """

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(default=600, ge=0)
    """CPU seconds (RLIMIT_CPU): past it the tool is killed with a CpuLimit error."""
    memory_bytes: int = Field(default=4 * 1024**3, ge=0)
    """Address space per process (RLIMIT_AS): allocations past it fail with MemoryError."""
    nproc: int = Field(default=256, ge=0)
    """Processes of the sandbox's user (RLIMIT_NPROC; not enforced for root)."""
    fsize_bytes: int = Field(default=1024**3, ge=0)
    """Largest file the tool may write (RLIMIT_FSIZE)."""
    nofile: int = Field(default=256, ge=0)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    output_bytes: int = Field(default=1024**2, ge=1024)
    """Output kept per call for the result (head and tail); the rest is counted only."""
    output_limit_bytes: int = Field(default=1024**3, ge=0)
    """Output a call may write in all (stdout and stderr); past it the tool is
    stopped: error type OutputLimit. 0: no limit (the result still keeps only
    head and tail)."""
    sandbox_memory_bytes: int = Field(default=1024**3, ge=0)
    """Memory of the whole sandbox, every process and its /tmp together (cgroup);
    past it the kernel kills the tool: error type OutOfMemory."""
    sandbox_pids: int = Field(default=256, ge=0)
    """Processes and threads in the whole sandbox (cgroup pids)."""
    cpus: float = Field(default=1.0, ge=0)
    """CPU cores the sandbox may use at once (cgroup cpu quota); 0: no cap."""
    tmp_bytes: int = Field(default=256 * 1024**2, ge=1024**2)
    """Size of the sandbox's private /tmp and /dev/shm (RAM-backed, each)."""
    workspace_bytes: int = Field(default=512 * 1024**2, ge=1024**2)
    """Disk quota of the workspace (under namespaces: a RAM-backed tmpfs of this size)."""
    max_egress_connections: int = Field(default=64, ge=1)
    """Connections through the egress proxy one sandbox may hold open at once;
    past it a new one is refused (reason connection_limit)."""

    def rlimits(self) -> dict[str, int]:
        return {
            "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_bytes,
            "nproc": self.nproc,
            "fsize_bytes": self.fsize_bytes,
            "nofile": self.nofile,
        }


def image_reference(image: str) -> str:
    """The full image reference a config or tool profile means by `image`.

    A name without "/" names one of tooljail's sandbox images (`tooljail images
    build NAME`): "python" is "tooljail/python:latest", "python:scientific" is
    "tooljail/python:scientific". Anything with a "/" is a full reference, used
    as given ("tooljail/python:latest", "docker.io/library/python:3.12",
    "registry.example.com/team/tools@sha256:...").

    Raises:
        ValueError: When `image` cannot be an image reference.
    """
    image = image.strip()
    if not _IMAGE_REFERENCE.match(image) or image.endswith((":", "@", "/")):
        raise ValueError(
            f"{image!r} is not an image: use a sandbox image's name (python) or a full "
            "reference with a '/' (docker.io/library/python:3.12)"
        )
    if "/" in image:
        return image
    name, _, tag = image.partition(":")
    if "@" in image:
        raise ValueError(
            f"{image!r}: an image digest needs the full reference (tooljail/NAME@sha256:...)"
        )
    return f"{TOOLJAIL_REPOSITORY}/{name}:{tag or 'latest'}"


def default_python() -> str:
    """The interpreter binary sandboxes run: this one's, symlinks and shims resolved.

    A pyenv shim on PATH costs ~180 ms per start, and a venv's launcher would
    bring the daemon's packages along; the real binary has neither problem.
    """
    return os.path.realpath(sys.executable)


class ProcessSandboxConfig(BaseModel):
    """Settings of the process backend. Unknown keys are rejected, to catch typos."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["process"] = "process"
    python: str = Field(default_factory=default_python)
    """The Python interpreter that runs the runner and the tools: a binary, or a
    virtualenv's bin/python (to give tools packages; the sandbox uid must be able
    to read it: see README, "Packages in the sandbox"). The default, the daemon's
    own binary, is replaced by the system's python3 where the sandbox uid cannot
    reach it; a configured one is used as it is, or the daemon refuses to start."""
    use_cgroups: bool = True
    """Track (and limit) each sandbox in its own cgroup where the host allows it."""
    bwrap: str = "bwrap"
    """The bubblewrap binary: a path, or a name looked up on PATH."""
    user: str = "nobody"
    """The host user sandboxes run as when the daemon runs as root."""
    zygote: bool = True
    """Under namespaces, fork sandboxes from a warm zygote instead of starting
    bubblewrap and an interpreter for each (much cheaper refills)."""
    start_timeout_s: float = Field(default=20.0, gt=0)
    """How long a new sandbox may take to say it is ready."""


class DockerSandboxConfig(BaseModel):
    """Settings of the docker backend. Unknown keys are rejected, to catch typos."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["docker"] = "docker"
    image: str = DEFAULT_IMAGE
    """The sandbox image: a sandbox image's name ("python" is tooljail/python:latest,
    made by `tooljail images build python`), or a full reference with a "/"
    ("docker.io/library/python:3.12"); see `image_reference`."""
    docker_host: str | None = None
    """The engine: "unix:///path" or "tcp://host:port"; None: DOCKER_HOST, else the
    local socket. It must run on this host (sandboxes bind-mount local directories)."""
    network: bool = False
    """Give sandboxes the engine's default network, unfiltered (no egress rules,
    no secrets, DNS open); False: no network but what `[egress]` allows."""
    python: str = "/usr/bin/python3"
    """The interpreter in the image that runs the runner and the tools."""
    user: str = "65534:65534"
    """uid:gid (numeric) the container runs as; never root."""
    runtime: str | None = None
    """An OCI runtime other than the engine's default (e.g. "runsc" for gVisor)."""
    start_timeout_s: float = Field(default=30.0, gt=0)
    """How long a new container may take until its runner says it is ready."""
    connect_timeout_s: float = Field(default=3.0, gt=0)
    """How long the engine may take to answer the first request."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """The bound on each engine request after that."""

    @field_validator("image")
    @classmethod
    def _full_reference(cls, v: str) -> str:
        return image_reference(v)

    @field_validator("user")
    @classmethod
    def _numeric_unprivileged(cls, v: str) -> str:
        uid, _, gid = v.partition(":")
        if not uid.isdigit() or not (gid or uid).isdigit():
            raise ValueError("user must be numeric, uid:gid (e.g. 65534:65534)")
        if int(uid) == 0 or int(gid or uid) == 0:
            raise ValueError("sandboxes never run as root (uid or gid 0)")
        return f"{int(uid)}:{int(gid or uid)}"

    @property
    def uid(self) -> int:
        return int(self.user.split(":")[0])

    @property
    def gid(self) -> int:
        return int(self.user.split(":")[1])


class BackendSettings(BaseModel):
    """The config's backend choice and each backend's own table (mixed into `Settings`)."""

    backend: BackendKind = "process"
    """The backend of every tool whose sandbox profile names none (the built-ins
    included): "process" (namespaces on this host) or "docker" (containers)."""
    sandbox: ProcessSandboxConfig = Field(default_factory=ProcessSandboxConfig)
    """The process backend's settings."""
    docker: DockerSandboxConfig = Field(default_factory=DockerSandboxConfig)
    """The docker backend's settings: image, docker_host, network, ..."""


class SandboxProfile(BaseModel):
    """Where a tool's calls run (`@tool(sandbox={...})`). Unset keys follow the daemon.

    Unknown keys and values are rejected, to catch typos. `image` and
    `network=True` belong to the docker backend, so they need `backend="docker"`
    (the process backend never has a network of its own); `egress` rules, which
    go through the daemon's proxy, work on both.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    backend: BackendKind | None = None
    """The backend; None: the daemon's default (`serve --backend`)."""
    image: str | None = None
    """The docker image: a sandbox image's name ("python") or a full reference
    with a "/"; None: the daemon's `docker.image`."""
    network: bool | None = None
    """Give the container the engine's default network, unfiltered (egress rules
    are the filtered way out); None: the daemon's `docker.network` (off unless
    configured)."""
    egress: list[str] | None = None
    """Egress rules the tool's calls may reach through the daemon's proxy
    ("api.example.com", "*.example.org:443"; see docs/egress.md), within its
    caller's allowance; either backend. None: none (no network)."""

    @field_validator("egress")
    @classmethod
    def _egress(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            parse_rules(v, "egress")
        return v

    @functools.cached_property
    def egress_rules(self) -> tuple[Rule, ...] | None:
        """The parsed `egress` rules, parsed once (a call reads them at each
        admission); None: the tool asks for none."""
        return None if self.egress is None else parse_rules(self.egress, "egress")

    @model_validator(mode="after")
    def _check(self) -> SandboxProfile:
        if self.image is not None:
            if self.backend != "docker":
                raise ValueError(
                    "image is a docker setting: add backend='docker' "
                    f"(got backend={self.backend!r})"
                )
            # Same rule as the config's docker.image; raises ValueError with the fix.
            image_reference(self.image)
        if self.network and self.backend != "docker":
            raise ValueError(
                "network=True needs backend='docker': the process backend has no network"
            )
        return self
