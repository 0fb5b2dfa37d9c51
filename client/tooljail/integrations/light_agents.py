"""The daemon's tools as light-agents tools: `ToolBaseSchema` instances.

    from light_agents.ai_agents import OpenAIAgent
    from tooljail import Client
    from tooljail.integrations import light_agents

    client = Client()
    agent = OpenAIAgent(tools=light_agents.tools(client))

light-agents (`light-agents` 0.1.2 on PyPI) registers a tool's bound `run` in
its `ToolRegistry` under the tool's `name`; `ToolRegistry.execute_tool` calls it
with the model's arguments merged with the agent's own keyword arguments
(`verbose`, the thread's external fields, ...) and wants a `ToolResponseSchema`
back. So each tool here:

- declares the daemon tool's parameters as its fields (light-agents'
  serializers build the schema the model reads from a tool's fields: each
  field's type from its default value, its description from the field), and
  `required` from the schema; `openai_serializer` gives the model the daemon's
  full JSON schema instead (enums, items, bounds, and a parameter named as a
  field of `ToolBaseSchema` itself, like `name`, which cannot be a field);
- takes, in `run(**kwargs)`, the tool's arguments and `timeout_s`, and drops
  every other keyword (those the agent adds), since the daemon refuses
  arguments a tool does not declare;
- returns `ToolResponseSchema(content=<the text the model reads>)`, with
  `is_error=True` on a tool's error, a timeout (it may still take effect; the
  text carries the call id), a cancellation, a refusal, or no daemon; and the
  call's outcome (`Outcome.as_dict()`: status, call id, still_running,
  artifacts) in `external_fields["tooljail"]`, for the thread, not the model.

Call ids: light-agents hands a tool only its arguments, never the model's
tool-call id (`run_id`), so each call gets a fresh id (`tooljail.integrations._ids`).

light-agents runs tools synchronously and takes one response per call, so the
target is a `Client` or `Session`, and a streaming tool's output reaches the
model whole; `on_output` sees it as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import Field, PrivateAttr, create_model

from tooljail.integrations.core import (
    Outcome,
    SyncTarget,
    ToolSpec,
    is_async,
    require,
    run,
    stream,
    tool_specs,
)

_schemas = require("light_agents.schemas", "light-agents")
_ToolBaseSchema: Any = _schemas.ToolBaseSchema
_ToolResponseSchema: Any = _schemas.ToolResponseSchema

__all__ = ["DaemonTool", "OutputCallback", "openai_serializer", "tools"]

OutputCallback = Callable[[str, str], None]
"""Called with (the tool's name, a piece of its output) as a streaming tool's output arrives."""

# A placeholder default per JSON type: light-agents' serializers read a field's
# type from its default value (str -> string, a number -> number, ...).
_PLACEHOLDERS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0.0,
    "boolean": False,
    "array": [],
    "object": {},
}


class DaemonTool(_ToolBaseSchema):  # type: ignore[misc]  # light-agents ships no type hints
    """One daemon tool as a light-agents tool; made by `tools`, one subclass per tool.

    Its fields beyond `ToolBaseSchema`'s are the tool's parameters (for the
    schema the model reads); the call itself goes to the daemon with the
    arguments `run` is given.
    """

    _target: SyncTarget = PrivateAttr()
    _spec: ToolSpec = PrivateAttr()
    _on_output: OutputCallback | None = PrivateAttr(default=None)

    @property
    def spec(self) -> ToolSpec:
        """The daemon tool this runs (its daemon name, schema, flags)."""
        return self._spec

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the daemon tool with the keyword arguments it declares.

        Args:
            args: Not used: light-agents passes every argument by name.
            kwargs: The tool's arguments, an optional `timeout_s`, and whatever
                else the agent passes (dropped: the daemon refuses arguments a
                tool does not declare).

        Returns:
            A `ToolResponseSchema`: `content` is the text the model reads,
            `is_error` is set when the call failed, and
            `external_fields["tooljail"]` holds the call's outcome as data.
        """
        # The declared parameters include `timeout_s` (core adds it to the schema).
        declared = self._spec.parameters.get("properties") or {}
        arguments = {k: v for k, v in kwargs.items() if k in declared}
        outcome = self._call(arguments)
        return _ToolResponseSchema(
            content=outcome.text,
            is_error=not outcome.ok,
            external_fields={"tooljail": outcome.as_dict()},
        )

    def _call(self, arguments: dict[str, Any]) -> Outcome:
        if not (self._spec.streaming and self._on_output is not None):
            return run(self._target, self._spec, arguments)
        for item in stream(self._target, self._spec, arguments):
            if isinstance(item, Outcome):
                return item
            self._on_output(self.name, item)
        raise AssertionError("core.stream ends with an Outcome")  # pragma: no cover


def tools(
    target: SyncTarget,
    names: Iterable[str] | None = None,
    *,
    on_output: OutputCallback | None = None,
) -> list[DaemonTool]:
    """The daemon's tools (or the named ones) as light-agents tools.

    Args:
        target: A `Client`, or a `Session` to run every tool in its interpreter
            and workspace (a variable set by one call is there in the next).
        names: The daemon's names of the tools to serve, in that order; None
            serves all. Each keeps the daemon's name.
        on_output: Called with (tool name, text) as a streaming tool's output
            arrives; the model still gets the whole output in one response.

    Returns:
        `ToolBaseSchema` instances, for `OpenAIAgent(tools=...)`,
        `ClaudeAgent(tools=...)` or `ToolRegistry.register_tools`.

    Raises:
        TypeError: When `target` is an `AsyncClient` or `AsyncSession`
            (light-agents calls tools synchronously).
        ToolNotFoundError: When a name is not served (the message names those that are).
        TransportError: When the daemon cannot be reached.
    """
    if is_async(target):
        raise TypeError(
            "light-agents calls its tools synchronously: give light_agents.tools "
            "a Client or Session, not an AsyncClient or AsyncSession"
        )
    return [_tool(target, spec, on_output) for spec in tool_specs(target, names)]


def _tool(target: SyncTarget, spec: ToolSpec, on_output: OutputCallback | None) -> DaemonTool:
    properties: dict[str, Any] = spec.parameters.get("properties") or {}
    fields: dict[str, Any] = {
        name: (Any, Field(default=_placeholder(prop), description=prop.get("description")))
        for name, prop in properties.items()
        if _declarable(name)
    }
    model = create_model(f"DaemonTool_{spec.name}", __base__=DaemonTool, **fields)
    tool = model(
        name=spec.name,
        description=spec.description,
        required=list(spec.parameters.get("required") or []),
    )
    tool._target = target
    tool._spec = spec
    tool._on_output = on_output
    return tool


def _declarable(name: str) -> bool:
    """Whether a parameter can be a field of the tool's model.

    A parameter named as one of `ToolBaseSchema`'s own fields (`name`,
    `description`, ...) or a pydantic attribute would replace it: such a
    parameter is not declared (light-agents' own serializer does not show it;
    `openai_serializer` does), and `run` still passes it to the daemon.
    """
    reserved = name in DaemonTool.model_fields or hasattr(DaemonTool, name)
    return not (reserved or name.startswith(("_", "model_")))


def _placeholder(prop: dict[str, Any]) -> Any:
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return _PLACEHOLDERS.get(kind if isinstance(kind, str) else "string", "")


def openai_serializer(tool: Any) -> dict[str, Any]:
    """A tool in OpenAI's function-calling form, with a daemon tool's full JSON schema.

    For `OpenAIAgent(tools_serializer=light_agents.openai_serializer)`: a
    `DaemonTool` gets the daemon's schema (enums, array items, bounds, the
    `timeout_s` limit), which light-agents' own serializer reduces to a type
    and a description per field; any other tool is serialized by light-agents.
    """
    if isinstance(tool, DaemonTool):
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.spec.parameters,
            },
        }
    serializers = require("light_agents.serializers.tools", "light-agents")
    serialized: dict[str, Any] = serializers.openai_tool_calling_serializer(tool)
    return serialized
