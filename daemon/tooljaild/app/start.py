"""The daemon's start steps that need only its settings: sandboxes and tools.

`Daemon.start` runs them in order; `tooljail tools --check` runs them without a
daemon (`check_tool_files`), and a reload runs `load_tools` again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tooljaild.app.errors import DaemonError
from tooljaild.app.pools import PoolSet, Profile
from tooljaild.sandbox.backends import BACKENDS, Backend, Host, Sandboxes
from tooljaild.sandbox.isolation import IsolationError, install_runner
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS
from tooljaild.tools.loader import load_registry
from tooljaild.tools.registry import Registry, Tool

if TYPE_CHECKING:
    pass


STATE_DIR_MODE = 0o711
"""The state directory and `workspaces/`: passed through by sandboxes, listed by nobody."""


async def open_sandboxes(
    settings: Settings,
    *,
    state_dir: Path,
    daemon_id: str,
    table: Mapping[str, type[Backend]] = BACKENDS,
) -> Sandboxes:
    """Every backend of `table`, prepared for `settings` (the daemon's and `tools --check`'s).

    Args:
        settings: The settings (the check passes its own, milder ones).
        state_dir: Where the runner is installed and the backends keep state.
        daemon_id: Labels what the backends make (containers).
        table: The backends by kind.

    Raises:
        DaemonError: A backend cannot be used as configured (isolation = strict
            on a host that lacks a feature, a directory the sandbox uid cannot reach).
    """
    host = await asyncio.to_thread(_host, settings, state_dir, daemon_id)
    sandboxes = Sandboxes(settings, host, table)
    try:
        await sandboxes.prepare()
    except IsolationError as exc:
        await sandboxes.close()
        raise DaemonError(str(exc)) from exc
    return sandboxes


def _host(settings: Settings, state_dir: Path, daemon_id: str) -> Host:
    """What every backend shares; installs the runner (blocking: run it in a thread)."""
    return Host(
        state_dir=state_dir.resolve(),
        workspace_root=state_dir / "workspaces",
        runner_dir=install_runner(state_dir),
        shared_dirs=tuple(d.resolve() for d in (*settings.tools_dirs, *settings.files_dirs)),
        daemon_id=daemon_id,
    )


async def load_tools(
    settings: Settings, sandboxes: Sandboxes, profile: Profile, builtins: tuple[Tool, ...]
) -> Registry:
    """The registry: `builtins` and the user tools, described in a sandbox of `profile`."""
    if not settings.tools_dirs:
        return Registry(builtins=builtins)
    sandbox = sandboxes.factory(profile)()
    try:
        await sandbox.start()
        return await load_registry(settings.tools_dirs, sandbox, builtins=builtins)
    finally:
        await sandbox.close()


async def check_tool_files(settings: Settings) -> Registry:
    """Load the tool files the daemon's way, without serving (`tooljail tools --check`).

    The same assembly as `Daemon.start` (`open_sandboxes`, `load_tools`), made
    mild, since a check reports and never refuses: a process sandbox (no engine
    needed), best-effort isolation (a strict host check is `tooljail doctor`'s),
    no cgroups, in a temporary state directory.

    Raises:
        DaemonError: The sandboxes cannot be made (a directory the sandbox uid
            cannot reach).
    """
    import tempfile

    mild = settings.model_copy(
        update={
            "isolation": "none" if settings.isolation == "none" else "best-effort",
            "backend": "process",
            "sandbox": settings.sandbox.model_copy(update={"use_cgroups": False}),
        }
    )
    with tempfile.TemporaryDirectory(prefix="tooljail-check-") as tmp:
        os.chmod(tmp, STATE_DIR_MODE)
        sandboxes = await open_sandboxes(mild, state_dir=Path(tmp), daemon_id="check")
        try:
            default = PoolSet(mild, sandboxes.factory).default
            return await load_tools(mild, sandboxes, default, BUILTIN_TOOLS)
        finally:
            await sandboxes.close()
