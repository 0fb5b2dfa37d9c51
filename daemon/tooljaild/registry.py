"""The tools the daemon serves: built-ins, user tools, and their load diagnostics.

Loading user tools happens in three steps, so that user code never runs in the
daemon's process:

1. `find_tool_files` lists the candidate files of the configured directories.
2. A sandbox runner imports each file and describes it with
   `tooljail._tooldef.collect_tools` (raw, JSON-serialisable specs).
3. `build_user_tools` validates those specs into `Tool`s, and `Registry` puts
   them next to the built-ins, reporting every problem as a `Diagnostic`.

`validate_arguments` checks a call's arguments against a tool's schema before
any sandbox is used, with one error message a person or a model can act on.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from tooljail._errors import InvalidArgumentsError, ToolNotFoundError
from tooljail._tooldef import json_type_name
from tooljail._types import Diagnostic, ToolInfo
from tooljail._wire import bounded
from tooljaild.sandbox.base import Limits

__all__ = [
    "BUILTIN_TOOLS",
    "Registry",
    "SandboxProfile",
    "Tool",
    "ToolOptions",
    "build_user_tools",
    "find_tool_files",
    "validate_arguments",
]

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a tool name may be (what the OpenAI and Anthropic APIs accept)."""

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_KILL_AFTER_S = 86400.0


class SandboxProfile(BaseModel):
    """Where a tool's calls run (`@tool(sandbox={...})`). Unset keys follow the daemon.

    Unknown keys and values are rejected, to catch typos. `image` and
    `network=True` belong to the docker backend, so they need `backend="docker"`
    (the process backend never has a network).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    backend: Literal["process", "docker"] | None = None
    """The backend; None: the daemon's default (`serve --backend`)."""
    image: str | None = None
    """The docker image: a sandbox image's name ("python") or a full reference
    with a "/"; None: the daemon's `docker.image`."""
    network: bool | None = None
    """Give the container the engine's default network; None: the daemon's
    `docker.network` (off unless configured)."""

    @model_validator(mode="after")
    def _check(self) -> SandboxProfile:
        if self.image is not None:
            if self.backend != "docker":
                raise ValueError(
                    "image is a docker setting: add backend='docker' "
                    f"(got backend={self.backend!r})"
                )
            # Same rule as the config's docker.image; raises ValueError with the fix.
            from tooljaild.sandbox.docker import image_reference

            image_reference(self.image)
        if self.network and self.backend != "docker":
            raise ValueError(
                "network=True needs backend='docker': the process backend has no network"
            )
        return self


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

    @model_validator(mode="after")
    def _check_bounds(self) -> ToolOptions:
        unknown = sorted(set(self.limits) - set(Limits.model_fields))
        if unknown:
            raise ValueError(
                f"unknown limit {', '.join(unknown)}; limits are " + ", ".join(Limits.model_fields)
            )
        for key, value in self.limits.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"limit {key} must be a whole number >= 0, got {value!r}")
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
    module_path: str | None = None
    """The file the runner imports (user tools only)."""
    function: str | None = None
    """The attribute of the module to call (user tools only)."""
    file: str = ""
    """Where the tool was defined, for diagnostics; "" for built-ins."""

    # Compiled lazily by `validate_arguments`; private attributes may be set on a
    # frozen model, and the schema never changes after construction.
    _validator: Any = PrivateAttr(default=None)

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
        )


def _code_schema(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"code": {"type": "string", "description": what}},
        "required": ["code"],
        "additionalProperties": False,
    }


BUILTIN_TOOLS: tuple[Tool, ...] = (
    Tool(
        name="execute_python_code",
        description=(
            "Run Python 3 code in a fresh, isolated sandbox and return what it printed. "
            "Returns {stdout, stderr, exit_code}; exit_code 0 means success. Use print() to "
            "see values: nothing is echoed. Each call starts from a clean interpreter, so "
            "define everything you need in the same code. The network is off, and the "
            "sandbox has a time limit and a memory limit."
        ),
        input_schema=_code_schema("The complete Python source to run, as a script."),
        source="builtin",
        builtin="execute_python_code",
    ),
    Tool(
        name="execute_python_code_stream",
        description=(
            "Run Python 3 code in a fresh, isolated sandbox, streaming every line of output "
            "as it is printed. Use it for long-running code whose progress matters. The "
            "final result is the same as execute_python_code: {stdout, stderr, exit_code}. "
            "The network is off, and the sandbox has a time limit and a memory limit."
        ),
        input_schema=_code_schema("The complete Python source to run, as a script."),
        options=ToolOptions(streaming=True),
        source="builtin",
        builtin="execute_python_code_stream",
    ),
    Tool(
        name="execute_python_file",
        description=(
            "Run an existing Python file (.py) in an isolated sandbox, like "
            "`python path args...`. The path is relative to the call's workspace, or to a "
            "scripts directory configured for the daemon; paths outside them are refused. "
            "Returns {stdout, stderr, exit_code}; exit_code 0 means success."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "The .py file to run, relative to the workspace.",
                },
                "args": {
                    "type": "array",
                    "items": {"type": "string"},
                    "default": [],
                    "description": "Command-line arguments passed to the script (sys.argv[1:]).",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        source="builtin",
        builtin="execute_python_file",
    ),
)
"""The tools every daemon serves."""


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


# --- loading user tools ----------------------------------------------------------


def find_tool_files(dirs: list[Path]) -> tuple[list[Path], list[Diagnostic]]:
    """List the tool modules of the configured directories.

    Only `*.py` files directly in each directory count (no recursion), sorted by
    name, directories in the order given. Files whose name starts with "_" are
    helpers the tools may import, and are skipped without a diagnostic.

    Args:
        dirs: The tool directories.

    Returns:
        (files, diagnostics). A file is skipped with an error diagnostic when its
        stem is not a Python identifier ("bad_file_name") or it is a symlink to a
        place outside its directory ("path_escape"); a missing or unreadable
        directory gives "bad_tools_dir".
    """
    files: list[Path] = []
    diagnostics: list[Diagnostic] = []
    seen_dirs: set[Path] = set()
    for directory in dirs:
        try:
            root = directory.resolve(strict=True)
            if not root.is_dir():
                raise NotADirectoryError(f"{directory} is not a directory")
            entries = sorted(directory.iterdir(), key=lambda p: p.name)
        except OSError as exc:
            diagnostics.append(
                Diagnostic(
                    severity="error",
                    code="bad_tools_dir",
                    message=f"cannot read tools directory {directory}: {exc.strerror or exc}",
                    file=str(directory),
                )
            )
            continue
        if root in seen_dirs:
            continue
        seen_dirs.add(root)
        for entry in entries:
            if entry.suffix != ".py" or entry.name.startswith("_"):
                continue
            if not _MODULE_NAME.match(entry.stem):
                diagnostics.append(
                    Diagnostic(
                        severity="error",
                        code="bad_file_name",
                        message=f"{entry.name} is not loaded: a tool file's name must be a "
                        "Python identifier (letters, digits, _; not starting with a digit)",
                        file=str(entry),
                    )
                )
                continue
            target = entry.resolve()
            if not target.is_relative_to(root):
                diagnostics.append(
                    Diagnostic(
                        severity="error",
                        code="path_escape",
                        message=f"{entry.name} is not loaded: it links to {target}, outside "
                        f"the tools directory {root}",
                        file=str(entry),
                    )
                )
                continue
            # Directories named x.py and dangling links are not modules.
            if target.is_file():
                files.append(entry)
    return files, diagnostics


def build_user_tools(described: list[dict[str, Any]]) -> tuple[list[Tool], list[Diagnostic]]:
    """Validate the raw specs the runner reported into `Tool`s.

    Args:
        described: One item per file: {"file": str, "specs": [raw specs from
            `collect_tools`], "problems": [problem dicts], "error": {"type",
            "message", "traceback"} or None when the import succeeded}.

    Returns:
        (tools, diagnostics). A spec with a bad name ("bad_name"), schema
        ("bad_schema") or options ("bad_options") is left out with an error
        diagnostic; a module that failed to import gives "import_failed".
    """
    tools: list[Tool] = []
    diagnostics: list[Diagnostic] = []
    for item in described:
        file = str(item.get("file", ""))
        error = item.get("error")
        if error:
            diagnostics.append(_import_failed(file, error))
        for problem in item.get("problems") or []:
            diagnostics.append(_problem_diagnostic(file, problem))
        for spec in item.get("specs") or []:
            tool_or_problem = _build_tool(file, spec)
            if isinstance(tool_or_problem, Tool):
                tools.append(tool_or_problem)
            else:
                diagnostics.append(tool_or_problem)
    return tools, diagnostics


def _import_failed(file: str, error: object) -> Diagnostic:
    info = error if isinstance(error, dict) else {"message": str(error)}
    kind = info.get("type") or "Exception"
    message = f"could not import {file}: {kind}: {info.get('message', '')}".rstrip(": ")
    if info.get("traceback"):
        message += "\n" + str(info["traceback"]).rstrip()
    return Diagnostic(severity="error", code="import_failed", message=message, file=file)


def _problem_diagnostic(file: str, problem: object) -> Diagnostic:
    if not isinstance(problem, dict):
        problem = {"message": str(problem)}
    severity = problem.get("severity")
    return Diagnostic(
        severity=severity if severity in ("error", "warning") else "error",
        code=str(problem.get("code") or "bad_tool"),
        message=str(problem.get("message", "")),
        file=file,
        tool=str(problem.get("tool") or ""),
    )


def _build_tool(file: str, spec: object) -> Tool | Diagnostic:
    def bad(code: str, message: str, tool: str = "") -> Diagnostic:
        return Diagnostic(severity="error", code=code, message=message, file=file, tool=tool)

    if not isinstance(spec, dict):
        return bad("bad_spec", f"a tool spec must be an object, got {json_type_name(spec)}")
    name = spec.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        return bad(
            "bad_name",
            f"tool name {name!r} is invalid: use 1 to 64 letters, digits, '_' or '-'",
            str(name or spec.get("function") or ""),
        )
    function = spec.get("function")
    if not isinstance(function, str) or not function:
        return bad("bad_spec", f"tool '{name}' does not say which function to call", name)
    schema = spec.get("input_schema")
    if not isinstance(schema, dict):
        return bad("bad_schema", f"input schema of tool '{name}' must be an object", name)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = _dotted(list(exc.absolute_path)) or "the top level"
        return bad(
            "bad_schema",
            f"input schema of tool '{name}' is not valid JSON Schema at {where}: {exc.message}",
            name,
        )
    if schema.get("type") != "object":
        return bad(
            "bad_schema",
            f"input schema of tool '{name}' must have type \"object\" (named arguments), "
            f"got {schema.get('type')!r}",
            name,
        )
    options = spec.get("options") or {}
    try:
        tool_options = ToolOptions.model_validate(options)
    except ValidationError as exc:
        return bad("bad_options", f"options of tool '{name}': {_readable(exc)}", name)
    description = spec.get("description")
    return Tool(
        name=name,
        description=description if isinstance(description, str) else "",
        input_schema=schema,
        options=tool_options,
        source="user",
        module_path=file,
        function=function,
        file=file,
    )


def _readable(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = SandboxProfile if err["loc"][:1] == ("sandbox",) else ToolOptions
            what = "sandbox key" if known is SandboxProfile else "option"
            message = f"unknown {what} (known: {', '.join(known.model_fields)})"
        elif err["type"] == "model_type" and err["loc"] == ("sandbox",):
            message = "must be a dict, e.g. {'backend': 'docker', 'image': 'python'}"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


# --- the registry ----------------------------------------------------------------


class Registry:
    """The served tools by name, with the diagnostics of loading them.

    Args:
        user_tools: User tools in load order; of two tools with one name, the
            first is served.
        diagnostics: Diagnostics from `find_tool_files` and `build_user_tools`.
        builtins: The built-in tools; they win every name collision.

    Raises:
        ValueError: When two built-ins share a name (a programming error).
    """

    def __init__(
        self,
        user_tools: Iterable[Tool] = (),
        diagnostics: Iterable[Diagnostic] = (),
        *,
        builtins: Iterable[Tool] = BUILTIN_TOOLS,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._diagnostics = list(diagnostics)
        for tool in builtins:
            if tool.name in self._tools:
                raise ValueError(f"two built-in tools are named {tool.name!r}")
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
