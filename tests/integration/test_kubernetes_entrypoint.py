"""The pod's entrypoint (deploy/kubernetes/image/entrypoint.sh) makes its two mounts, then execs.

Run as root in a private mount namespace (`unshare -m`), with a read-only
cgroup2 tree mounted where a container runtime puts one and a stand-in for
`tooljail` on PATH that reports what it finds: the cgroup tree writable, an
unmasked procfs at /run/tooljail/proc, its own arguments intact. Without
SYS_ADMIN the mounts fail, and the entrypoint says so and still execs (the
daemon's strict isolation then names what is missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "kubernetes" / "image" / "entrypoint.sh"

STAND_IN = """#!/bin/sh
echo "args: $*"
mountpoint -q /run/tooljail/proc && echo "proc: mounted"
[ -w /sys/fs/cgroup/cgroup.procs ] && echo "cgroup: writable"
exit 0
"""

# As a runtime leaves an unprivileged container: /run private to it, cgroup2
# mounted read-only. Only this mount namespace sees any of it.
CONTAINER = (
    "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /sys/fs/cgroup"
    ' && mount -t cgroup2 -o ro none /sys/fs/cgroup && exec "$@"'
)

# A container's /proc as runtimes leave it: part of it masked (a read-only
# tmpfs over a directory) and /proc/sys read-only, in a pid namespace of its own.
MASKED_PROC = (
    "mount -t tmpfs -o ro tmpfs /proc/acpi || mount -t tmpfs -o ro tmpfs /proc/scsi;"
    " mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys"
)

# What a process sandbox's bubblewrap does with /proc, as the sandbox uid.
BWRAP = (
    "setpriv --reuid=65534 --regid=65534 --clear-groups -- bwrap --unshare-user"
    " --unshare-pid --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64"
    " --symlink usr/bin /bin --proc /proc --dev /dev -- /bin/true"
)

pytestmark = [
    pytest.mark.isolation,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces, mounts)"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare"),
]


def _run(tmp_path: Path, *wrapper: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tooljail").write_text(STAND_IN)
    (bin_dir / "tooljail").chmod(0o755)
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", CONTAINER, "container"]
    argv += [*wrapper, "sh", str(ENTRYPOINT), "serve", "--config", "/etc/tooljail/tooljail.toml"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_the_cgroup_tree_becomes_writable_and_an_unmasked_proc_is_mounted(
    tmp_path: Path,
) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "args: serve --config /etc/tooljail/tooljail.toml" in lines
    assert "proc: mounted" in lines
    assert "cgroup: writable" in lines
    assert done.stderr == ""


def test_without_sys_admin_it_says_what_failed_and_still_starts_the_daemon(
    tmp_path: Path,
) -> None:
    drop = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"]
    done = _run(tmp_path, *drop)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "args: serve --config /etc/tooljail/tooljail.toml" in lines
    assert "proc: mounted" not in lines and "cgroup: writable" not in lines
    assert "cannot make /sys/fs/cgroup writable" in done.stderr
    assert "cannot mount an unmasked procfs" in done.stderr


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_bubblewrap_gets_its_proc_under_a_masked_proc_once_the_entrypoint_ran(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tooljail").write_text(f"#!/bin/sh\n{BWRAP} && echo 'sandbox: made'\nexit 0\n")
    (bin_dir / "tooljail").chmod(0o755)
    script = f"{MASKED_PROC}; mount -t tmpfs tmpfs /run; {BWRAP} || echo 'before: refused';"
    script += f" exec sh {ENTRYPOINT} serve"
    argv = ["unshare", "-m", "-p", "-f", "--mount-proc", "--propagation", "private"]
    argv += ["sh", "-c", script]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    # Without the unmasked procfs the kernel refuses bubblewrap its /proc
    # ("mount too revealing"); with it, the same sandbox is made.
    assert "before: refused" in done.stdout.splitlines(), (done.stdout, done.stderr)
    assert "Can't mount proc" in done.stderr
    assert "sandbox: made" in done.stdout.splitlines(), (done.stdout, done.stderr)
