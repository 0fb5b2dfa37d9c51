"""A disk a test can cut the power of: ext4 on a loop device, shut down without a flush.

How the cut is made, and why it is faithful to a power cut for what it tests:
`cut()` calls ext4's shutdown ioctl with `EXT4_GOING_FLAGS_NOLOGFLUSH`
(xfstests' `godown -f`, the way its crash tests stop a filesystem): from that
instant the filesystem writes nothing more, neither the dirty pages of its
files nor its journal's running transaction, and then it is unmounted and the
loop device detached, which drops every cached page of it. Mounted again, the
filesystem holds exactly what had reached the block device: what an fsync or
fdatasync forced there (data, and the ext4 journal commit that makes it
reachable), plus whatever the kernel's writeback happened to send before (it
sends pages ~30 s after they were dirtied, so a test of a few seconds sees
almost none). That is what a power cut leaves, with one difference on the safe
side for the writer: the loop device's backing file survives, so a write the
"disk" acknowledged is never lost from a volatile disk cache. A write that no
sync covered is lost, as `control_file_lost` shows in each run.

The machine's kernel here has no device-mapper (no `dm-flakey`, which the
issue suggests), hence the shutdown ioctl; it needs root, a loop device,
`mkfs.ext4` (e2fsprogs) and `losetup` (util-linux), which .ci/run installs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

EXT4_IOC_SHUTDOWN = 0x8004587D
"""_IOR('X', 125, __u32), from linux/fs/ext4/ext4.h."""
EXT4_GOING_FLAGS_NOLOGFLUSH = 2
"""Shut down without flushing the data or the ext4 journal."""
IMAGE_BYTES = 64 * 1024 * 1024


def missing() -> str | None:
    """Why this machine cannot cut a disk's power, or None when it can."""
    if os.geteuid() != 0:
        return "mounting a loop device needs root"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux, e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "this kernel has no loop devices (/dev/loop-control)"
    return None


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


class PowerCutDisk:
    """An ext4 filesystem on a loop device over `image`, mounted at `mount`."""

    def __init__(self, image: Path, mount: Path) -> None:
        self.image = image
        self.mount = mount
        self.device = ""
        with open(image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        _run("mkfs.ext4", "-q", "-F", str(image))
        mount.mkdir(exist_ok=True)
        self.power_on()
        mount.chmod(0o755)  # the sandbox uid walks through to the state directory

    def power_on(self) -> None:
        """Attach the image and mount it (ext4 replays its journal, as after a cut)."""
        self.device = _run("losetup", "--find", "--show", str(self.image))
        try:
            _run("mount", "-t", "ext4", self.device, str(self.mount))
        except OSError:
            _run("losetup", "-d", self.device)
            self.device = ""
            raise

    def cut(self) -> None:
        """Stop the filesystem where it stands, with nothing flushed, and take it away."""
        fd = os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)
        self.off()

    def off(self, timeout_s: float = 10.0) -> None:
        """Unmount and detach (idempotent). Not lazily: a process left holding a
        file there (a sandbox of the killed daemon) must not keep the old
        filesystem alive while the image is mounted again.

        Raises:
            OSError: It is still busy after `timeout_s`.
        """
        if not self.device:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(["umount", str(self.mount)], capture_output=True, text=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise OSError(f"cannot unmount {self.mount}: {done.stderr.strip()}")
            time.sleep(0.05)
        _run("losetup", "-d", self.device)
        self.device = ""

    def write_control(self, name: str, *, synced: bool) -> None:
        """A small file on the disk, fsynced (with its directory) or not."""
        path = self.mount / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"x" * 100)
            if synced:
                os.fsync(fd)
        finally:
            os.close(fd)
        if synced:
            dir_fd = os.open(self.mount, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def control_file_lost(self, name: str) -> bool:
        """Whether a control file is gone (or empty) after a cut and a power-on."""
        path = self.mount / name
        return not path.exists() or path.stat().st_size == 0
