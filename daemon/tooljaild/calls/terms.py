"""What a call runs with: its checked arguments, its timeout, its limits and the
request its sandbox gets. Pure functions of the tool, the request and the settings.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tooljail.errors import BadTimeoutError, InvalidRequestError
from tooljail.types import ToolInfo
from tooljaild.sandbox.base import RunRequest
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.registry import Tool, validate_arguments

CHECK_ON_LOOP_BYTES = 64 * 1024
"""Arguments up to this size are decoded and checked on the event loop (well
under a millisecond); larger ones on a thread (`CallManager.check_arguments`)."""

_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')
"""A JSON string (skipped whole, by the regex engine) or a structural character."""


@dataclass(frozen=True)
class CheckedArguments:
    """A request's arguments, decoded and checked against `tool`'s schema."""

    tool: Tool
    values: dict[str, Any]


def check_shape(arguments_json: str, settings: Settings) -> None:
    """Refuse arguments past the bounds of their shape, before decoding them.

    The work of decoding and validating grows with the number of values, not
    the bytes: 4.5 MiB of 400,000 unknown keys held the event loop 1.3 s, while
    a 4 MiB string decodes in milliseconds. So the values (object members and
    array elements) are counted, and the nesting measured, first: by counting
    the characters that can separate values (an upper bound, in C, ~1 ms per
    MiB); only where that bound is passed are the tokens outside strings
    counted one by one, stopping at the first past the bound. Either way the
    cost is bounded by the size and `settings.max_argument_values`.

    Raises:
        InvalidRequestError: More than `max_argument_values` values, or nested
            deeper than `max_argument_depth`.
    """
    max_values, max_depth = settings.max_argument_values, settings.max_argument_depth
    # Each value but a container's first follows a comma; the first, its bracket.
    opening = arguments_json.count("[") + arguments_json.count("{")
    if arguments_json.count(",") + opening <= max_values and opening <= max_depth:
        return
    values = depth = 0
    for match in _TOKEN.finditer(arguments_json):
        token = match.group()
        if token in ",[{":
            values += 1
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
        if values > max_values:
            raise InvalidRequestError(
                f"the arguments hold more than {max_values} values (object members and array "
                "elements); send large data as a file or in fewer, larger strings "
                "(setting max_argument_values)"
            )
        if depth > max_depth:
            raise InvalidRequestError(
                f"the arguments are nested deeper than {max_depth} levels "
                "(setting max_argument_depth)"
            )


def parse_arguments(tool: Tool, arguments_json: str, settings: Settings) -> dict[str, Any]:
    """The call's arguments, checked against the tool's schema (first their shape:
    `check_shape`).

    Raises:
        InvalidRequestError: They are not JSON, or past the bounds of their shape.
        InvalidArgumentsError: They do not fit the schema, or name a file outside
            the files directories (`execute_python_file`).
    """
    check_shape(arguments_json, settings)
    try:
        arguments = json.loads(arguments_json) if arguments_json.strip() else {}
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"arguments are not valid JSON: {exc}") from exc
    validated = dict(validate_arguments(tool, arguments))
    run = tool.run
    if run is not None and run.prepare is not None:
        validated = run.prepare(validated, settings)
    return validated


def max_timeout_for(tool: Tool, settings: Settings) -> float:
    """The longest timeout a call of `tool` may have on this daemon."""
    return min(tool.options.max_timeout_s, settings.max_timeout_s)


def timeout_for(tool: Tool, requested: float, settings: Settings) -> float:
    """The call's timeout: the one asked for (0: none asked), else the tool's own
    `timeout_s` where it sets one, else the daemon's `default_timeout_s`.

    Raises:
        BadTimeoutError: The timeout asked for is outside the tool's bounds.
    """
    upper = max_timeout_for(tool, settings)
    if not requested:
        # A tool that sets no timeout_s takes the daemon's default (its options
        # still hold the field's default value, which says nothing).
        own = "timeout_s" in tool.options.model_fields_set
        return min(tool.options.timeout_s if own else settings.default_timeout_s, upper)
    if not settings.min_timeout_s <= requested <= upper:
        raise BadTimeoutError(
            f"timeout {requested:g}s is outside the bounds of {tool.name!r}: "
            f"{settings.min_timeout_s:g} to {upper:g} seconds"
        )
    return requested


def tool_info(tool: Tool, settings: Settings) -> ToolInfo:
    """The tool as `ListTools` shows it: with the timeouts in force on this daemon."""
    return tool.info().model_copy(
        update={
            "timeout_s": timeout_for(tool, 0.0, settings),
            "max_timeout_s": max_timeout_for(tool, settings),
            # What it may reach and the names of what it holds; never a value.
            "egress": tuple(tool.options.sandbox.egress or ()),
            "secrets": tuple(tool.options.secrets),
        }
    )


def limits_for(tool: Tool, settings: Settings) -> Limits:
    """The daemon's sandbox limits, with the tool's own overrides."""
    limits = settings.limits
    if tool.options.limits:
        limits = Limits.model_validate({**limits.model_dump(), **tool.options.limits})
    return limits


def fingerprint(
    tool: str,
    arguments: dict[str, Any],
    session_id: str = "",
    egress: Sequence[str] = (),
    secrets: Sequence[str] = (),
) -> str:
    """What makes two requests under one call id the same call: tool, arguments,
    the session it runs in, and the egress rules and secrets it asked for (what
    asks for none of these has the same fingerprint as before they existed:
    journals keep answering retries across the upgrade). A retry that asks for
    other rules is another call, not the stored one's answer."""
    parts: list[Any] = [tool, arguments, session_id] if session_id else [tool, arguments]
    if egress or secrets:
        parts.append({"egress": sorted(egress), "secrets": sorted(secrets)})
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_request(tool: Tool, arguments: dict[str, Any], limits: Limits) -> RunRequest:
    """What the sandbox's runner is asked to run."""
    run = tool.run
    if run is not None:
        if run.kind == "daemon":
            raise ValueError(f"{tool.name!r} runs in the daemon: it has no sandbox request")
        payload = run.payload(arguments)
        if run.kind == "workspace":  # writes are refused past the workspace's quota
            payload["quota_bytes"] = limits.workspace_bytes
        return RunRequest(run.kind, payload, limits)
    return RunRequest(
        "user",
        {"module_path": tool.module_path, "function": tool.function, "args": arguments},
        limits,
    )
