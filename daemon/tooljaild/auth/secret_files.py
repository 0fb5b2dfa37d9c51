"""Files that hold secrets (the TLS private key, the tokens file): read only when private.

A key others can read lets them pose as the daemon; a tokens file others can
change lets them give themselves an identity, and one they can read gives
them every token's hash to guess at. So such a file is read only when it is:

- a regular file (a FIFO would block the read, a device is nobody's key);
- owned by the daemon's user or by root (anyone else could rewrite it);
- writable by its owner alone (no group or other write bit);
- readable by no one but its owner and its group (no other bits): a group
  such as `tooljail` may read it, as deploy/systemd installs the config.

The check is made on the descriptor that is read (`fstat`), so a file swapped
between the check and the read is not the one read. `tooljail serve` refuses
to start on such a file, and a reload (SIGHUP) keeps what it read before; the
message names the file, its mode and owner, and the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tooljail.errors import TooljailError

__all__ = ["ExposedSecretError", "exposure", "read_secret"]


class ExposedSecretError(TooljailError, ValueError):
    """A secret file others could read or change (or not a regular file); the message
    names it and says how to fix it."""


def exposure(st: os.stat_result, path: Path, what: str, *, euid: int | None = None) -> str | None:
    """Why the file of `st` may not hold a secret; None when it may.

    Args:
        st: The file's status (of the descriptor that will be read).
        path: Its path, for the message.
        what: What it is, for the message ("the tokens file").
        euid: The daemon's user; None: this process's effective uid.
    """
    euid = os.geteuid() if euid is None else euid
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        return f"{what} {path} is not a regular file: give a file's path"
    if st.st_uid not in (euid, 0):
        return (
            f"{what} {path} belongs to uid {st.st_uid}, who could change it; it must "
            f"belong to the daemon's user or root: chown {euid} {path}"
        )
    if mode & 0o007:
        whom = "read by every user of this host" if mode & 0o004 else "used by other users"
    elif mode & 0o020:
        whom = "changed by its group"
    else:
        return None
    return (
        f"{what} {path} can be {whom} (mode {mode:04o}); it must be private to the "
        f"daemon's user: chmod 600 {path} (or 640 to let its group read it)"
    )


def read_secret(path: Path, what: str) -> bytes:
    """The bytes of a secret file, once it is known private (see the module doc).

    Args:
        path: The file.
        what: What it is, for the messages ("the tokens file", "[tls] key_file").

    Raises:
        ExposedSecretError: Others could read or change it, or it is not a regular file.
        OSError: It cannot be opened or read.
    """
    # O_NONBLOCK: a FIFO put there opens at once and is refused, instead of
    # hanging the start (or a reload) until someone writes to it.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        problem = exposure(os.fstat(fd), path, what)
        if problem is not None:
            raise ExposedSecretError(problem)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)
