"""The daemon's tools as functions for PyAgenity's `ToolNode`.

    from pyagenity.graph import ToolNode
    from tooljail import Client
    from tooljail.integrations import pyagenity

    client = Client()
    tool_node = ToolNode(pyagenity.tools(client))

`ToolNode` registers a function under its `__name__` and builds the schema the
model reads from the function's signature, so each function here has a real
one, made from the daemon's JSON schema: keyword-only parameters annotated
`str`, `int`, `float`, `bool`, `list[...]`, `dict[str, Any]` or `Literal[...]`,
the optional ones `... | None = None`, plus the optional `timeout_s` and the
`tool_call_id` PyAgenity injects (left out of the schema). The docstring is the
daemon's description with an `Args:` section, since ToolNode's schema carries
no parameter descriptions.

Each function returns PyAgenity's tool message (`Message.tool_message`): on
success a `ToolResultBlock` with the text the model reads; on a tool error, a
timeout (which may still take effect: the text says so and carries the call id
and whether the daemon still runs it), a cancellation, a refusal or an
unreachable daemon, a `ToolResultBlock` with `is_error=True, status="failed"`
and an `ErrorBlock` with the same text, as ToolNode builds its own failures.
The message's metadata holds the outcome under `"tooljail"`, with
`arguments_sha256` (the SHA-256 of the canonical JSON arguments: two calls with
the same arguments have the same).

The call runs under the `tool_call_id` ToolNode injects, as `<client name>:<id>`
(`tooljail.integrations._ids`): a host that restarts and replays the
conversation gets the journaled answer of a call that already ran, and the tool
does not run twice.

A streaming tool publishes each output chunk as it arrives through the graph's
publisher (`StateGraph(publisher=...)`): an `EventModel` with
`event="tool_execution"`, `event_type="progress"`, `content_type=["text"]`,
the chunk in `content` and its place in `data["chunk_index"]`; the tool message
at the end holds the whole output.

Needs pyagenity >= 0.3.9 (tested with 0.3.9), which needs Python >= 3.12: on
an older pyagenity, or an older Python where pip installed 0.3.3 (it declares
>= 3.10 but is written in 3.12 syntax), importing this module says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import inspect
import keyword
import platform
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Literal, cast, overload

from tooljail import AsyncClient, AsyncSession
from tooljail.common import arguments_sha256
from tooljail.integrations._ids import arun, astream, run, stream
from tooljail.integrations.core import (
    AsyncTarget,
    Outcome,
    SyncTarget,
    Target,
    ToolSpec,
    atool_specs,
    is_async,
    split_arguments,
    tool_specs,
)
from tooljail.integrations.core import require as _require

# Entered by its public entry first, as its users do (`from pyagenity.graph import
# ToolNode`): in pyagenity 0.3.9, `pyagenity.utils` imported before anything else
# of pyagenity's is a circular import (utils -> state -> state.agent_state -> utils),
# while every other order works. The modules below avoid `pyagenity.utils` too.
_ENTRY = "pyagenity.graph"
MINIMUM = (0, 3, 9)
"""The oldest pyagenity this adapter is tested with (its messages moved to `pyagenity.state`)."""


def _older_than_minimum() -> str | None:
    """The installed pyagenity's version if it is older than `MINIMUM`, else None."""
    try:
        version = importlib.metadata.version("pyagenity")
    except importlib.metadata.PackageNotFoundError:
        return None
    release = tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])
    return version if release < MINIMUM else None


try:
    # pyagenity.state.message(_block), not pyagenity.utils.message: 0.3.9 moved
    # Message and its blocks there (0.3.3's `pyagenity.utils.message` is gone, and
    # its `pyagenity.state` package, which exists, has no Message: ask for the modules).
    _message = _require("pyagenity.state.message", "pyagenity", entry=_ENTRY)
    _blocks = _require("pyagenity.state.message_block", "pyagenity", entry=_ENTRY)
    _events = _require("pyagenity.publisher.events", "pyagenity", entry=_ENTRY)
    _publish = _require("pyagenity.publisher.publish", "pyagenity", entry=_ENTRY)
    _constants = _require("pyagenity.graph.tool_node.constants", "pyagenity", entry=_ENTRY)
except SyntaxError as e:
    # pyagenity 0.3.3 declares Python >= 3.10 but is written in 3.12 syntax
    # (`class BeforeInvokeCallback[T, R]`): pip installs it where it cannot run.
    raise ImportError(
        f"pyagenity needs Python >= 3.12 (this is {platform.python_version()}; {e}): "
        "on 3.12 or later, pip install 'tooljail[pyagenity]'"
    ) from e
except ImportError as e:
    # An older release has another layout: say which one to install, not only what broke.
    old = _older_than_minimum()
    if old is None:
        raise
    raise ImportError(
        f"this integration needs pyagenity >= {'.'.join(map(str, MINIMUM))}, and "
        f"{old} is installed: pip install -U 'tooljail[pyagenity]' ({e})"
    ) from e

__all__ = ["atools", "tool_message", "tools"]

TOOL_CALL_ID = "tool_call_id"
"""The argument ToolNode injects: the id of the model's tool call."""
CONFIG = "config"
"""The argument ToolNode injects: the graph's run config (a streaming tool publishes with it)."""


def tool_message(outcome: Outcome, tool_call_id: str, arguments_hash: str = "") -> Any:
    """An outcome as PyAgenity's tool message for the call `tool_call_id`.

    Success: one `ToolResultBlock` with the text. Failure: a failed
    `ToolResultBlock` and an `ErrorBlock` (code: how it ended), each with the text.
    The metadata's `"tooljail"` holds the outcome and `arguments_sha256`: the
    result's (the daemon's hash of the canonical arguments), else
    `arguments_hash` (a call refused before it had a result).
    """
    details = {key: value for key, value in outcome.as_dict().items() if key != "text"}
    result_hash = outcome.result.arguments_sha256 if outcome.result is not None else ""
    if result_hash or arguments_hash:
        details["arguments_sha256"] = result_hash or arguments_hash
    result = _blocks.ToolResultBlock(
        call_id=tool_call_id,
        output=outcome.text,
        is_error=not outcome.ok,
        status="completed" if outcome.ok else "failed",
    )
    content = [result]
    if not outcome.ok:
        content.append(
            _blocks.ErrorBlock(message=outcome.text, code=outcome.kind.value, data=details)
        )
    return _message.Message.tool_message(content=content, meta={"tooljail": details})


# --- the signature ToolNode reads ----------------------------------------------

_SCALARS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict[str, Any],
}


def _annotation(schema: dict[str, Any]) -> Any:
    """The Python type ToolNode turns back into (about) this JSON schema."""
    if schema.get("enum"):
        try:
            return Literal[tuple(schema["enum"])]
        except TypeError:  # an unhashable value (a list, an object): no Literal holds it
            return Any
    for union in ("anyOf", "oneOf"):
        if schema.get(union):
            # ToolNode renders one type: the first that is not null.
            options = [s for s in schema[union] if s.get("type") != "null"]
            return _annotation(options[0]) if options else Any
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "array":
        return list[_annotation(schema.get("items") or {})]  # type: ignore[misc]
    return _SCALARS.get(str(kind), Any)


def _signature(spec: ToolSpec, injected: tuple[str, ...]) -> inspect.Signature:
    properties: dict[str, Any] = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or ())
    params = []
    for name, schema in properties.items():
        if (
            not name.isidentifier()
            or keyword.iskeyword(name)
            or name in _constants.INJECTABLE_PARAMS
        ):
            raise ValueError(
                f"tool {spec.tool!r}: its parameter {name!r} cannot be a Python keyword "
                "argument ToolNode passes (not an identifier, or one ToolNode injects); "
                "leave the tool out with names=..."
            )
        annotation = _annotation(schema)
        # Keyword-only: a required parameter may follow an optional one.
        if name in required:
            params.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation)
            )
            continue
        # An optional one keeps the daemon's default (ToolNode shows it to the
        # model); without one, None stands for "not given" and is not sent.
        default = schema.get("default")
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=annotation if default is not None else annotation | None,
            )
        )
    for name in injected:
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=str if name == TOOL_CALL_ID else dict[str, Any],
            )
        )
    return inspect.Signature(params, return_annotation=Any)


def _docstring(spec: ToolSpec) -> str:
    lines = [spec.description.strip() or spec.tool]
    properties: dict[str, Any] = spec.parameters.get("properties") or {}
    described = [(n, s["description"]) for n, s in properties.items() if s.get("description")]
    if described:
        lines += ["", "Args:"]
        lines += [f"    {name}: {' '.join(str(text).split())}" for name, text in described]
    return "\n".join(lines)


def _arguments(given: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The injected tool call id and config, and the tool's arguments (None: not given)."""
    tool_call_id = str(given.pop(TOOL_CALL_ID, "") or "")
    config = given.pop(CONFIG, None) or {}
    return tool_call_id, config, {k: v for k, v in given.items() if v is not None}


def _hash(spec: ToolSpec, arguments: dict[str, Any]) -> str:
    """The tool's own arguments' hash (as the daemon's), for a call refused before
    any result said it; "" when they have none (a bad timeout_s, a value JSON
    cannot hold)."""
    try:
        return arguments_sha256(split_arguments(spec, arguments)[0])
    except (TypeError, ValueError):
        return ""


# --- the functions ----------------------------------------------------------------


def _publish_chunk(
    config: dict[str, Any], spec: ToolSpec, tool_call_id: str, index: int, text: str
) -> None:
    # pyagenity 0.3.9's EventModel has no delta fields (its docstring still names
    # them, its model refuses them): a chunk is a TEXT progress event with the
    # text in `content` and its place in `data["chunk_index"]`.
    event = _events.EventModel.default(
        base_config=config,
        data={"tool_call_id": tool_call_id, "function_name": spec.name, "chunk_index": index},
        content_type=[_events.ContentType.TEXT],
        event=_events.Event.TOOL_EXECUTION,
        event_type=_events.EventType.PROGRESS,
        node_name="ToolNode",
    )
    event.content = text
    _publish.publish_event(event)  # to the graph's publisher, as ToolNode's own events


async def _in_thread(items: Iterator[str | Outcome]) -> AsyncGenerator[str | Outcome, None]:
    """A sync Client's stream, each item waited for on a worker thread."""
    try:
        # core's streams never yield None: it marks their end here.
        while (item := await asyncio.to_thread(next, items, None)) is not None:
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            with contextlib.suppress(ValueError):  # still in next() on its thread: it ends there
                close()


def _streaming_function(target: Target, spec: ToolSpec) -> Callable[..., Any]:
    # Always a coroutine, even for a sync Client: publishing an event needs the
    # graph's event loop, which a sync tool (run on a worker thread) has not.
    async def call(**given: Any) -> Any:
        tool_call_id, config, arguments = _arguments(given)
        items: AsyncGenerator[str | Outcome, None]
        if is_async(target):
            # core.astream is an async generator (typed as an iterator).
            items = cast(
                "AsyncGenerator[str | Outcome, None]",
                astream(cast(AsyncTarget, target), spec, arguments, tool_call_id),
            )
        else:
            items = _in_thread(stream(cast(SyncTarget, target), spec, arguments, tool_call_id))
        # Closed here, not when collected: the call's stream ends with the tool.
        async with contextlib.aclosing(items):
            index = 0
            async for item in items:
                if isinstance(item, Outcome):
                    return tool_message(item, tool_call_id, _hash(spec, arguments))
                _publish_chunk(config, spec, tool_call_id, index, item)
                index += 1
        # core's streams always end with an Outcome.
        raise RuntimeError(f"{spec.tool}: the stream ended without a result")

    return call


def _function(target: Target, spec: ToolSpec) -> Callable[..., Any]:
    if spec.streaming:
        function = _streaming_function(target, spec)
        injected: tuple[str, ...] = (TOOL_CALL_ID, CONFIG)
    elif is_async(target):
        async_target = cast(AsyncTarget, target)

        async def call_async(**given: Any) -> Any:
            tool_call_id, _, arguments = _arguments(given)
            outcome = await arun(async_target, spec, arguments, tool_call_id)
            return tool_message(outcome, tool_call_id, _hash(spec, arguments))

        function, injected = call_async, (TOOL_CALL_ID,)
    else:
        sync_target = cast(SyncTarget, target)

        # ToolNode runs a sync function on a worker thread (asyncio.to_thread).
        def call_sync(**given: Any) -> Any:
            tool_call_id, _, arguments = _arguments(given)
            outcome = run(sync_target, spec, arguments, tool_call_id)
            return tool_message(outcome, tool_call_id, _hash(spec, arguments))

        function, injected = call_sync, (TOOL_CALL_ID,)
    signature = _signature(spec, injected)
    function.__signature__ = signature  # type: ignore[attr-defined]
    function.__annotations__ = {
        **{p.name: p.annotation for p in signature.parameters.values()},
        "return": Any,
    }
    function.__name__ = spec.name
    function.__qualname__ = spec.name
    function.__doc__ = _docstring(spec)
    return function


@overload
def tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[Callable[..., Any]]: ...
@overload
def tools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> Awaitable[list[Callable[..., Any]]]: ...
def tools(
    target: Target, names: Iterable[str] | None = None
) -> list[Callable[..., Any]] | Awaitable[list[Callable[..., Any]]]:
    """The daemon's tools (or those named) as functions for `ToolNode(...)`.

    Non-streaming tools are sync functions (ToolNode runs them on a worker
    thread); a streaming tool is a coroutine function, so it can publish its
    output on the graph's loop.

    Args:
        target: A `Client`, or a `Session` to run every call in its interpreter
            and workspace.
        names: The tools to give, in this order; None gives all the daemon serves.

    Raises:
        ToolNotFoundError: When a name is not served (the message lists those that are).
        TransportError: When the daemon cannot be reached to list its tools.
        ValueError: When a tool has a parameter that cannot be a keyword
            argument (not an identifier, or a name ToolNode injects).
    An `AsyncClient` or `AsyncSession` gives a coroutine to await, as `atools`.
    """
    if isinstance(target, AsyncClient | AsyncSession):
        return atools(target, names)
    return [_function(target, spec) for spec in tool_specs(target, names)]


async def atools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> list[Callable[..., Any]]:
    """As `tools`, for an `AsyncClient` or `AsyncSession`: every function is a coroutine function.

    Raises:
        ToolNotFoundError: When a name is not served.
        TransportError: When the daemon cannot be reached to list its tools.
        ValueError: When a tool has a parameter that cannot be a keyword argument.
    """
    return [_function(target, spec) for spec in await atool_specs(target, names)]
