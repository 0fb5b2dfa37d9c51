"""Loading user tools: their code is imported inside a sandbox, never here.

The daemon finds the tool files, asks a fresh sandbox's runner to import them
and describe what they define, and validates those descriptions. A file that
fails to import, or a tool with a malformed schema, becomes a diagnostic; the
good tools are still served.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tooljail._types import Diagnostic
from tooljaild.registry import Registry, build_user_tools, find_tool_files
from tooljaild.sandbox.base import RunRequest, Sandbox, SandboxError, Termination

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 60.0


async def load_registry(tools_dirs: list[Path], sandbox: Sandbox) -> Registry:
    """Build the registry: built-ins plus the user tools in `tools_dirs`.

    Args:
        tools_dirs: Directories of tool files.
        sandbox: A started sandbox, used once to import the files; the caller closes it.
    """
    import asyncio

    files, diagnostics = find_tool_files(tools_dirs)
    if not files:
        return Registry([], diagnostics)
    stderr = bytearray()

    def sink(kind: object, data: bytes) -> None:
        if len(stderr) < 64 * 1024:
            stderr.extend(data)

    request = RunRequest("describe", {"files": [str(f) for f in files]})
    task = asyncio.create_task(sandbox.run(request, sink))
    done, _ = await asyncio.wait({task}, timeout=DESCRIBE_TIMEOUT_S)
    if not done:
        await sandbox.kill()
    try:
        outcome = await task
    except SandboxError as exc:
        outcome = None
        why = str(exc)
    if outcome is None or outcome.termination is not Termination.RETURNED:
        if outcome is not None:
            why = (
                f"timed out after {DESCRIBE_TIMEOUT_S:g}s"
                if outcome.termination is Termination.KILLED
                else (outcome.error.message if outcome.error else outcome.termination.value)
            )
        diagnostics.append(
            Diagnostic(
                severity="error",
                code="load_failed",
                message=f"importing the tool files failed: {why}; "
                + stderr.decode(errors="replace")[-2000:],
                file=", ".join(str(f) for f in files),
            )
        )
        return Registry([], diagnostics)
    described: list[dict[str, Any]] = outcome.value or []
    tools, more = build_user_tools(described)
    return Registry(tools, diagnostics + more)
