"""The workspace file tools: ten built-ins that work on the files of a workspace.

Their names are the ones OmniCoreAgent reserves for them (ls, read_file,
write_file, edit_file, insert_file, delete_file, move_file, clear_files, glob,
grep). Each runs as a request of kind "workspace" inside the sandbox (a fresh
one outside a session, the session's own inside one), where the runner calls
`_workspace.run(op, args, root, quota_bytes)` (runner/_workspace.py): the
daemon never touches a workspace path, so no path and no symlink can reach
the host. The op's JSON value is the call's result data.

`builtin_tools` serves these Tools and their `BuiltinRun` entries (built there
from `workspace_payload`: this module imports nothing of `builtin_tools`, which
imports it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tooljaild.runner._workspace import LIMITS
from tooljaild.sandbox.backends import Promises
from tooljaild.tools.registry import Tool

__all__ = [
    "FRESH_WORKSPACE",
    "NOTHING_PERSISTS",
    "WORKSPACE_TOOL_NAMES",
    "workspace_payload",
    "workspace_tools",
]

FRESH_WORKSPACE = (
    "Outside a session each call works on a fresh, empty workspace of its own and "
    "nothing it writes persists; in a session the workspace and its files are kept "
    "between calls."
)
"""The sentence every workspace tool's description ends with."""
NOTHING_PERSISTS = (
    "This call ran outside a session, on a fresh workspace of its own that is gone now: "
    "nothing it wrote persists. Create a session to keep files between calls."
)
"""What a workspace tool's result says when its call had no session (the call
manager adds it to the result's message)."""

_PATH = (
    "Path relative to the workspace root, e.g. 'data/notes.txt'. Absolute paths and "
    "paths leaving the workspace ('..', symlinks pointing outside) are refused."
)
_DIR = "Directory relative to the workspace root; '' or omitted: the workspace root."


def _schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _lines(description: str, minimum: int, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "description": description}
    if default is not None:
        schema["default"] = default
    return schema


_TOOLS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "ls",
        "List a directory of the workspace: each entry's name (directories end with '/'), "
        "type, and size in bytes for files; a symlink shows its target. Not recursive "
        f"(use glob for that). At most {LIMITS['max_entries']} entries, sorted by name, "
        "with a note when there are more.",
        _schema({"path": _string(_DIR)}, []),
    ),
    (
        "read_file",
        "Read a text file of the workspace. Returns its lines numbered like `cat -n` "
        "(the number, a tab, the line; the numbers are not part of the file), "
        f"{LIMITS['default_limit']} lines from the start unless offset/limit say "
        f"otherwise; lines longer than {LIMITS['max_line_chars']} characters are cut with "
        f"a mark, and at most {LIMITS['max_read_bytes'] // 1024} KiB are returned at once. "
        "A note says how many lines are left and which offset reads on. A binary file is "
        "described (size, likely type) rather than shown.",
        _schema(
            {
                "path": _string(_PATH),
                "offset": _lines(
                    "Lines to skip from the start: 0 reads from line 1, 100 from line 101.",
                    0,
                    0,
                ),
                "limit": _lines("Most lines to return.", 1, LIMITS["default_limit"]),
            },
            ["path"],
        ),
    ),
    (
        "write_file",
        "Create a file in the workspace, or replace all of an existing file's content, "
        "with the given text (UTF-8). Missing parent directories are created. Refused "
        "when it would pass the workspace's size quota. To change part of a file, use "
        "edit_file or insert_file instead.",
        _schema(
            {"path": _string(_PATH), "content": _string("The file's complete new content.")},
            ["path", "content"],
        ),
    ),
    (
        "edit_file",
        "Replace one exact piece of text in a workspace file: old_string must occur "
        "exactly once in the file (whitespace and indentation included, without "
        "read_file's line numbers); it is replaced by new_string. If it occurs 0 times or "
        "more than once nothing changes and the error says how many times it matched: "
        "read the file again, or include more surrounding lines to make it unique. "
        "Returns the edited lines with their numbers.",
        _schema(
            {
                "path": _string(_PATH),
                "old_string": _string("The exact text to replace; must occur exactly once."),
                "new_string": _string("The text to put in its place (may be empty)."),
            },
            ["path", "old_string", "new_string"],
        ),
    ),
    (
        "insert_file",
        "Insert text into an existing workspace file between two lines, keeping every "
        "existing line. offset is the number of lines BEFORE the insertion point: 0 inserts "
        "at the start, 3 after line 3, the file's line count appends at the end.",
        _schema(
            {
                "path": _string(_PATH),
                "offset": _lines(
                    "Lines before the insertion point: 0 = the start of the file, N = after "
                    "line N (at most the file's line count).",
                    0,
                ),
                "content": _string("The lines to insert; a final newline is added if missing."),
            },
            ["path", "offset", "content"],
        ),
    ),
    (
        "delete_file",
        "Delete a file (or a symlink: the link itself, never its target) from the "
        "workspace. A directory is deleted only when empty: empty it first with "
        "clear_files.",
        _schema({"path": _string(_PATH)}, ["path"]),
    ),
    (
        "move_file",
        "Move or rename a file or directory of the workspace from path to new_path "
        "(missing parent directories of new_path are created). Never overwrites: if "
        "new_path exists the move is refused; delete_file it first to replace it.",
        _schema(
            {
                "path": _string(_PATH),
                "new_path": _string("Where it goes, relative to the workspace root."),
            },
            ["path", "new_path"],
        ),
    ),
    (
        "clear_files",
        "Delete everything inside a directory of the workspace (by default the whole "
        "workspace), keeping the directory itself; says how many files and directories "
        "it removed. Symlinks are removed, never followed.",
        _schema({"path": _string(_DIR)}, []),
    ),
    (
        "glob",
        "Find workspace files and directories whose paths match a glob pattern: '*' "
        "matches within one directory level, '**/' any number of directories, '?' one "
        "character, '[abc]' a set; e.g. '**/*.py' finds Python files at any depth, "
        "'*.csv' only in the searched directory. Returns paths relative to the workspace "
        f"(directories end with '/'), sorted, at most {LIMITS['max_entries']} with a note "
        "when there are more.",
        _schema(
            {
                "pattern": _string("The glob pattern, relative to path."),
                "path": _string(_DIR + " The directory searched."),
            },
            ["pattern"],
        ),
    ),
    (
        "grep",
        "Search the text files of the workspace (or of one directory or file) for lines "
        "matching a Python regular expression (re.search; '(?i)' in front ignores case). "
        "Returns 'path:line_number:line' for each match, at most "
        f"{LIMITS['max_matches']} with a note when there are more; binary files are "
        "skipped. An invalid expression gets an error saying why.",
        _schema(
            {
                "pattern": _string("A Python regular expression, e.g. 'def \\w+\\('."),
                "path": _string(
                    "File or directory to search, relative to the workspace root; '' or "
                    "omitted: the whole workspace."
                ),
            },
            ["pattern"],
        ),
    ),
)

WORKSPACE_TOOL_NAMES: tuple[str, ...] = tuple(name for name, _, _ in _TOOLS)
"""The ten tools' names, which are also their ops' names."""


def _where(promises: Promises | None) -> str:
    """Where the tools run, only as far as this daemon promises it."""
    if promises is None:
        return ""
    if promises.isolated:
        return " It runs inside the call's isolated sandbox: only the workspace can be reached."
    return (
        " It runs in a process on the daemon's host, not isolated from it; paths are still "
        "confined to the workspace."
    )


def workspace_tools(promises: Promises | None = None) -> tuple[Tool, ...]:
    """The ten workspace tools.

    Args:
        promises: What holds in the built-ins' sandboxes (whether they are
            isolated); None: unknown, so nothing is said of it.
    """
    where = _where(promises)
    return tuple(
        Tool(
            name=name,
            description=f"{description}{where} {FRESH_WORKSPACE}",
            input_schema=schema,
            source="builtin",
            builtin=name,
        )
        for name, description, schema in _TOOLS
    )


def workspace_payload(op: str) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The payload of a workspace request running `op` with a call's checked arguments.

    The daemon adds "quota_bytes" (`calls.terms.run_request`): the op needs the
    workspace's limit, which is not an argument.
    """

    def payload(arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {"op": op, "args": dict(arguments)}

    return payload
