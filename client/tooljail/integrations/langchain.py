"""The daemon's tools as LangChain `StructuredTool`s (`pip install 'tooljail[langchain]'`).

    from tooljail import Client
    from tooljail.integrations import langchain

    client = Client()
    tools = langchain.tools(client)  # await langchain.tools(async_client) with an AsyncClient
    message = tools[0].invoke(
        {"type": "tool_call", "id": "call_1", "name": "execute_python_code",
         "args": {"code": "print(1 + 1)"}}
    )  # ToolMessage(content="2", status="success", artifact={... "call_id": ...})

Each tool's `args_schema` is the daemon's JSON schema (with `timeout_s`), so a
chat model's `bind_tools` sends the model exactly what the daemon checks. With a
`Client` or `Session` a tool has a sync function (LangChain runs it in a worker
thread for `ainvoke`); with an `AsyncClient` or `AsyncSession` a coroutine (and
no sync function: LangChain's `invoke` then says so).

- Success: the content is the output text; `response_format` is
  "content_and_artifact", so a `ToolMessage` also carries the outcome's data
  (`call_id`, `status`, `effect`, the artifacts) as its `artifact`.
- Failure (the tool's error, a timeout, a cancellation, a refusal, no daemon):
  the tool raises `ToolFailed`, a `ToolException`, and `handle_tool_error=True`
  makes it a `ToolMessage` with `status="error"` and the outcome's text as its
  content (a timeout's names the call id and whether it is still running).
- The call's id: invoked with a `ToolCall` (as an agent does), the call runs
  under its id, as `<client name>:<id>` (`tooljail.integrations._ids`): a host
  that restarts and replays the conversation gets the journaled answer, and the
  tool does not run twice. Invoked with bare arguments, a fresh id.
- Streaming: a streaming tool's output goes out as it arrives as LangChain
  custom events named `tooljail_output` (data `{"tool": name, "text": chunk}`),
  which `astream_events(..., version="v2")` yields as `on_custom_event` and a
  callback handler receives in `on_custom_event`; the tool's result is still
  the whole output. LangChain has no other way for a tool to stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Iterable
from typing import Any, overload

from tooljail.integrations import _ids, core
from tooljail.integrations.core import AsyncTarget, Outcome, SyncTarget, Target, ToolSpec

core.require("langchain_core", "langchain")

from langchain_core.callbacks import (  # noqa: E402 (after the check that says what to install)
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.tools import StructuredTool, ToolException  # noqa: E402

__all__ = ["OUTPUT_EVENT", "ToolFailed", "tools"]

OUTPUT_EVENT = "tooljail_output"
"""The name of the custom event that carries a streaming tool's output as it arrives."""

Answer = tuple[str, dict[str, Any]]
"""What a tool returns: the text the model reads, and the outcome as the message's artifact."""


class ToolFailed(ToolException):
    """A call that did not succeed; its message is what the model reads.

    Attributes:
        outcome: The call's whole outcome (`kind`, `call_id`, `still_running`, ...),
            for a `handle_tool_error` callable of your own.
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.text)
        self.outcome = outcome


@overload
def tools(target: SyncTarget, names: Iterable[str] | None = None) -> list[StructuredTool]: ...
@overload
def tools(
    target: AsyncTarget, names: Iterable[str] | None = None
) -> Awaitable[list[StructuredTool]]: ...
def tools(
    target: Target, names: Iterable[str] | None = None
) -> list[StructuredTool] | Awaitable[list[StructuredTool]]:
    """The daemon's tools (or those named, in that order) as LangChain tools.

    Args:
        target: A `Client` or `Session` (the list is returned, tools with a sync
            function), or an `AsyncClient` or `AsyncSession` (a coroutine giving
            it, tools with a coroutine: await it).
        names: The daemon's names of the tools to give; None gives all.

    Raises:
        ToolNotFoundError: When a name is not served, naming those that are.
        TransportError: When the daemon cannot be reached.
    """
    if isinstance(target, AsyncTarget):
        return _async_tools(target, names)
    return [_sync_tool(target, spec) for spec in core.tool_specs(target, names)]


async def _async_tools(target: AsyncTarget, names: Iterable[str] | None) -> list[StructuredTool]:
    return [_async_tool(target, spec) for spec in await core.atool_specs(target, names)]


_MODEL_ID = "tooljail:tool_call_id"
"""The key under which `_Tool` hands the function the model's tool-call id (no
tool's argument can be named so: a ":" is in no Python name, and in no schema
property a daemon serves that a model would fill)."""


class _Tool(StructuredTool):
    """A StructuredTool whose function learns the model's tool-call id.

    LangChain injects a `ToolCall`'s id only into an `InjectedToolCallId`
    argument of a pydantic schema; ours is the daemon's JSON schema, so the id
    is taken where LangChain hands it to the tool (`_to_args_and_kwargs`, for
    `invoke` and `ainvoke` of a ToolCall) and passed on under `_MODEL_ID`.
    """

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = super()._to_args_and_kwargs(tool_input, tool_call_id)
        if tool_call_id:
            kwargs[_MODEL_ID] = tool_call_id
        return args, kwargs


def _structured_tool(spec: ToolSpec, **function: Any) -> StructuredTool:
    return _Tool(
        name=spec.name,
        description=spec.description,
        args_schema=spec.parameters,
        response_format="content_and_artifact",
        handle_tool_error=True,
        metadata={"tooljail_tool": spec.tool, "idempotent": spec.idempotent},
        **function,
    )


def _answer(outcome: Outcome) -> Answer:
    if not outcome.ok:
        raise ToolFailed(outcome)
    return outcome.text, outcome.as_dict()


def _event(spec: ToolSpec, text: str) -> dict[str, str]:
    return {"tool": spec.name, "text": text}


def _sync_tool(target: SyncTarget, spec: ToolSpec) -> StructuredTool:
    def call(**arguments: Any) -> Answer:
        model_id = arguments.pop(_MODEL_ID, None)
        if not spec.streaming:
            return _answer(_ids.run(target, spec, arguments, model_id))
        for item in _ids.stream(target, spec, arguments, model_id):
            if isinstance(item, Outcome):
                return _answer(item)
            # RuntimeError: not inside a LangChain run (the function called directly),
            # so no one listens.
            with contextlib.suppress(RuntimeError):
                dispatch_custom_event(OUTPUT_EVENT, _event(spec, item))
        raise AssertionError("core.stream ends with an Outcome")

    return _structured_tool(spec, func=call)


def _async_tool(target: AsyncTarget, spec: ToolSpec) -> StructuredTool:
    async def call(**arguments: Any) -> Answer:
        model_id = arguments.pop(_MODEL_ID, None)
        if not spec.streaming:
            return _answer(await _ids.arun(target, spec, arguments, model_id))
        async for item in _ids.astream(target, spec, arguments, model_id):
            if isinstance(item, Outcome):
                return _answer(item)
            with contextlib.suppress(RuntimeError):  # as in _sync_tool
                await adispatch_custom_event(OUTPUT_EVENT, _event(spec, item))
        raise AssertionError("core.astream ends with an Outcome")

    return _structured_tool(spec, coroutine=call)
