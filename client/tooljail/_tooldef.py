"""Define user tools: the `@tool` decorator, LightAgent `tool_info`, and discovery.

This module is stdlib-only on purpose: the sandbox runner loads it by file path
(where neither pydantic nor tooljail is importable) to describe the tools of a
user module, and the SDK re-exports `tool` from it. That is also why it is one
file of over 500 lines: the daemon copies exactly this file next to the runner
in every sandbox (`isolation.install_runner`), where a sibling module would not
resolve; its parts (decorator, `tool_info`, schema inference, docstrings) are
marked by the order of its functions. What it produces are plain,
JSON-serialisable dicts; the daemon validates them (see `tooljaild.tools.registry`).

A raw tool spec, as attached by `@tool` to `func.__tooljail_tool__`:

    {"name": str, "description": str, "input_schema": dict (JSON Schema),
     "options": dict (only the options given explicitly, plus "streaming"),
     "style": "decorator" | "tool_info"}

`collect_tools` adds "function" (the attribute name in the module) to each spec,
and reports problems as {"severity", "code", "message", "tool"} dicts.
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, overload

__all__ = ["collect_tools", "tool"]

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTR = "__tooljail_tool__"
"""The attribute `@tool` sets on a function to hold its raw spec."""

_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARRAY_ORIGINS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_OBJECT_ORIGINS = (dict, collections.abc.Mapping)
_TOOL_INFO_TYPES = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
    # Python spellings, which LightAgent users write often enough to accept.
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list": "array",
    "dict": "object",
}
# "sandbox" (its "egress" rules among them) and "secrets" as for `@tool`.
_TOOL_INFO_OPTIONS = (
    "timeout_s",
    "kill_after_s",
    "idempotent",
    "streaming",
    "sandbox",
    "secrets",
    "cache_s",
)
_PARAM_LINE = re.compile(r"^(\s*)\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns|Yields|Raises|Examples?|Notes?):\s*$"
)


_NOT_JSON = object()
"""Marks a default that JSON cannot carry, so that it stays out of the schema."""


class _SpecProblem(Exception):
    """A tool that cannot be described; becomes a problem dict in `collect_tools`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@overload
def tool(func: F, /) -> F: ...


@overload
def tool(
    func: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    kill_after_s: float | None = None,
    idempotent: bool | None = None,
    streaming: bool | None = None,
    limits: dict[str, Any] | None = None,
    sandbox: dict[str, Any] | None = None,
    secrets: list[str] | None = None,
    cache_s: float | None = None,
) -> Callable[[F], F]: ...


def tool(
    func: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    kill_after_s: float | None = None,
    idempotent: bool | None = None,
    streaming: bool | None = None,
    limits: dict[str, Any] | None = None,
    sandbox: dict[str, Any] | None = None,
    secrets: list[str] | None = None,
    cache_s: float | None = None,
) -> F | Callable[[F], F]:
    """Mark a function as a tool, inferring its input schema from its signature.

    Usable bare (`@tool`) or with options (`@tool(timeout_s=30)`). The function is
    returned unchanged and stays callable; its spec is stored in
    `func.__tooljail_tool__`. Options left as None are not set, so the daemon's
    defaults apply; bounds are checked by the daemon when it loads the tool.

    Args:
        func: The function, when used as `@tool`.
        name: The tool's name; defaults to the function's name.
        description: For the model; defaults to the docstring's first paragraph.
        timeout_s: Default timeout of a call, in seconds.
        kill_after_s: When to kill a call that ignored its timeout, in seconds.
        idempotent: Whether running a call twice is harmless (allows retries).
        streaming: Whether output is streamed; defaults to True for generator and
            async-generator functions.
        limits: Sandbox limit overrides, passed through to the sandbox layer.
        sandbox: Where calls run, e.g. `{"backend": "docker", "image": "python",
            "network": False}`; keys left out follow the daemon's defaults.
            `"egress": ["api.example.com"]` names what its calls may reach
            through the daemon's egress proxy (none: no network).
        secrets: Names of secrets from the daemon's secrets file that its
            calls hold, e.g. `["NEWS_API_KEY"]`: inside the sandbox each is an
            environment variable with a placeholder, which the proxy swaps for
            the value only on the way to the secret's hosts.
        cache_s: For how long (seconds, up to 7 days) a success is given again,
            without running the tool, to the same caller asking with the same
            arguments: the result says `cached=True` and names the call that ran
            (`cached_from`). Only for a tool whose answer depends on its
            arguments alone (a lookup, a fetch), and not a streaming one (only
            the result is kept); 0 or None: never.

    Returns:
        The function itself, or a decorator when called with options only.

    Raises:
        TypeError: When the function takes `*args`/`**kwargs` or positional-only
            parameters, or a parameter's type hint has no JSON Schema equivalent.
    """
    explicit: dict[str, Any] = {
        key: value
        for key, value in (
            ("timeout_s", timeout_s),
            ("kill_after_s", kill_after_s),
            ("idempotent", idempotent),
            ("streaming", streaming),
            ("limits", limits),
            ("sandbox", sandbox),
            ("secrets", secrets),
            ("cache_s", cache_s),
        )
        if value is not None
    }

    def decorate(f: F) -> F:
        if not callable(f):
            raise TypeError(f"@tool expects a function, got {type(f).__name__}")
        options = dict(explicit)
        if "streaming" not in options:
            options["streaming"] = inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f)
        doc_description, param_docs = _parse_docstring(f)
        spec = {
            "name": name if name is not None else getattr(f, "__name__", ""),
            "description": description if description is not None else doc_description,
            "input_schema": _infer_schema(f, param_docs),
            "options": options,
            "style": "decorator",
        }
        # A wrapper class or a bound method may refuse attributes; say so plainly.
        try:
            setattr(f, SPEC_ATTR, spec)
        except (AttributeError, TypeError) as exc:
            raise TypeError(f"@tool cannot annotate {f!r}: {exc}") from exc
        return f

    if func is not None:
        return decorate(func)
    return decorate


def collect_tools(module: types.ModuleType) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Describe every tool of a module, never raising for a bad one.

    Tools are the module's attributes decorated with `@tool` (even when imported
    from a helper module) and the functions defined in the module that carry a
    LightAgent-style `tool_info` dict. Other functions are helpers and ignored.
    An object bound to several names is reported once, under its first name.

    Args:
        module: The imported user module.

    Returns:
        (specs, problems): each spec is a raw spec plus "function", the attribute
        name to call; each problem is {"severity": "error" | "warning", "code",
        "message", "tool"}. A module without any tool yields one "no_tools"
        warning.
    """
    specs: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    seen: set[int] = set()
    module_name = getattr(module, "__name__", "")
    found_any = False
    for attr, obj in list(vars(module).items()):
        try:
            decorated = getattr(obj, SPEC_ATTR, None)
            tool_info = (
                getattr(obj, "tool_info", None)
                if callable(obj) and getattr(obj, "__module__", None) == module_name
                else None
            )
            if decorated is None and tool_info is None:
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            found_any = True
            if decorated is not None:
                if tool_info is not None:
                    problems.append(
                        _problem(
                            "warning",
                            "both_styles",
                            f"'{attr}' has both @tool and tool_info; using @tool",
                            attr,
                        )
                    )
                raw = _checked_decorated_spec(decorated)
            else:
                raw = _spec_from_tool_info(obj, tool_info, problems, attr)
            specs.append({"function": attr, **raw})
        except _SpecProblem as exc:
            problems.append(_problem("error", exc.code, exc.message, attr))
        except Exception as exc:
            # User objects can raise from attribute access or signature inspection;
            # one broken tool must not hide the module's other tools.
            problems.append(
                _problem(
                    "error",
                    "bad_tool",
                    f"could not describe '{attr}': {type(exc).__name__}: {exc}",
                    attr,
                )
            )
    if not found_any:
        problems.append(
            _problem(
                "warning",
                "no_tools",
                f"module {module_name!r} defines no tools: decorate functions with "
                "@tool or give them a tool_info dict",
                "",
            )
        )
    return specs, problems


def _problem(severity: str, code: str, message: str, tool_name: str) -> dict[str, Any]:
    return {"severity": severity, "code": code, "message": message, "tool": tool_name}


def _checked_decorated_spec(raw: object) -> dict[str, Any]:
    # The attribute is normally ours, but anything can be assigned to it.
    keys = ("name", "description", "input_schema", "options", "style")
    if not isinstance(raw, dict) or any(key not in raw for key in keys):
        raise _SpecProblem("bad_tool", f"{SPEC_ATTR} must be a dict with keys {', '.join(keys)}")
    return {key: raw[key] for key in keys}


def _spec_from_tool_info(
    func: Callable[..., Any], info: object, problems: list[dict[str, Any]], attr: str
) -> dict[str, Any]:
    """Convert a LightAgent `tool_info` dict to a raw spec.

    Raises:
        _SpecProblem: When `tool_info` is malformed.
    """
    if not isinstance(info, dict):
        raise _SpecProblem("bad_tool_info", f"tool_info of '{attr}' must be a dict")
    name = info.get("tool_name")
    if not isinstance(name, str) or not name:
        raise _SpecProblem(
            "bad_tool_info", f"tool_info of '{attr}' needs a non-empty string 'tool_name'"
        )
    params = info.get("tool_params", [])
    if not isinstance(params, list):
        raise _SpecProblem("bad_tool_info", f"tool_info 'tool_params' of '{name}' must be a list")

    signature = _signature_or_none(func)
    sig_params = signature.parameters if signature is not None else {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for index, param in enumerate(params):
        if not isinstance(param, dict) or not isinstance(param.get("name"), str):
            raise _SpecProblem(
                "bad_tool_info", f"tool_params[{index}] of '{name}' needs a string 'name'"
            )
        pname = param["name"]
        ptype = param.get("type", "string")
        if ptype not in _TOOL_INFO_TYPES:
            raise _SpecProblem(
                "bad_tool_info",
                f"parameter '{pname}' of '{name}' has unknown type {ptype!r}; use one of "
                "string, integer, number, boolean, array, object",
            )
        prop: dict[str, Any] = {"type": _TOOL_INFO_TYPES[ptype]}
        if isinstance(param.get("description"), str) and param["description"]:
            prop["description"] = param["description"]
        properties[pname] = prop
        is_required = param.get("required")
        if is_required is None:
            # Unstated: required exactly when the function needs the argument.
            sig_param = sig_params.get(pname)
            is_required = sig_param is not None and sig_param.default is inspect.Parameter.empty
        if is_required:
            required.append(pname)

    if signature is not None:
        _check_tool_info_params(signature, properties, name, attr, problems)

    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    title = info.get("tool_title")
    if isinstance(title, str) and title:
        schema["title"] = title
    options = {key: info[key] for key in _TOOL_INFO_OPTIONS if key in info}
    options.setdefault(
        "streaming", inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func)
    )
    description = info.get("tool_description") or title or ""
    return {
        "name": name,
        "description": str(description),
        "input_schema": schema,
        "options": options,
        "style": "tool_info",
    }


def _check_tool_info_params(
    signature: inspect.Signature,
    properties: dict[str, Any],
    name: str,
    attr: str,
    problems: list[dict[str, Any]],
) -> None:
    # Mismatches make calls fail at run time, so warn at load time instead.
    kinds = {p.kind for p in signature.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        for pname in properties:
            if pname not in signature.parameters:
                problems.append(
                    _problem(
                        "warning",
                        "param_mismatch",
                        f"tool_info of '{name}' lists parameter '{pname}' that "
                        f"function '{attr}' does not take",
                        name,
                    )
                )
    for pname, param in signature.parameters.items():
        needed = param.default is inspect.Parameter.empty and param.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        if needed and pname not in properties:
            problems.append(
                _problem(
                    "warning",
                    "param_mismatch",
                    f"function '{attr}' requires parameter '{pname}' that tool_info "
                    f"of '{name}' does not list",
                    name,
                )
            )


def _signature_or_none(func: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _infer_schema(func: Callable[..., Any], param_docs: dict[str, str]) -> dict[str, Any]:
    """Build the object schema of a function's parameters.

    Raises:
        TypeError: On *args/**kwargs, positional-only parameters, or a hint that
            has no JSON Schema equivalent.
    """
    func_name = getattr(func, "__qualname__", repr(func))
    signature = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as exc:
        # Usually a string annotation (PEP 563) naming something local to a
        # function: find the parameter, so that the message points at it.
        globalns = getattr(func, "__globals__", {})
        for pname, param in signature.parameters.items():
            if isinstance(param.annotation, str):
                try:
                    eval(param.annotation, globalns)
                except Exception as inner:
                    raise TypeError(
                        f"@tool function {func_name}, parameter '{pname}': cannot resolve "
                        f"type hint {param.annotation!r} ({inner}); tool hints must name "
                        "module-level or built-in types"
                    ) from exc
        raise TypeError(f"@tool could not resolve the type hints of {func_name}: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in signature.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            star = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise TypeError(
                f"@tool function {func_name} takes {star}{pname}: tools take named "
                "arguments only, so list each parameter explicitly"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"@tool function {func_name} has positional-only parameter '{pname}': "
                "tools are called with keyword arguments"
            )
        try:
            prop = _hint_schema(hints.get(pname, Any))
        except TypeError as exc:
            raise TypeError(f"@tool function {func_name}, parameter '{pname}': {exc}") from exc
        if pname in param_docs and "description" not in prop:
            prop = {"description": param_docs[pname], **prop}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            default = _as_json(param.default)
            if default is not _NOT_JSON:
                prop["default"] = default
        properties[pname] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _hint_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of one type hint.

    Raises:
        TypeError: When the hint has no JSON Schema equivalent.
    """
    if hint is Any or hint is object or hint is inspect.Parameter.empty:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if isinstance(hint, type) and hint in _PRIMITIVES:
        return {"type": _PRIMITIVES[hint]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        # Annotated[int, "text"]: a string in the metadata describes the parameter.
        schema = _hint_schema(args[0])
        texts = [meta for meta in args[1:] if isinstance(meta, str)]
        return {"description": texts[0], **schema} if texts else schema
    if origin is typing.Literal:
        return _literal_schema(args)
    if origin is typing.Union or origin is types.UnionType:
        non_null = [arg for arg in args if arg is not type(None)]
        branches = [_hint_schema(arg) for arg in non_null]
        if len(non_null) < len(args):
            branches.append({"type": "null"})
        return {"anyOf": branches}
    container = origin if origin is not None else hint
    if container in _ARRAY_ORIGINS:
        return _array_schema(container, args)
    if container in _OBJECT_ORIGINS:
        if not args:
            return {"type": "object"}
        if args[0] is not str:
            raise TypeError(f"dict keys must be str (JSON object keys), got {args[0]!r}")
        return {"type": "object", "additionalProperties": _hint_schema(args[1])}
    raise TypeError(
        f"type hint {hint!r} has no JSON Schema equivalent; use str, int, float, bool, "
        "list[...], dict[str, ...], Literal[...], a union of these, or Any"
    )


def _array_schema(container: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        # tuple[int, str]: a fixed-length array, one schema per position.
        if args == ((),):  # tuple[()] is the empty tuple
            return {**schema, "maxItems": 0}
        items = [_hint_schema(arg) for arg in args]
        return {**schema, "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
    if args:
        schema["items"] = _hint_schema(args[0])
    if container in (set, frozenset, collections.abc.Set):
        schema["uniqueItems"] = True
    return schema


def _literal_schema(values: tuple[Any, ...]) -> dict[str, Any]:
    for value in values:
        if not isinstance(value, str | int | float | bool | None):
            raise TypeError(f"Literal value {value!r} is not a JSON scalar")
    schema: dict[str, Any] = {"enum": list(values)}
    types_ = {json_type_name(value) for value in values}
    if len(types_) == 1:
        schema = {"type": types_.pop(), **schema}
    return schema


def json_type_name(value: object) -> str:
    """The JSON Schema type name of a Python value ("integer", "array", ...)."""
    # bool before int: True is an int in Python but not a JSON integer.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _as_json(value: object) -> object:
    """The value as JSON would carry it (tuples become lists), or `_NOT_JSON`."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return _NOT_JSON


def _parse_docstring(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """Split a docstring into its first paragraph and per-parameter texts.

    A parameter is described by a line `name: text` or, in a Google-style `Args:`
    section, `name (type): text`; more-indented lines below continue it. Only
    names of the function's parameters count, so `Returns: ...` is no parameter.
    """
    doc = inspect.getdoc(func) or ""
    signature = _signature_or_none(func)
    names = set(signature.parameters) if signature is not None else set()
    lines = doc.splitlines()

    first: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or _SECTION.match(stripped):
            break
        match = _PARAM_LINE.match(line)
        if match and match.group(2) in names:
            break
        first.append(stripped)

    params: dict[str, str] = {}
    current: str | None = None
    current_indent = 0
    for line in lines:
        match = _PARAM_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if match and match.group(2) in names:
            current, current_indent = match.group(2), len(match.group(1))
            params[current] = match.group(3).strip()
        elif current is not None and line.strip() and indent > current_indent:
            params[current] = f"{params[current]} {line.strip()}".strip()
        else:
            current = None
    return " ".join(first), {name: text for name, text in params.items() if text}
