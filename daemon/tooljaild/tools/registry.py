"""The tools the daemon serves: what a tool is, its arguments' check, the registry.

`Tool` (with its `ToolOptions` and `SandboxProfile`) is a tool as the daemon
serves it; `Registry` holds the served ones by name next to the diagnostics of
loading them. The built-ins are in `tools.builtin.catalog`, handed in by the
daemon; loading user tools (in a sandbox, never here) is in `loader`.

`validate_arguments` checks a call's arguments against a tool's schema before
any sandbox is used, with one error message a person or a model can act on.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SkipValidation, model_validator

from tooljail.common import bounded, json_type_name
from tooljail.errors import InvalidArgumentsError, ToolNotFoundError
from tooljail.types import Diagnostic, ToolInfo
from tooljaild.settings.egress_rules import check_secret_name
from tooljaild.settings.sandbox import Limits, SandboxProfile
from tooljaild.tools.run import BuiltinRun

__all__ = [
    "Registry",
    "Tool",
    "ToolOptions",
    "validate_arguments",
]

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a tool name may be (what the OpenAI and Anthropic APIs accept)."""

_MAX_KILL_AFTER_S = 86400.0
MAX_CACHE_S = 7 * 24 * 3600.0
"""The longest a tool may cache a success (`cache_s`): a week, the journal's
default retention (`journal_max_age_s`), where the cache lives."""


class ToolOptions(BaseModel):
    """How calls of a tool run. Unknown keys are rejected, to catch typos."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    timeout_s: float = 180.0
    """Default timeout of a call, in seconds; a call may ask for another within bounds."""
    max_timeout_s: float = Field(default=1000.0, ge=1.0)
    """The longest timeout a call of this tool may ask for, in seconds."""
    kill_after_s: float = 0.0
    """When to kill a call that keeps running after its timeout, in seconds from its
    start; 0 means kill it at the timeout."""
    idempotent: bool = False
    """Whether running a call twice is harmless, so that it may be retried."""
    streaming: bool = False
    """Whether the call's output is streamed while it runs."""
    limits: dict[str, Any] = Field(default_factory=dict)
    """Sandbox limit overrides (from `@tool(limits=...)`), read by the sandbox layer."""
    sandbox: SandboxProfile = Field(default_factory=SandboxProfile)
    """Which backend (and image, network) runs the calls (from `@tool(sandbox=...)`)."""
    secrets: list[str] = Field(default_factory=list)
    """Names of the secrets its calls hold (from `@tool(secrets=[...])`): in the
    sandbox each variable holds a placeholder the egress proxy swaps for the value
    on the way to that secret's hosts."""
    cache_s: float = 0.0
    """For how long, in seconds, a success is given again (marked cached, without
    running the tool) to the same caller asking with the same arguments
    (`@tool(cache_s=...)`); 0: never. At most `MAX_CACHE_S`; a journal that keeps
    calls for less bounds it too (the cache is the journal)."""

    @model_validator(mode="after")
    def _check_bounds(self) -> ToolOptions:
        for name in self.secrets:
            problem = check_secret_name(name)
            if problem is not None:
                raise ValueError(problem)
        unknown = sorted(set(self.limits) - set(Limits.model_fields))
        if unknown:
            raise ValueError(
                f"unknown limit {', '.join(unknown)}; limits are " + ", ".join(Limits.model_fields)
            )
        for key, value in self.limits.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"limit {key} must be a whole number >= 0, got {value!r}")
        if not 0.0 <= self.cache_s <= MAX_CACHE_S:
            raise ValueError(
                f"cache_s must be between 0 (no cache) and {MAX_CACHE_S:g} seconds (7 days), "
                f"got {self.cache_s:g}"
            )
        if self.cache_s and self.streaming:
            # The journal keeps a call's result, not what it streamed: a cached
            # answer of a streaming tool would come without its content.
            raise ValueError(
                "cache_s cannot be set on a streaming tool (a generator): only the "
                "result is kept, not what it streamed; return the value instead"
            )
        # A tool that sets no timeout_s takes the daemon's default_timeout_s
        # (capped by max_timeout_s): its field's default value is not checked.
        own_timeout = "timeout_s" in self.model_fields_set
        if own_timeout and not 1.0 <= self.timeout_s <= self.max_timeout_s:
            raise ValueError(
                f"timeout_s must be between 1 and {self.max_timeout_s:g} seconds, "
                f"got {self.timeout_s:g}"
            )
        floor = self.timeout_s if own_timeout else 0.0
        if self.kill_after_s != 0 and not (floor < self.kill_after_s <= _MAX_KILL_AFTER_S):
            above = f"more than timeout_s ({self.timeout_s:g}) and " if own_timeout else ""
            raise ValueError(
                f"kill_after_s must be 0 (kill at the timeout) or {above}at most "
                f"{_MAX_KILL_AFTER_S:g}, got {self.kill_after_s:g}"
            )
        return self


class Tool(BaseModel):
    """A tool as the daemon serves it."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Unique among served tools; matches `TOOL_NAME`."""
    description: str = ""
    """What the tool does, written for a model."""
    input_schema: dict[str, Any]
    """JSON Schema (draft 2020-12) of the arguments object."""
    options: ToolOptions = Field(default_factory=ToolOptions)
    source: Literal["builtin", "user"]
    builtin: str | None = None
    """Which built-in implementation runs the call (built-ins only)."""
    run: SkipValidation[BuiltinRun | None] = Field(default=None, exclude=True, repr=False)
    """How the daemon runs it, set once by the catalog that builds a built-in
    (`tools.builtin.catalog.builtin_tools`); None: a user tool (its module's function)."""
    module_path: str | None = None
    """The file the runner imports (user tools only)."""
    function: str | None = None
    """The attribute of the module to call (user tools only)."""
    file: str = ""
    """Where the tool was defined, for diagnostics; "" for built-ins."""

    # Compiled lazily by `validate_arguments`; private attributes may be set on a
    # frozen model, and the schema never changes after construction.
    _validator: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _no_cached_builtins(self) -> Tool:
        # A built-in runs code or reads what changes (workspaces, artifacts):
        # its answer is never an earlier one's.
        if self.source == "builtin" and self.options.cache_s:
            raise ValueError(f"the built-in {self.name!r} cannot cache its results (cache_s)")
        return self

    @property
    def runs_in_daemon(self) -> bool:
        """Whether it runs in the daemon itself (no sandbox, so never in a session)."""
        return self.run is not None and self.run.kind == "daemon"

    def info(self) -> ToolInfo:
        """This tool as the SDK sees it."""
        return ToolInfo(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            timeout_s=self.options.timeout_s,
            max_timeout_s=self.options.max_timeout_s,
            kill_after_s=self.options.kill_after_s,
            idempotent=self.options.idempotent,
            streaming=self.options.streaming,
            source=self.source,
            cache_s=self.options.cache_s,
        )


# --- argument validation ---------------------------------------------------------


def validate_arguments(tool: Tool, arguments: object) -> dict[str, object]:
    """Check a call's arguments against the tool's input schema.

    Args:
        tool: The tool being called.
        arguments: The decoded JSON arguments.

    Returns:
        A copy of the arguments (defaults are not filled in: the tool has them).

    Raises:
        InvalidArgumentsError: When the arguments are not a JSON object or do not
            match the schema. It reports the single most useful problem: an
            unknown argument, then a missing one, then a wrong value.
    """
    if not isinstance(arguments, dict):
        actual = json_type_name(arguments)
        raise InvalidArgumentsError(
            f"arguments must be a JSON object of named parameters, got {actual}",
            parameter="",
            expected="object",
            actual=actual,
        )
    if tool._validator is None:
        validator_class = jsonschema.Draft202012Validator
        tool._validator = validator_class(tool.input_schema)
    errors = list(tool._validator.iter_errors(arguments))
    if errors:
        raise _describe(min(errors, key=_error_rank))
    return dict(arguments)


_RANK = {"additionalProperties": 0, "required": 1, "type": 2, "enum": 3, "const": 3}


def _error_rank(error: Any) -> tuple[int, int]:
    # Shallow before deep, and an unknown name before a missing one: a misspelt
    # argument shows as both, and "did you mean" explains it best.
    return (len(error.absolute_path), _RANK.get(error.validator, 4))


def _describe(error: Any) -> InvalidArgumentsError:
    path = list(error.absolute_path)
    where = _dotted(path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    instance = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = list(schema.get("properties", {}))
        unknown = [k for k in instance if k not in schema.get("properties", {})]
        name = unknown[0] if unknown else "?"
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        accepted = f"accepted: {', '.join(known)}" if known else "it takes no arguments here"
        label = f"unknown argument '{name}'" if not path else f"unknown key '{name}' in {where}"
        return InvalidArgumentsError(
            f"{label}{hint}; {accepted}",
            parameter=_dotted([*path, name]),
            expected=", ".join(known),
            actual=name,
        )
    if error.validator == "required" and isinstance(instance, dict):
        missing = [r for r in schema.get("required", []) if r not in instance]
        name = missing[0] if missing else "?"
        prop = schema.get("properties", {}).get(name, {})
        expected = _expected(prop) or "a value"
        about = f": {prop['description']}" if prop.get("description") else ""
        more = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        owner = "" if not path else f" in {where}"
        return InvalidArgumentsError(
            f"missing required argument '{name}'{owner} ({expected}{about}){more}",
            parameter=_dotted([*path, name]),
            expected=expected,
            actual="missing",
        )
    if error.validator in ("anyOf", "oneOf") and error.context:
        # When the value has the type of one branch (a list given for
        # `list[str] | None`), the problem is inside it: report that instead.
        inner = [
            e
            for e in error.context
            if e.relative_path or e.validator not in ("type", "enum", "const")
        ]
        if inner:
            return _describe(min(inner, key=_error_rank))
    expected = _expected(schema)
    if error.validator in ("type", "enum", "const", "anyOf", "oneOf") and expected:
        actual = json_type_name(instance)
        return InvalidArgumentsError(
            f"parameter '{where}' expects {expected}, got {actual} ({_short(instance)})",
            parameter=where,
            expected=expected,
            actual=actual,
        )
    return InvalidArgumentsError(
        f"parameter '{where}' is invalid: {error.message}",
        parameter=where,
        expected=expected,
        actual=json_type_name(instance),
    )


def _expected(schema: Mapping[str, Any]) -> str:
    """What a schema accepts, in words: "integer", "integer or null", 'one of "a", "b"'.

    Returns "" when the schema is not a plain type, enum or union of those.
    """
    if "enum" in schema:
        return "one of " + ", ".join(_short(v) for v in schema["enum"])
    if "const" in schema:
        return _short(schema["const"])
    if "type" in schema:
        kind = schema["type"]
        return kind if isinstance(kind, str) else " or ".join(kind)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_expected(sub) for sub in schema[key]]
            return " or ".join(parts) if all(parts) else ""
    return ""


def _dotted(path: Sequence[object]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: object, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the registry ----------------------------------------------------------------


class Registry:
    """The served tools by name, with the diagnostics of loading them.

    Args:
        user_tools: User tools in load order; of two tools with one name, the
            first is served.
        diagnostics: Diagnostics from `find_tool_files` and `build_user_tools`.
        builtins: The built-in tools, handed in by whoever composes the daemon
            (`tools.builtin.catalog` builds them); they win every name collision.
            Empty by default: this module knows no tool of its own.

    Raises:
        ValueError: When two built-ins share a name (a programming error).
    """

    def __init__(
        self,
        user_tools: Iterable[Tool] = (),
        diagnostics: Iterable[Diagnostic] = (),
        *,
        builtins: Iterable[Tool] = (),
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._diagnostics = list(diagnostics)
        for tool in builtins:
            if tool.name in self._tools:
                raise ValueError(f"two built-in tools are named {tool.name!r}")
            if tool.source == "builtin" and tool.run is None:
                raise ValueError(f"the built-in {tool.name!r} does not say how it runs")
            self._tools[tool.name] = tool
        for tool in user_tools:
            first = self._tools.get(tool.name)
            if first is None:
                self._tools[tool.name] = tool
                continue
            other = (
                "the built-in tool" if first.source == "builtin" else f"the tool in {first.file}"
            )
            self._diagnostics.append(
                Diagnostic(
                    severity="error",
                    code="duplicate_name",
                    message=f"tool '{tool.name}' in {tool.file} is not served: {other} has "
                    "the same name; rename one of them",
                    file=tool.file,
                    tool=tool.name,
                )
            )

    def get(self, name: str) -> Tool:
        """The tool of that name.

        Raises:
            ToolNotFoundError: When no such tool is served; the message suggests a
                close name and lists some available ones.
        """
        tool = self._tools.get(name)
        if tool is not None:
            return tool
        names = list(self._tools)
        # A name far past the 64-character limit is close to none, and difflib
        # takes seconds on the event loop for a request-sized one.
        close = difflib.get_close_matches(name, names, n=1) if len(name) <= 128 else []
        hint = f" Did you mean '{close[0]}'?" if close else ""
        shown = ", ".join(names[:10]) + (
            f" (and {len(names) - 10} more)" if len(names) > 10 else ""
        )
        raise ToolNotFoundError(
            f"no tool named '{bounded(name, 160)}'.{hint} Available tools: {shown}"
        )

    def tools(self) -> list[Tool]:
        """Every served tool: built-ins first, then user tools in load order."""
        return list(self._tools.values())

    @property
    def diagnostics(self) -> list[Diagnostic]:
        """Problems found while loading, in the order they were found."""
        return list(self._diagnostics)
