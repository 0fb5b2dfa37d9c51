"""Sandbox images: what they contain, whether they are built, and how to build them offline.

The docker backend runs tools in images built from the Dockerfiles under
`sandbox_images/` (one directory per image). An image is tagged
`tooljail/<name>:<hash12>`, where the hash covers every file of its directory and
its build args, and also with a moving tag (`latest`, or `scientific` for that
variant). "Current" therefore means: the tag for today's hash exists and carries
that hash in its `org.tooljail.image.hash` label. Building a current image does
nothing.

The base (the Dockerfile's `BASE` build arg) is not part of the hash: it is
Debian bookworm either way, pulled as `debian:bookworm-slim` where a registry
answers, otherwise debootstrapped here and imported as
`tooljail/base-bookworm:<recipe hash>` (built once, then reused): see
`sandbox.images.base`. The errors live in `sandbox.images.common` (also named here).

Errors:

    ImageError                       any failure; the message says what to do
    ├── EngineUnavailableError       no Docker engine answers (also a ConnectionError)
    └── ImageBuildError              debootstrap or `docker build` failed; has the log's tail
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker.errors import DockerException

from tooljaild.sandbox.docker_engine import EngineUnavailableError as EngineDown
from tooljaild.sandbox.docker_engine import connect_client
from tooljaild.sandbox.images import base as image_base
from tooljaild.sandbox.images.common import LOG_TAIL_LINES, Log, first_line, get_image

# The errors are this module's too (its docstring draws them): re-exported by name.
from tooljaild.sandbox.images.common import EngineUnavailableError as EngineUnavailableError
from tooljaild.sandbox.images.common import ImageBuildError as ImageBuildError
from tooljaild.sandbox.images.common import ImageError as ImageError

if TYPE_CHECKING:
    from docker import DockerClient

ENGINE_TIMEOUT_S = 2.0
"""How long the engine may take to answer the first request (doctor must not hang)."""
REQUEST_TIMEOUT_S = 60.0
"""Bound on each later request; builds, pulls and imports have their own."""
BUILD_TIMEOUT_S = 3600.0
"""Bound on the wait for each line of a `docker build` (pip downloads can be slow)."""

LABEL_IMAGE = "org.tooljail.image"
LABEL_HASH = "org.tooljail.image.hash"
LABEL_BASE = "org.tooljail.image.base"


class State(StrEnum):
    """Where an image stands against today's content hash."""

    CURRENT = "current"
    """The tag for today's content hash exists."""
    STALE = "stale"
    """An older build is there (under the moving tag), not today's content."""
    MISSING = "missing"
    """Neither."""


def images_root() -> Path:
    """The `sandbox_images` directory: shipped in the package, or the source checkout's.

    A wheel carries it as `tooljaild/sandbox_images` (see pyproject.toml); a source
    checkout or an editable install finds it at the repository root, two levels
    above the `tooljaild` package.
    """
    package = Path(__file__).resolve().parents[2]  # tooljaild/sandbox/images/build.py
    packaged = package / "sandbox_images"
    return packaged if packaged.is_dir() else package.parents[1] / "sandbox_images"


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """One sandbox image: a Dockerfile directory and the repository it is tagged in."""

    name: str
    directory: Path
    """The build context: the Dockerfile and everything it copies."""
    repository: str
    """Tags go here: `<repository>:<hash12>` and `<repository>:latest`."""
    args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The Dockerfile's build args with their defaults, except BASE."""

    @property
    def has_scientific(self) -> bool:
        """Whether the image has a scientific variant (the SCIENTIFIC build arg)."""
        return "SCIENTIFIC" in self.args


IMAGES: dict[str, ImageSpec] = {
    "python": ImageSpec("python", images_root() / "python", "tooljail/python", {"SCIENTIFIC": "0"}),
}
"""Every image `tooljail images build` knows, by name."""


@dataclasses.dataclass(frozen=True)
class ImageStatus:
    """Where one image (variant) stands in the engine."""

    name: str
    variant: str
    """`latest` (the default build args) or `scientific`."""
    state: State
    tag: str
    """The tag of today's content: `tooljail/python:<hash12>`."""
    moving_tag: str
    """`tooljail/python:latest` (or `:scientific`): the newest build of this variant."""
    content_hash: str
    image_id: str | None = None
    """The current image, or the stale one under the moving tag; None when missing."""
    size: int | None = None
    """Its size in bytes."""


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """What `build` did."""

    status: ImageStatus
    """The image's status after the build (current)."""
    built: bool
    """False when the image was already current and nothing was built."""
    base: str | None
    """The base image built on; None when nothing was built."""
    seconds: float


# ---------------------------------------------------------------------- content and status


def spec_for(name: str) -> ImageSpec:
    """The spec of the image called `name`.

    Raises:
        ImageError: No image has that name.
    """
    try:
        return IMAGES[name]
    except KeyError:
        raise ImageError(f"no sandbox image {name!r}; known: {', '.join(sorted(IMAGES))}") from None


def build_args(spec: ImageSpec, *, scientific: bool = False) -> dict[str, str]:
    """The build args of one variant of `spec` (BASE is added at build time).

    Raises:
        ImageError: `scientific` was asked of an image without that variant.
    """
    args = dict(spec.args)
    if scientific:
        if not spec.has_scientific:
            raise ImageError(f"the {spec.name} image has no scientific variant")
        args["SCIENTIFIC"] = "1"
    return args


def content_hash(spec: ImageSpec, build_args: Mapping[str, str]) -> str:
    """SHA-256 (hex) over the files of the image's directory and its build args.

    File names, contents and executable bits count (COPY keeps the mode);
    timestamps and the order files were written in do not.

    Raises:
        ImageError: The directory has no Dockerfile (a broken install).
    """
    if not (spec.directory / "Dockerfile").is_file():
        raise ImageError(
            f"no Dockerfile in {spec.directory}: this install lacks the sandbox_images "
            "directory (reinstall tooljail, or run from a source checkout)"
        )
    digest = hashlib.sha256(b"tooljail-image-v1\0")
    for path in sorted(p for p in spec.directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        executable = b"x" if os.access(path, os.X_OK) else b"-"
        relative = path.relative_to(spec.directory).as_posix().encode()
        digest.update(b"file\0%s\0%s\0%d\0" % (relative, executable, len(data)))
        digest.update(data)
    for key in sorted(build_args):
        digest.update(b"arg\0%s\0%s\0" % (key.encode(), build_args[key].encode()))
    return digest.hexdigest()


def image_status(client: DockerClient, name: str, *, scientific: bool = False) -> ImageStatus:
    """Whether the image `name` (that variant) is current, stale or missing in the engine.

    Raises:
        ImageError: Unknown name, or no Dockerfile for it.
        docker.errors.DockerException: The engine failed to answer.
    """
    spec = spec_for(name)
    digest = content_hash(spec, build_args(spec, scientific=scientific))
    variant = "scientific" if scientific else "latest"
    tag = f"{spec.repository}:{digest[:12]}"
    status = ImageStatus(name, variant, State.MISSING, tag, f"{spec.repository}:{variant}", digest)
    current = get_image(client, tag)
    if current is not None and current.labels.get(LABEL_HASH) == digest:
        return _found(status, State.CURRENT, current)
    previous = get_image(client, status.moving_tag)
    return status if previous is None else _found(status, State.STALE, previous)


def _found(status: ImageStatus, state: State, image: Any) -> ImageStatus:
    return dataclasses.replace(status, state=state, image_id=image.id, size=image.attrs.get("Size"))


# ---------------------------------------------------------------------- engine


def connect(
    timeout: float = ENGINE_TIMEOUT_S, request_timeout: float = REQUEST_TIMEOUT_S
) -> DockerClient:
    """A client of the engine at DOCKER_HOST (default: the local socket).

    Args:
        timeout: How long the engine may take to answer the first request.
        request_timeout: The bound on each later request (builds, pulls and
            imports bound their own waits).

    Raises:
        EngineUnavailableError: No engine answered within `timeout`.
    """
    try:
        return connect_client(timeout=timeout, request_timeout=request_timeout)
    except EngineDown as exc:  # the sandbox backend's error: this module's own here
        raise EngineUnavailableError(str(exc)) from None


# ---------------------------------------------------------------------- build


def build(
    client: DockerClient,
    name: str,
    *,
    scientific: bool = False,
    force: bool = False,
    log: Log = print,
) -> BuildResult:
    """Build the image `name` unless it is current; idempotent.

    When a current image exists (and not `force`), only its moving tag is
    checked (and moved to it if needed). Otherwise a base is found or made (see
    `ensure_base`) and the Dockerfile is built on it, its log streamed to `log`
    line by line.

    Args:
        client: The engine (see `connect`).
        name: A key of IMAGES.
        scientific: Build the variant with numpy, pandas, matplotlib and scipy.
        force: Build even when current, without the build cache.
        log: Receives each progress and build-log line.

    Raises:
        ImageError: Unknown name or variant; no base could be had (the message
            says what is missing).
        ImageBuildError: debootstrap or `docker build` failed.
        docker.errors.DockerException: The engine failed otherwise.
    """
    start = time.monotonic()
    spec = spec_for(name)
    args = build_args(spec, scientific=scientific)
    status = image_status(client, name, scientific=scientific)
    if status.state is State.CURRENT and not force:
        _ensure_moving_tag(client, status, log)
        log(f"{status.tag} is current: nothing to build")
        return BuildResult(status, built=False, base=None, seconds=time.monotonic() - start)
    base = image_base.ensure_base(client, log=log)
    log(f"building {status.tag} from {spec.directory} on {base}")
    _docker_build(client, spec, args, status, base, nocache=force, log=log)
    after = image_status(client, name, scientific=scientific)
    if after.state is not State.CURRENT:
        raise ImageError(f"built {after.tag}, but the engine does not show it with its labels")
    _ensure_moving_tag(client, after, log)
    seconds = time.monotonic() - start
    log(f"built {after.tag} (also {after.moving_tag}) in {seconds:.0f} s")
    return BuildResult(after, built=True, base=base, seconds=seconds)


def _docker_build(
    client: DockerClient,
    spec: ImageSpec,
    args: Mapping[str, str],
    status: ImageStatus,
    base: str,
    *,
    nocache: bool,
    log: Log,
) -> None:
    # The low-level API streams the log as it comes; `client.images.build` would
    # return it only at the end.
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    what = f"building {status.tag} failed"
    lines = _LineBuffer(tail, log)
    try:
        for chunk in client.api.build(
            path=str(spec.directory),
            tag=status.tag,
            buildargs={**args, "BASE": base},
            labels={LABEL_IMAGE: spec.name, LABEL_HASH: status.content_hash, LABEL_BASE: base},
            rm=True,
            forcerm=True,
            nocache=nocache,
            pull=False,
            decode=True,
            timeout=BUILD_TIMEOUT_S,
        ):
            lines.feed(chunk.get("stream", ""))
            if "error" in chunk:
                lines.flush()
                error = chunk["error"].strip()
                raise ImageBuildError(f"{what}: {explain_failure(error, tail, args)}", tail)
    except (DockerException, OSError) as exc:  # OSError: requests' timeouts, a lost socket
        lines.flush()
        raise ImageBuildError(f"{what}: {first_line(exc)}", tail) from exc
    lines.flush()


PIP_FAILED = (
    "No matching distribution found",
    "Could not find a version that satisfies",
    "Could not fetch URL",
)
"""What pip prints when no package index answered it (or none had the package)."""
APT_FAILED = ("Unable to locate package", "Failed to fetch", "Temporary failure resolving")


def explain_failure(error: str, tail: Iterable[str], args: Mapping[str, str]) -> str:
    """The engine's error, led by what failed in words, where the log tail shows it.

    The engine says only that a RUN step "returned a non-zero code"; for the
    scientific variant the usual cause is a package index that did not answer.
    """
    lines = list(tail)
    if args.get("SCIENTIFIC") == "1" and any(m in ln for ln in lines for m in PIP_FAILED):
        said = next((ln for ln in lines if "Could not fetch URL" in ln), None) or next(
            ln for ln in lines if any(m in ln for m in PIP_FAILED)
        )
        why = ""
        if "CERTIFICATE_VERIFY_FAILED" in "\n".join(lines):
            why = (
                " (the build does not trust the index's TLS certificate: a proxy that"
                " intercepts TLS needs its CA inside the build)"
            )
        return (
            "pip could not install the scientific packages (numpy, pandas, matplotlib, "
            f"scipy) from PyPI{why}: {said.strip()[:300]}. Build where PyPI answers "
            "`docker build`, or give the process backend a virtualenv with these packages "
            "instead ([sandbox] python = ...; README: Packages in the sandbox). "
            f"The engine said: {error}"
        )
    if any(m in ln for ln in lines for m in APT_FAILED):
        said = next(ln for ln in lines if any(m in ln for m in APT_FAILED))
        return (
            f"apt-get could not reach a Debian mirror: {said.strip()[:300]}. "
            f"The engine said: {error}"
        )
    return error


class _LineBuffer:
    """Turns the build stream's pieces into whole lines, without terminal colours.

    The engine sends text in arbitrary pieces (a RUN's stderr often mid-line),
    with ANSI colour codes around stderr.
    """

    _ANSI = re.compile(r"\x1b\[[0-9;]*m")

    def __init__(self, tail: deque[str], log: Log) -> None:
        self._pending = ""
        self._tail = tail
        self._log = log

    def feed(self, text: str) -> None:
        *complete, self._pending = (self._pending + text).split("\n")
        for line in complete:
            self._emit(line)

    def flush(self) -> None:
        self._emit(self._pending)
        self._pending = ""

    def _emit(self, line: str) -> None:
        line = self._ANSI.sub("", line).rstrip()
        if line:
            self._tail.append(line)
            self._log(line)


def _ensure_moving_tag(client: DockerClient, status: ImageStatus, log: Log) -> None:
    moving = get_image(client, status.moving_tag)
    if moving is None or moving.id != status.image_id:
        repository, tag = status.moving_tag.rsplit(":", 1)
        client.api.tag(status.image_id, repository, tag, force=True)
        log(f"tagged {status.moving_tag} -> {status.tag}")
