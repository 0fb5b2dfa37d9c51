"""The base of the sandbox images: Debian bookworm, pulled or debootstrapped here.

Apart from `images` (what an image contains, whether it is current, the build)
because getting a base is its own trade: a registry that may not answer in
time, an apt mirror read from the host's sources, debootstrap, trimming and
`docker import`. `images.build` asks `ensure_base` for the Dockerfile's `BASE`.

The base is not part of an image's content hash: it is Debian bookworm either
way, `debian:bookworm-slim` where a registry answers, otherwise built here as
`tooljail/base-bookworm:<recipe hash>` (built once, then reused).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from tooljaild.sandbox.images.common import (
    LOG_TAIL_LINES,
    ImageBuildError,
    ImageError,
    Log,
    first_line,
    get_image,
)

if TYPE_CHECKING:
    from docker import DockerClient

__all__ = [
    "DEFAULT_MIRROR",
    "OFFLINE_RECIPE",
    "OFFLINE_REPOSITORY",
    "PULL_TIMEOUT_S",
    "REGISTRY_BASE",
    "debian_mirror",
    "ensure_base",
]

PULL_TIMEOUT_S = 60.0
"""How long a pull of the registry base may take before we build the base offline."""

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


def ensure_base(client: DockerClient, *, log: Log = print) -> str:
    """A Debian bookworm base image in the engine, and its name.

    In order: `debian:bookworm-slim` if present, or if a pull succeeds within
    PULL_TIMEOUT_S; the offline base if built before; else the offline base is
    built now (debootstrap, `docker import`).

    Raises:
        ImageError: No registry, and the offline base can't be built here.
        ImageBuildError: debootstrap failed.
    """
    if get_image(client, REGISTRY_BASE) is not None:
        log(f"base: {REGISTRY_BASE} (present)")
        return REGISTRY_BASE
    if _pull(client, REGISTRY_BASE, log):
        log(f"base: {REGISTRY_BASE} (pulled)")
        return REGISTRY_BASE
    offline = f"{OFFLINE_REPOSITORY}:{hashlib.sha256(OFFLINE_RECIPE.encode()).hexdigest()[:12]}"
    if get_image(client, offline) is not None:
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
        log(f"cannot pull {reference} ({first_line(outcome[0])}): building the base offline")
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
