"""Finding the cgroup tree the daemon may use, v2 or v1, and preparing it.

Done once, at start-up: read which cgroups this process is in, pick the v2
unified tree or the v1 hierarchies, move the daemon into its own leaf where v2
requires it, enable the limit controllers, and prove with a probe directory
that children can be made. What it finds (`Tree`) is all `CgroupTracker` needs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from tooljaild.sandbox.cgroups import _fs as fs

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


class Tree(NamedTuple):
    """A usable cgroup tree: where sandbox cgroups go and what they can be limited by."""

    version: int
    """1 or 2."""
    bases: dict[str, Path]
    """Role ("unified" on v2; "pids", "memory", "cpu", "freezer" on v1) -> the
    directory sandbox cgroups are made in."""
    controllers: frozenset[str]
    """Those of "memory", "pids" and "cpu" that limits can be set with."""


def cgroup_name_for(state_dir: Path) -> str:
    """The cgroup directory name of the daemon that owns `state_dir`.

    One state directory has one daemon at a time, so a daemon starting on it may
    sweep whatever a killed predecessor left under this name, and never touches
    another daemon's sandboxes.
    """
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"tooljail-{digest}"


def find_tree(name: str, root: Path, proc_self_cgroup: Path) -> Tree | None:
    """Find a cgroup tree this process may create children in, and prepare it.

    On v2 this may move the calling process (and every other process of its
    cgroup) into the leaf `<own>/daemon`, and enables the memory, pids and cpu
    controllers for `<own>/<name>`: see the package docstring. It creates and
    removes a probe directory to prove the tree is writable.

    Args:
        name: The directory, under the daemon's own cgroup, that holds the
            sandboxes. Two daemons in the same cgroup need different names,
            since `sweep_stale` removes whatever it finds there.
        root: Where the cgroup filesystems are mounted (a fake tree in tests).
        proc_self_cgroup: This process's cgroup membership file.

    Returns:
        The tree, or None when the host gives this process no writable
        cgroup tree (the runner's subreaper sweep is then the only guard).

    Raises:
        ValueError: When `name` is not a plain directory name.
    """
    fs.check_name("cgroup name", name)
    if name == fs.DAEMON_LEAF:
        raise ValueError(f"cgroup name {name!r} is reserved for the daemon's own leaf")
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError as exc:
        log.debug("cannot read %s: %s", proc_self_cgroup, exc)
        return None
    memberships = _parse_proc_cgroup(lines)
    if (root / "cgroup.controllers").exists():
        own = memberships.get(fs.UNIFIED)
        if own is None:
            log.debug("no cgroup v2 line in %s", proc_self_cgroup)
            return None
        return _find_v2(root, own, name)
    return _find_v1(root, memberships, name)


def _find_v2(root: Path, own: str, name: str) -> Tree | None:
    own_dir = _own_dir(root, own)
    # A second detect() in a daemon that an earlier one moved into its leaf
    # must reuse the tree above, not nest another one inside the leaf.
    if own_dir.name == fs.DAEMON_LEAF and (own_dir.parent / name).is_dir():
        own_dir = own_dir.parent
    base = own_dir / name
    try:
        controllers = _enable_v2(own_dir, base)
    except OSError as exc:
        log.warning(
            "cgroup v2: cannot enable controllers for %s (%s); sandboxes are tracked "
            "and killed but get no cgroup limits",
            base,
            exc,
        )
        controllers = frozenset()
    if not _probe(base, None):
        return None
    if not controllers:
        log.warning(
            "cgroup v2: no memory, pids or cpu controller for %s; sandboxes are tracked "
            "and killed but get no cgroup limits",
            base,
        )
    return Tree(2, {fs.UNIFIED: base}, controllers)


def _find_v1(root: Path, memberships: Mapping[str, str], name: str) -> Tree | None:
    bases: dict[str, Path] = {}
    for role, marker in fs.V1_ROLES.items():
        own = memberships.get(role)
        mount = _v1_mount(root, memberships, role)
        if own is None or mount is None:
            continue
        base = _own_dir(mount, own) / name
        if _probe(base, marker):
            bases[role] = base
        elif role == "pids":
            # Without the pids hierarchy nothing tracks the tree; do not
            # leave half a setup behind in the others.
            return None
    if "pids" not in bases:
        return None
    controllers = frozenset(role for role in fs.LIMIT_CONTROLLERS if role in bases)
    return Tree(1, bases, controllers)


def _enable_v2(own_dir: Path, base: Path) -> frozenset[str]:
    """Enable the limit controllers for `base`'s children; return those enabled.

    Raises:
        OSError: When the daemon's processes cannot be moved to their leaf, or
            `base` cannot be made.
    """
    available = [
        c for c in fs.LIMIT_CONTROLLERS if c in fs.read_words(own_dir / "cgroup.controllers")
    ]
    if not available:
        base.mkdir(exist_ok=True)
        return frozenset()
    enabled_above = {w.lstrip("+") for w in fs.read_words(own_dir / "cgroup.subtree_control")}
    if not set(available) <= enabled_above:
        # The real root cgroup has no cgroup.type and is exempt from the rule; a
        # cgroup namespace's root is not, and has one.
        must_empty = (own_dir / "cgroup.type").exists()
        leaf = own_dir / fs.DAEMON_LEAF
        for attempt in range(3):
            if must_empty and fs.read_pids(own_dir):
                leaf.mkdir(exist_ok=True)
                _move_procs(own_dir, leaf)
            try:
                available = _enable(own_dir, available)
                break
            except OSError as exc:
                # EBUSY: a process (a child forked meanwhile) is still in own_dir.
                if exc.errno != errno.EBUSY or attempt == 2:
                    raise
    base.mkdir(exist_ok=True)
    return frozenset(_enable(base, available))


def _enable(path: Path, controllers: list[str]) -> list[str]:
    """Write `+c` for each controller to `path`'s subtree_control; return those enabled.

    All at once first; if the kernel refuses that, one by one, so one controller
    it will not enable (cpu with realtime threads, say) does not cost the others.

    Raises:
        OSError: When none can be enabled (EBUSY is raised as is, for a retry).
    """
    control = path / "cgroup.subtree_control"
    try:
        fs.write(control, " ".join(f"+{c}" for c in controllers))
        return controllers
    except OSError as exc:
        if exc.errno == errno.EBUSY or len(controllers) == 1:
            raise
        first_error = exc
    done: list[str] = []
    for c in controllers:
        try:
            fs.write(control, f"+{c}")
        except OSError as exc:
            log.warning("cgroup v2: cannot enable %s in %s: %s", c, path, exc)
        else:
            done.append(c)
    if not done:
        raise first_error
    return done


def _move_procs(src: Path, dst: Path) -> None:
    """Move every process listed in `src` into `dst`, one pid per write."""
    # One open file and one write per pid: the kernel takes one pid per write.
    with open(dst / "cgroup.procs", "wb", buffering=0) as f:
        for pid in fs.read_pids(src):
            with contextlib.suppress(ProcessLookupError):  # It exited meanwhile.
                f.write(b"%d\n" % pid)


def _probe(base: Path, marker: str | None) -> bool:
    """Make `base` and prove children can be made in it (with `marker`, if given)."""
    probe = base / f"probe-{os.getpid()}"
    try:
        base.mkdir(exist_ok=True)
        probe.mkdir(exist_ok=True)
        try:
            usable = marker is None or (probe / marker).exists()
        finally:
            fs.rmdir(probe)
    except OSError as exc:
        log.debug("cgroup tree %s not usable: %s", base, exc)
        return False
    if not usable:
        log.debug("cgroup tree %s lacks %s", base, marker)
    return usable


def _parse_proc_cgroup(lines: Iterable[str]) -> dict[str, str]:
    """Map each v1 controller (and "unified" for the v2 line) to this process's path.

    A combined v1 hierarchy such as `cpu,cpuacct` is also listed under that
    combined name, which is how its mount point is often called.
    """
    found: dict[str, str] = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, own = parts
        if hier == "0" and controllers == "":
            found[fs.UNIFIED] = own
            continue
        names = [c for c in controllers.split(",") if c and not c.startswith("name=")]
        for c in names:
            found[c] = own
        if len(names) > 1:
            found[",".join(names)] = own
    return found


def _v1_mount(root: Path, memberships: Mapping[str, str], role: str) -> Path | None:
    """The mount point of the v1 hierarchy that holds `role`, or None."""
    candidates = [root / role]
    candidates += [root / key for key in memberships if "," in key and role in key.split(",")]
    for mount in candidates:
        if (mount / "cgroup.procs").exists():
            return mount
    return None


def _own_dir(mount: Path, own: str) -> Path:
    """This process's cgroup directory under `mount`.

    Without a cgroup namespace, a container may see its host path in
    /proc/self/cgroup while its own cgroup is mounted at the root: use the
    mount then.
    """
    path = mount / own.lstrip("/")
    if path.is_dir():
        return path
    log.debug("cgroup %s not found under %s; using the mount itself", own, mount)
    return mount
