"""The daemon's tools for a function-calling loop of your own: OpenAI's and Anthropic's shapes.

No package is needed: the tools are plain dicts, and a tool call is read as the
SDKs give it (their objects, or dicts).

    from openai import OpenAI
    from tooljail import Client
    from tooljail.integrations import openai as tj

    client, llm = Client(), OpenAI()
    messages = [{"role": "user", "content": "What is 2**100? Run Python."}]
    reply = llm.chat.completions.create(model=..., messages=messages, tools=tj.tools(client))
    message = reply.choices[0].message
    messages.append(message)
    messages += [tj.dispatch(client, call) for call in message.tool_calls or []]

- `tools(target)`: Chat Completions tool definitions (`{"type": "function",
  "function": {...}}`) with the daemon's JSON schemas and `timeout_s`.
- `dispatch(target, tool_call)` runs one tool call, a `ChatCompletionMessageToolCall`
  or its dict (`arguments` a JSON string), and returns the `tool` message to
  append: `{"role": "tool", "tool_call_id": ..., "content": text}`. A Responses
  API `function_call` item gives its `function_call_output` item instead. The
  text is the output on success; on failure what happened (a timeout's names the
  call id and whether it is still running), for the model to act on: OpenAI's
  tool message has no error flag. Arguments that are not JSON, a tool the daemon
  does not serve (or that `names` leaves out) are answered the same way, and the
  tool does not run. `adispatch` is the same with an `AsyncClient`/`AsyncSession`.
- `anthropic_tools(target)`: Anthropic Messages tool definitions (`name`,
  `description`, `input_schema`); `anthropic_dispatch(target, block)` runs a
  `tool_use` block (object or dict) and returns the `tool_result` block, with
  `is_error` true on failure; `anthropic_adispatch` awaits.
- The call's id: the model's own (`tool_call.id`, a Responses item's
  `call_id`, `tool_use.id`), as `<client name>:<id>`
  (`tooljail.integrations._ids`): a host that restarts and replays the same
  conversation gets the journaled answer of a call that already ran, and the
  tool does not run twice. Give the client the same `client_name` across restarts.
- Streaming: a tool message is whole, so `on_output` (a callable taking each
  chunk of text) is how a host shows a streaming tool's output as it arrives.

With an `AsyncClient` or `AsyncSession`, `tools` and `anthropic_tools` return
a coroutine: await it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, overload

from tooljail.errors import TooljailError
from tooljail.integrations import _ids, core
from tooljail.integrations.core import AsyncTarget, Outcome, SyncTarget, Target, ToolSpec

__all__ = [
    "adispatch",
    "anthropic_adispatch",
    "anthropic_dispatch",
    "anthropic_tools",
    "dispatch",
    "tools",
]

Message = dict[str, Any]
OnOutput = Callable[[str], object]
"""Called with each chunk of a streaming tool's output text as it arrives."""


# --- the tools ---------------------------------------------------------------------


def _openai_tool(spec: ToolSpec) -> Message:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _anthropic_tool(spec: ToolSpec) -> Message:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}


async def _async_shaped(
    target: AsyncTarget, names: Iterable[str] | None, shape: Callable[[ToolSpec], Message]
) -> list[Message]:
    return [shape(spec) for spec in await core.atool_specs(target, names)]


def _shaped(
    target: Target, names: Iterable[str] | None, shape: Callable[[ToolSpec], Message]
) -> list[Message] | Awaitable[list[Message]]:
    if isinstance(target, AsyncTarget):
        return _async_shaped(target, names, shape)
    return [shape(spec) for spec in core.tool_specs(target, names)]


@overload
def tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[Message]: ...
@overload
def tools(target: AsyncTarget, names: Iterable[str] | None = None) -> Awaitable[list[Message]]: ...
def tools(
    target: Target, names: Iterable[str] | None = None
) -> list[Message] | Awaitable[list[Message]]:
    """The daemon's tools (or those named, in that order) as OpenAI tool definitions.

    Args:
        target: A `Client` or `Session`, or an `AsyncClient` or `AsyncSession`
            (then a coroutine giving the list: await it).
        names: The daemon's names of the tools to give; None gives all.

    Raises:
        ToolNotFoundError: When a name is not served, naming those that are.
        TransportError: When the daemon cannot be reached.
    """
    return _shaped(target, names, _openai_tool)


@overload
def anthropic_tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[Message]: ...
@overload
def anthropic_tools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> Awaitable[list[Message]]: ...
def anthropic_tools(
    target: Target, names: Iterable[str] | None = None
) -> list[Message] | Awaitable[list[Message]]:
    """The daemon's tools (or those named) as Anthropic Messages tool definitions.

    Args and raises as `tools`.
    """
    return _shaped(target, names, _anthropic_tool)


# --- reading a tool call -----------------------------------------------------------


def _field(obj: Any, name: str) -> Any:
    """A field of an SDK object or of its dict."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


@dataclass(frozen=True)
class _Call:
    """One tool call as a model asked for it, in any of the shapes read here."""

    id: str
    name: str
    arguments: Any
    """A JSON string (OpenAI), a dict (Anthropic), or None."""
    shape: Callable[[str, str, bool], Message]
    """(call id, text, ok) -> the message or block that answers it."""

    def reply(self, text: str, *, ok: bool) -> Message:
        return self.shape(self.id, text, ok)

    def answer(self, outcome: Outcome) -> Message:
        return self.shape(self.id, outcome.text, outcome.ok)


def _chat_answer(call_id: str, text: str, ok: bool) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _responses_answer(call_id: str, text: str, ok: bool) -> Message:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def _anthropic_answer(call_id: str, text: str, ok: bool) -> Message:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": not ok}


def _openai_call(tool_call: Any) -> _Call:
    if _field(tool_call, "type") == "function_call":  # a Responses API item
        return _Call(
            id=str(_field(tool_call, "call_id") or ""),
            name=str(_field(tool_call, "name") or ""),
            arguments=_field(tool_call, "arguments"),
            shape=_responses_answer,
        )
    function = _field(tool_call, "function")
    return _Call(
        id=str(_field(tool_call, "id") or ""),
        name=str(_field(function, "name") or ""),
        arguments=_field(function, "arguments"),
        shape=_chat_answer,
    )


def _anthropic_call(block: Any) -> _Call:
    return _Call(
        id=str(_field(block, "id") or ""),
        name=str(_field(block, "name") or ""),
        arguments=_field(block, "input"),
        shape=_anthropic_answer,
    )


def _parse_arguments(raw: Any) -> dict[str, Any] | str:
    """The call's arguments, or why they cannot be read (what the model is told)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as e:
            shown = raw[:200] if isinstance(raw, str) else raw[:200].decode(errors="replace")
            return (
                f"The arguments are not valid JSON ({e}): {shown!r}. "
                "The tool did not run; call it again with a JSON object of arguments."
            )
    if not isinstance(raw, Mapping):
        return (
            f"The arguments must be a JSON object, got {type(raw).__name__}. "
            "The tool did not run; call it again with a JSON object of arguments."
        )
    return dict(raw)


def _ready(
    call: _Call, specs: Iterable[ToolSpec], names: Iterable[str] | None
) -> tuple[ToolSpec, dict[str, Any]] | Message:
    """The spec and arguments to run, or the answer that says why nothing runs."""
    arguments = _parse_arguments(call.arguments)
    if isinstance(arguments, str):
        return call.reply(arguments, ok=False)
    allowed = None if names is None else set(names)
    offered = {s.name: s for s in specs if allowed is None or s.tool in allowed}
    if call.name not in offered:
        return call.reply(
            f"There is no tool named {call.name!r}. The tool did not run. "
            f"The tools are: {', '.join(sorted(offered)) or 'none'}.",
            ok=False,
        )
    return offered[call.name], arguments


def _unreachable(call: _Call, error: TooljailError) -> Message:
    return call.reply(core.outcome_of_error(call.name, call.id, error).text, ok=False)


# --- running it --------------------------------------------------------------------


def _run(
    target: SyncTarget, call: _Call, names: Iterable[str] | None, on_output: OnOutput | None
) -> Message:
    try:
        ready = _ready(call, core.tool_specs(target), names)
    except TooljailError as e:
        return _unreachable(call, e)
    if not isinstance(ready, tuple):
        return ready
    spec, arguments = ready
    if on_output is None or not spec.streaming:
        return call.answer(_ids.run(target, spec, arguments, call.id))
    for item in _ids.stream(target, spec, arguments, call.id):
        if not isinstance(item, Outcome):
            on_output(item)
            continue
        return call.answer(item)
    raise AssertionError("core.stream ends with an Outcome")


async def _arun(
    target: AsyncTarget, call: _Call, names: Iterable[str] | None, on_output: OnOutput | None
) -> Message:
    try:
        ready = _ready(call, await core.atool_specs(target), names)
    except TooljailError as e:
        return _unreachable(call, e)
    if not isinstance(ready, tuple):
        return ready
    spec, arguments = ready
    if on_output is None or not spec.streaming:
        return call.answer(await _ids.arun(target, spec, arguments, call.id))
    async for item in _ids.astream(target, spec, arguments, call.id):
        if not isinstance(item, Outcome):
            on_output(item)
            continue
        return call.answer(item)
    raise AssertionError("core.astream ends with an Outcome")


def dispatch(
    target: SyncTarget,
    tool_call: Any,
    *,
    names: Iterable[str] | None = None,
    on_output: OnOutput | None = None,
) -> Message:
    """Runs one OpenAI tool call and returns the message that answers it.

    Never raises for what the model can act on: bad JSON, an unknown tool, the
    tool's failure, a timeout, a refusal or no daemon all become the message's text.

    Args:
        target: A `Client` or `Session` (in a session, calls share its interpreter).
        tool_call: A Chat Completions tool call (`ChatCompletionMessageToolCall` or
            its dict: `id`, `function.name`, `function.arguments` a JSON string),
            or a Responses API `function_call` item (object or dict).
        names: The daemon's names of the tools the model was offered; a call to
            any other is refused. None: any tool the daemon serves.
        on_output: Called with each chunk of a streaming tool's output as it arrives.

    Returns:
        `{"role": "tool", "tool_call_id", "content"}`, or for a Responses API item
        `{"type": "function_call_output", "call_id", "output"}`.
    """
    return _run(target, _openai_call(tool_call), names, on_output)


async def adispatch(
    target: AsyncTarget,
    tool_call: Any,
    *,
    names: Iterable[str] | None = None,
    on_output: OnOutput | None = None,
) -> Message:
    """As `dispatch`, awaited, with an `AsyncClient` or `AsyncSession`."""
    return await _arun(target, _openai_call(tool_call), names, on_output)


def anthropic_dispatch(
    target: SyncTarget,
    block: Any,
    *,
    names: Iterable[str] | None = None,
    on_output: OnOutput | None = None,
) -> Message:
    """Runs one Anthropic `tool_use` block and returns the `tool_result` block.

    Args:
        target: A `Client` or `Session`.
        block: A `ToolUseBlock` or its dict (`id`, `name`, `input` a dict).
        names: As in `dispatch`.
        on_output: As in `dispatch`.

    Returns:
        `{"type": "tool_result", "tool_use_id", "content", "is_error"}`.
    """
    return _run(target, _anthropic_call(block), names, on_output)


async def anthropic_adispatch(
    target: AsyncTarget,
    block: Any,
    *,
    names: Iterable[str] | None = None,
    on_output: OnOutput | None = None,
) -> Message:
    """As `anthropic_dispatch`, awaited, with an `AsyncClient` or `AsyncSession`."""
    return await _arun(target, _anthropic_call(block), names, on_output)
