"""The built-in tools, described for the daemon that serves them.

A model reads a built-in's description to decide what to run, so it says only
what holds on this daemon: whether the code is isolated from the host, whether
it can reach a network and which memory bound holds (the `Promises` of the
built-ins' sandbox profile, from its backend), and where `execute_python_file`
looks for files (the configured files directories, as `calls` resolves a path).
`BUILTIN_TOOLS` describes them without a daemon, promising none of that.

How the daemon runs each built-in is here too (`RUNS`): which request the
sandbox's runner gets, how its arguments are checked beyond the schema, and
that its result is the program's output. Adding a built-in: a `Tool` in
`builtin_tools` (with `builtin` naming its entry) and its entry in `RUNS`;
a new request kind also needs its handler in the runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tooljail.errors import InvalidArgumentsError
from tooljaild.sandbox.backends import Promises
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.artifacts import ARTIFACT_TOOL_RUNS, ARTIFACT_TOOLS
from tooljaild.tools.builtin.call_status import CALL_STATUS_TOOL, call_status
from tooljaild.tools.builtin.commands import (
    check_command_arguments,
    command_of,
    command_payload,
    run_command_tool,
)
from tooljaild.tools.builtin.packages import (
    INSTALL_PACKAGES_TOOL,
    check_install_arguments,
    install_packages,
)
from tooljaild.tools.builtin.processes import (
    PROCESS_TOOL_RUNS,
    PROCESS_TOOLS,
    check_stop_arguments,
)
from tooljaild.tools.builtin.upload import UPLOAD_FILE_TOOL, check_upload_arguments, upload_file
from tooljaild.tools.builtin.workspace import (
    WORKSPACE_TOOL_NAMES,
    workspace_payload,
    workspace_tools,
)
from tooljaild.tools.registry import Tool, ToolOptions
from tooljaild.tools.run import BuiltinRun

__all__ = ["BUILTIN_TOOLS", "RUNS", "BuiltinRun", "builtin_tools"]

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
    """Where execute_python_file finds a path (see `_resolve_file`)."""
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
    promises: Promises | None = None,
    files_dirs: Sequence[Path] | None = None,
    *,
    packages: bool = True,
) -> tuple[Tool, ...]:
    """The built-in tools, their descriptions saying only what holds, each
    carrying how it runs (its `BuiltinRun` from `RUNS`, as `Tool.run`).

    Args:
        promises: What holds in the built-ins' sandboxes; None: unknown, so
            nothing is promised beyond a time limit.
        files_dirs: The daemon's files directories (absolute); None: unknown.
        packages: Serve install_packages (a daemon with `[egress]`: without it
            no sandbox reaches an index, and the tool list stays as it was).
    """
    where, holds = _where(promises), _what_holds(promises)
    tools = (
        Tool(
            name="execute_python_code",
            description=(
                f"Run Python 3 code {where} and return what it printed. {_RESULT} Use "
                "print() to see values: nothing is echoed. Outside a session each call "
                "starts from a clean interpreter, so define everything you need in the same "
                f"code; in a session, variables and imports persist between calls. {holds}"
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
        run_command_tool(where=where, holds=holds),
        *workspace_tools(promises),
        *ARTIFACT_TOOLS,
        UPLOAD_FILE_TOOL,
        *((INSTALL_PACKAGES_TOOL,) if packages else ()),
        *PROCESS_TOOLS,
        CALL_STATUS_TOOL,
    )
    return tuple(_with_run(tool) for tool in tools)


def _resolve_file(arguments: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`execute_python_file`'s path, made absolute inside a files directory."""
    path = str(arguments["path"])
    dirs = [d.resolve() for d in settings.files_dirs]
    if not dirs:
        raise InvalidArgumentsError(
            "execute_python_file is not enabled: no files directory is configured "
            "(start the daemon with --files-dir DIR)",
            parameter="path",
            expected="a file inside a configured files directory",
            actual=path,
        )
    candidates = [Path(path)] if Path(path).is_absolute() else [d / path for d in dirs]
    for candidate in candidates:
        real = candidate.resolve()
        if any(real.is_relative_to(d) for d in dirs) and real.is_file():
            return {**arguments, "path": str(real)}
    raise InvalidArgumentsError(
        f"no file {path!r} inside the files directories "
        f"({', '.join(str(d) for d in dirs)}); paths may not leave them",
        parameter="path",
        expected="a file inside " + ", ".join(str(d) for d in dirs),
        actual=path,
    )


def _code(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"code": arguments["code"]}


RUNS: dict[str, BuiltinRun] = {
    "execute_python_code": BuiltinRun("code", _code),
    "execute_python_code_stream": BuiltinRun("code", _code),
    "execute_python_file": BuiltinRun(
        "file",
        lambda a: {"path": a["path"], "args": list(a.get("args") or [])},
        prepare=_resolve_file,
    ),
    "run_command": BuiltinRun(
        "command", command_payload, prepare=check_command_arguments, command_of=command_of
    ),
    **{
        name: BuiltinRun("workspace", workspace_payload(name), output_is_data=False)
        for name in WORKSPACE_TOOL_NAMES
    },
    **{
        name: BuiltinRun("daemon", lambda a: {}, output_is_data=False, in_daemon=handler)
        for name, handler in ARTIFACT_TOOL_RUNS.items()
    },
    "upload_file": BuiltinRun(
        "daemon",
        lambda a: {},
        prepare=check_upload_arguments,
        output_is_data=False,
        in_daemon=upload_file,
    ),
    "call_status": BuiltinRun(
        "daemon", lambda a: {}, output_is_data=False, in_daemon=call_status, at_once=True
    ),
    "install_packages": BuiltinRun(
        "daemon",
        lambda a: {},
        prepare=check_install_arguments,
        output_is_data=False,
        in_daemon=install_packages,
        needs_session=True,
    ),
    **{
        name: BuiltinRun(
            "daemon",
            lambda a: {},
            prepare=check_stop_arguments if name == "stop_process" else None,
            output_is_data=False,
            in_daemon=handler,
            needs_session=True,
            # start_process runs a command line: the allow-list holds for it too.
            command_of=command_of if name == "start_process" else None,
        )
        for name, handler in PROCESS_TOOL_RUNS.items()
    },
}
"""Each built-in's implementation, by the `builtin` name its `Tool` carries."""


def _with_run(tool: Tool) -> Tool:
    """`tool`, carrying how it runs (`RUNS`): decided here, once, for every call."""
    assert tool.builtin is not None, tool.name
    return tool.model_copy(update={"run": RUNS[tool.builtin]})


BUILTIN_TOOLS: tuple[Tool, ...] = builtin_tools()
"""The tools every daemon serves, described without a daemon (promising nothing)."""
