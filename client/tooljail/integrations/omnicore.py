"""The daemon's tools as an OmniCoreAgent `ToolRegistry`.

    from omnicoreagent import OmniCoreAgent
    from tooljail import Client
    from tooljail.integrations import omnicore

    client = Client()
    agent = OmniCoreAgent(..., local_tools=omnicore.registry(client))

Each daemon tool becomes an omnicoreagent `Tool` with the daemon's JSON schema
(plus the optional `timeout_s` argument) and its `idempotent` flag, which
OmniCoreAgent reads to decide whether a call interrupted by a crash may run
again. Its function returns OmniCoreAgent's result envelope, which its
`ToolExecutor` reads as is; `message` is always the text the model reads,
`data` always the daemon's structured data:

- success: `{"status": "success", "data": <the daemon's data: a Python run's
  stdout, stderr, exit_code; a user tool's value>, "message": <the text>}`;
- a tool error, a timeout (which may still take effect: the message says so and
  carries the call id and whether the daemon still runs it), a cancellation, a
  refusal, an unreachable daemon: `{"status": "error", "message": <that text>,
  "data": <the daemon's data, e.g. the partial stdout/stderr/exit_code (a
  value that is no dict under "value"), and the call id, how it ended, its
  effect and artifacts>}`; a partial result is `"partial"`.

OmniCoreAgent's defaults reserve names the daemon also serves: its workspace
files (`enable_workspace_files=True`) the ten workspace tool names, and its
tool-result offloading (`tool_offload.enabled`) the four artifact tool names.
An agent refuses a registry holding them, so `registry` leaves them out unless
asked: `workspace_tools=True` serves the daemon's workspace tools (files in the
sandbox, for an agent made with `enable_workspace_files=False`),
`artifact_tools=True` its artifact tools (for one with
`tool_offload={"enabled": False}`).

A call runs under the model's tool-call id, which OmniCoreAgent 0.6 marks
while the tool runs (`omnicoreagent.governance.calls.current_tool_call`), as
`<client name>:<id>` (`tooljail.integrations._ids`): a host that restarts and
replays a conversation gets the journaled answer of a call that already ran.
Without it (an older release, the function called directly) a fresh id.

OmniCoreAgent has no channel for a local tool's output while it runs, so a
streaming tool returns its whole output at the end. omnicoreagent 0.6 needs
Python >= 3.12 (`pip install 'tooljail[omnicore]'`).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast, overload

from tooljail import AsyncClient, AsyncSession
from tooljail.integrations._ids import arun, run
from tooljail.integrations.core import (
    AsyncTarget,
    Outcome,
    OutcomeKind,
    SyncTarget,
    Target,
    ToolSpec,
    atool_specs,
    is_async,
    tool_specs,
)
from tooljail.integrations.core import require as _require

# The registry's own module, not the `omnicoreagent` package: the package's
# lazy exports resolve to these classes, and this import skips the rest.
try:
    _omni = _require("omnicoreagent.core.tools.local_tools_registry", "omnicore")
except ImportError as e:
    if sys.version_info < (3, 12):
        # The extra installs nothing here: omnicoreagent requires Python >= 3.12.
        raise ImportError(
            f"{e}; omnicoreagent needs Python >= 3.12 (this is {platform.python_version()})"
        ) from e
    raise

try:  # 0.6 and later: the tool call a tool runs for, in a context variable
    from omnicoreagent.governance.calls import (  # type: ignore[import-not-found,unused-ignore]
        current_tool_call as _current_tool_call,
    )
except ImportError:  # an older release: the call gets a fresh id
    _current_tool_call = None

__all__ = ["ARTIFACT_TOOL_NAMES", "WORKSPACE_TOOL_NAMES", "aregistry", "envelope", "registry"]

WORKSPACE_TOOL_NAMES = frozenset(
    {"ls", "read_file", "write_file", "edit_file", "insert_file", "delete_file", "move_file",
     "clear_files", "glob", "grep"}
)  # fmt: skip
"""The names OmniCoreAgent's own workspace tools take (`enable_workspace_files`, on by default)."""

ARTIFACT_TOOL_NAMES = frozenset(
    {"read_artifact", "tail_artifact", "search_artifact", "list_artifacts"}
)
"""The names OmniCoreAgent's tool-result offloading takes (`tool_offload`, on by default)."""


def envelope(outcome: Outcome) -> dict[str, Any]:
    """An outcome as OmniCoreAgent's result envelope (`status`, `data`, `message`).

    Its `ToolExecutor` takes a dict with only these keys and a status of
    success, partial or error as the result itself, not as data. `message` is
    what the model reads; `data` the daemon's data, as a program reads it
    (`data["stdout"]` of a Python run), with on failure how the call ended.
    """
    data = outcome.result.data if outcome.result is not None else None
    if outcome.ok:
        return {"status": "success", "data": data, "message": outcome.text}
    details = {key: value for key, value in outcome.as_dict().items() if key != "text"}
    # The partial output a failed run left (stdout, stderr, exit code) beside how it
    # ended; how it ended wins a clash of names: it is what a program branches on.
    output = data if isinstance(data, dict) else ({} if data is None else {"value": data})
    status = "partial" if outcome.kind is OutcomeKind.PARTIAL else "error"
    return {"status": status, "data": {**output, **details}, "message": outcome.text}


def _served(
    specs: Iterable[ToolSpec], names: Iterable[str] | None, reserved: frozenset[str]
) -> list[ToolSpec]:
    """The specs an agent takes with its defaults: all but `reserved` when none were named.

    Raises:
        ValueError: When a name is asked for that is reserved and not allowed.
    """
    if names is None:
        return [s for s in specs if s.name not in reserved]
    asked = [n for n in names if n in reserved]
    if asked:
        which = ", ".join(map(repr, asked))
        raise ValueError(
            f"{which}: OmniCoreAgent reserves these names for its own tools, on by default; "
            "to serve the daemon's instead, pass workspace_tools=True (and make the agent "
            "with agent_config={'enable_workspace_files': False}) or artifact_tools=True "
            "(with agent_config={'tool_offload': {'enabled': False}})"
        )
    return list(specs)


def _reserved(workspace_tools: bool, artifact_tools: bool) -> frozenset[str]:
    return (frozenset() if workspace_tools else WORKSPACE_TOOL_NAMES) | (
        frozenset() if artifact_tools else ARTIFACT_TOOL_NAMES
    )


def _model_call_id() -> str | None:
    """The model's id of the tool call being run (OmniCoreAgent's tool runner marks
    it in a context variable, which a sync tool's worker thread inherits); None
    where the release or the caller does not say."""
    if _current_tool_call is None:
        return None
    call = _current_tool_call()
    return None if call is None else str(getattr(call, "tool_call_id", "") or "") or None


def _function(target: Target, spec: ToolSpec) -> Callable[..., Any]:
    # `Tool.execute` binds the model's arguments to the function's signature:
    # **arguments takes them all, and the daemon checks them against the schema
    # (a wrong one comes back as a refusal the model can read).
    if is_async(target):
        async_target = cast(AsyncTarget, target)

        async def call_async(**arguments: Any) -> dict[str, Any]:
            return envelope(await arun(async_target, spec, arguments, _model_call_id()))

        function: Callable[..., Any] = call_async
    else:
        sync_target = cast(SyncTarget, target)

        # OmniCoreAgent runs a sync tool on a worker thread (asyncio.to_thread).
        def call_sync(**arguments: Any) -> dict[str, Any]:
            return envelope(run(sync_target, spec, arguments, _model_call_id()))

        function = call_sync
    function.__name__ = spec.name
    function.__qualname__ = spec.name
    function.__doc__ = spec.description
    return function


def _registry_of(target: Target, specs: Iterable[ToolSpec]) -> Any:
    tools = _omni.ToolRegistry()
    for spec in specs:
        tools.register(
            _omni.Tool(
                name=spec.name,
                description=spec.description,
                inputSchema=spec.parameters,
                function=_function(target, spec),
                idempotent=spec.idempotent,
            )
        )
    return tools


@overload
def registry(
    target: SyncTarget,
    names: Iterable[str] | None = None,
    *,
    workspace_tools: bool = False,
    artifact_tools: bool = False,
) -> Any: ...
@overload
def registry(
    target: AsyncTarget,
    names: Iterable[str] | None = None,
    *,
    workspace_tools: bool = False,
    artifact_tools: bool = False,
) -> Awaitable[Any]: ...
def registry(
    target: Target,
    names: Iterable[str] | None = None,
    *,
    workspace_tools: bool = False,
    artifact_tools: bool = False,
) -> Any:
    """The daemon's tools (or those named) as an omnicoreagent `ToolRegistry`.

    Give it to `OmniCoreAgent(local_tools=...)`, or merge it into a registry of
    your own (`mine.merge(registry(client))`). The tools are sync functions;
    OmniCoreAgent runs them on a worker thread. It works with an agent's
    default settings: the names the agent reserves for its own tools are left out.

    Args:
        target: A `Client`, or a `Session` to run every call in its interpreter
            and workspace.
        names: The tools to register, in this order; None registers all the
            daemon serves but those the agent reserves (unless allowed below).
        workspace_tools: Serve the daemon's workspace tools (`WORKSPACE_TOOL_NAMES`:
            files in the sandbox) too; the agent must be made with
            `agent_config={"enable_workspace_files": False}`.
        artifact_tools: Serve the daemon's artifact tools (`ARTIFACT_TOOL_NAMES`)
            too; the agent must be made with `agent_config={"tool_offload":
            {"enabled": False}}`.

    Returns:
        An `omnicoreagent.ToolRegistry` of `Tool`s.

    Raises:
        ToolNotFoundError: When a name is not served (the message lists those that are).
        ValueError: When a name is one the agent reserves and it was not allowed.
        TransportError: When the daemon cannot be reached to list its tools.
    An `AsyncClient` or `AsyncSession` gives a coroutine to await, as `aregistry`.
    """
    if isinstance(target, AsyncClient | AsyncSession):
        return aregistry(
            target, names, workspace_tools=workspace_tools, artifact_tools=artifact_tools
        )
    reserved = _reserved(workspace_tools, artifact_tools)
    names = None if names is None else list(names)
    specs = _served(tool_specs(target, names), names, reserved)
    return _registry_of(target, specs)


async def aregistry(
    target: AsyncTarget,
    names: Iterable[str] | None = None,
    *,
    workspace_tools: bool = False,
    artifact_tools: bool = False,
) -> Any:
    """As `registry`, for an `AsyncClient` or `AsyncSession`: the tools are coroutines.

    Raises:
        ToolNotFoundError: When a name is not served.
        ValueError: When a name is one the agent reserves and it was not allowed.
        TransportError: When the daemon cannot be reached to list its tools.
    """
    reserved = _reserved(workspace_tools, artifact_tools)
    names = None if names is None else list(names)
    return _registry_of(target, _served(await atool_specs(target, names), names, reserved))
