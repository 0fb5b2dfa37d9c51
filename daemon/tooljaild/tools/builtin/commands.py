"""The built-in `run_command`: a command line (or a plain argv) in the sandbox.

It runs as request kind "command" (runner/_kinds.py `run_command`): in a
fresh sandbox, relative to its working directory, or in a session, in its
workspace and under its limits. The program writes straight to the call's
output pipes, so its output streams as it comes and the result's data is the
call's captured output (``{stdout, stderr, exit_code}``, head and tail, the
whole of each stream spilled to an artifact past the cap), as for
execute_python_code. A timeout kills the whole process tree (a fresh
sandbox is killed; in a session every process the call started is killed at
the deadline, see docs/sessions.md) and the result says so.

The allow-list (`tooljaild.settings.commands`) is checked at admission, before
anything is journaled, on the command line the arguments name (`command_of`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tooljail.errors import InvalidArgumentsError
from tooljaild.settings.config import Settings
from tooljaild.tools.registry import Tool

__all__ = [
    "MAX_STDIN_CHARS",
    "RUN_COMMAND_TOOL",
    "check_command_arguments",
    "command_of",
    "command_payload",
    "run_command_tool",
]

MAX_STDIN_CHARS = 1 << 20
"""The longest `stdin` a call may give (the request's own bound is larger)."""

_HOST_HAS_BASH = os.access("/bin/bash", os.X_OK) or os.access("/usr/bin/bash", os.X_OK)
"""The process backend's sandboxes use the host's /usr; the sandbox images carry bash."""


def _schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "A shell command line, run as `bash -lc COMMAND` "
                "(pipes, &&, redirections work). Give this or argv.",
            },
            "argv": {
                "type": "array",
                "items": {"type": "string"},
                "description": "A program and its arguments, run without a shell. "
                "Give this or command.",
            },
            "cwd": {
                "type": "string",
                "default": "",
                "description": "The directory to run in, relative to the workspace "
                "(default: the workspace itself).",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "default": {},
                "description": "Environment variables to add.",
            },
            "stdin": {
                "type": "string",
                "description": "Text given to the command on its standard input "
                "(default: none, /dev/null).",
            },
        },
        "additionalProperties": False,
    }


def run_command_tool(*, where: str, holds: str, bash: bool = _HOST_HAS_BASH) -> Tool:
    """The `run_command` tool, its description saying only what holds.

    Args:
        where: Where it runs ("in a fresh, isolated sandbox"...).
        holds: The sentence about the network and the limits.
        bash: The sandbox has bash; False: the description says sh runs the line.
    """
    shell = (
        "The command line runs under bash (`bash -lc`)"
        if bash
        else "This daemon's sandbox has no bash: the command line runs under `sh -c`"
    )
    return Tool(
        name="run_command",
        description=(
            f"Run a shell command {where} (git, pytest, ls, grep, make...) and return "
            "{stdout, stderr, exit_code}; exit_code 0 means success. "
            f"{shell}; or give argv to run a program without a shell. Output streams "
            "as it is written; past the output cap the whole of each stream is kept as an "
            "artifact. In a session it runs in the session's workspace (files persist "
            f"between calls); at the time limit every process it started is killed. {holds}"
        ),
        input_schema=_schema(),
        source="builtin",
        builtin="run_command",
    )


RUN_COMMAND_TOOL = run_command_tool(where="in a fresh sandbox", holds="Each call has a time limit.")
"""`run_command` described without a daemon (promising nothing)."""


def check_command_arguments(arguments: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Exactly one of command and argv, argv not empty, a bounded stdin.

    Raises:
        InvalidArgumentsError: Naming the argument and what it should be.
    """
    command, argv = arguments.get("command"), arguments.get("argv")
    if (command is None) == (argv is None):
        raise InvalidArgumentsError(
            "give exactly one of command (a shell command line) and argv (a program "
            "and its arguments)",
            parameter="command",
            expected="exactly one of command and argv",
            actual="both" if command is not None else "neither",
        )
    if argv is not None and (not argv or not argv[0]):
        raise InvalidArgumentsError(
            "argv must name a program first",
            parameter="argv",
            expected="a non-empty list whose first item is a program",
            actual=repr(argv),
        )
    if command is not None and not command.strip():
        raise InvalidArgumentsError(
            "command is empty",
            parameter="command",
            expected="a command line",
            actual=repr(command),
        )
    for text, name in ((command, "command"), (arguments.get("stdin"), "stdin")):
        if isinstance(text, str) and "\x00" in text and name == "command":
            raise InvalidArgumentsError(
                "command holds a NUL character",
                parameter=name,
                expected="text without NUL",
                actual="text with NUL",
            )
    stdin = arguments.get("stdin")
    if isinstance(stdin, str) and len(stdin) > MAX_STDIN_CHARS:
        raise InvalidArgumentsError(
            f"stdin is longer than {MAX_STDIN_CHARS} characters: write it to a file "
            "in the workspace and redirect it instead",
            parameter="stdin",
            expected=f"at most {MAX_STDIN_CHARS} characters",
            actual=f"{len(stdin)} characters",
        )
    return arguments


def command_of(arguments: Mapping[str, Any]) -> tuple[str | None, Sequence[str] | None]:
    """(command, argv) of the checked arguments: what the allow-list checks."""
    argv = arguments.get("argv")
    return arguments.get("command"), None if argv is None else [str(a) for a in argv]


def command_payload(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The runner's "command" request payload (runner/_kinds.py `run_command`)."""
    payload: dict[str, Any] = {
        "dir": str(arguments.get("cwd") or ""),
        "vars": dict(arguments.get("env") or {}),
    }
    if arguments.get("argv") is not None:
        payload["argv"] = [str(a) for a in arguments["argv"]]
    else:
        payload["command"] = str(arguments["command"])
    if arguments.get("stdin") is not None:
        payload["stdin"] = str(arguments["stdin"])
    return payload
