"""The workspace file operations, run inside a sandbox: `run(op, args, root, quota_bytes)`.

The ten workspace tools (ls, read_file, write_file, edit_file, insert_file,
delete_file, move_file, clear_files, glob, grep) and the files API's chunked
upload and download (upload_chunk, upload_abort, download_chunk) are ops of this
one function. It runs in the sandbox process that handles a request of kind
"workspace" (a fresh worker outside a session, the session's supervisor inside
one), never in the daemon: whatever a path or a symlink names, it names it in
the sandbox's view, where the host's files are not.

Paths are relative to the workspace root. Absolute paths, paths that climb out
with ``..`` and symlinks whose target resolves outside the root are refused
with an ``InvalidPathError`` naming the path as given. A path is resolved
(`os.path.realpath`) and checked for containment before it is used, and the
resolved path is then opened with O_NOFOLLOW, so that a symlink swapped in
as its last component after the check is refused rather than followed.
delete_file and move_file act on a symlink itself (its directory is what must
lie inside), never on its target. Code running in the same sandbox at the same
moment (a session's background process) could still race a parent directory
into a symlink between check and use; it would reach only what that code can
reach anyway: the sandbox's own view. The sandbox, not this check, is what
keeps the host out; the check keeps a model's paths honest.

Failures raise `WorkspaceError(type_, message)`, whose message a model can act
on; the types the daemon maps for the files RPCs are "InvalidPathError",
"FileNotFoundError" and "WorkspaceFullError". Results are small JSON values,
with a "note" where something was left out.

This file must stay stdlib-only and importable by Python 3.11+ on its own: it is
installed beside _runner.py in every sandbox. It is over 500 lines because it
is thirteen small operations sharing one set of path, quota and text helpers;
split, the sandbox would read more files at every start.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LIMITS", "WorkspaceError", "run"]

DEFAULT_LIMIT = 2000
"""Lines read_file returns when no `limit` is given."""
MAX_LINE_CHARS = 2000
"""Characters of one line read_file shows; the rest is cut with a mark."""
MAX_READ_BYTES = 256 * 1024
"""Bytes of text one read_file returns at most."""
MAX_ENTRIES = 1000
"""Entries ls and glob return at most."""
MAX_MATCHES = 200
"""Matching lines grep returns at most."""
MAX_MATCH_CHARS = 500
"""Characters of one matching line grep shows."""
MAX_GREP_FILE_BYTES = 16 * 1024 * 1024
"""Files larger than this are not searched by grep (said in its note)."""
MAX_CHUNK_BYTES = 4 * 1024 * 1024
"""The largest download_chunk `length`: its base64 must fit a result frame."""
SNIFF_BYTES = 8192
"""Bytes looked at to tell text from binary."""
UPLOAD_PREFIX = ".tooljail-upload-"
"""Hidden temporary file of an upload in progress, in the target's directory."""

LIMITS = {
    "default_limit": DEFAULT_LIMIT,
    "max_line_chars": MAX_LINE_CHARS,
    "max_read_bytes": MAX_READ_BYTES,
    "max_entries": MAX_ENTRIES,
    "max_matches": MAX_MATCHES,
}
"""The bounds, for the tools' descriptions (one source of truth)."""

_UPLOAD_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
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


def _n(count: int, noun: str, plural: str = "") -> str:
    """`count` and `noun`, plural where it is not 1 ("1 line", "3 lines")."""
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


def _invalid_path(message: str) -> WorkspaceError:
    return WorkspaceError("InvalidPathError", message)


def _not_found(path: str, hint: str = "") -> WorkspaceError:
    tail = f" {hint}" if hint else " (ls shows what is there)"
    return WorkspaceError("FileNotFoundError", f"no such file or directory: {path!r}{tail}")


def _bad_argument(message: str) -> WorkspaceError:
    return WorkspaceError("InvalidArgumentError", message)


# --------------------------------------------------------------------------- paths


class _Workspace:
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
            raise _bad_argument(f"{name} must be a string path relative to the workspace")
        if "\0" in path:
            raise _invalid_path(f"{name} {path!r} holds a NUL character")
        if os.path.isabs(path):
            raise _invalid_path(
                f"{name} {path!r} is absolute: paths are relative to the workspace "
                "(e.g. 'data/file.txt'), and nothing outside it can be reached"
            )
        norm = os.path.normpath(path) if path else "."
        if norm == ".." or norm.startswith(".." + os.sep):
            raise _invalid_path(f"{name} {path!r} leaves the workspace: paths must stay inside it")
        if norm == "." and not allow_root:
            raise _invalid_path(f"{name} {path!r} is the workspace itself; name a file in it")
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
            raise _invalid_path(
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
            raise _invalid_path(
                f"{name} {path!r} leads outside the workspace (through a symlink): refused"
            )
        return os.path.join(parent, os.path.basename(norm))

    def make_parents(self, real: str, path: str) -> None:
        """Create the directories above `real` (inside the workspace) as needed."""
        parent = os.path.dirname(real)
        if os.path.isdir(parent):
            return
        if os.path.lexists(parent) and not os.path.isdir(parent):
            raise _invalid_path(f"cannot write {path!r}: a part of its path is not a directory")
        os.makedirs(parent, exist_ok=True)
        if not self.inside(os.path.realpath(parent)):  # a race with a symlink: undo nothing, refuse
            raise _invalid_path(f"{path!r} leads outside the workspace: refused")

    # ----------------------------------------------------------------------- quota

    def usage(self) -> int:
        """Bytes the workspace's regular files hold (their sizes, links not followed)."""
        total = 0
        for top, dirs, files in os.walk(self.root, onerror=None, followlinks=False):
            for name in files + dirs:
                try:
                    st = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
        return total

    def check_room(self, path: str, adding: int, freeing: int = 0) -> None:
        """Refuse a write of `adding` bytes (freeing `freeing`) that would pass the
        quota or the free space of the workspace's file system.

        Raises:
            WorkspaceError: WorkspaceFullError; nothing has been written.
        """
        if self.quota_bytes > 0:
            used = self.usage()
            if used - freeing + adding > self.quota_bytes:
                raise _full(
                    path,
                    f"writing {adding} bytes would pass the workspace quota of "
                    f"{self.quota_bytes} bytes ({used} in use)",
                )
        try:
            vfs = os.statvfs(self.root)
        except OSError:
            return
        free = vfs.f_bavail * vfs.f_frsize
        if adding - freeing > free:
            raise _full(path, f"writing {adding} bytes needs more than the {free} bytes free")


def _full(path: str, why: str) -> WorkspaceError:
    return WorkspaceError(
        "WorkspaceFullError",
        f"{path!r} was not written: {why}. Free space first (delete_file, clear_files).",
    )


def _os_error(exc: OSError, path: str) -> WorkspaceError:
    """An OSError as the model should read it, naming the path as it gave it."""
    code = exc.errno
    if code in _FULL_ERRNOS:
        return _full(path, "the workspace is full")
    if code == errno.ENOENT:
        return _not_found(path)
    if code == errno.ELOOP:
        return _invalid_path(f"{path!r} is a symlink (or changed into one): refused")
    if code in (errno.EISDIR, errno.ENOTDIR):
        return _invalid_path(f"{path!r}: {os.strerror(code)}")
    if code in (errno.EACCES, errno.EPERM):
        return WorkspaceError("PermissionError", f"permission denied: {path!r}")
    if code == errno.ENAMETOOLONG:
        return _invalid_path(f"{path!r}: the name is too long")
    return WorkspaceError("OSError", f"{path!r}: {os.strerror(code or 0) or exc}")


# --------------------------------------------------------------------------- arguments


def _arg(args: dict[str, Any], name: str, kind: type, default: Any = ..., *, low: int = 0) -> Any:
    """Argument `name` of type `kind` (ints: at least `low`); `...`: required."""
    if name not in args or args[name] is None:
        if default is ...:
            raise _bad_argument(f"missing argument {name!r}")
        return default
    value: Any = args[name]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad_argument(f"{name} must be an integer, not {type(value).__name__}")
        if value < low:
            raise _bad_argument(f"{name} must be at least {low}, not {value}")
    elif not isinstance(value, kind):
        raise _bad_argument(f"{name} must be of type {kind.__name__}, not {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- reading


def _open_file(ws: _Workspace, path: str, real: str) -> int:
    """A read descriptor on the regular file `real`, never through a symlink."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_error(exc, path) from None
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise _invalid_path(f"{path!r} is a directory, not a file: use ls to list it")
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _invalid_path(f"{path!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _is_binary(head: bytes) -> bool:
    """Whether `head` (a file's first bytes) is no UTF-8 text: NUL bytes, or bytes
    that do not decode (a multi-byte character cut at the end is still text)."""
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return not (len(head) == SNIFF_BYTES and exc.start >= len(head) - 3)
    return False


_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "PNG image"),
    (0, b"\xff\xd8\xff", "JPEG image"),
    (0, b"GIF8", "GIF image"),
    (0, b"%PDF", "PDF document"),
    (0, b"PK\x03\x04", "ZIP archive (also .docx, .xlsx, .jar, .whl)"),
    (0, b"\x1f\x8b", "gzip-compressed data"),
    (0, b"BZh", "bzip2-compressed data"),
    (0, b"\xfd7zXZ\x00", "xz-compressed data"),
    (0, b"(\xb5/\xfd", "zstd-compressed data"),
    (0, b"7z\xbc\xaf\x27\x1c", "7-zip archive"),
    (0, b"\x7fELF", "ELF executable or library"),
    (0, b"SQLite format 3\x00", "SQLite database"),
    (0, b"PAR1", "Parquet file"),
    (0, b"\x93NUMPY", "NumPy array (.npy)"),
    (0, b"\x89HDF\r\n\x1a\n", "HDF5 file"),
    (0, b"\x00asm", "WebAssembly module"),
    (0, b"ID3", "MP3 audio"),
    (0, b"OggS", "Ogg media"),
    (0, b"fLaC", "FLAC audio"),
    (0, b"BM", "BMP image"),
    (0, b"\xff\xfe", "UTF-16 text (little-endian)"),
    (0, b"\xfe\xff", "UTF-16 text (big-endian)"),
    (4, b"ftyp", "MP4/QuickTime media"),
    (257, b"ustar", "tar archive"),
)


def _guess_type(head: bytes) -> str:
    """A guess of a binary file's type from its magic bytes."""
    if head.startswith(b"RIFF") and len(head) >= 12:
        return {b"WEBP": "WebP image", b"WAVE": "WAV audio", b"AVI ": "AVI video"}.get(
            head[8:12], "RIFF file"
        )
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "Python pickle"
    for offset, magic, name in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    return "unknown binary data"


def _describe_binary(path: str, size: int, head: bytes) -> dict[str, Any]:
    return {
        "path": path,
        "binary": True,
        "size_bytes": size,
        "type": _guess_type(head),
        "note": "Not shown: this is not UTF-8 text. Read it with execute_python_code "
        "(e.g. open(path, 'rb')) or download it.",
    }


def _cut_line(line: str, limit: int, more_bytes: int = 0) -> str:
    """`line` cut at `limit` characters, with a mark saying how much was left
    (`more_bytes`: bytes of the line already left unread)."""
    if len(line) <= limit and not more_bytes:
        return line
    left = len(line[limit:].encode("utf-8", "replace")) + more_bytes
    return f"{line[:limit]}... [line cut: {left} more bytes]"


def _text_lines(text: str, *, keepends: bool = False) -> list[str]:
    """`text`'s lines, ended by newlines only (as read_file numbers them:
    str.splitlines would also split at form feeds and other separators).
    Without `keepends`, a carriage return before the newline goes too."""
    parts = text.split("\n")
    last = parts.pop()
    if keepends:
        lines = [part + "\n" for part in parts]
    else:
        lines = [part.removesuffix("\r") for part in parts]
    if last:
        lines.append(last)
    return lines


def _numbered(first: int, lines: list[str]) -> str:
    return "".join(f"{first + i:6}\t{line}\n" for i, line in enumerate(lines))


_LINE_BYTES = MAX_LINE_CHARS * 4
"""Bytes of one line read into memory: a 1 GB line costs no more than this."""


def _bounded_lines(f: Any) -> Iterator[tuple[bytes, int]]:
    """Each line of binary file `f`: its first `_LINE_BYTES` bytes, and how many
    more bytes (newline excluded) were skipped unread."""
    while True:
        line = f.readline(_LINE_BYTES)
        if not line:
            return
        skipped = 0
        if not line.endswith(b"\n") and len(line) == _LINE_BYTES:
            while rest := f.readline(1 << 16):
                if rest.endswith(b"\n"):
                    skipped += len(rest) - 1
                    break
                skipped += len(rest)
        yield line, skipped


def _lines_left(f: Any) -> int:
    """The number of lines from `f`'s position to its end, counted in blocks."""
    count, last = 0, b"\n"
    while block := f.read(1 << 20):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


def _read_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    offset = _arg(args, "offset", int, 0)
    limit = _arg(args, "limit", int, DEFAULT_LIMIT, low=1)
    fd = _open_file(ws, path, ws.resolve(path))
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(SNIFF_BYTES)
        if _is_binary(head):
            return _describe_binary(path, size, head)
        f.seek(0)
        shown: list[str] = []
        seen = used = 0
        cut_bytes = False
        for raw, skipped in _bounded_lines(f):
            seen += 1
            if seen <= offset:
                continue
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            line = _cut_line(text, MAX_LINE_CHARS, skipped)
            used += len(line.encode("utf-8", "replace")) + 8
            if used > MAX_READ_BYTES and shown:
                cut_bytes = True
                seen -= 1  # this line is not shown: it is one of those left
                total = seen + 1 + _lines_left(f)
                break
            shown.append(line)
            if len(shown) >= limit:
                break
        else:
            total = seen
        if len(shown) >= limit and not cut_bytes:
            total = seen + _lines_left(f)
    return {
        "path": path,
        **page(offset, shown, total, limit, cut_bytes, noun="file", tool="read_file"),
    }


def _read_text(ws: _Workspace, path: str, real: str) -> tuple[str, os.stat_result]:
    """The whole UTF-8 text of a file to be edited, and its stat."""
    fd = _open_file(ws, path, real)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    try:
        return data.decode("utf-8"), st
    except UnicodeDecodeError:
        raise WorkspaceError(
            "NotTextError", f"{path!r} is not UTF-8 text ({len(data)} bytes): it cannot be edited"
        ) from None


# --------------------------------------------------------------------------- writing


def _write_bytes(ws: _Workspace, path: str, real: str, data: bytes, mode: int = 0o644) -> None:
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
        raise _invalid_path(f"{path!r} is a directory, not a file")
    ws.check_room(path, len(data), old.st_size if old is not None else 0)
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
        raise _os_error(exc, path) from None


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _write_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    content = _arg(args, "content", str)
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
    lines = _text_lines(text)
    start = max(1, first_line - around)
    end = min(len(lines), first_line + max(count, 1) - 1 + around)
    return _numbered(start, [_cut_line(s, MAX_LINE_CHARS) for s in lines[start - 1 : end]])


def _edit_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    old = _arg(args, "old_string", str)
    new = _arg(args, "new_string", str)
    if not old:
        raise _bad_argument("old_string is empty: give the exact text to replace")
    if old == new:
        raise _bad_argument("old_string and new_string are the same: nothing would change")
    real = ws.resolve(path)
    text, st = _read_text(ws, path, real)
    count = text.count(old)
    if count == 0:
        raise WorkspaceError(
            "EditMatchError",
            f"old_string matched 0 times in {path!r}: nothing was changed. It must be the "
            "file's exact text, with its whitespace and indentation and without read_file's "
            "line-number prefix: read_file the file and copy it.",
        )
    if count > 1:
        raise WorkspaceError(
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


def _insert_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    offset = _arg(args, "offset", int)
    content = _arg(args, "content", str)
    real = ws.resolve(path)
    text, st = _read_text(ws, path, real)
    lines = _text_lines(text, keepends=True)
    if offset > len(lines):
        raise _bad_argument(
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


# --------------------------------------------------------------------------- entries


def _entry_kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def _entry(name: str, full: str) -> dict[str, Any]:
    st = os.lstat(full)
    kind = _entry_kind(st)
    entry: dict[str, Any] = {"name": name + ("/" if kind == "directory" else ""), "type": kind}
    if kind == "file":
        entry["size_bytes"] = st.st_size
    elif kind == "symlink":
        entry["target"] = os.readlink(full)
    return entry


def _ls(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str, "")
    real = ws.resolve(path, allow_root=True)
    shown = ws.rel(real)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise _os_error(exc, path) from None
    if not stat.S_ISDIR(st.st_mode):
        return {"path": shown, "entries": [_entry(os.path.basename(real), real)]}
    try:
        names = sorted(os.listdir(real))
    except OSError as exc:
        raise _os_error(exc, path) from None
    entries = []
    for name in names[:MAX_ENTRIES]:
        try:
            entries.append(_entry(name, os.path.join(real, name)))
        except OSError:
            continue  # gone since the listing
    result: dict[str, Any] = {"path": shown, "entries": entries}
    if len(names) > MAX_ENTRIES:
        result["note"] = (
            f"Showing {MAX_ENTRIES} of {len(names)} entries (sorted by name); use glob with "
            "a pattern to find the others."
        )
    elif not names:
        result["note"] = "The directory is empty."
    return result


def _delete_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    full = ws.resolve_entry(path)
    try:
        st = os.lstat(full)
    except OSError as exc:
        raise _os_error(exc, path) from None
    try:
        if stat.S_ISDIR(st.st_mode):
            left = len(os.listdir(full))
            if left:
                raise WorkspaceError(
                    "DirectoryNotEmptyError",
                    f"{path!r} is a directory holding {_n(left, 'entry', 'entries')}: nothing "
                    f"was deleted. Empty it with clear_files ({path!r}), then delete_file it.",
                )
            os.rmdir(full)
        else:
            os.unlink(full)
    except OSError as exc:
        raise _os_error(exc, path) from None
    return {"path": path, "deleted": _entry_kind(st)}


def _move_file(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    new_path = _arg(args, "new_path", str)
    source = ws.resolve_entry(path)
    target = ws.resolve_entry(new_path, "new_path")
    if not os.path.lexists(source):
        raise _not_found(path)
    if os.path.lexists(target):
        raise WorkspaceError(
            "FileExistsError",
            f"new_path {new_path!r} already exists: move_file never overwrites. Delete it "
            "first (delete_file) or choose another new_path.",
        )
    if os.path.isdir(source) and (target + os.sep).startswith(source + os.sep):
        raise _invalid_path(f"cannot move the directory {path!r} into itself ({new_path!r})")
    ws.make_parents(target, new_path)
    try:
        os.rename(source, target)
    except OSError as exc:
        raise _os_error(exc, path) from None
    return {"path": path, "new_path": new_path}


def _clear_files(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str, "")
    real = ws.resolve(path, allow_root=True)
    if not os.path.isdir(real):
        if not os.path.lexists(real):
            raise _not_found(path)
        raise _invalid_path(f"{path!r} is not a directory: use delete_file for a file")
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
        raise _os_error(exc, path or ".") from None
    return {
        "path": ws.rel(real),
        "removed_files": files,
        "removed_directories": dirs,
    }


# --------------------------------------------------------------------------- searching


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob (``*``, ``?``, ``[...]``, ``**`` for any directories) as a regex on
    '/'-separated paths relative to the base."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and _class_end(pattern, i) > 0:
            end = _class_end(pattern, i)
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _class_end(pattern: str, start: int) -> int:
    """Where the character class opened at `start` closes; 0: it does not (a literal '[')."""
    i = start + 1
    if pattern[i : i + 1] == "!":
        i += 1
    if pattern[i : i + 1] == "]":
        i += 1  # a ']' first in the class is one of its characters
    end = pattern.find("]", i)
    return max(end, 0)


def _walk(real: str) -> Iterator[tuple[str, bool]]:
    """Every entry below `real`, as (path relative to `real`, is a directory),
    sorted, symlinks not followed."""
    for top, dirs, files in os.walk(real, followlinks=False):
        dirs.sort()
        rel_top = os.path.relpath(top, real)
        prefix = "" if rel_top == "." else rel_top + "/"
        for name in dirs:
            yield prefix + name, not os.path.islink(os.path.join(top, name))
        for name in sorted(files):
            yield prefix + name, False


def _glob(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    pattern = _arg(args, "pattern", str)
    path = _arg(args, "path", str, "")
    if not pattern or os.path.isabs(pattern) or ".." in pattern.split("/"):
        raise _invalid_path(
            f"pattern {pattern!r} must be relative to the searched directory and stay "
            "inside it (no leading '/', no '..')"
        )
    real = ws.resolve(path, allow_root=True)
    if not os.path.isdir(real):
        raise _invalid_path(f"path {path!r} is not a directory")
    regex = _glob_regex(pattern)
    base = ws.rel(real)
    found: list[str] = []
    more = 0
    for rel, is_dir in _walk(real):
        if regex.match(rel):
            if len(found) < MAX_ENTRIES:
                full = rel if base == "." else f"{base}/{rel}"
                found.append(full + ("/" if is_dir else ""))
            else:
                more += 1
    result: dict[str, Any] = {"pattern": pattern, "matches": found}
    if more:
        result["note"] = (
            f"Showing the first {MAX_ENTRIES} of {MAX_ENTRIES + more} matches; narrow the "
            "pattern or the path."
        )
    elif not found:
        result["note"] = "Nothing matches."
    return result


def _grep(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    pattern = _arg(args, "pattern", str)
    path = _arg(args, "path", str, "")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise WorkspaceError(
            "PatternError",
            f"pattern {pattern!r} is not a valid Python regular expression: {exc}",
        ) from None
    real = ws.resolve(path, allow_root=True)
    if os.path.isdir(real):
        base = ws.rel(real)
        files = [
            (rel if base == "." else f"{base}/{rel}") for rel, is_dir in _walk(real) if not is_dir
        ]
    elif os.path.lexists(real):
        files = [ws.rel(real)]
    else:
        raise _not_found(path)
    matches: list[str] = []
    more = searched = 0
    skipped: list[str] = []
    for rel in files:
        full = os.path.join(ws.root, rel)
        try:
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue  # symlinks and others: their targets are found on their own
            if st.st_size > MAX_GREP_FILE_BYTES:
                skipped.append(f"{rel} (larger than {MAX_GREP_FILE_BYTES} bytes)")
                continue
            with os.fdopen(os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
                data = f.read()
        except OSError:
            continue
        if _is_binary(data[:SNIFF_BYTES]):
            continue
        searched += 1
        for number, line in enumerate(_text_lines(data.decode("utf-8", "replace")), 1):
            if regex.search(line):
                if len(matches) < MAX_MATCHES:
                    matches.append(f"{rel}:{number}:{_cut_line(line, MAX_MATCH_CHARS)}")
                else:
                    more += 1
    result: dict[str, Any] = {"pattern": pattern, "matches": matches, "files_searched": searched}
    notes = []
    if more:
        notes.append(
            f"Showing the first {MAX_MATCHES} of {MAX_MATCHES + more} matching lines; "
            "narrow the pattern or the path."
        )
    elif not matches:
        notes.append("No line matches.")
    if skipped:
        notes.append("Not searched: " + ", ".join(skipped[:10]) + ".")
    if notes:
        result["note"] = " ".join(notes)
    return result


# --------------------------------------------------------------------------- files API


def _upload_id(args: dict[str, Any]) -> str:
    upload_id = _arg(args, "upload_id", str)
    if not _UPLOAD_ID.fullmatch(upload_id):
        raise _bad_argument("upload_id must be 1-64 letters, digits, '_' or '-'")
    return str(upload_id)


def _upload_chunk(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    upload_id = _upload_id(args)
    first = _arg(args, "first", bool)
    last = _arg(args, "last", bool)
    try:
        data = base64.b64decode(_arg(args, "data_b64", str), validate=True)
    except binascii.Error:
        raise _bad_argument("data_b64 is not valid base64") from None
    real = ws.resolve(path)
    if os.path.isdir(real):
        raise _invalid_path(f"{path!r} is a directory, not a file")
    tmp = os.path.join(os.path.dirname(real), UPLOAD_PREFIX + upload_id)
    try:
        if first:
            ws.make_parents(real, path)
        elif not os.path.isfile(tmp):
            raise WorkspaceError(
                "UploadError", f"no upload {upload_id!r} of {path!r} is in progress"
            )
        try:
            freeing = os.lstat(real).st_size if os.path.isfile(real) else 0
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
        raise _os_error(exc, path) from None
    except WorkspaceError:
        _remove_quietly(tmp)  # a failed chunk fails the upload: nothing of it stays
        raise
    return {"path": path, "upload_id": upload_id, "received_bytes": size}


def _upload_abort(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    upload_id = _upload_id(args)
    path = _arg(args, "path", str, None)
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


def _download_chunk(ws: _Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = _arg(args, "path", str)
    offset = _arg(args, "offset", int, 0)
    length = _arg(args, "length", int, MAX_CHUNK_BYTES, low=1)
    length = min(length, MAX_CHUNK_BYTES)
    fd = _open_file(ws, path, ws.resolve(path))
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, length, offset)
    except OSError as exc:
        raise _os_error(exc, path) from None
    finally:
        os.close(fd)
    return {
        "data_b64": base64.b64encode(data).decode("ascii"),
        "size_bytes": size,
        "eof": offset + len(data) >= size,
    }


# --------------------------------------------------------------------------- entry point

_OPS: dict[str, tuple[Callable[[_Workspace, dict[str, Any]], Any], frozenset[str]]] = {
    "ls": (_ls, frozenset({"path"})),
    "read_file": (_read_file, frozenset({"path", "offset", "limit"})),
    "write_file": (_write_file, frozenset({"path", "content"})),
    "edit_file": (_edit_file, frozenset({"path", "old_string", "new_string"})),
    "insert_file": (_insert_file, frozenset({"path", "offset", "content"})),
    "delete_file": (_delete_file, frozenset({"path"})),
    "move_file": (_move_file, frozenset({"path", "new_path"})),
    "clear_files": (_clear_files, frozenset({"path"})),
    "glob": (_glob, frozenset({"pattern", "path"})),
    "grep": (_grep, frozenset({"pattern", "path"})),
    "upload_chunk": (
        _upload_chunk,
        frozenset({"path", "upload_id", "data_b64", "first", "last"}),
    ),
    "upload_abort": (_upload_abort, frozenset({"upload_id", "path"})),
    "download_chunk": (_download_chunk, frozenset({"path", "offset", "length"})),
}
"""Each op: its function and the arguments it takes."""


def run(op: str, args: dict[str, Any], root: str, quota_bytes: int) -> Any:
    """Run one workspace op on the workspace at `root`.

    Args:
        op: One of the ten tools' names, or upload_chunk, upload_abort, download_chunk.
        args: The op's arguments (see each op); unknown ones are refused.
        root: The workspace root as this process sees it.
        quota_bytes: The workspace's quota; writes that would pass it are refused.
            0: none known (the file system's free space still holds).

    Returns:
        A JSON value: the op's result.

    Raises:
        WorkspaceError: The op was refused or failed; nothing was half done.
    """
    entry = _OPS.get(op)
    if entry is None:
        raise _bad_argument(f"unknown workspace op {op!r}")
    if not isinstance(args, dict):
        raise _bad_argument("the op's arguments must be an object")
    function, allowed = entry
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise _bad_argument(f"{op} takes no argument {unknown[0]!r}")
    try:
        return function(_Workspace(root, int(quota_bytes or 0)), args)
    except OSError as exc:
        raise _os_error(exc, str(args.get("path", "."))) from None


def page(
    offset: int,
    shown: list[str],
    total: int,
    limit: int,
    cut: bool,
    *,
    noun: str,
    tool: str,
    also: str = "",
) -> dict[str, Any]:
    """A paged read's answer (read_file's, and the daemon's read_artifact's): lines
    `offset + 1`.. of `total`, numbered, and a note of how to read on.

    Args:
        cut: The byte cap ended the page (else `limit` did).
        noun: What is read ("file", "artifact"), for the notes.
        tool: The tool to call again to read on.
        also: Words after the note's "to read on" (another way to go on).
    """
    result: dict[str, Any] = {"content": _numbered(offset + 1, shown), "total_lines": total}
    if not shown:
        result["note"] = (
            f"The {noun} is empty."
            if total == 0
            else f"offset {offset} is past the end: the {noun} has {_n(total, 'line')}."
        )
        return result
    last = offset + len(shown)
    result["lines"] = f"{offset + 1}-{last}"
    if last < total:
        why = f"the {MAX_READ_BYTES // 1024} KiB cap" if cut else f"limit={limit}"
        result["note"] = (
            f"Showing lines {offset + 1}-{last} of {total} ({why}); "
            f"{_n(total - last, 'more line')} left: call {tool} again with offset={last} "
            f"to read on{also}."
        )
    return result
