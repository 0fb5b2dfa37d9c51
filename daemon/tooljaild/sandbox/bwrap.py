"""Namespaces through bubblewrap: the command line that wraps a runner.

Inside, the runner sees a read-only system (`/usr` and the few `/etc` files a
Python needs), its interpreter (a virtualenv's directory and its base's prefix
too: see sandbox/interpreter.py), the runner's own files at `/opt/tooljail`, a
fresh `/proc`, a minimal `/dev`, size-capped private `/tmp` and `/dev/shm`, and
its workspace at `/workspace`: the only writable paths. New user, pid, net, ipc, uts, mount and
cgroup namespaces; no network unless the tool's profile allows it; every
capability dropped; a new session; killed with its parent. The workspace is a
size-capped tmpfs (its quota; it is counted in the sandbox's memory too).

Everything outside `/usr` is bound from a file descriptor the daemon opened
(`--bind-fd`), so the sandbox's unprivileged uid needs no access to the host
paths leading to them (state directory, a pyenv prefix under /root...).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

INSIDE_RUNNER_DIR = "/opt/tooljail"
INSIDE_WORKSPACE = "/workspace"
ZYGOTE_SHARED = "/.tooljail-shared"
"""Where the zygote sees the shared directories a second time (see argv)."""
INSIDE_EGRESS = "/run/tooljail"
"""Where a sandbox sees its own egress directory, read-only (egress/env.py's INSIDE_DIR)."""
ZYGOTE_EGRESS = "/.tooljail-egress"
"""Where the zygote sees the egress root (every sandbox's directory), read-only:
each worker binds its own from there and then hides this view."""
INSIDE_UID = 1000
INSIDE_GID = 1000

# What a Python and the programs it may start read from /etc. The rest of /etc
# (shadow, the daemon's config, ssh keys...) is not there.
ETC_FILES = (
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/fonts",
    "/etc/host.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/pki",
    "/etc/protocols",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/services",
    "/etc/ssl",
    "/etc/timezone",
)
PASSWD = (
    "root:x:0:0::/:/usr/sbin/nologin\n"
    f"sandbox:x:{INSIDE_UID}:{INSIDE_GID}::{INSIDE_WORKSPACE}:/bin/sh\n"
    "nobody:x:65534:65534::/:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nsandbox:x:{INSIDE_GID}:\nnogroup:x:65534:\n"


@dataclass
class BwrapSpec:
    """What one sandbox's bubblewrap binds, and how."""

    bwrap: str
    python: str
    runner_dir_fd: int
    extra_ro: list[tuple[int, str]] = field(default_factory=list)
    """(fd, path) pairs bound read-only at the same path: the interpreter's
    directories outside /usr (a virtualenv, its base's prefix), then the tool
    and files directories."""
    zygote_ro: list[int] = field(default_factory=list)
    """For the zygote: a second descriptor of each `extra_ro` directory, bound at
    ZYGOTE_SHARED/i (bubblewrap closes a descriptor once it has bound it)."""
    tmp_bytes: int = 256 * 1024**2
    workspace_bytes: int = 512 * 1024**2
    """The workspace is RAM-backed and size-capped: its disk quota."""
    network: bool = False
    seccomp_fd: int | None = None
    data_fds: tuple[int, int] | None = None
    """Pipes holding /etc/passwd and /etc/group for the sandbox (bwrap --file)."""
    zygote: bool = False
    """For the zygote: it may make nested user namespaces (one per sandbox it
    forks), and each child applies the seccomp filter itself."""
    egress_fd: int | None = None
    """The sandbox's egress directory, bound read-only at INSIDE_EGRESS."""
    zygote_egress_fd: int | None = None
    """For the zygote: the egress root, bound read-only at ZYGOTE_EGRESS, and an
    empty INSIDE_EGRESS for its workers to bind their own directory on."""

    def argv(self, runner_args: list[str]) -> list[str]:
        args = [
            self.bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            str(INSIDE_UID),
            "--gid",
            str(INSIDE_GID),
            "--hostname",
            "tooljail",
            "--clearenv",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        if not self.zygote:
            args.append("--disable-userns")
        if not self.network:
            args.append("--unshare-net")
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            top = Path("/") / name
            if top.is_symlink():
                args += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                args += ["--ro-bind", str(top), str(top)]
        for etc in ETC_FILES:
            args += ["--ro-bind-try", etc, etc]
        if self.network:
            for etc in ("/etc/resolv.conf", "/etc/hosts", "/etc/gai.conf"):
                args += ["--ro-bind-try", etc, etc]
        # The kernel's own file systems and the RAM-backed scratch space come first:
        # binds below /tmp (a tools directory under /tmp, say) must land on top.
        args += [
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(self.tmp_bytes), "--tmpfs", "/tmp",
            "--size", str(self.tmp_bytes), "--tmpfs", "/dev/shm",
            "--size", str(self.workspace_bytes), "--tmpfs", INSIDE_WORKSPACE,
        ]  # fmt: skip
        if self.data_fds is not None:
            args += ["--perms", "0444", "--file", str(self.data_fds[0]), "/etc/passwd"]
            args += ["--perms", "0444", "--file", str(self.data_fds[1]), "/etc/group"]
        for fd, path in self.extra_ro:
            args += ["--ro-bind-fd", str(fd), path]
        for i, fd in enumerate(self.zygote_ro):
            # Its sandboxes mount fresh /tmp, /dev/shm and /workspace over the
            # zygote's: they bind from here what lay below those again.
            args += ["--ro-bind-fd", str(fd), f"{ZYGOTE_SHARED}/{i}"]
        if self.egress_fd is not None:
            args += ["--ro-bind-fd", str(self.egress_fd), INSIDE_EGRESS]
        if self.zygote_egress_fd is not None:
            args += ["--ro-bind-fd", str(self.zygote_egress_fd), ZYGOTE_EGRESS]
            args += ["--dir", INSIDE_EGRESS]
        args += [
            "--ro-bind-fd", str(self.runner_dir_fd), INSIDE_RUNNER_DIR,
            # Everything else is read-only: the root tmpfs bubblewrap built, /etc
            # included. Not recursive, so /tmp, /dev/shm and /workspace stay writable.
            "--remount-ro", "/",
            "--chdir", INSIDE_WORKSPACE,
        ]  # fmt: skip
        if self.seccomp_fd is not None:
            args += ["--seccomp", str(self.seccomp_fd)]
        return [*args, "--", self.python, "-I", "-B", *runner_args]

    def fds(self) -> list[int]:
        """Every descriptor bubblewrap must inherit."""
        fds = [self.runner_dir_fd, *(fd for fd, _ in self.extra_ro), *self.zygote_ro]
        fds += [fd for fd in (self.egress_fd, self.zygote_egress_fd) if fd is not None]
        if self.seccomp_fd is not None:
            fds.append(self.seccomp_fd)
        if self.data_fds is not None:
            fds.extend(self.data_fds)
        return fds


def find_bwrap(configured: str = "bwrap") -> str | None:
    """The bubblewrap binary: a configured path, or `bwrap` on PATH."""
    if "/" in configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which(configured)


def probe(bwrap: str, uid: int | None, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Check that bubblewrap can make the namespaces we need, as the sandbox uid.

    Returns:
        (True, "") when it can, else (False, why) in words an operator can act on.
    """
    argv = [
        bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
        "--unshare-uts", "--die-with-parent", "--ro-bind", "/usr", "/usr",
        "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true",
    ]  # fmt: skip
    for name in ("bin", "lib", "lib64"):
        path = Path("/") / name
        if path.is_symlink():
            argv[1:1] = ["--symlink", os.readlink(path), str(path)]
    kwargs: dict[str, object] = {}
    if uid is not None:
        kwargs.update(user=uid, group=uid_gid(uid), extra_groups=[])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kwargs)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{bwrap} could not run: {exc}"
    if proc.returncode != 0:
        hint = ""
        if "user namespace" in proc.stderr or "Operation not permitted" in proc.stderr:
            hint = (
                " (the kernel refuses unprivileged user namespaces: set "
                "kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0, or on "
                "Ubuntu allow bwrap in AppArmor)"
            )
        return False, f"{bwrap} failed: {proc.stderr.strip()}{hint}"
    return True, ""


def uid_gid(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid
