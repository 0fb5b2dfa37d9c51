"""The workspace ops that change files: write_file, edit_file, insert_file,
delete_file, move_file, clear_files, and the files API's upload_chunk and
upload_abort.

Every write is checked against the quota first and lands whole or not at all (a
hidden file beside the target, then a rename). Run through `run` in
_workspace.py, which says how paths are checked. Stdlib-only, installed beside
_runner.py in every sandbox: see _workspace.py.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import stat
from typing import Any

try:  # the daemon and its tests: tooljaild.runner._workspace_write
    from . import _workspace_paths as paths
    from . import _workspace_read as read
except ImportError:  # a sandbox: top-level modules beside _runner.py, no package
    import _workspace_paths as paths  # type: ignore[import-not-found, no-redef]
    import _workspace_read as read  # type: ignore[import-not-found, no-redef]

UPLOAD_PREFIX = ".tooljail-upload-"
"""Hidden temporary file of an upload in progress, in the target's directory."""

_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


# --------------------------------------------------------------------------- writing


def _write_bytes(ws: paths.Workspace, path: str, real: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `real` with `data` atomically: a hidden file beside it, then a rename.

    Raises:
        WorkspaceError: WorkspaceFullError (checked first, and for ENOSPC, EDQUOT
            and EFBIG while writing: the target is then left as it was).
    """
    try:
        old = os.lstat(real)
    except FileNotFoundError:
        old = None
    if old is not None and stat.S_ISDIR(old.st_mode):
        raise paths.invalid_path(f"{path!r} is a directory, not a file")
    ws.check_room(path, len(data), paths.held(old) if old is not None else 0)
    ws.make_parents(real, path)
    directory, name = os.path.split(real)
    tmp = os.path.join(directory, f".{name}.tooljail-{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, real)
    except OSError as exc:
        _remove_quietly(tmp)
        raise paths.os_error(exc, path) from None


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    content = paths.arg(args, "content", str)
    real = ws.resolve(path)
    created = not os.path.lexists(real)
    data = content.encode("utf-8", "replace")
    _write_bytes(ws, path, real, data)
    return {
        "path": path,
        "created": created,
        "size_bytes": len(data),
        "lines": content.count("\n") + (0 if content.endswith("\n") or not content else 1),
    }


def _snippet(text: str, first_line: int, count: int, around: int = 3) -> str:
    """Numbered lines `first_line`..+`count` of `text` (1-based) with `around` more each side."""
    lines = read.text_lines(text)
    start = max(1, first_line - around)
    end = min(len(lines), first_line + max(count, 1) - 1 + around)
    return read.numbered(
        start, [read.cut_line(s, read.MAX_LINE_CHARS) for s in lines[start - 1 : end]]
    )


def edit_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    old = paths.arg(args, "old_string", str)
    new = paths.arg(args, "new_string", str)
    if not old:
        raise paths.bad_argument("old_string is empty: give the exact text to replace")
    if old == new:
        raise paths.bad_argument("old_string and new_string are the same: nothing would change")
    real = ws.resolve(path)
    text, st = read.read_text(ws, path, real)
    count = text.count(old)
    if count == 0:
        raise paths.WorkspaceError(
            "EditMatchError",
            f"old_string matched 0 times in {path!r}: nothing was changed. It must be the "
            "file's exact text, with its whitespace and indentation and without read_file's "
            "line-number prefix: read_file the file and copy it.",
        )
    if count > 1:
        raise paths.WorkspaceError(
            "EditMatchError",
            f"old_string matched {count} times in {path!r}: nothing was changed. It must "
            "match exactly once: include more of the surrounding lines to make it unique.",
        )
    at = text.index(old)
    edited = text[:at] + new + text[at + len(old) :]
    _write_bytes(ws, path, real, edited.encode("utf-8"), stat.S_IMODE(st.st_mode))
    line = text.count("\n", 0, at) + 1
    return {
        "path": path,
        "line": line,
        "size_bytes": len(edited.encode("utf-8")),
        "snippet": _snippet(edited, line, new.count("\n") + 1),
    }


def insert_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    offset = paths.arg(args, "offset", int)
    content = paths.arg(args, "content", str)
    real = ws.resolve(path)
    text, st = read.read_text(ws, path, real)
    lines = read.text_lines(text, keepends=True)
    if offset > len(lines):
        raise paths.bad_argument(
            f"offset {offset} is past the end of {path!r}, which has {len(lines)} lines: "
            f"use offset={len(lines)} to append at the end"
        )
    if lines and not lines[-1].endswith("\n") and offset == len(lines):
        lines[-1] += "\n"  # appending after a last line without its newline
    if content and not content.endswith("\n") and offset < len(lines):
        content += "\n"  # the lines after it stay lines of their own
    edited = "".join(lines[:offset]) + content + "".join(lines[offset:])
    _write_bytes(ws, path, real, edited.encode("utf-8"), stat.S_IMODE(st.st_mode))
    added = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
    return {
        "path": path,
        "inserted_lines": added,
        "at_line": offset + 1,
        "size_bytes": len(edited.encode("utf-8")),
        "snippet": _snippet(edited, offset + 1, added),
    }


def delete_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    full = ws.resolve_entry(path)
    try:
        st = os.lstat(full)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    try:
        if stat.S_ISDIR(st.st_mode):
            left = len(os.listdir(full))
            if left:
                raise paths.WorkspaceError(
                    "DirectoryNotEmptyError",
                    f"{path!r} is a directory holding {paths.counted(left, 'entry', 'entries')}: "
                    f"nothing was deleted. Empty it with clear_files ({path!r}), then "
                    "delete_file it.",
                )
            os.rmdir(full)
        else:
            os.unlink(full)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    return {"path": path, "deleted": read.entry_kind(st)}


def move_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    new_path = paths.arg(args, "new_path", str)
    source = ws.resolve_entry(path)
    target = ws.resolve_entry(new_path, "new_path")
    if not os.path.lexists(source):
        raise paths.not_found(path)
    if os.path.lexists(target):
        raise paths.WorkspaceError(
            "FileExistsError",
            f"new_path {new_path!r} already exists: move_file never overwrites. Delete it "
            "first (delete_file) or choose another new_path.",
        )
    if os.path.isdir(source) and (target + os.sep).startswith(source + os.sep):
        raise paths.invalid_path(f"cannot move the directory {path!r} into itself ({new_path!r})")
    ws.make_parents(target, new_path)
    try:
        os.rename(source, target)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    return {"path": path, "new_path": new_path}


def clear_files(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str, "")
    real = ws.resolve(path, allow_root=True)
    if not os.path.isdir(real):
        if not os.path.lexists(real):
            raise paths.not_found(path)
        raise paths.invalid_path(f"{path!r} is not a directory: use delete_file for a file")
    files = dirs = 0
    try:
        for top, subdirs, names in os.walk(real, topdown=False, followlinks=False):
            for name in names:
                os.unlink(os.path.join(top, name))
                files += 1
            for name in subdirs:
                full = os.path.join(top, name)
                if os.path.islink(full):
                    os.unlink(full)  # a link to a directory: the link goes, never its target
                    files += 1
                else:
                    os.rmdir(full)
                    dirs += 1
    except OSError as exc:
        raise paths.os_error(exc, path or ".") from None
    return {
        "path": ws.rel(real),
        "removed_files": files,
        "removed_directories": dirs,
    }


# --------------------------------------------------------------------------- files API


def _upload_id(args: dict[str, Any]) -> str:
    upload_id = paths.arg(args, "upload_id", str)
    if not _UPLOAD_ID.fullmatch(upload_id):
        raise paths.bad_argument("upload_id must be 1-64 letters, digits, '_' or '-'")
    return str(upload_id)


def upload_chunk(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    upload_id = _upload_id(args)
    first = paths.arg(args, "first", bool)
    last = paths.arg(args, "last", bool)
    try:
        data = base64.b64decode(paths.arg(args, "data_b64", str), validate=True)
    except binascii.Error:
        raise paths.bad_argument("data_b64 is not valid base64") from None
    real = ws.resolve(path)
    if os.path.isdir(real):
        raise paths.invalid_path(f"{path!r} is a directory, not a file")
    tmp = os.path.join(os.path.dirname(real), UPLOAD_PREFIX + upload_id)
    try:
        if first:
            ws.make_parents(real, path)
        elif not os.path.isfile(tmp):
            raise paths.WorkspaceError(
                "UploadError", f"no upload {upload_id!r} of {path!r} is in progress"
            )
        try:
            freeing = paths.held(os.lstat(real)) if os.path.isfile(real) else 0
        except OSError:
            freeing = 0
        ws.check_room(path, len(data), freeing)
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_CREAT | os.O_TRUNC if first else os.O_APPEND
        fd = os.open(tmp, flags, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if last:
            os.replace(tmp, real)
            return {"path": path, "size_bytes": size}
    except OSError as exc:
        _remove_quietly(tmp)
        raise paths.os_error(exc, path) from None
    except paths.WorkspaceError:
        _remove_quietly(tmp)  # a failed chunk fails the upload: nothing of it stays
        raise
    return {"path": path, "upload_id": upload_id, "received_bytes": size}


def upload_abort(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    upload_id = _upload_id(args)
    path = paths.arg(args, "path", str, None)
    name = UPLOAD_PREFIX + upload_id
    if path is not None:
        candidates = [os.path.join(os.path.dirname(ws.resolve(path)), name)]
    else:
        candidates = [
            os.path.join(top, name)
            for top, _, files in os.walk(ws.root, followlinks=False)
            if name in files
        ]
    removed = 0
    for tmp in candidates:
        if os.path.isfile(tmp) and not os.path.islink(tmp):
            _remove_quietly(tmp)
            removed += 1
    return {"upload_id": upload_id, "removed": removed > 0}
