"""The cgroup filesystem as every part of the package sees it: layout, reads, writes.

Cgroup files are read and written with one system call each where the kernel
cares (a value per write; `cgroup.procs` one pid per write), and a missing
optional file is not an error. Tests replace `rmdir` to fake the kernel's
(interface files go with the directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterable
from pathlib import Path

LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
"""The controllers a sandbox can be limited by, in the order they are enabled."""

DAEMON_LEAF = "daemon"
"""On v2, the leaf the daemon's own processes move into (see the package docstring)."""

UNIFIED = "unified"
"""The key of the single v2 directory in the per-role maps (v1 keys are the V1_ROLES)."""

V1_ROLES = {
    # role: a file every cgroup of that hierarchy has when the role is usable.
    "pids": "pids.max",
    "memory": "memory.limit_in_bytes",
    "cpu": "cpu.cfs_quota_us",
    "freezer": "freezer.state",
}

NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_name(kind: str, value: str) -> None:
    """Raise ValueError unless `value` is a plain directory name (`[A-Za-z0-9_.-]{1,64}`)."""
    if not is_name(value):
        raise ValueError(f"{kind} must match [A-Za-z0-9_.-]{{1,64}} and not be . or ..: {value!r}")


def is_name(value: str) -> bool:
    return bool(NAME_RE.fullmatch(value)) and value not in {".", ".."}


def sigkill(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid; return those that still existed."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        alive.append(pid)
    return alive


def rmdir(path: Path) -> None:
    """Remove a cgroup directory (tests replace this to fake the kernel's rmdir)."""
    path.rmdir()


def write(path: Path | str, text: str) -> None:
    """Write one value to a cgroup file in a single write call.

    Raises:
        OSError: When the file cannot be opened or the kernel refuses the value.
    """
    # os-level, as `read_text`: a session call resets a peak each time, and a
    # buffered text file's set-up cost more than the write. The flags are
    # open(path, "w")'s, as before (the kernel ignores O_CREAT and O_TRUNC on
    # an interface file; a test's fake cgroup tree gets the file made).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_if_present(path: Path, text: str) -> None:
    # Optional files (swap accounting) exist only with some kernel configs.
    if path.exists():
        write(path, text)


def read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def read_text(path: Path | str) -> str:
    """A cgroup file's text: os-level calls, as the daemon's loop reads a few per sandbox.

    Raises:
        OSError: When the file cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def read_int(path: Path | str) -> int | None:
    try:
        return int(read_text(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_keyed(path: Path | str) -> dict[str, int]:
    """Parse a flat keyed file (`key value` per line), such as memory.events.

    Raises:
        OSError: When the file cannot be read.
    """
    values: dict[str, int] = {}
    for line in read_text(path).splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            values[key] = int(value)
    return values


def read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in read_text(path / "cgroup.procs").split()]
    except OSError:
        return []
