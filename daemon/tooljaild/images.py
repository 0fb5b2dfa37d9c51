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
`tooljail/base-bookworm:<recipe hash>` (built once, then reused).

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
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker.errors import DockerException, ImageNotFound

from tooljail.errors import TooljailError
from tooljaild.sandbox.docker_engine import EngineUnavailableError as EngineDown
from tooljaild.sandbox.docker_engine import connect_client

if TYPE_CHECKING:
    from docker import DockerClient

Log = Callable[[str], None]

ENGINE_TIMEOUT_S = 2.0
"""How long the engine may take to answer the first request (doctor must not hang)."""
REQUEST_TIMEOUT_S = 60.0
"""Bound on each later request; builds, pulls and imports have their own."""
PULL_TIMEOUT_S = 60.0
"""How long a pull of the registry base may take before we build the base offline."""
BUILD_TIMEOUT_S = 3600.0
"""Bound on the wait for each line of a `docker build` (pip downloads can be slow)."""
LOG_TAIL_LINES = 25
"""How many of the last log lines a build error shows."""

LABEL_IMAGE = "org.tooljail.image"
LABEL_HASH = "org.tooljail.image.hash"
LABEL_BASE = "org.tooljail.image.base"
LABEL_RECIPE = "org.tooljail.base.recipe"

REGISTRY_BASE = "debian:bookworm-slim"
OFFLINE_REPOSITORY = "tooljail/base-bookworm"
OFFLINE_SUITE = "bookworm"
OFFLINE_ARGS = ("--variant=minbase", "--include=python3")
OFFLINE_TRIM = ("usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/doc")
"""Left out of the offline base, as debian:bookworm-slim does (copyright files stay)."""
OFFLINE_RECIPE = " ".join(("debootstrap", *OFFLINE_ARGS, OFFLINE_SUITE, "trim", *OFFLINE_TRIM))
"""What the offline base is; its tag is a hash of this."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageError(TooljailError):
    """A sandbox image could not be checked or built; the message says what to do."""


class EngineUnavailableError(ImageError, ConnectionError):
    """No Docker engine answers at DOCKER_HOST (or the default socket)."""


class ImageBuildError(ImageError):
    """debootstrap or `docker build` failed.

    Attributes:
        log_tail: The last lines of its log, also at the end of the message.
    """

    def __init__(self, what: str, log_tail: Iterable[str]) -> None:
        self.log_tail = list(log_tail)
        tail = "\n".join(f"    {line}" for line in self.log_tail)
        super().__init__(f"{what}; the last lines of its log:\n{tail}" if tail else what)


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
    above this package.
    """
    here = Path(__file__).resolve().parent
    packaged = here / "sandbox_images"
    return packaged if packaged.is_dir() else here.parents[1] / "sandbox_images"


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


def _get(client: DockerClient, reference: str) -> Any:
    """The image called `reference`, or None."""
    try:
        return client.images.get(reference)
    except ImageNotFound:
        return None


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
    current = _get(client, tag)
    if current is not None and current.labels.get(LABEL_HASH) == digest:
        return _found(status, State.CURRENT, current)
    previous = _get(client, status.moving_tag)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
    base = ensure_base(client, log=log)
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
                raise ImageBuildError(f"{what}: {chunk['error'].strip()}", tail)
    except (DockerException, OSError) as exc:  # OSError: requests' timeouts, a lost socket
        lines.flush()
        raise ImageBuildError(f"{what}: {_first_line(exc)}", tail) from exc
    lines.flush()


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
    moving = _get(client, status.moving_tag)
    if moving is None or moving.id != status.image_id:
        repository, tag = status.moving_tag.rsplit(":", 1)
        client.api.tag(status.image_id, repository, tag, force=True)
        log(f"tagged {status.moving_tag} -> {status.tag}")


# ---------------------------------------------------------------------- base


def ensure_base(client: DockerClient, *, log: Log = print) -> str:
    """A Debian bookworm base image in the engine, and its name.

    In order: `debian:bookworm-slim` if present, or if a pull succeeds within
    PULL_TIMEOUT_S; the offline base if built before; else the offline base is
    built now (debootstrap, `docker import`).

    Raises:
        ImageError: No registry, and the offline base can't be built here.
        ImageBuildError: debootstrap failed.
    """
    if _get(client, REGISTRY_BASE) is not None:
        log(f"base: {REGISTRY_BASE} (present)")
        return REGISTRY_BASE
    if _pull(client, REGISTRY_BASE, log):
        log(f"base: {REGISTRY_BASE} (pulled)")
        return REGISTRY_BASE
    offline = f"{OFFLINE_REPOSITORY}:{hashlib.sha256(OFFLINE_RECIPE.encode()).hexdigest()[:12]}"
    if _get(client, offline) is not None:
        log(f"base: {offline} (built offline before)")
        return offline
    _build_offline_base(client, offline, log)
    return offline


def _pull(client: DockerClient, reference: str, log: Log) -> bool:
    """Try to pull `reference` within PULL_TIMEOUT_S; any failure means "no registry"."""
    outcome: list[BaseException | None] = []

    def pull() -> None:
        try:
            client.images.pull(reference)
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    log(f"pulling {reference} ...")
    # The SDK gives pulls no timeout: a thread bounds the wait. If the pull hangs,
    # the daemon thread is left to end with the process.
    thread = threading.Thread(target=pull, name="tooljail-pull", daemon=True)
    thread.start()
    thread.join(PULL_TIMEOUT_S)
    if not outcome:
        log(f"no registry answered within {PULL_TIMEOUT_S:.0f} s: building the base offline")
        return False
    if outcome[0] is not None:
        log(f"cannot pull {reference} ({_first_line(outcome[0])}): building the base offline")
        return False
    return True


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this host's apt uses for bookworm, or deb.debian.org.

    Reads one-line `sources.list` entries and deb822 `*.sources` files.
    """
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found = _mirror_deb822(text) if path.suffix == ".sources" else _mirror_one_line(text)
        if found is not None:
            return found
    return DEFAULT_MIRROR


def _mirror_one_line(text: str) -> str | None:
    for line in text.splitlines():
        # deb [signed-by=...] URI SUITE COMPONENT...
        words = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if (
            words[:1] == ["deb"]
            and len(words) >= 4
            and words[2] == OFFLINE_SUITE
            and "main" in words[3:]
        ):
            return words[1]
    return None


def _mirror_deb822(text: str) -> str | None:
    for stanza in text.split("\n\n"):
        fields: dict[str, list[str]] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith(("#", " ", "\t")):
                fields[key.strip().lower()] = value.split()
        if (
            "deb" in fields.get("types", [])
            and OFFLINE_SUITE in fields.get("suites", [])
            and "main" in fields.get("components", [])
            and fields.get("uris")
        ):
            return fields["uris"][0]
    return None


def _build_offline_base(client: DockerClient, reference: str, log: Log) -> None:
    """debootstrap a minimal bookworm with python3 and import it as `reference`.

    Raises:
        ImageError: Not root, or debootstrap is missing.
        ImageBuildError: debootstrap failed.
    """
    debootstrap = shutil.which("debootstrap")
    hint = f"or make {REGISTRY_BASE} available to the engine (`docker pull` or `docker load`)"
    if debootstrap is None:
        raise ImageError(
            f"no registry answers, and building the base offline needs debootstrap: "
            f"install it (`apt-get install debootstrap`), {hint}"
        )
    if os.geteuid() != 0:
        raise ImageError(
            "no registry answers, and building the base offline needs root (debootstrap "
            f"makes device nodes and chroots): run `sudo tooljail images build`, {hint}"
        )
    mirror = debian_mirror()
    start = time.monotonic()
    # Not /tmp: it may be mounted nodev or noexec, which debootstrap can't work in.
    work = Path(tempfile.mkdtemp(prefix="tooljail-base-", dir="/var/tmp"))
    rootfs = work / "rootfs"
    try:
        argv = [debootstrap, *OFFLINE_ARGS, OFFLINE_SUITE, str(rootfs), mirror]
        log(f"$ {' '.join(argv)}")
        _run_logged(argv, f"debootstrap from {mirror} failed", log)
        _trim(rootfs)
        tarball = work / "rootfs.tar"
        _run_logged(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."],
            "packing the debootstrapped tree failed",
            log,
        )
        repository, tag = reference.rsplit(":", 1)
        log(f"importing it as {reference}")
        client.api.import_image_from_file(
            str(tarball),
            repository=repository,
            tag=tag,
            changes=[f'LABEL {LABEL_RECIPE}="{OFFLINE_RECIPE}"'],
        )
        log(f"base: {reference} (built offline in {time.monotonic() - start:.0f} s)")
    finally:
        _remove_tree(work, log)


def _trim(rootfs: Path) -> None:
    """Remove what a sandbox never reads: ~50 MB of docs and translations, apt's caches."""
    root = rootfs.resolve()
    for name in OFFLINE_TRIM:
        directory = rootfs / name
        # Never follow a symlink out of the tree: an absolute one points into the host.
        if not directory.resolve().is_relative_to(root):
            continue
        for path in directory.glob("*"):
            if name == "usr/share/doc" and path.is_dir() and not path.is_symlink():
                for item in path.iterdir():
                    if item.name != "copyright":
                        _remove(item)
            else:
                _remove(path)
    # debootstrap keeps the .debs it installed; apt fetches fresh lists when it needs them.
    for path in [
        *(rootfs / "var/cache/apt/archives").glob("*.deb"),
        *(rootfs / "var/lib/apt/lists").glob("*_*"),
    ]:
        path.unlink()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _run_logged(argv: list[str], what: str, log: Log) -> None:
    """Run `argv`, sending each output line to `log`.

    Raises:
        ImageBuildError: It exited non-zero.
    """
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            tail.append(line)
            log(line)
    if proc.returncode != 0:
        raise ImageBuildError(f"{what} (exit {proc.returncode})", tail)


def _remove_tree(work: Path, log: Log) -> None:
    # A debootstrap that died half-way can leave /proc or /sys mounted in the
    # tree: deleting through a mount would reach outside it, so leave it then.
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    mounts = [p for p in (line.split()[4] for line in mountinfo) if p.startswith(f"{work}/")]
    if mounts:
        log(f"not removing {work}: still mounted there: {', '.join(mounts)} (umount, then rm -r)")
        return
    shutil.rmtree(work, ignore_errors=True)
