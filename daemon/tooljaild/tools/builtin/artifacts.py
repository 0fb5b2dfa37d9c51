"""The artifact tools: a model reads what its calls made, a page at a time.

OmniCoreAgent's names and arguments: `read_artifact` (`artifact_id`,
`offset`/`limit` in lines), `tail_artifact` (`artifact_id`, `lines`),
`search_artifact` (`artifact_id`, `pattern`: a regular expression, run with RE2
in linear time, see `artifacts.pattern`) and
`list_artifacts` (optionally of one `call_id` or `session_id`). They run in the
daemon (`tooljaild.tools.in_daemon`): the store is the daemon's, and nothing of it
enters a sandbox.

Each reads the store as the calling client (`DaemonCall.client`): another
client's id is "not found", like an id never made; a gone one says why. Every
answer is bounded in lines and bytes, with a note of what is left and how to
read on, like the workspace's read_file and grep (whose limits and line
helpers these share: `runner._workspace_read`). A binary artifact (a plot) is
described, never dumped.

Memory: an artifact is read from its file by seeking and in bounded lines,
never whole (a 1 GiB output costs the daemon a few blocks); `tail_artifact`
reads backwards in blocks. The reading runs on a worker thread so that a
search through a big artifact does not stall the event loop, and stops at its
next line when the call is stopped (a thread cannot be cancelled: it is asked).
The store itself (its SQLite index) is used on the event loop only, as it asks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from tooljail.errors import (
    ArtifactGoneError,
    ArtifactNotFoundError,
    InvalidRequestError,
    TooljailError,
)
from tooljail.types import ArtifactInfo
from tooljaild.artifacts.pattern import BadPattern, Pattern, too_long
from tooljaild.runner._workspace_paths import counted
from tooljaild.runner._workspace_read import (
    DEFAULT_LIMIT,
    MAX_LINE_CHARS,
    MAX_MATCH_CHARS,
    MAX_MATCHES,
    MAX_READ_BYTES,
    SNIFF_BYTES,
    bounded_lines,
    cut_line,
    guess_type,
    is_binary,
    lines_left,
    numbered,
    page,
)
from tooljaild.tools.in_daemon import DaemonCall, Handler, ToolFailure
from tooljaild.tools.registry import Tool

if TYPE_CHECKING:
    from tooljaild.artifacts.store import ArtifactStore

__all__ = [
    "ARTIFACT_TOOLS",
    "ARTIFACT_TOOL_RUNS",
    "MAX_LISTED",
    "MAX_TAIL_LINES",
    "gone",
    "list_artifacts",
    "locate",
    "read_artifact",
    "search_artifact",
    "tail_artifact",
]

MAX_TAIL_LINES = DEFAULT_LIMIT
"""Lines tail_artifact returns at most."""
DEFAULT_TAIL_LINES = 100
MAX_LISTED = 200
"""Artifacts list_artifacts describes per page (newest first)."""
_BLOCK = 64 * 1024
"""Bytes read at a time when reading backwards."""
_TAIL_SCAN_BYTES = 2 * MAX_READ_BYTES
"""Bytes tail_artifact reads back at most: a last line of 1 GiB costs no more."""

_T = TypeVar("_T")


class _Stopped(TooljailError):
    """The call was stopped while its reading ran on a thread (no one reads it: the
    call has ended)."""


# ------------------------------------------------------------------ shared


def locate(call: DaemonCall) -> tuple[ArtifactInfo, Path]:
    """The call's `artifact_id`: its description and file, read as the caller.

    Raises:
        ToolFailure: The daemon keeps no artifacts, or the id is unknown to
            this client (another client's too), or the artifact is gone.
    """
    artifact_id = str(call.arguments["artifact_id"])
    store = _store(call)
    try:
        return store.get(artifact_id, call.client), store.path(artifact_id, call.client)
    except ArtifactNotFoundError:
        raise ToolFailure(
            "ArtifactNotFound",
            f"No artifact {artifact_id[:80]!r} of yours is known to this daemon: check the id "
            "(call list_artifacts to see the artifacts your calls made).",
        ) from None
    except ArtifactGoneError as exc:
        raise gone(artifact_id, exc.reason) from None


def _store(call: DaemonCall) -> ArtifactStore:
    store = call.services.artifacts
    if store is None:
        raise ToolFailure(
            "ArtifactsUnavailable", "This daemon keeps no artifacts: there is nothing to read."
        )
    return store


def gone(artifact_id: str, reason: str) -> ToolFailure:
    why = {
        "evicted": "it was evicted to make room for newer ones (the store's size bound)",
        "expired": "it expired (the store's age bound)",
        "deleted": "it was deleted",
    }.get(reason, "it was removed")
    return ToolFailure(
        "ArtifactGone",
        f"Artifact {artifact_id[:80]!r} is gone: {why}. Its content cannot be read any "
        "more; run the call that made it again if you need it.",
    )


async def _in_thread(call: DaemonCall, read: Callable[[threading.Event], _T]) -> _T:
    """`read(stop)` on a worker thread; `stop` is set when the call is stopped.

    Raises:
        ToolFailure: The artifact's file went (evicted) before it was opened.
    """
    stop = threading.Event()
    try:
        return await asyncio.to_thread(read, stop)
    except asyncio.CancelledError:
        stop.set()  # the thread ends at its next line; nothing waits for it
        raise
    except FileNotFoundError:
        raise gone(str(call.arguments["artifact_id"]), "evicted") from None


def _head(info: ArtifactInfo) -> dict[str, Any]:
    return {
        "artifact_id": info.artifact_id,
        "name": info.name,
        "mime_type": info.mime_type,
        "size_bytes": info.size_bytes,
    }


def _binary(info: ArtifactInfo, f: IO[bytes]) -> dict[str, Any] | None:
    """A description of the artifact if it is no text (an image: never dumped), else None."""
    head = f.read(SNIFF_BYTES)
    f.seek(0)
    binary = is_binary(head)
    media = info.mime_type.startswith(("image/", "audio/", "video/"))
    if not binary and (not media or info.mime_type == "image/svg+xml"):
        return None  # SVG is text a model can read
    kind = guess_type(head) if binary else info.mime_type
    return {
        "binary": True,
        "type": kind,
        "note": f"Not shown: this artifact is {kind} ({info.mime_type}, "
        f"{counted(info.size_bytes, 'byte')}), not text. Its owner can fetch it whole with "
        "the SDK's get_artifact or `tooljail artifacts get`, or pass it to upload_file.",
    }


def _lines_of(f: IO[bytes], stop: threading.Event) -> Iterator[tuple[str, int]]:
    """Each line of `f` as text (cut at `MAX_LINE_CHARS`, marked) and its bytes in the file."""
    for raw, skipped in bounded_lines(f):
        if stop.is_set():
            raise _Stopped("the call was stopped")
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        yield cut_line(text, MAX_LINE_CHARS, skipped), len(raw) + skipped


def _compile(pattern: str, max_bytes: int) -> Pattern:
    """`pattern` compiled (on the worker thread: it costs time in its size).

    Raises:
        ToolFailure: It cannot be searched with (`BadPattern`'s reason).
    """
    try:
        return Pattern(pattern, max_bytes)
    except BadPattern as exc:
        kind = "UnsupportedPattern" if exc.unsupported else "InvalidPattern"
        raise ToolFailure(kind, str(exc)) from None


def _int(call: DaemonCall, key: str, default: int) -> int:
    value = call.arguments.get(key)
    return default if value is None else int(value)


# ------------------------------------------------------------------ the tools


async def read_artifact(call: DaemonCall) -> dict[str, Any]:
    """`limit` numbered lines of the artifact from line `offset` + 1, bounded in bytes."""
    info, path = locate(call)
    offset = _int(call, "offset", 0)
    limit = _int(call, "limit", DEFAULT_LIMIT)

    def read(stop: threading.Event) -> dict[str, Any]:
        with path.open("rb") as f:
            described = _binary(info, f)
            if described is not None:
                return described
            shown: list[str] = []
            seen = used = 0
            cut_bytes = False
            lines = _lines_of(f, stop)
            for line, _ in lines:
                seen += 1
                if seen <= offset:
                    continue
                used += len(line.encode("utf-8", "replace")) + 8
                if used > MAX_READ_BYTES and shown:
                    cut_bytes, seen = True, seen - 1  # this line is one of those left
                    break
                shown.append(line)
                if len(shown) >= limit:
                    break
            else:
                return _page(offset, shown, seen, limit, cut_bytes)
            return _page(offset, shown, seen + cut_bytes + lines_left(f), limit, cut_bytes)

    return {**_head(info), **await _in_thread(call, read)}


def _page(offset: int, shown: list[str], total: int, limit: int, cut: bool) -> dict[str, Any]:
    """read_artifact's answer: lines `offset + 1`.. of `total`, and how to read on."""
    return page(
        offset, shown, total, limit, cut,
        noun="artifact", tool="read_artifact", also=", or search_artifact to find a line",
    )  # fmt: skip


async def tail_artifact(call: DaemonCall) -> dict[str, Any]:
    """The artifact's last `lines` lines, numbered, read backwards in blocks."""
    info, path = locate(call)
    want = min(_int(call, "lines", DEFAULT_TAIL_LINES), MAX_TAIL_LINES)

    def read(stop: threading.Event) -> dict[str, Any]:
        with path.open("rb") as f:
            described = _binary(info, f)
            if described is not None:
                return described
            size = f.seek(0, 2)
            data, start = _read_back(f, size, want, stop)
            total = _count_lines(f, stop)
        pieces = data.split(b"\n")
        if pieces and pieces[-1] == b"":
            pieces.pop()  # the last line's newline ends it; it starts no line
        partial = start > 0  # the first piece may be the end of a longer line
        if partial and len(pieces) > 1:
            pieces.pop(0)
        pieces = pieces[-want:]
        shown: list[str] = []
        used = 0
        for raw in reversed(pieces):
            line = cut_line(raw.decode("utf-8", "replace").rstrip("\r"), MAX_LINE_CHARS)
            used += len(line.encode("utf-8", "replace")) + 8
            if used > MAX_READ_BYTES and shown:
                break
            shown.append(line)
        shown.reverse()
        first = total - len(shown) + 1
        tail: dict[str, Any] = {"content": numbered(first, shown), "total_lines": total}
        if not shown:
            tail["note"] = "The artifact is empty."
            return tail
        tail["lines"] = f"{first}-{total}"
        if first > 1:
            tail["note"] = (
                f"Showing the last {counted(len(shown), 'line')} of {total}"
                + (" (the byte cap)" if len(shown) < min(want, total) else "")
                + f"; read_artifact with offset={max(0, first - 1 - DEFAULT_LIMIT)} reads "
                "the lines before them."
            )
        return tail

    return {**_head(info), **await _in_thread(call, read)}


def _read_back(f: IO[bytes], size: int, want: int, stop: threading.Event) -> tuple[bytes, int]:
    """The end of `f` holding its last `want` lines (or `_TAIL_SCAN_BYTES`), and where it starts."""
    blocks: list[bytes] = []
    start = size
    newlines = 0
    # A final newline ends the last line: one more is needed to see `want` whole lines.
    while start > 0 and size - start < _TAIL_SCAN_BYTES:
        if stop.is_set():
            raise _Stopped("the call was stopped")
        step = min(_BLOCK, start)
        start -= step
        f.seek(start)
        block = f.read(step)
        blocks.append(block)
        newlines += block.count(b"\n")
        if newlines > want:
            break
    return b"".join(reversed(blocks)), start


def _count_lines(f: IO[bytes], stop: threading.Event) -> int:
    """The lines of `f` (a last one without a newline counts), in blocks."""
    f.seek(0)
    count, last = 0, b"\n"
    while block := f.read(1 << 20):
        if stop.is_set():
            raise _Stopped("the call was stopped")
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


async def search_artifact(call: DaemonCall) -> dict[str, Any]:
    """The artifact's lines matching `pattern` (RE2), numbered, at most `MAX_MATCHES`.

    The pattern's size is checked first, on the loop (a length: cheap); it is
    compiled and run on the worker thread, in time linear in its size and the
    text's (`artifacts.pattern`), so no pattern stalls the loop or outlives the
    call's timeout by more than a line.
    """
    pattern = str(call.arguments["pattern"])
    store = _store(call)
    limit = store.settings.max_search_pattern_bytes
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ToolFailure("PatternTooLong", too_long(size, limit))
    info, path = locate(call)

    def search(stop: threading.Event) -> dict[str, Any]:
        regex = _compile(pattern, limit)
        with path.open("rb") as f:
            described = _binary(info, f)
            if described is not None:
                return {**described, "note": described["note"] + " It cannot be searched."}
            matches: list[str] = []
            found = 0
            number = 0
            for number, (line, _) in enumerate(_lines_of(f, stop), 1):
                if regex.search(line.encode("utf-8", "surrogatepass")):
                    found += 1
                    if len(matches) < MAX_MATCHES:
                        matches.append(f"{number}:{cut_line(line, MAX_MATCH_CHARS)}")
        answer: dict[str, Any] = {
            "pattern": pattern,
            "matches": "\n".join(matches),
            "match_count": found,
            "total_lines": number,
        }
        if found > len(matches):
            answer["note"] = (
                f"Showing the first {len(matches)} of {found} matching lines; narrow the "
                "pattern, or read_artifact with offset=<line - 1> around a match to see more."
            )
        elif not found:
            answer["note"] = f"No line of {counted(number, 'line')} matches."
        return answer

    return {**_head(info), **await _in_thread(call, search)}


async def list_artifacts(call: DaemonCall) -> dict[str, Any]:
    """A page of the caller's kept artifacts, newest first, of one call or session if asked.

    A page costs the loop time in its size (`MAX_LISTED`), never in the store's.
    """
    store = _store(call)
    try:
        page = store.page(
            call.client,
            call_id=str(call.arguments.get("call_id") or ""),
            session_id=str(call.arguments.get("session_id") or ""),
            page_size=MAX_LISTED,
            page_token=str(call.arguments.get("page_token") or ""),
        )
    except InvalidRequestError as exc:
        raise ToolFailure("InvalidPageToken", str(exc)) from None
    listed = [
        {
            "artifact_id": i.artifact_id,
            "name": i.name,
            "mime_type": i.mime_type,
            "size_bytes": i.size_bytes,
            "call_id": i.call_id,
            "session_id": i.session_id,
            "tool": i.tool,
            "source": i.source,
            "created_unix": i.created_unix,
        }
        for i in page.artifacts
    ]
    answer: dict[str, Any] = {"artifacts": listed, "count": len(listed)}
    if page.next_page_token:
        answer["next_page_token"] = page.next_page_token
        answer["note"] = (
            f"Showing {len(listed)} artifacts; there are older ones: call list_artifacts "
            f"with page_token={page.next_page_token!r} for the next page, or pass call_id "
            "or session_id to list those of one call or session."
        )
    elif not listed:
        answer["note"] = (
            "No artifact of yours is kept (for this call or session if named)."
            if not call.arguments.get("page_token")
            else "No more artifacts: this was the last page."
        )
    return answer


# ------------------------------------------------------------------ descriptions

_ID = {
    "type": "string",
    "minLength": 1,
    "description": "The artifact's id, as a result or list_artifacts names it.",
}


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Tool:
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return Tool(
        name=name, description=description, input_schema=schema, source="builtin", builtin=name
    )


ARTIFACT_TOOLS: tuple[Tool, ...] = (
    _tool(
        "read_artifact",
        "Read an artifact (a large output or result a call of yours stored instead of "
        "returning it whole; its id is in that call's result) as numbered lines: `limit` "
        f"lines from line `offset` + 1, at most {MAX_READ_BYTES // 1024} KiB per call. The "
        "answer says how many lines are left and the offset to read on with. Images and "
        "other binary artifacts are described, not shown.",
        {
            "artifact_id": _ID,
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Lines to skip from the start (0: from the first line).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "default": DEFAULT_LIMIT,
                "description": "Lines to return at most.",
            },
        },
        ["artifact_id"],
    ),
    _tool(
        "tail_artifact",
        "Show the last lines of an artifact (e.g. the end of a long output, where errors "
        "usually are), numbered as read_artifact numbers them.",
        {
            "artifact_id": _ID,
            "lines": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TAIL_LINES,
                "default": DEFAULT_TAIL_LINES,
                "description": "How many lines from the end.",
            },
        },
        ["artifact_id"],
    ),
    _tool(
        "search_artifact",
        "Find the lines of an artifact that match a regular expression (RE2: Python's "
        "syntax without backreferences or lookaround); returns "
        f"them as `line_number:text` (at most {MAX_MATCHES}) and how many matched in all. "
        "Read around a match with read_artifact (offset = line number - 1).",
        {
            "artifact_id": _ID,
            "pattern": {
                "type": "string",
                "minLength": 1,
                "description": "A regular expression (RE2 syntax, searched in each line); "
                "escape special characters to find them literally. At most "
                "[artifacts] max_search_pattern_bytes (4096 by default) bytes.",
            },
        },
        ["artifact_id", "pattern"],
    ),
    _tool(
        "list_artifacts",
        "List the artifacts your calls made and that are still kept (newest first, "
        f"{MAX_LISTED} a page): id, name, MIME type, size, and the call and session that "
        "made each. When there are more, the answer's next_page_token reads on.",
        {
            "call_id": {
                "type": "string",
                "description": "Only the artifacts of this call.",
            },
            "session_id": {
                "type": "string",
                "description": "Only the artifacts of this session's calls.",
            },
            "page_token": {
                "type": "string",
                "maxLength": 64,
                "description": "The next_page_token of the answer before (none: the newest).",
            },
        },
        [],
    ),
)
"""The artifact tools, served by every daemon."""

ARTIFACT_TOOL_RUNS: dict[str, Handler] = {
    "read_artifact": read_artifact,
    "tail_artifact": tail_artifact,
    "search_artifact": search_artifact,
    "list_artifacts": list_artifacts,
}
"""Each artifact tool's in-daemon handler, by name."""
