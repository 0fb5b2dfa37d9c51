"""The workspace ops that search: glob (names) and grep (lines of text).

Both walk a directory of the workspace without following symlinks and return
at most `MAX_ENTRIES` names or `MAX_MATCHES` lines, saying in a note what was
left out. grep is bounded in time (`GREP_TIMEOUT_S`, even inside one regex
match) and in bytes. Run through `run` in _workspace.py, which says how paths
are checked. Stdlib-only, installed beside _runner.py in every sandbox: see
_workspace.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import time
from collections.abc import Iterator
from typing import Any

try:  # the daemon and its tests: tooljaild.runner._workspace_search
    from . import _workspace_paths as paths
    from ._workspace_read import (
        MAX_ENTRIES,
        MAX_MATCH_CHARS,
        MAX_MATCHES,
        SNIFF_BYTES,
        cut_line,
        is_binary,
        text_lines,
    )
except ImportError:  # a sandbox: top-level modules beside _runner.py, no package
    import _workspace_paths as paths  # type: ignore[import-not-found, no-redef]
    from _workspace_read import (  # type: ignore[import-not-found, no-redef]
        MAX_ENTRIES,
        MAX_MATCH_CHARS,
        MAX_MATCHES,
        SNIFF_BYTES,
        cut_line,
        is_binary,
        text_lines,
    )

MAX_GREP_FILE_BYTES = 16 * 1024 * 1024
"""Files larger than this are not searched by grep (said in its note)."""
MAX_GREP_TOTAL_BYTES = 256 * 1024 * 1024
"""Bytes grep searches at most in one call (the rest is named in its note)."""
GREP_TIMEOUT_S = 5.0
"""How long one grep may search; past it, a PatternTimeoutError (the session lives on)."""
MAX_PATTERN_CHARS = 4096
"""The longest pattern grep takes."""


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


def glob(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    pattern = paths.arg(args, "pattern", str)
    path = paths.arg(args, "path", str, "")
    if not pattern or os.path.isabs(pattern) or ".." in pattern.split("/"):
        raise paths.invalid_path(
            f"pattern {pattern!r} must be relative to the searched directory and stay "
            "inside it (no leading '/', no '..')"
        )
    real = ws.resolve(path, allow_root=True)
    if not os.path.isdir(real):
        raise paths.invalid_path(f"path {path!r} is not a directory")
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


class _Expired(Exception):
    """grep's time bound passed (raised from the SIGALRM handler)."""


@contextlib.contextmanager
def _time_bound(seconds: float) -> Iterator[None]:
    """Raise `_Expired` in this block once `seconds` pass, even inside one regex
    match (the `re` engine checks for signals as it backtracks). Only in the main
    thread (where signals are handled); the caller also checks the clock between
    lines, which bounds everything but one line."""

    def expire(signum: int, frame: Any) -> None:
        raise _Expired

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread: the clock checks alone
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def grep(ws: paths.Workspace, args: dict[str, Any]) -> dict[str, Any]:
    pattern = paths.arg(args, "pattern", str)
    path = paths.arg(args, "path", str, "")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise paths.WorkspaceError(
            "PatternError",
            f"the pattern is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS}",
        )
    try:
        with _time_bound(GREP_TIMEOUT_S):
            return _grep(ws, pattern, path, time.monotonic() + GREP_TIMEOUT_S)
    except _Expired:
        raise paths.WorkspaceError(
            "PatternTimeoutError",
            f"grep stopped after {GREP_TIMEOUT_S:g}s: pattern {cut_line(pattern, 200)!r} is "
            "too slow on these files (nested quantifiers such as '(a+)+' can take "
            "exponential time). Simplify the pattern or search a narrower path.",
        ) from None


def _grep(ws: paths.Workspace, pattern: str, path: str, deadline: float) -> dict[str, Any]:
    try:
        regex = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise paths.WorkspaceError(
            "PatternError",
            f"pattern {cut_line(pattern, 200)!r} is not a valid Python regular expression: {exc}",
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
        raise paths.not_found(path)
    matches: list[str] = []
    more = searched = total = 0
    skipped: list[str] = []
    for rel in files:
        if total >= MAX_GREP_TOTAL_BYTES:
            skipped.append(f"the rest (past {MAX_GREP_TOTAL_BYTES} bytes searched)")
            break
        full = os.path.join(ws.root, rel)
        try:
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode):
                continue  # symlinks and others: their targets are found on their own
            if st.st_size > MAX_GREP_FILE_BYTES:
                skipped.append(f"{rel} (larger than {MAX_GREP_FILE_BYTES} bytes)")
                continue
            # O_NONBLOCK and a check of what was opened: a FIFO swapped in after
            # the lstat must never block the search (it would block the session).
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                data = f.read(MAX_GREP_FILE_BYTES + 1)
        except OSError:
            continue
        if is_binary(data[:SNIFF_BYTES]):
            continue
        searched += 1
        total += len(data)
        for number, line in enumerate(text_lines(data.decode("utf-8", "replace")), 1):
            if regex.search(line):
                if len(matches) < MAX_MATCHES:
                    matches.append(f"{rel}:{number}:{cut_line(line, MAX_MATCH_CHARS)}")
                else:
                    more += 1
            if not number % 1024 and time.monotonic() > deadline:
                raise _Expired
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
