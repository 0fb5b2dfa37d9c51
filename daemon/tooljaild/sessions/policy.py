"""The tool policy of the session RPCs that do a tool's work.

An identity's allow-list and approvals (`auth.policy.Identity`) are kept at
every door that does what a tool does, not only at `Call` and `Run`:

- `UploadFile` writes a file into a workspace: it is `write_file`'s work;
- `DownloadFile` reads one: it is `read_file`'s;
- `CreateSession` holds a sandbox for calls: an identity that may call no tool
  that runs in a sandbox has nothing to run in it.

A tool that needs an approver cannot be done through these doors (a stream of
chunks cannot wait for a person): the refusal says to call the tool instead,
where the approval is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable

from tooljail.errors import PermissionDeniedError
from tooljaild.auth.policy import Identity

__all__ = ["DOWNLOAD_TOOL", "UPLOAD_TOOL", "check_file_rpc", "check_may_open_session"]

UPLOAD_TOOL = "write_file"
"""The tool whose work an upload does."""
DOWNLOAD_TOOL = "read_file"
"""The tool whose work a download does."""


def check_file_rpc(identity: Identity | None, rpc: str, tool: str) -> None:
    """Refuse `rpc` (doing `tool`'s work) to an identity whose policy refuses `tool`
    or makes it wait for an approver; None (no authentication): allowed.

    Raises:
        PermissionDeniedError: Naming the tool, and what to do instead.
    """
    if identity is None:
        return
    if not identity.may_use(tool):
        raise PermissionDeniedError(
            f"this identity may not call the tool {tool!r}, and {rpc} does {tool}'s work: "
            "refused (the tokens file's `tools` for this identity would have to list it)"
        )
    if identity.needs_approval(tool):
        raise PermissionDeniedError(
            f"this identity's calls of {tool!r} wait for an approver, and {rpc} does "
            f"{tool}'s work but cannot wait for one: refused. Call the {tool} tool in the "
            "session instead; it waits for approval."
        )


def check_may_open_session(identity: Identity | None, sandboxed_tools: Iterable[str]) -> None:
    """Refuse a session to an identity that may call none of `sandboxed_tools` (the
    tools that run in a sandbox, and so in a session); None: allowed.

    Raises:
        PermissionDeniedError: Saying why.
    """
    if identity is None or identity.tools is None:
        return
    if not any(identity.may_use(name) for name in sandboxed_tools):
        raise PermissionDeniedError(
            "this identity may call no tool that runs in a sandbox, so a session would "
            "have nothing to run: refused (its tokens file entry lists only tools that "
            "run in the daemon)"
        )
