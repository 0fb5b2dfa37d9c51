"""Every built-in tool has one entry saying how it runs, and nothing else does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tooljail.errors import InvalidArgumentsError
from tooljaild.calls import terms
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS, RUNS, builtin_tools
from tooljaild.tools.registry import Registry, Tool


def test_each_builtin_has_its_run_and_each_run_a_builtin() -> None:
    assert {t.builtin for t in BUILTIN_TOOLS} == set(RUNS)
    for tool in (*BUILTIN_TOOLS, *builtin_tools(files_dirs=[])):
        # Decided once, as the catalog builds the tool: every step reads `tool.run`.
        assert tool.run is RUNS[tool.name]
        assert tool.runs_in_daemon == (tool.run.kind == "daemon")


def test_a_builtin_that_does_not_say_how_it_runs_is_not_served() -> None:
    bare = Tool(name="bare", input_schema={"type": "object"}, source="builtin", builtin="bare")
    with pytest.raises(ValueError, match="does not say how it runs"):
        Registry(builtins=[bare])


def test_how_a_tool_runs_is_not_part_of_what_it_says() -> None:
    tool = next(t for t in BUILTIN_TOOLS if t.name == "execute_python_code")
    assert "run" not in tool.model_dump()
    assert "run=" not in repr(tool)


def test_the_file_tool_runs_a_resolved_path_and_refuses_one_outside(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "job.py").write_text("print(1)\n")
    settings = Settings(files_dirs=[files], state_dir=tmp_path / "state")
    tool = next(t for t in BUILTIN_TOOLS if t.name == "execute_python_file")
    arguments = terms.parse_arguments(tool, '{"path": "job.py", "args": ["a"]}', settings)
    request = terms.run_request(tool, arguments, Limits())
    assert request.kind == "file"
    assert request.payload == {"path": str((files / "job.py").resolve()), "args": ["a"]}
    with pytest.raises(InvalidArgumentsError, match="may not leave"):
        terms.parse_arguments(tool, '{"path": "../../etc/passwd"}', settings)
