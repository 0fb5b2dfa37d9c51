"""The ten workspace tools as the daemon serves them: names, schemas, descriptions,
how they run (a "workspace" request with the quota), and name collisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tooljail.errors import InvalidArgumentsError
from tooljaild.calls import terms
from tooljaild.runner import _workspace
from tooljaild.sandbox.backends import Promises
from tooljaild.sandbox.frames import _result_problem
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS, RUNS, builtin_tools
from tooljaild.tools.builtin.workspace import FRESH_WORKSPACE, WORKSPACE_TOOL_NAMES, workspace_tools
from tooljaild.tools.loader import build_user_tools
from tooljaild.tools.registry import Registry

NAMES = (
    "ls",
    "read_file",
    "write_file",
    "edit_file",
    "insert_file",
    "delete_file",
    "move_file",
    "clear_files",
    "glob",
    "grep",
)


def _tool(name: str) -> Any:
    return next(t for t in BUILTIN_TOOLS if t.name == name)


def test_the_ten_names_are_omnicoreagents() -> None:
    assert WORKSPACE_TOOL_NAMES == NAMES
    assert [t.name for t in BUILTIN_TOOLS if t.name in NAMES] == list(NAMES)


def test_every_tool_runs_its_own_op_in_the_sandbox_and_returns_its_value() -> None:
    for name in NAMES:
        run = _tool(name).run
        assert run is not None and run is RUNS[name]
        assert run.kind == "workspace" and run.output_is_data is False
        # Each tool is an op of the runner's _workspace, with the arguments its schema names.
        _, allowed = _workspace._OPS[name]
        assert set(_tool(name).input_schema["properties"]) == allowed


@pytest.mark.parametrize(
    ("name", "required"),
    [
        ("ls", []),
        ("read_file", ["path"]),
        ("write_file", ["path", "content"]),
        ("edit_file", ["path", "old_string", "new_string"]),
        ("insert_file", ["path", "offset", "content"]),
        ("delete_file", ["path"]),
        ("move_file", ["path", "new_path"]),
        ("clear_files", []),
        ("glob", ["pattern"]),
        ("grep", ["pattern"]),
    ],
)
def test_schemas_name_the_pinned_arguments(name: str, required: list[str]) -> None:
    schema = _tool(name).input_schema
    assert schema["required"] == required and schema["additionalProperties"] is False
    for key, prop in schema["properties"].items():
        assert prop["description"], (name, key)


def test_descriptions_say_what_a_model_must_know() -> None:
    described = {t.name: t.description for t in BUILTIN_TOOLS if t.name in NAMES}
    for name, text in described.items():
        assert text.endswith(FRESH_WORKSPACE), name
        assert "nothing it writes persists" in text
    assert "exactly once" in described["edit_file"] and "0 times" in described["edit_file"]
    assert "number of lines BEFORE the insertion point" in described["insert_file"]
    assert "0 inserts at the start" in described["insert_file"]
    assert "Never overwrites" in described["move_file"]
    assert "only when empty" in described["delete_file"]
    assert "2000 lines" in described["read_file"] and "256 KiB" in described["read_file"]
    assert "Python regular expression" in described["grep"]
    assert "'**/'" in described["glob"]


@pytest.mark.parametrize(
    ("promises", "says", "never"),
    [
        (
            Promises(isolated=True, network=False, memory="1 GiB"),
            "isolated sandbox",
            "not isolated",
        ),
        (Promises(isolated=False, network=True, memory=None), "not isolated", "isolated sandbox"),
        (None, "", "isolated"),
    ],
)
def test_descriptions_claim_isolation_only_where_it_holds(
    promises: Promises | None, says: str, never: str
) -> None:
    for tool in workspace_tools(promises):
        assert says in tool.description and never not in tool.description
        assert "network" not in tool.description and "memory" not in tool.description
    names = [t.name for t in builtin_tools(promises)]
    first = names.index(NAMES[0])
    assert names[first : first + len(NAMES)] == list(NAMES)  # together, in this order


def test_the_request_carries_the_op_its_arguments_and_the_quota(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    tool = _tool("read_file")
    arguments = terms.parse_arguments(tool, '{"path": "a.txt", "limit": 5}', settings)
    request = terms.run_request(tool, arguments, Limits(workspace_bytes=3 * 2**20))
    assert request.kind == "workspace"
    assert request.payload == {
        "op": "read_file",
        "args": {"path": "a.txt", "limit": 5},
        "quota_bytes": 3 * 2**20,
    }


@pytest.mark.parametrize(
    ("name", "arguments", "parameter"),
    [
        ("read_file", '{"path": "a", "offset": -1}', "offset"),
        ("read_file", '{"path": "a", "limit": 0}', "limit"),
        ("insert_file", '{"path": "a", "content": "x"}', "offset"),
        ("edit_file", '{"path": "a", "old": "x", "new_string": "y"}', "old"),
        ("move_file", '{"path": "a", "new_path": 3}', "new_path"),
    ],
)
def test_bad_arguments_never_reach_a_sandbox(
    tmp_path: Path, name: str, arguments: str, parameter: str
) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    with pytest.raises(InvalidArgumentsError) as info:
        terms.parse_arguments(_tool(name), arguments, settings)
    assert info.value.parameter == parameter


def test_a_workspace_result_must_be_a_json_value() -> None:
    ok: dict[str, Any] = {"t": "result", "ok": True, "exit_code": 0}
    assert _result_problem({**ok, "kind": "json", "value": {"a": 1}}, "workspace", False) is None
    assert _result_problem({**ok, "kind": "text", "value": "x"}, "workspace", False)
    assert _result_problem({**ok, "kind": "none", "value": None}, "workspace", False)
    failed = {"t": "result", "ok": False, "exit_code": 1}
    error = {"type": "InvalidPathError", "message": "m", "traceback": ""}
    assert _result_problem({**failed, "error": error}, "workspace", False) is None


def test_a_user_tool_named_like_a_workspace_tool_is_shadowed_with_a_diagnostic() -> None:
    """The registry's rule for every built-in name holds for the new ones: the
    built-in wins, and the user's tool is reported as a duplicate, not served."""
    spec = {
        "name": "read_file",
        "function": "read_file",
        "description": "My own reader.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
        "options": {"streaming": False},
        "style": "decorator",
    }
    tools, _ = build_user_tools([{"file": "mine.py", "specs": [spec], "problems": []}])
    registry = Registry(tools, builtins=BUILTIN_TOOLS)
    assert registry.get("read_file").source == "builtin"
    duplicates = [d for d in registry.diagnostics if d.code == "duplicate_name"]
    assert [(d.file, d.tool) for d in duplicates] == [("mine.py", "read_file")]
    assert "built-in" in duplicates[0].message
