"""Where the daemon listens: the Unix socket (and its directory), or a loopback port.

A Unix socket is the default, and anyone who can connect to it can run code as
the daemon's sandboxes, so two things hold:

- A non-root daemon's default directory (`$XDG_RUNTIME_DIR/tooljail`, or
  `/tmp/tooljail-<uid>` without XDG_RUNTIME_DIR) is its own before it is used:
  made 0700 when missing; when present it must be a real directory (not a
  link) owned by the daemon's uid that neither group nor others may write
  (else someone else could have put a socket of theirs where clients dial).
  One only group/other readable (as daemons before this check made them) is
  narrowed to 0700: nobody else could have written into it.
- The socket is never connectable by others, not even for a moment: it is
  bound inside a fresh 0700 directory next to its place, given its mode,
  owner and group there (the config's `socket_mode`, `socket_owner`,
  `socket_group`), made to listen, then linked into place (never over
  another's socket) and the private name removed. A process-wide umask would
  race the pool's threads making workspaces at the same time.
- The public socket is the daemon's relay (`tooljaild.app.relay`), not gRPC's:
  gRPC listens in that private directory, which stays (until stop) so that
  only the daemon's uid (and root) can reach gRPC directly, and the relay
  tells gRPC each caller's uid (`tooljaild.auth.peer`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tooljail.common import default_socket_path
from tooljaild.app.errors import DaemonError
from tooljaild.sandbox.file_modes import make_dirs

__all__ = [
    "SocketPlan",
    "prepare_socket",
    "private_dir_problem",
]

SOCKET_MODE = 0o660
"""The owner and its group may connect; nobody else."""


def _refused(message: str) -> DaemonError:
    return DaemonError(message)


def private_dir_problem(directory: Path, uid: int) -> str | None:
    """Why `directory` is not safe to hold this daemon's socket; None when it is.

    Safe: a directory itself (not a symbolic link), owned by `uid`, that neither
    group nor others may write. Read and search bits are not judged here (the
    caller narrows them on a directory it owns).
    """
    try:
        st = os.lstat(directory)
    except OSError as exc:
        return f"cannot inspect {directory}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{directory} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if st.st_uid != uid:
        return f"{directory} belongs to uid {st.st_uid}, not to this daemon's uid {uid}"
    if st.st_mode & 0o022:
        return f"{directory} may be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _own_private_dir(directory: Path) -> None:
    """Make `directory` 0700 or check that it is ours and private (see the module doc).

    Raises:
        DaemonError: It is not ours, a link, or writable by others.
    """
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    except OSError as exc:
        raise _refused(f"cannot create {directory}: {exc.strerror or exc}") from exc
    problem = private_dir_problem(directory, os.geteuid())
    if problem is not None:
        raise _refused(
            f"refusing to put the socket in {directory}: {problem}. Someone else could "
            "then listen where clients dial, or read what they send. Remove it (or make "
            f"it yours: chown {os.geteuid()} and chmod 700), or listen elsewhere "
            "(--listen unix:///PATH)"
        )
    if stat.S_IMODE(os.lstat(directory).st_mode) & 0o077:
        # Ours, and nobody else could write into it: only narrow what others see.
        os.chmod(directory, 0o700, follow_symlinks=False)


@dataclass(frozen=True)
class SocketPlan:
    """Where the socket goes, and the private place gRPC listens.

    `bind_address` is what gRPC binds (it stays private); `publish()` then puts
    the relay's listening socket at `path`; `discard()` at stop removes the
    private directory.
    """

    path: Path
    private_dir: Path
    mode: int = SOCKET_MODE
    uid: int = -1
    """The socket's owner; -1: the daemon's user."""
    gid: int = -1
    """The socket's group; -1: the daemon's group."""

    @property
    def bind_address(self) -> str:
        return f"unix://{self.private_dir / 's'}"

    @property
    def grpc_socket(self) -> Path:
        """gRPC's own socket, which only the daemon's uid (and root) may reach."""
        return self.private_dir / "s"

    def publish(self) -> socket.socket:
        """Bind, give its mode and listen on the public socket, then put it at `path`.

        Returns:
            The listening socket (for `tooljaild.app.relay.PeerRelay.start`).

        Raises:
            DaemonError: Another process took `path` meanwhile, or the socket
                cannot be made there.
        """
        staged = self.private_dir / "public"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(staged))
            if self.uid != -1 or self.gid != -1:
                os.chown(staged, self.uid, self.gid, follow_symlinks=False)
            os.chmod(staged, self.mode)
            sock.listen(1024)
            # link() never replaces: a socket someone bound there since the check stays.
            os.link(staged, self.path)
        except FileExistsError as exc:
            sock.close()
            raise _refused(f"another process is already listening on {self.path}") from exc
        except OSError as exc:
            sock.close()
            raise _refused(f"cannot put the socket at {self.path}: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
        return sock

    def discard(self) -> None:
        """Remove the private directory (and gRPC's socket in it). Idempotent."""
        shutil.rmtree(self.private_dir, ignore_errors=True)


def prepare_socket(
    listen: str, mode: int = SOCKET_MODE, uid: int = -1, gid: int = -1
) -> SocketPlan:
    """Check the socket's place, clear a dead daemon's socket, make the private bind dir.

    `mode`, `uid` and `gid` are what `SocketPlan.publish` gives the socket (-1: as made).

    Raises:
        DaemonError: The path is relative, its directory is not safe (the
            non-root default one, see the module doc) or cannot be made, or a
            live process listens there.
    """
    path = Path(listen.removeprefix("unix://").removeprefix("unix:"))
    if not path.is_absolute():
        raise _refused(f"the Unix socket path must be absolute: {listen}")
    if os.geteuid() != 0 and path.parent == default_socket_path().parent:
        _own_private_dir(path.parent)
    else:
        try:
            # As such, not narrowed by the daemon's umask (0077): clients reach the socket.
            make_dirs(path.parent, 0o755)
        except OSError as exc:
            raise _refused(f"cannot create {path.parent}: {exc}") from exc
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # left by a daemon that died: nobody listens on it
        else:
            raise _refused(f"another process is already listening on {path}")
        finally:
            probe.close()
    try:
        # mkdtemp makes it 0700. Its name and the socket's ("/.XXXXXXXX/s") are
        # no longer than "/tooljail.sock", so the bind path fits the 107-byte
        # limit of a Unix socket address wherever the default name does.
        private = Path(tempfile.mkdtemp(prefix=".", dir=path.parent))
    except OSError as exc:
        raise _refused(f"cannot create a directory in {path.parent}: {exc}") from exc
    return SocketPlan(path, private, mode, uid, gid)
