"""Tests of the registry: options, argument validation, tool files, user tools."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import ValidationError

from tooljail._tooldef import collect_tools, tool
from tooljail.errors import InvalidArgumentsError, ToolNotFoundError
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS
from tooljaild.tools.builtin.workspace import WORKSPACE_TOOL_NAMES
from tooljaild.tools.loader import build_user_tools, find_tool_files
from tooljaild.tools.registry import Registry, Tool, ToolOptions, validate_arguments


def _user_tool(func: Any, file: str = "tools.py") -> Tool:
    module = types.ModuleType("m")
    func.__module__ = "m"
    module.f = func  # type: ignore[attr-defined]
    specs, problems = collect_tools(module)
    tools, diagnostics = build_user_tools(
        [{"file": file, "specs": specs, "problems": problems, "error": None}]
    )
    assert diagnostics == []
    return tools[0]


@tool
def _search(query: str, n: int = 5, mode: Literal["fast", "slow"] = "fast") -> None:
    """Search.

    query: Words to look for.
    """


@tool
def _tagger(tags: list[str] | None = None, weights: dict[str, float] | None = None) -> None:
    pass


SEARCH = _user_tool(_search)
TAGGER = _user_tool(_tagger)


def _invalid(tool_: Tool, arguments: object) -> InvalidArgumentsError:
    with pytest.raises(InvalidArgumentsError) as info:
        validate_arguments(tool_, arguments)
    return info.value


# --- options and built-ins -------------------------------------------------------


def test_tool_options_defaults() -> None:
    options = ToolOptions()
    assert options.timeout_s == 180
    assert options.max_timeout_s == 1000
    assert options.kill_after_s == 0
    assert options.idempotent is False
    assert options.streaming is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout_s": 0.5},
        {"timeout_s": 1001},
        {"timeout_s": 50, "max_timeout_s": 40},
        {"timeout_s": 10, "kill_after_s": 5},
        {"timeout_s": 10, "kill_after_s": 10},
        {"kill_after_s": 90000},
        {"idempotent": "yes"},
        {"timeuot_s": 10},
    ],
)
def test_tool_options_bounds(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ToolOptions(**kwargs)


def test_tool_options_accept_kill_after_past_timeout() -> None:
    assert ToolOptions(timeout_s=10, kill_after_s=20).kill_after_s == 20


def test_builtins_are_served_with_closed_schemas() -> None:
    registry = Registry(builtins=BUILTIN_TOOLS)
    names = [t.name for t in registry.tools()]
    assert names == [
        "execute_python_code",
        "execute_python_code_stream",
        "execute_python_file",
        "run_command",
        *WORKSPACE_TOOL_NAMES,
        "read_artifact",
        "tail_artifact",
        "search_artifact",
        "list_artifacts",
        "upload_file",
        "install_packages",  # served by daemons with [egress] only (builtin_tools(packages=))
        "start_process",
        "list_processes",
        "read_process_output",
        "write_process_input",
        "stop_process",
        "call_status",
    ]
    for builtin in BUILTIN_TOOLS:
        assert builtin.source == "builtin"
        assert builtin.builtin == builtin.name
        assert builtin.input_schema["additionalProperties"] is False
        assert builtin.description
    assert registry.get("execute_python_code_stream").options.streaming is True
    assert registry.get("execute_python_file").input_schema["required"] == ["path"]


def test_tool_info_for_the_sdk() -> None:
    info = Registry(builtins=BUILTIN_TOOLS).get("execute_python_code_stream").info()
    assert info.name == "execute_python_code_stream"
    assert info.streaming is True
    assert info.source == "builtin"
    assert info.openai_schema()["function"]["parameters"]["required"] == ["code"]


# --- argument validation ---------------------------------------------------------


def test_valid_arguments_pass_and_are_copied() -> None:
    arguments = {"query": "cats", "n": 3}
    result = validate_arguments(SEARCH, arguments)
    assert result == arguments
    assert result is not arguments


@pytest.mark.parametrize(
    ("arguments", "actual"),
    [([1, 2], "array"), ("code", "string"), (None, "null"), (3, "integer")],
)
def test_arguments_must_be_an_object(arguments: object, actual: str) -> None:
    error = _invalid(SEARCH, arguments)
    assert error.parameter == ""
    assert error.expected == "object"
    assert error.actual == actual
    assert "JSON object" in error.message


def test_missing_required_argument_is_named() -> None:
    error = _invalid(SEARCH, {"n": 2})
    assert error.parameter == "query"
    assert error.expected == "string"
    assert error.message.startswith("missing required argument 'query'")
    # The parameter's description helps a model fill it in.
    assert "Words to look for." in error.message


def test_wrong_type_names_parameter_expected_and_actual() -> None:
    error = _invalid(SEARCH, {"query": "x", "n": "abc"})
    assert error.message == "parameter 'n' expects integer, got string (\"abc\")"
    assert (error.parameter, error.expected, error.actual) == ("n", "integer", "string")


def test_boolean_is_not_an_integer() -> None:
    error = _invalid(SEARCH, {"query": "x", "n": True})
    assert (error.parameter, error.actual) == ("n", "boolean")


def test_enum_violation_lists_allowed_values() -> None:
    error = _invalid(SEARCH, {"query": "x", "mode": "medium"})
    assert error.parameter == "mode"
    assert error.expected == 'one of "fast", "slow"'
    assert "medium" in error.message


def test_wrong_item_type_points_into_the_list() -> None:
    error = _invalid(TAGGER, {"tags": ["a", "b", 3]})
    assert error.message == "parameter 'tags[2]' expects string, got integer (3)"
    assert error.parameter == "tags[2]"


def test_wrong_type_for_optional_mentions_null() -> None:
    error = _invalid(TAGGER, {"tags": "a,b"})
    assert error.parameter == "tags"
    assert error.expected == "array or null"
    assert error.actual == "string"


def test_wrong_value_in_dict_uses_dotted_path() -> None:
    error = _invalid(TAGGER, {"weights": {"a": "heavy"}})
    assert error.parameter == "weights.a"
    assert error.expected == "number"


def test_unknown_argument_lists_accepted_ones_and_suggests() -> None:
    error = _invalid(SEARCH, {"qurey": "cats"})
    assert error.parameter == "qurey"
    assert "unknown argument 'qurey'" in error.message
    assert "did you mean 'query'?" in error.message
    assert "query, n, mode" in error.message


def test_unknown_argument_on_a_builtin() -> None:
    error = _invalid(BUILTIN_TOOLS[0], {"code": "print(1)", "timeout": 3})
    assert error.parameter == "timeout"
    assert "accepted: code" in error.message


# --- tool files ------------------------------------------------------------------


def test_find_tool_files_rules(tmp_path: Path) -> None:
    tools_dir = tmp_path / "tools"
    tools_dir.mkdir()
    (tools_dir / "b_tools.py").write_text("")
    (tools_dir / "a_tools.py").write_text("")
    (tools_dir / "_helpers.py").write_text("")  # a helper: skipped quietly
    (tools_dir / "notes.txt").write_text("")
    (tools_dir / "my-tools.py").write_text("")  # not importable as a module
    (tools_dir / "sub").mkdir()
    (tools_dir / "sub" / "deep.py").write_text("")  # not recursive
    outside = tmp_path / "outside.py"
    outside.write_text("")
    os.symlink(outside, tools_dir / "sneaky.py")
    os.symlink(tools_dir / "a_tools.py", tools_dir / "linked.py")  # inside: fine

    files, diagnostics = find_tool_files([tools_dir])

    assert [f.name for f in files] == ["a_tools.py", "b_tools.py", "linked.py"]
    by_code = {d.code: d for d in diagnostics}
    assert set(by_code) == {"bad_file_name", "path_escape"}
    assert by_code["bad_file_name"].file.endswith("my-tools.py")
    assert by_code["path_escape"].file.endswith("sneaky.py")
    assert all(d.severity == "error" for d in diagnostics)


def test_find_tool_files_reports_a_missing_dir(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "t.py").write_text("")
    files, diagnostics = find_tool_files([tmp_path / "missing", good])
    assert [f.name for f in files] == ["t.py"]
    assert [d.code for d in diagnostics] == ["bad_tools_dir"]
    assert "missing" in diagnostics[0].message


# --- building user tools ---------------------------------------------------------


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "echo",
        "function": "echo",
        "description": "Echo.",
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        "options": {"streaming": False},
        "style": "decorator",
    }
    spec.update(overrides)
    return spec


def test_build_user_tools_builds_good_specs() -> None:
    tools, diagnostics = build_user_tools(
        [{"file": "/t/echo.py", "specs": [_spec(options={"timeout_s": 30})], "problems": []}]
    )
    assert diagnostics == []
    (echo,) = tools
    assert echo.source == "user"
    assert (echo.module_path, echo.function, echo.file) == ("/t/echo.py", "echo", "/t/echo.py")
    assert echo.options.timeout_s == 30


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"name": "has space"}, "bad_name"),
        ({"name": "x" * 65}, "bad_name"),
        ({"input_schema": {"type": "array"}}, "bad_schema"),
        ({"input_schema": {"type": "object", "properties": 3}}, "bad_schema"),
        ({"options": {"timeout_s": 5000}}, "bad_options"),
        ({"options": {"timout_s": 5}}, "bad_options"),
    ],
)
def test_build_user_tools_rejects_bad_specs_but_keeps_others(
    overrides: dict[str, Any], code: str
) -> None:
    tools, diagnostics = build_user_tools(
        [{"file": "t.py", "specs": [_spec(**overrides), _spec(name="ok")], "problems": []}]
    )
    assert [t.name for t in tools] == ["ok"]
    assert [d.code for d in diagnostics] == [code]
    assert diagnostics[0].severity == "error"
    assert diagnostics[0].file == "t.py"


def test_bad_options_message_is_readable() -> None:
    _, diagnostics = build_user_tools(
        [{"file": "t.py", "specs": [_spec(options={"timeout_s": 5000})], "problems": []}]
    )
    assert diagnostics[0].message == (
        "options of tool 'echo': timeout_s must be between 1 and 1000 seconds, got 5000"
    )


def test_import_failure_and_problems_become_diagnostics() -> None:
    tools, diagnostics = build_user_tools(
        [
            {
                "file": "broken.py",
                "specs": [],
                "problems": [],
                "error": {"type": "SyntaxError", "message": "invalid syntax", "traceback": ""},
            },
            {
                "file": "empty.py",
                "specs": [],
                "problems": [
                    {"severity": "warning", "code": "no_tools", "message": "none", "tool": ""}
                ],
                "error": None,
            },
        ]
    )
    assert tools == []
    failed, empty = diagnostics
    assert (failed.code, failed.severity, failed.file) == ("import_failed", "error", "broken.py")
    assert "SyntaxError: invalid syntax" in failed.message
    assert "broken.py" in failed.message
    assert (empty.code, empty.severity, empty.file) == ("no_tools", "warning", "empty.py")


# --- the registry ----------------------------------------------------------------


def test_duplicate_names_serve_the_first_only() -> None:
    tools, _ = build_user_tools(
        [
            {"file": "a.py", "specs": [_spec()], "problems": []},
            {"file": "b.py", "specs": [_spec(), _spec(name="execute_python_code")]},
        ]
    )
    registry = Registry(tools, builtins=BUILTIN_TOOLS)

    assert registry.get("echo").file == "a.py"
    assert registry.get("execute_python_code").source == "builtin"
    duplicates = [d for d in registry.diagnostics if d.code == "duplicate_name"]
    assert [(d.file, d.tool) for d in duplicates] == [
        ("b.py", "echo"),
        ("b.py", "execute_python_code"),
    ]
    assert "built-in" in duplicates[1].message
    assert len(registry.tools()) == len(BUILTIN_TOOLS) + 1


def test_registry_keeps_load_diagnostics() -> None:
    _, diagnostics = build_user_tools(
        [{"file": "t.py", "specs": [_spec(name="bad name")], "problems": []}]
    )
    assert [d.code for d in Registry((), diagnostics).diagnostics] == ["bad_name"]


def test_unknown_tool_suggests_a_close_name() -> None:
    registry = Registry(builtins=BUILTIN_TOOLS)
    with pytest.raises(ToolNotFoundError) as info:
        registry.get("execute_python")
    message = info.value.message
    assert "no tool named 'execute_python'" in message
    assert "Did you mean" in message
    assert "execute_python_code" in message
    assert isinstance(info.value, LookupError)


def test_tool_limits_are_checked_when_the_tool_loads() -> None:
    from pydantic import ValidationError

    from tooljaild.tools.registry import ToolOptions

    assert ToolOptions(limits={"cpu_s": 5}).limits == {"cpu_s": 5}
    with pytest.raises(ValidationError, match="unknown limit cpu_seconds"):
        ToolOptions(limits={"cpu_seconds": 5})
    with pytest.raises(ValidationError, match="whole number"):
        ToolOptions(limits={"cpu_s": -1})
