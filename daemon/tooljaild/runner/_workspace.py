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

The ops live in four modules beside this one: _workspace_paths.py (the root,
path checks, quota and errors), _workspace_read.py (the ops that read one
place, the text helpers and the bounds), _workspace_search.py (glob and grep)
and _workspace_write.py (the ops that change files). These files must stay
stdlib-only and importable by Python 3.11+ on their own: they are installed
beside _runner.py in every sandbox, where each is a top-level module (and a
module of `tooljaild.runner` in the daemon, whose artifact tools share the text
helpers). install_runner compiles them once, and the zygote imports them once
for every session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # the daemon and its tests: tooljaild.runner._workspace
    from . import _workspace_paths as paths
    from . import _workspace_read as read
    from . import _workspace_search as search
    from . import _workspace_write as write
except ImportError:  # a sandbox: top-level modules beside _runner.py, no package
    import _workspace_paths as paths  # type: ignore[import-not-found, no-redef]
    import _workspace_read as read  # type: ignore[import-not-found, no-redef]
    import _workspace_search as search  # type: ignore[import-not-found, no-redef]
    import _workspace_write as write  # type: ignore[import-not-found, no-redef]

__all__ = ["LIMITS", "WorkspaceError", "run"]

LIMITS = read.LIMITS
"""The bounds, for the tools' descriptions (see `_workspace_read.LIMITS`)."""
WorkspaceError = paths.WorkspaceError
"""What every op raises when it refuses or fails (see `_workspace_paths`)."""


# --------------------------------------------------------------------------- entry point

_OPS: dict[str, tuple[Callable[[paths.Workspace, dict[str, Any]], Any], frozenset[str]]] = {
    "ls": (read.ls, frozenset({"path"})),
    "read_file": (read.read_file, frozenset({"path", "offset", "limit"})),
    "write_file": (write.write_file, frozenset({"path", "content"})),
    "edit_file": (write.edit_file, frozenset({"path", "old_string", "new_string"})),
    "insert_file": (write.insert_file, frozenset({"path", "offset", "content"})),
    "delete_file": (write.delete_file, frozenset({"path"})),
    "move_file": (write.move_file, frozenset({"path", "new_path"})),
    "clear_files": (write.clear_files, frozenset({"path"})),
    "glob": (search.glob, frozenset({"pattern", "path"})),
    "grep": (search.grep, frozenset({"pattern", "path"})),
    "upload_chunk": (
        write.upload_chunk,
        frozenset({"path", "upload_id", "data_b64", "first", "last"}),
    ),
    "upload_abort": (write.upload_abort, frozenset({"upload_id", "path"})),
    "download_chunk": (read.download_chunk, frozenset({"path", "offset", "length"})),
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
        raise paths.bad_argument(f"unknown workspace op {op!r}")
    if not isinstance(args, dict):
        raise paths.bad_argument("the op's arguments must be an object")
    function, allowed = entry
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise paths.bad_argument(f"{op} takes no argument {unknown[0]!r}")
    try:
        return function(paths.Workspace(root, int(quota_bytes or 0)), args)
    except OSError as exc:
        raise paths.os_error(exc, str(args.get("path", "."))) from None


def error_of(exc: BaseException) -> tuple[str, str]:
    """(type, message) of a `WorkspaceError(type_, message)`, for a result frame."""
    args = [str(arg) for arg in exc.args]
    type_ = getattr(exc, "type_", None) or getattr(exc, "type", None)
    message = getattr(exc, "message", None)
    if not isinstance(type_, str):
        type_ = args[0] if len(args) > 1 else "WorkspaceError"
    if not isinstance(message, str):
        message = args[-1] if args else ""
    return type_, message
