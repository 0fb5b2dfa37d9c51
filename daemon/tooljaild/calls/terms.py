"""What a call runs with: its checked arguments, its timeout, its limits and the
request its sandbox gets. Pure functions of the tool, the request and the settings.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tooljail._errors import BadTimeoutError, InvalidRequestError
from tooljail._types import ToolInfo
from tooljaild.builtin_tools import builtin_run
from tooljaild.config import Settings
from tooljaild.registry import Tool, validate_arguments
from tooljaild.sandbox.base import Limits, RunRequest


def parse_arguments(tool: Tool, arguments_json: str, settings: Settings) -> dict[str, Any]:
    """The call's arguments, checked against the tool's schema.

    Raises:
        InvalidRequestError: They are not JSON.
        InvalidArgumentsError: They do not fit the schema, or name a file outside
            the files directories (`execute_python_file`).
    """
    try:
        arguments = json.loads(arguments_json) if arguments_json.strip() else {}
    except ValueError as exc:
        raise InvalidRequestError(f"arguments are not valid JSON: {exc}") from exc
    validated = dict(validate_arguments(tool, arguments))
    run = builtin_run(tool)
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
        }
    )


def limits_for(tool: Tool, settings: Settings) -> Limits:
    """The daemon's sandbox limits, with the tool's own overrides."""
    limits = settings.limits
    if tool.options.limits:
        limits = Limits.model_validate({**limits.model_dump(), **tool.options.limits})
    return limits


def fingerprint(tool: str, arguments: dict[str, Any], session_id: str = "") -> str:
    """What makes two requests under one call id the same call: tool, arguments and
    the session it runs in (outside a session, the same fingerprint as before
    sessions existed: journals keep answering retries across the upgrade)."""
    parts: list[Any] = [tool, arguments, session_id] if session_id else [tool, arguments]
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_request(tool: Tool, arguments: dict[str, Any], limits: Limits) -> RunRequest:
    """What the sandbox's runner is asked to run."""
    run = builtin_run(tool)
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
