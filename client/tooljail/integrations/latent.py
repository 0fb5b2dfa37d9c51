"""The daemon's tools as plain `async def` functions, for latent-style `@tool` decorators.

    from tooljail import Client
    from tooljail.integrations import latent

    client = Client()
    tools = latent.tools(client)  # await latent.tools(async_client) with an AsyncClient
    text = await tools[0](code="print(1 + 1)")

The contract (a latent-style decorator reads a function, not a tool object):

- each function is an `async def` (`inspect.iscoroutinefunction` is true) named
  as the tool, whose docstring is the tool's description followed by an `Args:`
  section, and whose `inspect.signature` and `__annotations__` (real types, so
  `typing.get_type_hints` works) are built from the tool's JSON schema: required
  parameters first, then optional ones with the schema's default, or None
  meaning "not sent" (such a parameter keeps its own type, not `X | None`,
  unless the schema allows null, so a decorator that maps only plain types
  still reads it right); `timeout_s: float = None` is the call's timeout;
- it returns the tool's output text; on failure (the tool's error, a timeout, a
  cancellation, a refusal, no daemon) it raises `ToolFailed`, whose message is
  what the model should read (a timeout's names the call id and whether it is
  still running) and whose `outcome` is the whole `core.Outcome`;
- bad arguments raise `TypeError` before anything is sent, as calling any
  Python function with them would;
- `fn.input_schema` is the daemon's JSON schema, for a decorator that takes a
  schema as is; `fn.spec` is the `core.ToolSpec`;
- a streaming tool's function returns the whole output; its `fn.astream(...)`
  (same arguments) is an async generator of the output text as it arrives,
  then the `core.Outcome`.

Call ids: a plain function is given no tool-call id, so each call gets a fresh
id (`tooljail.integrations._ids`).

With a `Client` or `Session` each call runs in a worker thread (the functions
are async either way); with an `AsyncClient` or `AsyncSession` it is awaited on
the caller's loop. With a session every call shares its interpreter and workspace.
"""

from __future__ import annotations

import asyncio
import inspect
import keyword
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping
from typing import Any, Literal, Union, overload

from tooljail.integrations import core
from tooljail.integrations.core import AsyncTarget, Outcome, SyncTarget, Target, ToolSpec

__all__ = ["ToolFailed", "tools"]

ToolFunction = Callable[..., Awaitable[str]]


class ToolFailed(RuntimeError):
    """A call that did not succeed; its message is what a model should read.

    Not a `TooljailError`: those are the SDK's and the daemon's own failures,
    while this one carries any ending, a tool's own error included.

    Attributes:
        outcome: The call's whole outcome (`kind`, `call_id`, `still_running`, ...).
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.text)
        self.outcome = outcome


@overload
def tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[ToolFunction]: ...
@overload
def tools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> Awaitable[list[ToolFunction]]: ...
def tools(
    target: Target, names: Iterable[str] | None = None
) -> list[ToolFunction] | Awaitable[list[ToolFunction]]:
    """The daemon's tools (or those named, in that order) as `async def` functions.

    Args:
        target: A `Client` or `Session` (the list is returned), or an
            `AsyncClient` or `AsyncSession` (a coroutine giving it: await it).
        names: The daemon's names of the tools to give; None gives all.

    Raises:
        ToolNotFoundError: When a name is not served, naming those that are.
        TransportError: When the daemon cannot be reached.
    """
    if isinstance(target, AsyncTarget):
        return _async_tools(target, names)
    return [_function(target, spec) for spec in core.tool_specs(target, names)]


async def _async_tools(target: AsyncTarget, names: Iterable[str] | None) -> list[ToolFunction]:
    return [_function(target, spec) for spec in await core.atool_specs(target, names)]


# --- the signature, from the JSON schema -------------------------------------------

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
    "object": dict[str, Any],
}


def _union(types: list[Any]) -> Any:
    unique = list(dict.fromkeys(types))
    if Any in unique:
        return Any
    return unique[0] if len(unique) == 1 else Union[tuple(unique)]  # noqa: UP007 (built at run time)


def python_type(schema: Mapping[str, Any]) -> Any:
    """The Python type a JSON schema describes, as far as type hints can say it.

    `enum` and `const` give a `Literal`, `anyOf`/`oneOf` and a list of types a
    union, an array `list[...]` of its items, an object `dict[str, Any]`;
    anything else `Any`.
    """
    if "const" in schema:
        return Literal[schema["const"]]
    if schema.get("enum"):
        return Literal[tuple(schema["enum"])]
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alternatives, list) and alternatives:
        return _union([python_type(s) for s in alternatives if isinstance(s, Mapping)] or [Any])
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return _union([python_type({**schema, "type": k}) for k in kind])
    if kind == "array":
        items = schema.get("items")
        return list[python_type(items) if isinstance(items, Mapping) else Any]  # type: ignore[misc]
    return _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any


def _is_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _signature(spec: ToolSpec) -> inspect.Signature:
    """The function's signature: required parameters, then optional ones.

    A parameter whose name cannot be a Python name (`from`, `a-b`) is taken
    through `**arguments` instead.
    """
    properties: Mapping[str, Any] = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or ())
    first, then = [], []
    for name, schema in properties.items():
        if not _is_name(name):
            continue
        annotation = python_type(schema if isinstance(schema, Mapping) else {})
        if name in required:
            first.append(inspect.Parameter(name, _KIND, annotation=annotation))
        else:
            default = schema.get("default") if isinstance(schema, Mapping) else None
            then.append(inspect.Parameter(name, _KIND, default=default, annotation=annotation))
    parameters = first + then
    if any(not _is_name(name) for name in properties) or spec.parameters.get(
        "additionalProperties"
    ):
        var = "arguments"
        while var in properties:  # a tool's own argument keeps its name
            var = f"_{var}"
        parameters.append(inspect.Parameter(var, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters, return_annotation=str)


_KIND = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _docstring(spec: ToolSpec, signature: inspect.Signature) -> str:
    """The description, then an `Args:` line per parameter (a decorator may send it all).

    No `Returns:`/`Raises:`: a decorator that sends the whole docstring as the
    description would send them to the model too, and they tell it nothing.
    """
    properties: Mapping[str, Any] = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or ())
    lines = [spec.description.strip() or f"The {spec.tool} tool."]
    args = []
    for name, parameter in signature.parameters.items():
        schema = properties.get(name)
        if parameter.kind is not _KIND or not isinstance(schema, Mapping):
            continue
        text = " ".join(str(schema.get("description") or "").split())
        if not text and schema.get("enum"):
            text = "One of " + ", ".join(map(repr, schema["enum"])) + "."
        args.append(f"    {name}: {text or ('Required.' if name in required else 'Optional.')}")
    if args:
        lines += ["", "Args:", *args]
    return "\n".join(lines)


def _arguments(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """What the caller passed, by the daemon's names; None for an optional one is not sent.

    Raises:
        TypeError: When the arguments do not fit the signature.
    """
    bound = signature.bind(*args, **kwargs)
    arguments: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        parameter = signature.parameters[name]
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif value is not None or parameter.default is not None:
            arguments[name] = value  # None is sent only where it is not the "not sent" default
    return arguments


# --- the function ------------------------------------------------------------------


def _function(target: Target, spec: ToolSpec) -> ToolFunction:
    signature = _signature(spec)

    async def call(*args: Any, **kwargs: Any) -> str:
        outcome = await _run(target, spec, _arguments(signature, args, kwargs))
        if not outcome.ok:
            raise ToolFailed(outcome)
        return outcome.text

    async def astream(*args: Any, **kwargs: Any) -> AsyncIterator[str | Outcome]:
        async for item in _stream(target, spec, _arguments(signature, args, kwargs)):
            yield item

    call.__name__ = call.__qualname__ = spec.name
    call.__doc__ = _docstring(spec, signature)
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {
        **{p.name: p.annotation for p in signature.parameters.values() if p.kind is _KIND},
        "return": str,
    }
    call.input_schema = spec.parameters  # type: ignore[attr-defined]
    call.spec = spec  # type: ignore[attr-defined]
    if spec.streaming:
        astream.__name__ = astream.__qualname__ = f"{spec.name}_stream"
        astream.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            list(signature.parameters.values()), return_annotation=AsyncIterator[str | Outcome]
        )
        call.astream = astream  # type: ignore[attr-defined]
    return call


async def _run(target: Target, spec: ToolSpec, arguments: dict[str, Any]) -> Outcome:
    if isinstance(target, AsyncTarget):
        return await core.arun(target, spec, arguments)
    # A sync client blocks: its call waits in a worker thread, not on the caller's loop.
    return await asyncio.to_thread(core.run, target, spec, arguments)


async def _stream(
    target: Target, spec: ToolSpec, arguments: dict[str, Any]
) -> AsyncIterator[str | Outcome]:
    if isinstance(target, AsyncTarget):
        async for item in core.astream(target, spec, arguments):
            yield item
        return
    items = core.stream(target, spec, arguments)

    def step() -> str | Outcome | None:
        return next(items, None)  # the stream never yields None: None is its end

    try:
        # A sync client blocks on each chunk: the wait is a worker thread's.
        while (chunk := await asyncio.to_thread(step)) is not None:
            yield chunk
    finally:
        if isinstance(items, Generator):
            items.close()  # a consumer that stops early ends the call's stream now
