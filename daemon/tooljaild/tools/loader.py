"""Loading user tools: their code is imported inside a sandbox, never here.

Three steps, so that user code never runs in the daemon's process:

1. `find_tool_files` lists the candidate files of the configured directories.
2. A sandbox runner imports each file and describes it with
   `tooljail._tooldef.collect_tools` (raw, JSON-serialisable specs).
3. `build_user_tools` validates those specs into `Tool`s, and `load_registry`
   puts them next to the built-ins in a `Registry`.

A file that fails to import, or a tool with a malformed schema, becomes a
diagnostic; the good tools are still served.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import ValidationError

from tooljail.common import json_type_name
from tooljail.types import Diagnostic
from tooljaild.sandbox.base import RunRequest, Sandbox, SandboxError, Termination
from tooljaild.settings.sandbox import SandboxProfile
from tooljaild.tools.registry import TOOL_NAME, Registry, Tool, ToolOptions
from tooljaild.tools.registry import _dotted as dotted

__all__ = ["DESCRIBE_TIMEOUT_S", "build_user_tools", "find_tool_files", "load_registry"]

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 60.0

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


async def load_registry(
    tools_dirs: list[Path], sandbox: Sandbox, *, builtins: Iterable[Tool] = ()
) -> Registry:
    """Build the registry: built-ins plus the user tools in `tools_dirs`.

    Args:
        tools_dirs: Directories of tool files.
        sandbox: A started sandbox, used once to import the files; the caller closes it.
        builtins: The built-ins as this daemon describes them (handed in: none by default).
    """
    import asyncio

    files, diagnostics = find_tool_files(tools_dirs)
    if not files:
        return Registry([], diagnostics, builtins=builtins)
    stderr = bytearray()

    def sink(kind: object, data: bytes) -> None:
        if len(stderr) < 64 * 1024:
            stderr.extend(data)

    request = RunRequest("describe", {"files": [str(f) for f in files]})
    task = asyncio.create_task(sandbox.run(request, sink))
    done, _ = await asyncio.wait({task}, timeout=DESCRIBE_TIMEOUT_S)
    if not done:
        await sandbox.kill()
    try:
        outcome = await task
    except SandboxError as exc:
        outcome = None
        why = str(exc)
    if outcome is None or outcome.termination is not Termination.RETURNED:
        if outcome is not None:
            why = (
                f"timed out after {DESCRIBE_TIMEOUT_S:g}s"
                if outcome.termination is Termination.KILLED
                else (outcome.error.message if outcome.error else outcome.termination.value)
            )
        diagnostics.append(
            Diagnostic(
                severity="error",
                code="load_failed",
                message=f"importing the tool files failed: {why}; "
                + stderr.decode(errors="replace")[-2000:],
                file=", ".join(str(f) for f in files),
            )
        )
        return Registry([], diagnostics, builtins=builtins)
    described: list[dict[str, Any]] = outcome.value or []
    tools, more = build_user_tools(described)
    return Registry(tools, diagnostics + more, builtins=builtins)


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
        where = dotted(list(exc.absolute_path)) or "the top level"
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
