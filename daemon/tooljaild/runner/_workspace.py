"""Workspace operations, run inside the sandbox (a stub: engineer W's file replaces it).

stdlib only, beside _runner.py. `run` is what a "workspace" request calls.
"""

from __future__ import annotations

from typing import Any


class WorkspaceError(Exception):
    """A workspace operation refused or failed: `type_` names why (for the caller)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(type_, message)
        self.type_ = type_
        self.message = message


def run(op: str, args: dict[str, Any], root: str, quota_bytes: int) -> Any:
    """Run workspace operation `op` on `args` in workspace `root`.

    Raises:
        WorkspaceError: Always, in this stub.
    """
    raise WorkspaceError("InvalidRequest", "unknown op")
