"""The workspace root and its checked paths, its quota, and the errors every op raises.

Shared by the read ops (_workspace_read.py) and the write ops
(_workspace_write.py); `run` in _workspace.py is the one entry point (its
docstring says how paths are checked and why). Stdlib-only, installed beside
_runner.py in every sandbox: see _workspace.py.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class WorkspaceError(Exception):
    """An op refused or failed; `type` names the kind, `message` says what to do.

    Args:
        type_: The error's type as the result reports it (e.g. "InvalidPathError").
        message: A sentence naming the path and what to do instead.
    """

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message


def counted(count: int, noun: str, plural: str = "") -> str:
    """`count` and `noun`, plural where it is not 1 ("1 line", "3 lines")."""
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


def invalid_path(message: str) -> WorkspaceError:
    """A refused path (absolute, outside the workspace, of the wrong kind)."""
    return WorkspaceError("InvalidPathError", message)


def not_found(path: str, hint: str = "") -> WorkspaceError:
    """`path` names nothing; `hint` says where to look (default: ls)."""
    tail = f" {hint}" if hint else " (ls shows what is there)"
    return WorkspaceError("FileNotFoundError", f"no such file or directory: {path!r}{tail}")


def bad_argument(message: str) -> WorkspaceError:
    """An argument missing, of the wrong type or out of range."""
    return WorkspaceError("InvalidArgumentError", message)


# --------------------------------------------------------------------------- paths


class Workspace:
    """The workspace root, and paths resolved inside it.

    Args:
        root: The workspace root as this process sees it.
        quota_bytes: The workspace quota; 0: none known.
    """

    def __init__(self, root: str, quota_bytes: int) -> None:
        self.root = os.path.realpath(root)
        self.quota_bytes = quota_bytes

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + os.sep)

    def rel(self, real: str) -> str:
        """`real` (inside the root) as the model names it: relative, "." for the root."""
        return os.path.relpath(real, self.root)

    def _checked(self, path: Any, name: str, *, allow_root: bool) -> str:
        """`path` normalized and checked lexically: relative, inside, a string."""
        if not isinstance(path, str):
            raise bad_argument(f"{name} must be a string path relative to the workspace")
        if "\0" in path:
            raise invalid_path(f"{name} {path!r} holds a NUL character")
        if os.path.isabs(path):
            raise invalid_path(
                f"{name} {path!r} is absolute: paths are relative to the workspace "
                "(e.g. 'data/file.txt'), and nothing outside it can be reached"
            )
        norm = os.path.normpath(path) if path else "."
        if norm == ".." or norm.startswith(".." + os.sep):
            raise invalid_path(f"{name} {path!r} leaves the workspace: paths must stay inside it")
        if norm == "." and not allow_root:
            raise invalid_path(f"{name} {path!r} is the workspace itself; name a file in it")
        return norm

    def resolve(self, path: Any, name: str = "path", *, allow_root: bool = False) -> str:
        """The real path `path` names, following symlinks, refused unless inside.

        Raises:
            WorkspaceError: InvalidPathError when it is absolute, leaves the
                workspace, or resolves (through a symlink) outside it.
        """
        norm = self._checked(path, name, allow_root=allow_root)
        real = os.path.realpath(os.path.join(self.root, norm))
        if not self.inside(real):
            raise invalid_path(
                f"{name} {path!r} leads outside the workspace (through a symlink): refused; "
                "only files inside the workspace can be reached"
            )
        return real

    def resolve_entry(self, path: Any, name: str = "path") -> str:
        """The path of the entry `path` names itself (a symlink is not followed):
        its directory resolved and checked, its own name kept.

        Raises:
            WorkspaceError: InvalidPathError as `resolve`, or for the root itself.
        """
        norm = self._checked(path, name, allow_root=False)
        parent = os.path.realpath(os.path.join(self.root, os.path.dirname(norm)))
        if not self.inside(parent):
            raise invalid_path(
                f"{name} {path!r} leads outside the workspace (through a symlink): refused"
            )
        return os.path.join(parent, os.path.basename(norm))

    def make_parents(self, real: str, path: str) -> None:
        """Create the directories above `real` (inside the workspace) as needed."""
        parent = os.path.dirname(real)
        if os.path.isdir(parent):
            return
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise invalid_path(f"cannot write {path!r}: a part of its path is not a directory")
        os.makedirs(parent, exist_ok=True)
        if not self.inside(os.path.realpath(parent)):  # a race with a symlink: undo nothing, refuse
            raise invalid_path(f"{path!r} leads outside the workspace: refused")

    # ----------------------------------------------------------------------- quota

    def usage(self) -> int:
        """Bytes the workspace's regular files hold on disk (`held`, links not followed)."""
        return sum(size for _, size in self._files())

    def _files(self) -> list[tuple[str, int]]:
        """Each regular file (relative path) with the bytes it holds."""
        found = []
        for top, dirs, files in os.walk(self.root, onerror=None, followlinks=False):
            for name in files + dirs:
                full = os.path.join(top, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((self.rel(full), held(st)))
        return found

    def _largest(self, count: int = 3) -> str:
        """The largest files, for a message ("a.bin (1048576 bytes), ...")."""
        files = sorted(self._files(), key=lambda f: -f[1])[:count]
        return ", ".join(f"{path!r} ({size} bytes)" for path, size in files if size)

    def check_room(self, path: str, adding: int, freeing: int = 0) -> None:
        """Refuse a write of `adding` bytes (freeing `freeing`) that would pass the
        quota or the free space of the workspace's file system.

        Raises:
            WorkspaceError: WorkspaceFullError; nothing has been written.
        """
        if self.quota_bytes > 0:
            used = self.usage()
            if used - freeing + adding > self.quota_bytes:
                largest = self._largest()
                raise _full(
                    path,
                    f"writing {adding} bytes would pass the workspace quota of "
                    f"{self.quota_bytes} bytes ({used} in use"
                    + (f"; the largest files: {largest}" if largest else "")
                    + ")",
                )
        try:
            vfs = os.statvfs(self.root)
        except OSError:
            return
        free = vfs.f_bavail * vfs.f_frsize
        if adding - freeing > free:
            raise _full(path, f"writing {adding} bytes needs more than the {free} bytes free")


def held(st: os.stat_result) -> int:
    """The bytes a file holds on disk, as the quota counts them: its size, or less
    for a sparse file (its allocated blocks). A file whose holes were counted at
    its apparent size (a 1 GiB `truncate`) would refuse every later write while
    holding almost nothing."""
    return min(st.st_size, st.st_blocks * 512)


def _full(path: str, why: str) -> WorkspaceError:
    return WorkspaceError(
        "WorkspaceFullError",
        f"{path!r} was not written: {why}. Free space first (delete_file, clear_files).",
    )


def os_error(exc: OSError, path: str) -> WorkspaceError:
    """An OSError as the model should read it, naming the path as it gave it."""
    code = exc.errno
    if code in _FULL_ERRNOS:
        return _full(path, "the workspace is full")
    if code == errno.ENOENT:
        return not_found(path)
    if code == errno.ELOOP:
        return invalid_path(f"{path!r} is a symlink (or changed into one): refused")
    if code in (errno.EISDIR, errno.ENOTDIR):
        return invalid_path(f"{path!r}: {os.strerror(code)}")
    if code in (errno.EACCES, errno.EPERM):
        return WorkspaceError("PermissionError", f"permission denied: {path!r}")
    if code == errno.ENAMETOOLONG:
        return invalid_path(f"{path!r}: the name is too long")
    return WorkspaceError("OSError", f"{path!r}: {os.strerror(code or 0) or exc}")


# --------------------------------------------------------------------------- arguments


def arg(args: dict[str, Any], name: str, kind: type, default: Any = ..., *, low: int = 0) -> Any:
    """Argument `name` of type `kind` (ints: at least `low`); `...`: required."""
    if name not in args or args[name] is None:
        if default is ...:
            raise bad_argument(f"missing argument {name!r}")
        return default
    value: Any = args[name]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_argument(f"{name} must be an integer, not {type(value).__name__}")
        if value < low:
            raise bad_argument(f"{name} must be at least {low}, not {value}")
    elif not isinstance(value, kind):
        raise bad_argument(f"{name} must be of type {kind.__name__}, not {type(value).__name__}")
    return value
