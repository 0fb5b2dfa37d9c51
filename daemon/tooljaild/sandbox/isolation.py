"""Which isolation features this host gives the process backend, and the level asked for.

Levels:
- `strict`: every feature must be active, or the daemon refuses to start and
  says which is missing and how to enable it.
- `best-effort` (default): use what the host has; say what is missing in the
  startup log and in `tooljail doctor`.
- `none`: rlimits, a private working directory and process-tree tracking only
  (no namespaces): for hosts where tools are trusted, or for debugging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import py_compile
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tooljail.errors import TooljailError
from tooljaild.runner import RUNNER_PATH
from tooljaild.sandbox import bwrap as bw
from tooljaild.sandbox import interpreter
from tooljaild.sandbox.cgroups import CgroupTracker

log = logging.getLogger(__name__)

Level = Literal["strict", "best-effort", "none"]


class IsolationError(TooljailError):
    """Strict isolation was asked for and a feature is missing; the message says which."""


@dataclass(frozen=True)
class Feature:
    name: str
    status: Literal["active", "missing", "n/a"]
    detail: str
    required: bool = True
    """Whether `strict` needs it."""


@dataclass
class Isolation:
    """What the process backend uses on this host, decided once at startup."""

    level: Level
    bwrap: str | None = None
    """The bubblewrap binary when namespaces are used."""
    uid: int | None = None
    """The host uid sandboxes run as, when the daemon runs as root."""
    gid: int | None = None
    seccomp: bool = False
    tracker: CgroupTracker | None = None
    features: list[Feature] = field(default_factory=list)

    @property
    def namespaces(self) -> bool:
        return self.bwrap is not None

    def missing(self) -> list[Feature]:
        return [f for f in self.features if f.status == "missing" and f.required]


def resolve(
    level: Level,
    *,
    bwrap: str = "bwrap",
    sandbox_user: str = "nobody",
    use_cgroups: bool = True,
    cgroup_name: str = "tooljail",
) -> Isolation:
    """Find out what this host provides and decide what to use, feature by feature.

    Args:
        cgroup_name: The directory that holds this daemon's sandbox cgroups
            (see `CgroupTracker.detect`): one per state directory, so that a
            daemon may sweep what a dead predecessor left there.

    Raises:
        IsolationError: `strict` and a required feature is missing.
    """
    iso = Isolation(level=level)
    _choose_uid(iso, sandbox_user)
    _track_cgroups(iso, cgroup_name if use_cgroups else None)
    if level == "none":
        iso.features.append(Feature("namespaces (bubblewrap)", "n/a", "isolation = none"))
        iso.features.append(Feature("seccomp filter", "n/a", "isolation = none"))
        return iso
    _find_namespaces(iso, bwrap)
    _choose_seccomp(iso)
    _hold_to_level(iso)
    return iso


def _choose_uid(iso: Isolation, sandbox_user: str) -> None:
    """As root, sandboxes run as `sandbox_user`; otherwise as the daemon's own uid."""
    if os.geteuid() != 0:
        iso.features.append(
            Feature("unprivileged uid", "active", f"the daemon itself runs as uid {os.geteuid()}")
        )
        return
    try:
        entry = pwd.getpwnam(sandbox_user)
    except KeyError:
        iso.features.append(
            Feature(
                "unprivileged uid",
                "missing",
                f"no user {sandbox_user!r}: create it (useradd --system "
                f"{sandbox_user}) or set sandbox.user",
            )
        )
        return
    iso.uid, iso.gid = entry.pw_uid, entry.pw_gid
    iso.features.append(
        Feature(
            "unprivileged uid",
            "active",
            f"sandboxes run as {sandbox_user} (uid {iso.uid}), never root",
        )
    )


def _track_cgroups(iso: Isolation, cgroup_name: str | None) -> None:
    """A writable cgroup tree tracks every process of a call and limits the whole sandbox.

    Args:
        cgroup_name: See `resolve`; None: cgroups are not used.
    """
    tracker = CgroupTracker.detect(cgroup_name) if cgroup_name is not None else None
    iso.tracker = tracker
    if tracker is None:
        how = (
            "run as root, or under systemd with Delegate=yes; the runner's subreaper "
            "sweep is used instead"
        )
        iso.features.append(
            Feature("cgroup tracking", "missing", f"no writable cgroup tree: {how}", required=False)
        )
        iso.features.append(
            Feature(
                "cgroup limits",
                "missing",
                "no writable cgroup tree: memory and pids of the whole sandbox "
                "are not bounded, only each process's rlimits",
            )
        )
        return
    where = ", ".join(map(str, tracker.bases))
    iso.features.append(
        Feature(
            "cgroup tracking",
            "active",
            f"v{tracker.version} at {where}: every process of a call is found and killed",
            required=False,
        )
    )
    limits = sorted(tracker.controllers)
    lacking = sorted({"memory", "pids", "cpu"} - tracker.controllers)
    iso.features.append(
        Feature(
            "cgroup limits",
            "missing" if {"memory", "pids"} - tracker.controllers else "active",
            f"limits the whole sandbox: {', '.join(limits) or 'nothing'}"
            + (f"; not delegated: {', '.join(lacking)}" if lacking else ""),
        )
    )


def _find_namespaces(iso: Isolation, bwrap: str) -> None:
    """Namespaces through bubblewrap, when it is installed and works here (a probe)."""
    found = bw.find_bwrap(bwrap)
    if found is None:
        iso.features.append(
            Feature(
                "namespaces (bubblewrap)",
                "missing",
                f"{bwrap} not found: apt-get install bubblewrap (or set sandbox.bwrap to its path)",
            )
        )
        return
    ok, why = bw.probe(found, iso.uid)
    if not ok:
        iso.features.append(Feature("namespaces (bubblewrap)", "missing", why))
        return
    iso.bwrap = found
    iso.features.append(
        Feature(
            "namespaces (bubblewrap)",
            "active",
            f"{found}: user, pid, net, ipc, uts, mount, cgroup namespaces; "
            "read-only system; private /tmp; no network by default",
        )
    )


def _choose_seccomp(iso: Isolation) -> None:
    """The seccomp filter, where libseccomp is there and bubblewrap can apply it."""
    try:
        from tooljaild.sandbox import seccomp

        available, why = seccomp.available()
    except ImportError as exc:  # pragma: no cover - the module ships with the daemon
        available, why = False, str(exc)
    if available and iso.bwrap is not None:
        iso.seccomp = True
        iso.features.append(
            Feature(
                "seccomp filter",
                "active",
                "mount, ptrace, bpf, keyctl, io_uring, new user namespaces, ... denied",
            )
        )
    elif available:
        iso.features.append(Feature("seccomp filter", "missing", "needs bubblewrap to be applied"))
    else:
        iso.features.append(Feature("seccomp filter", "missing", why))


def _hold_to_level(iso: Isolation) -> None:
    """`strict` refuses what is missing; `best-effort` says it in the log.

    Raises:
        IsolationError: `strict` and a required feature is missing.
    """
    missing = iso.missing()
    if iso.level == "strict" and missing:
        raise IsolationError(
            "isolation = strict, but this host lacks: "
            + "; ".join(f"{f.name}: {f.detail}" for f in missing)
        )
    for f in missing:
        log.warning(
            "isolation feature missing: %s: %s",
            f.name,
            f.detail,
            extra={"feature": f.name, "isolation": iso.level},
        )


def reachable(path: Path, uid: int, gid: int) -> bool:
    """Whether `uid` can walk every directory down to `path` (bubblewrap needs it).

    bubblewrap resolves bind sources as the sandbox's uid, even those passed
    as descriptors, so every ancestor needs the search bit for that uid.
    """
    current = Path("/")
    for part in path.resolve().parts[1:]:
        try:
            st = current.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            bit = 0o100
        elif st.st_gid == gid:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return False
        current = current / part
    return True


def sandbox_python(configured: str, iso: Isolation) -> str:
    """The interpreter sandboxes run, checked against what the sandbox uid can reach.

    The daemon's own interpreter (the default) may lie where the unprivileged
    sandbox uid cannot reach it (pyenv, a venv under /root): the system's
    python3 serves then, since the runner needs nothing but the standard
    library. Any other configured interpreter, a virtualenv's above all, is
    used as it is or refused: swapping it would lose the packages it was
    chosen for.

    Returns:
        What to exec: a virtualenv's python as configured (made absolute, never
        resolved: that would lose the venv), any other interpreter's real binary.

    Raises:
        IsolationError: The configured interpreter does not exist, or the
            sandbox uid cannot reach it (the message names the path component
            that stops it); or the default is unreachable and no system python3
            >= 3.11 was found.
    """
    if configured != os.path.realpath(sys.executable):
        return _configured_python(configured, iso)
    if not iso.namespaces or iso.uid is None:
        return configured
    gid = iso.gid if iso.gid is not None else iso.uid
    if reachable(Path(configured), iso.uid, gid):
        return configured
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists() and reachable(Path(candidate), iso.uid, gid):
            import subprocess

            version = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if version == "True":
                log.warning(
                    "the sandbox uid cannot reach %s; sandboxes use %s", configured, candidate
                )
                return candidate
    raise IsolationError(
        f"the sandbox user (uid {iso.uid}) cannot reach the interpreter {configured}, and no "
        "system python3 >= 3.11 was found: install python3, or set sandbox.python to an "
        "interpreter every user can reach"
    )


def _configured_python(configured: str, iso: Isolation) -> str:
    """`sandbox.python` as set by the operator: it exists and the sandbox uid reaches it.

    Raises:
        IsolationError: It does not, in words naming the path (see `sandbox_python`).
    """
    try:
        interp = interpreter.inspect(configured)
        identity = sandbox_identity(iso)
        if identity is not None:
            interpreter.check_reachable(interp, *identity)
    except interpreter.InterpreterError as exc:
        raise IsolationError(str(exc)) from exc
    return interp.path


def sandbox_identity(iso: Isolation) -> tuple[int, frozenset[int], str] | None:
    """(uid, groups, in words) sandboxes run as; None when that is root (no uid to check)."""
    if iso.uid is not None:
        gid = iso.gid if iso.gid is not None else iso.uid
        try:
            name = pwd.getpwuid(iso.uid).pw_name
        except KeyError:
            name = "the sandbox user"
        return iso.uid, frozenset({gid}), f"{name} (uid {iso.uid})"
    euid = os.geteuid()
    if euid == 0:
        return None
    # Not root: sandboxes run as the daemon's own uid, with its groups.
    return euid, frozenset({os.getegid(), *os.getgroups()}), f"uid {euid} (the daemon's own)"


RUNNER_DIR_MODE = 0o755
RUNNER_FILE_MODE = 0o644
"""The runner's directories and files: every sandbox reads them (install_runner)."""


RUNNER_MODULES = (
    # Imported by _runner.py at every sandbox's start:
    "_frames.py",
    "_keeper.py",
    "_kinds.py",
    # A session's, imported when it starts:
    "_session.py",
    "_interpreter.py",
    "_messages.py",
    "_procs.py",
    "_deadline.py",
    "_usage.py",
    "_turn.py",
    "_relay.py",
    "_streams.py",
    "_spawn.py",
    "_watch.py",
    "_egress.py",
    "_devices.py",
    # A call's, imported when it needs them:
    "_workspace.py",
    "_workspace_paths.py",
    "_workspace_read.py",
    "_workspace_search.py",
    "_workspace_write.py",
    "_artifacts.py",
    "_packages.py",
)
"""The runner's modules beside _runner.py (and _zygote.py, _tooljail_mpl.py),
which install_runner copies and precompiles."""


def install_runner(state_dir: Path) -> Path:
    """Copy the runner and the tool decorator where every sandbox can read them.

    They are bound read-only into sandboxes; a copy keeps the sandbox's view
    independent of where (and with which permissions) the daemon is installed.
    The one part of the state directory others may read (tooljaild.sandbox.file_modes):
    every sandbox's uid must, and it holds nothing but tooljail's own code.
    Modes are set as such, never left to the daemon's umask (0077).
    """
    from tooljail.common import TOOLDEF_SOURCE

    target = state_dir / "runner"
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(RUNNER_DIR_MODE)
    for source in (
        RUNNER_PATH,
        RUNNER_PATH.with_name("_zygote.py"),
        *(RUNNER_PATH.with_name(name) for name in RUNNER_MODULES),
        RUNNER_PATH.with_name("_tooljail_mpl.py"),
        TOOLDEF_SOURCE,
    ):
        dest = target / source.name
        tmp = dest.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        tmp.chmod(RUNNER_FILE_MODE)
        tmp.replace(dest)
    # The runner's modules are imported by every sandbox that starts outside
    # the zygote, and a session's when it starts: compiled once here instead
    # of in each (~8 ms each on a small VM). Only an interpreter of the
    # daemon's version uses these; others compile.
    for name in RUNNER_MODULES:
        with contextlib.suppress(OSError):  # then each session compiles it, as before
            compiled = py_compile.compile(str(target / name), quiet=2)
            if compiled is not None:
                # Written under the daemon's umask: made readable as the sources are.
                Path(compiled).parent.chmod(RUNNER_DIR_MODE)
                Path(compiled).chmod(RUNNER_FILE_MODE)
    return target
