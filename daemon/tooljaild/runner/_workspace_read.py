"""The workspace ops that read one place: ls, read_file and download_chunk.

With the text helpers they share with the search ops (_workspace_search.py),
the write ops (edit_file reads what it edits) and the daemon's artifact tools
(one way to page and cut text), and the bounds every tool states (`LIMITS`).
Run through `run` in _workspace.py, which says how paths are checked.
Stdlib-only, installed beside _runner.py in every sandbox: see _workspace.py.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator
from typing import Any

try:  # the daemon and its tests: tooljaild.runner._workspace_read
    from . import _workspace_paths as paths
except ImportError:  # a sandbox: a top-level module beside _runner.py, no package
    import _workspace_paths as paths  # type: ignore[import-not-found, no-redef]

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
MAX_CHUNK_BYTES = 4 * 1024 * 1024
"""The largest download_chunk `length`: its base64 must fit a result frame."""
SNIFF_BYTES = 8192
"""Bytes looked at to tell text from binary."""

LIMITS = {
    "default_limit": DEFAULT_LIMIT,
    "max_line_chars": MAX_LINE_CHARS,
    "max_read_bytes": MAX_READ_BYTES,
    "max_entries": MAX_ENTRIES,
    "max_matches": MAX_MATCHES,
}
"""The bounds, for the tools' descriptions (one source of truth)."""


def is_binary(head: bytes) -> bool:
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


def guess_type(head: bytes) -> str:
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
        "type": guess_type(head),
        "note": "Not shown: this is not UTF-8 text. Read it with execute_python_code "
        "(e.g. open(path, 'rb')) or download it.",
    }


def cut_line(line: str, limit: int, more_bytes: int = 0) -> str:
    """`line` cut at `limit` characters, with a mark saying how much was left
    (`more_bytes`: bytes of the line already left unread)."""
    if len(line) <= limit and not more_bytes:
        return line
    left = len(line[limit:].encode("utf-8", "replace")) + more_bytes
    return f"{line[:limit]}... [line cut: {left} more bytes]"


def text_lines(text: str, *, keepends: bool = False) -> list[str]:
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


def numbered(first: int, lines: list[str]) -> str:
    return "".join(f"{first + i:6}\t{line}\n" for i, line in enumerate(lines))


_LINE_BYTES = MAX_LINE_CHARS * 4
"""Bytes of one line read into memory: a 1 GB line costs no more than this."""


def bounded_lines(f: Any) -> Iterator[tuple[bytes, int]]:
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


def lines_left(f: Any) -> int:
    """The number of lines from `f`'s position to its end, counted in blocks."""
    count, last = 0, b"\n"
    while block := f.read(1 << 20):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


def _open_file(ws: paths.Workspace, path: str, real: str) -> int:
    """A read descriptor on the regular file `real`, never through a symlink."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise paths.invalid_path(f"{path!r} is a directory, not a file: use ls to list it")
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise paths.invalid_path(f"{path!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_file(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    offset = paths.arg(args, "offset", int, 0)
    limit = paths.arg(args, "limit", int, DEFAULT_LIMIT, low=1)
    fd = _open_file(ws, path, ws.resolve(path))
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(SNIFF_BYTES)
        if is_binary(head):
            return _describe_binary(path, size, head)
        f.seek(0)
        shown: list[str] = []
        seen = used = 0
        cut_bytes = False
        for raw, skipped in bounded_lines(f):
            seen += 1
            if seen <= offset:
                continue
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            line = cut_line(text, MAX_LINE_CHARS, skipped)
            used += len(line.encode("utf-8", "replace")) + 8
            if used > MAX_READ_BYTES and shown:
                cut_bytes = True
                seen -= 1  # this line is not shown: it is one of those left
                total = seen + 1 + lines_left(f)
                break
            shown.append(line)
            if len(shown) >= limit:
                break
        else:
            total = seen
        if len(shown) >= limit and not cut_bytes:
            total = seen + lines_left(f)
    return {
        "path": path,
        **page(offset, shown, total, limit, cut_bytes, noun="file", tool="read_file"),
    }


def read_text(ws: paths.Workspace, path: str, real: str) -> tuple[str, os.stat_result]:
    """The whole UTF-8 text of a file to be edited, and its stat."""
    fd = _open_file(ws, path, real)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read()
    try:
        return data.decode("utf-8"), st
    except UnicodeDecodeError:
        raise paths.WorkspaceError(
            "NotTextError", f"{path!r} is not UTF-8 text ({len(data)} bytes): it cannot be edited"
        ) from None


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
    result: dict[str, Any] = {"content": numbered(offset + 1, shown), "total_lines": total}
    if not shown:
        result["note"] = (
            f"The {noun} is empty."
            if total == 0
            else f"offset {offset} is past the end: the {noun} has {paths.counted(total, 'line')}."
        )
        return result
    last = offset + len(shown)
    result["lines"] = f"{offset + 1}-{last}"
    if last < total:
        why = f"the {MAX_READ_BYTES // 1024} KiB cap" if cut else f"limit={limit}"
        result["note"] = (
            f"Showing lines {offset + 1}-{last} of {total} ({why}); "
            f"{paths.counted(total - last, 'more line')} left: call {tool} again "
            f"with offset={last} to read on{also}."
        )
    return result


# --------------------------------------------------------------------------- entries


def entry_kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def _entry(name: str, full: str) -> dict[str, Any]:
    st = os.lstat(full)
    kind = entry_kind(st)
    entry: dict[str, Any] = {"name": name + ("/" if kind == "directory" else ""), "type": kind}
    if kind == "file":
        entry["size_bytes"] = st.st_size
    elif kind == "symlink":
        entry["target"] = os.readlink(full)
    return entry


def ls(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str, "")
    real = ws.resolve(path, allow_root=True)
    shown = ws.rel(real)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    if not stat.S_ISDIR(st.st_mode):
        return {"path": shown, "entries": [_entry(os.path.basename(real), real)]}
    try:
        names = sorted(os.listdir(real))
    except OSError as exc:
        raise paths.os_error(exc, path) from None
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


# --------------------------------------------------------------------------- searching


def download_chunk(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    path = paths.arg(args, "path", str)
    offset = paths.arg(args, "offset", int, 0)
    length = paths.arg(args, "length", int, MAX_CHUNK_BYTES, low=1)
    length = min(length, MAX_CHUNK_BYTES)
    fd = _open_file(ws, path, ws.resolve(path))
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, length, offset)
    except OSError as exc:
        raise paths.os_error(exc, path) from None
    finally:
        os.close(fd)
    return {
        "data_b64": base64.b64encode(data).decode("ascii"),
        "size_bytes": size,
        "eof": offset + len(data) >= size,
    }
