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
`ToolExecutor` reads as is:

- success: `{"status": "success", "data": <the text the model reads>}`;
- a tool error, a timeout (which may still take effect: the message says so and
  carries the call id and whether the daemon still runs it), a cancellation, a
  refusal, an unreachable daemon: `{"status": "error", "message": <that text>,
  "data": <the call id, how it ended, its artifacts>}`; a partial result is
  `"partial"`.

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
from tooljail.integrations.core import (
    AsyncTarget,
    Outcome,
    OutcomeKind,
    SyncTarget,
    Target,
    ToolSpec,
    arun,
    atool_specs,
    is_async,
    run,
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

__all__ = ["aregistry", "envelope", "registry"]


def envelope(outcome: Outcome) -> dict[str, Any]:
    """An outcome as OmniCoreAgent's result envelope (`status`, `data`, `message`).

    Its `ToolExecutor` takes a dict with only these keys and a status of
    success, partial or error as the result itself, not as data.
    """
    if outcome.ok:
        return {"status": "success", "data": outcome.text}
    details = {key: value for key, value in outcome.as_dict().items() if key != "text"}
    status = "partial" if outcome.kind is OutcomeKind.PARTIAL else "error"
    return {"status": status, "data": details, "message": outcome.text}


def _function(target: Target, spec: ToolSpec) -> Callable[..., Any]:
    # `Tool.execute` binds the model's arguments to the function's signature:
    # **arguments takes them all, and the daemon checks them against the schema
    # (a wrong one comes back as a refusal the model can read).
    if is_async(target):
        async_target = cast(AsyncTarget, target)

        async def call_async(**arguments: Any) -> dict[str, Any]:
            return envelope(await arun(async_target, spec, arguments))

        function: Callable[..., Any] = call_async
    else:
        sync_target = cast(SyncTarget, target)

        # OmniCoreAgent runs a sync tool on a worker thread (asyncio.to_thread).
        def call_sync(**arguments: Any) -> dict[str, Any]:
            return envelope(run(sync_target, spec, arguments))

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
def registry(target: SyncTarget, names: Iterable[str] | None = None) -> Any: ...
@overload
def registry(target: AsyncTarget, names: Iterable[str] | None = None) -> Awaitable[Any]: ...
def registry(target: Target, names: Iterable[str] | None = None) -> Any:
    """The daemon's tools (or those named) as an omnicoreagent `ToolRegistry`.

    Give it to `OmniCoreAgent(local_tools=...)`, or merge it into a registry of
    your own (`mine.merge(registry(client))`). The tools are sync functions;
    OmniCoreAgent runs them on a worker thread.

    Args:
        target: A `Client`, or a `Session` to run every call in its interpreter
            and workspace.
        names: The tools to register, in this order; None registers all the
            daemon serves.

    Returns:
        An `omnicoreagent.ToolRegistry` of `Tool`s.

    Raises:
        ToolNotFoundError: When a name is not served (the message lists those that are).
        TransportError: When the daemon cannot be reached to list its tools.
    An `AsyncClient` or `AsyncSession` gives a coroutine to await, as `aregistry`.
    """
    if isinstance(target, AsyncClient | AsyncSession):
        return aregistry(target, names)
    return _registry_of(target, tool_specs(target, names))


async def aregistry(target: AsyncTarget, names: Iterable[str] | None = None) -> Any:
    """As `registry`, for an `AsyncClient` or `AsyncSession`: the tools are coroutines.

    Raises:
        ToolNotFoundError: When a name is not served.
        TransportError: When the daemon cannot be reached to list its tools.
    """
    return _registry_of(target, await atool_specs(target, names))
