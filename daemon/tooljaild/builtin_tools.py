"""The built-in tools, described for the daemon that serves them.

A model reads a built-in's description to decide what to run, so it says only
what holds on this daemon: whether the code is isolated from the host, whether
it can reach a network and which memory bound holds (the `Promises` of the
built-ins' sandbox profile, from its backend), and where `execute_python_file`
looks for files (the configured files directories, as `calls` resolves a path).
`BUILTIN_TOOLS` describes them without a daemon, promising none of that.

Adding a built-in: a `Tool` in `builtin_tools` (with `builtin` naming its
implementation) and its runner kind in `calls`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tooljaild.registry import Tool, ToolOptions
from tooljaild.sandbox.backends import Promises

__all__ = ["BUILTIN_TOOLS", "builtin_tools"]

_RESULT = "Returns {stdout, stderr, exit_code}; exit_code 0 means success."


def _code_schema(what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"code": {"type": "string", "description": what}},
        "required": ["code"],
        "additionalProperties": False,
    }


def _where(promises: Promises | None) -> str:
    if promises is None:
        return "in a fresh sandbox"
    if promises.isolated:
        return "in a fresh, isolated sandbox"
    return "in a fresh process on the daemon's host, not isolated from it"


def _what_holds(promises: Promises | None) -> str:
    """The sentence about the network and the limits; only what this daemon enforces."""
    if promises is None:
        return "Each call has a time limit."
    network = "The network is off" if not promises.network else "The code can reach the network"
    memory = f" and a memory limit ({promises.memory})" if promises.memory else ""
    return f"{network}; each call has a time limit{memory}."


def _files_rule(files_dirs: Sequence[Path] | None) -> str:
    """Where execute_python_file finds a path (see `calls.CallManager._resolve_file`)."""
    if files_dirs is not None and not files_dirs:
        return (
            "Not enabled on this daemon: no files directory is configured, so every call "
            "is refused."
        )
    where = (
        "one of the files directories configured for the daemon"
        if files_dirs is None
        else "a files directory of this daemon (" + ", ".join(str(d) for d in files_dirs) + ")"
    )
    return (
        f"The path is relative to {where}, each tried in turn, or an absolute path inside "
        "one; paths that leave them are refused."
    )


def builtin_tools(
    promises: Promises | None = None, files_dirs: Sequence[Path] | None = None
) -> tuple[Tool, ...]:
    """The built-in tools, their descriptions saying only what holds.

    Args:
        promises: What holds in the built-ins' sandboxes; None: unknown, so
            nothing is promised beyond a time limit.
        files_dirs: The daemon's files directories (absolute); None: unknown.
    """
    where, holds = _where(promises), _what_holds(promises)
    return (
        Tool(
            name="execute_python_code",
            description=(
                f"Run Python 3 code {where} and return what it printed. {_RESULT} Use "
                "print() to see values: nothing is echoed. Each call starts from a clean "
                f"interpreter, so define everything you need in the same code. {holds}"
            ),
            input_schema=_code_schema("The complete Python source to run, as a script."),
            source="builtin",
            builtin="execute_python_code",
        ),
        Tool(
            name="execute_python_code_stream",
            description=(
                f"Run Python 3 code {where}, streaming every line of output as it is "
                "printed. Use it for long-running code whose progress matters. The final "
                "result is the same as execute_python_code: {stdout, stderr, exit_code}. "
                f"{holds}"
            ),
            input_schema=_code_schema("The complete Python source to run, as a script."),
            options=ToolOptions(streaming=True),
            source="builtin",
            builtin="execute_python_code_stream",
        ),
        Tool(
            name="execute_python_file",
            description=(
                f"Run an existing Python file (.py) {where}, like `python path args...`. "
                f"{_files_rule(files_dirs)} {_RESULT} {holds}"
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "The .py file to run: relative to a files directory, "
                        "or an absolute path inside one.",
                    },
                    "args": {
                        "type": "array",
                        "items": {"type": "string"},
                        "default": [],
                        "description": "Command-line arguments passed to the script "
                        "(sys.argv[1:]).",
                    },
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            source="builtin",
            builtin="execute_python_file",
        ),
    )


BUILTIN_TOOLS: tuple[Tool, ...] = builtin_tools()
"""The tools every daemon serves, described without a daemon (promising nothing)."""
