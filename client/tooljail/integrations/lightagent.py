"""The daemon's tools as LightAgent tools: callables carrying a `tool_info` dict.

    from LightAgent import LightAgent
    from tooljail import Client
    from tooljail.integrations import lightagent

    client = Client()
    agent = LightAgent(model="gpt-4o-mini", tools=lightagent.tools(client))
    print(agent.run("What is 2**100? Use run_python_code."))

LightAgent (`lightagent` 0.11 on PyPI) registers any callable with a
`tool_info` dict in its `ToolRegistry`, and its `AsyncToolDispatcher` checks
the model's arguments against `tool_params`, then calls the callable with them:
a plain function is called, a coroutine function awaited, a sync generator
handed on (streamed by `run(stream=True)`, joined otherwise), an async
generator collected into one string. So:

- with a `Client` or `Session`, every tool is a plain function returning the
  text the model reads, and the daemon's streaming tools are sync generators
  yielding the output as it arrives;
- with an `AsyncClient` or `AsyncSession` (`await atools(...)`), every tool
  is a coroutine function, and a streaming tool an async generator, which
  LightAgent collects rather than streams. LightAgent's `run` and `arun`
  dispatch tools on an event loop of their own (`run_async_safely`), where the
  client's gRPC channel does not work: the tools hand each call to the loop
  `atools` was awaited in, so that loop must stay free (`await agent.arun(...)`,
  not a blocking `agent.run(...)` on it).

Call ids: LightAgent hands a tool only its arguments, never the model's
tool-call id, so each call gets a fresh id (`tooljail.integrations._ids`).

Names: LightAgent 0.11 refuses, in its dispatch, any tool named
`execute_python_code`, `execute_python_file` or `execute_python_code_stream`
(its guard against its own unsandboxed executors, whatever the tool does).
Those three are served as `run_python_code`, `run_python_file` and
`run_python_code_stream` (`RENAMES`); every other tool keeps the daemon's name.

Failures (a tool's error, a timeout, a cancellation, a refusal, no daemon) are
strings in LightAgent's own error format, the one its dispatcher gives a tool
that raised: `[LA-TOOL] Tool execution failed. Guidance: ... Details: <what
happened and what to do>`. A timeout's details say it may still take effect and
carry the call id.
"""

from __future__ import annotations

import asyncio
from asyncio import AbstractEventLoop
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar, overload

from tooljail import AsyncClient, AsyncSession
from tooljail.integrations.core import (
    MAX_TEXT_CHARS,
    AsyncTarget,
    Outcome,
    SyncTarget,
    Target,
    ToolSpec,
    arun,
    astream,
    atool_specs,
    is_async,
    require,
    run,
    stream,
    tool_specs,
)

_errors = require("LightAgent.errors", "lightagent")

__all__ = ["ERROR_CODE", "RENAMES", "atools", "tools"]

RENAMES: dict[str, str] = {
    "execute_python_code": "run_python_code",
    "execute_python_file": "run_python_file",
    "execute_python_code_stream": "run_python_code_stream",
}
"""The daemon's name -> the name registered, for the names LightAgent's dispatch refuses."""

_T = TypeVar("_T")

ERROR_CODE = "LA-TOOL"
"""LightAgent's error code for a tool that failed: every failure is reported with it."""


@overload
def tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[Callable[..., Any]]: ...
@overload
def tools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> Awaitable[list[Callable[..., Any]]]: ...
def tools(
    target: Target, names: Iterable[str] | None = None
) -> list[Callable[..., Any]] | Awaitable[list[Callable[..., Any]]]:
    """The daemon's tools (or the named ones) as LightAgent tools.

    Args:
        target: A `Client`, or a `Session` to run every tool in its interpreter
            and workspace (a variable set by one call is there in the next). An
            `AsyncClient` or `AsyncSession` gives a coroutine to await, as `atools`.
        names: The daemon's names of the tools to serve, in that order; None
            serves all. `execute_python_code` is served as `run_python_code`
            (see `RENAMES`).

    Returns:
        Callables carrying `tool_info`, for `LightAgent(tools=...)` or
        `ToolRegistry.register_tools`. Each takes the tool's arguments and an
        optional `timeout_s`, and returns the text the model reads; a streaming
        tool yields it as it arrives.

    Raises:
        ToolNotFoundError: When a name is not served (the message names those that are).
        TransportError: When the daemon cannot be reached.
    """
    if isinstance(target, AsyncClient | AsyncSession):
        return atools(target, names)
    specs = tool_specs(target, names, renames=RENAMES)
    return [_registered(spec, _sync_tool(target, spec)) for spec in _checked(specs)]


async def atools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> list[Callable[..., Any]]:
    """As `tools`, for an `AsyncClient` or `AsyncSession`: coroutine-function tools.

    A streaming tool is an async generator, which LightAgent's dispatcher
    collects into one string. The tools run their calls on the event loop
    this is awaited in (the client's), from whichever loop LightAgent awaits
    them on: keep that loop free while an agent runs (`await agent.arun(...)`).

    Raises:
        TypeError: When `target` is a `Client` or `Session` (use `tools`).
        ToolNotFoundError: When a name is not served.
        TransportError: When the daemon cannot be reached.
    """
    if not is_async(target):
        raise TypeError("lightagent.atools needs an AsyncClient or AsyncSession; use tools")
    specs = await atool_specs(target, names, renames=RENAMES)
    loop = asyncio.get_running_loop()
    return [_registered(spec, _async_tool(target, spec, loop)) for spec in _checked(specs)]


def _checked(specs: list[ToolSpec]) -> list[ToolSpec]:
    """`specs`, unless a rename meets a served tool's own name (one would hide the other)."""
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise ValueError(
                f"two tools would both be registered as {spec.name!r} in LightAgent: "
                f"the daemon's {seen[spec.name]!r} and {spec.tool!r}; select one with names=[...]"
            )
        seen[spec.name] = spec.tool
    return specs


def _failure(outcome: Outcome) -> str:
    """A failed call as LightAgent reports a failed tool: `[LA-TOOL] ... Details: <text>`."""
    text: str = _errors.format_error_code(ERROR_CODE, outcome.text)
    return text


def _text(outcome: Outcome) -> str:
    return outcome.text if outcome.ok else _failure(outcome)


def _sync_tool(target: SyncTarget, spec: ToolSpec) -> Callable[..., Any]:
    if spec.streaming:

        def stream_tool(**arguments: Any) -> Iterator[str]:
            text = _StreamedText()
            for item in stream(target, spec, arguments):
                if piece := text.add(item):
                    yield piece

        return stream_tool

    def tool(**arguments: Any) -> str:
        return _text(run(target, spec, arguments))

    return tool


def _async_tool(target: AsyncTarget, spec: ToolSpec, loop: AbstractEventLoop) -> Callable[..., Any]:
    if spec.streaming:

        async def stream_tool(**arguments: Any) -> AsyncIterator[str]:
            if asyncio.get_running_loop() is loop:
                text = _StreamedText()
                async for item in astream(target, spec, arguments):
                    if piece := text.add(item):
                        yield piece
                return
            # Another loop (LightAgent.arun's): the pieces are gathered on the
            # client's loop; LightAgent collects an async generator's pieces anyway.
            for piece in await _on(loop, _gathered(target, spec, arguments)):
                yield piece

        return stream_tool

    async def tool(**arguments: Any) -> str:
        return _text(await _on(loop, arun(target, spec, arguments)))

    return tool


async def _on(loop: AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    """Awaits `coro` on `loop`, the async client's: its gRPC channel works only there.

    LightAgent's `run` and `arun` dispatch tools on an event loop of their own
    (`run_async_safely`); from there the call is handed to the client's loop,
    which must be running and free (`await agent.arun(...)` leaves it free; a
    blocking `agent.run(...)` made on that loop would wait for ever).
    """
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def _gathered(target: AsyncTarget, spec: ToolSpec, arguments: dict[str, Any]) -> list[str]:
    text = _StreamedText()
    return [piece async for item in astream(target, spec, arguments) if (piece := text.add(item))]


class _StreamedText:
    """What a streaming tool yields: its output as it arrives, then what the model must add.

    LightAgent joins a generator's pieces into the tool message the model
    reads, so the output is capped as `Outcome.text` caps it, and the end adds
    only what the output did not carry: on success the artifacts, on failure
    the `[LA-TOOL]` text (which repeats the output's tail, as every failure's does).
    """

    def __init__(self) -> None:
        self.sent = 0
        self.held = 0

    def add(self, item: str | Outcome) -> str:
        """The piece to yield for `item` (an output chunk, or the call's outcome at the end)."""
        if isinstance(item, Outcome):
            return self._end(item)
        room = max(MAX_TEXT_CHARS - self.sent, 0)
        piece = item[:room]
        self.sent += len(piece)
        self.held += len(item) - len(piece)
        return piece

    def _end(self, outcome: Outcome) -> str:
        if not self.sent:
            return _text(outcome)
        tail = []
        if self.held:
            tail.append(f"[... {self.held} more characters not shown]")
        if not outcome.ok:
            tail.append(_failure(outcome))
        elif outcome.artifacts:
            tail.append(_artifacts_text(outcome))
        return "".join("\n" + part for part in tail)


def _artifacts_text(outcome: Outcome) -> str:
    # As the end of `Outcome.text` names them (which holds the output too).
    return "Artifacts (read them with read_artifact, or Client.get_artifact):\n" + "\n".join(
        f"- {a.name or '(unnamed)'} ({a.mime_type}, {a.size_bytes} bytes): "
        f"artifact_id {a.artifact_id}"
        for a in outcome.artifacts
    )


def _registered(spec: ToolSpec, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` named as `spec` and carrying the `tool_info` LightAgent registers it by."""
    func.__name__ = func.__qualname__ = spec.name
    func.__doc__ = spec.description
    func.__dict__["tool_info"] = {
        "tool_name": spec.name,
        # LightAgent shows the title to the developer beside each streamed
        # chunk: the daemon's own name says which tool really ran.
        "tool_title": spec.tool,
        "tool_description": spec.description,
        "tool_params": _tool_params(spec.parameters),
    }
    return func


def _tool_params(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON schema's properties as LightAgent's `tool_params` list.

    Each property keeps all its JSON-schema keys (LightAgent passes every key
    but `name` and `required` on to the model), plus `name` and `required`.
    """
    required = set(schema.get("required") or ())
    return [
        {**prop, "name": name, "required": name in required}
        for name, prop in (schema.get("properties") or {}).items()
    ]
