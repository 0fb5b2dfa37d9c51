"""User tools: a tools directory with good and broken files, served by a real daemon.

The good tools are listed with schemas inferred from their signatures and run in
a sandbox; the broken files become diagnostics naming their file, and never stop
the good tools from being served. Tool code never runs in the daemon's process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import tooljail
from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import CallStatus, Client, Effect, Output, StreamKind, ToolResult

GOOD = '''
import asyncio
from typing import Literal

from tooljail import tool


@tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers.

    a: the first
    """
    return a + b


@tool
async def async_greet(name: str) -> str:
    """Greet someone, asynchronously."""
    await asyncio.sleep(0)
    return f"hello {name}"


@tool
def count_up(n: int):
    """Yield n small dicts."""
    for i in range(n):
        yield {"i": i, "square": i * i}


@tool
async def async_count(n: int):
    """Yield n values from an async generator."""
    for i in range(n):
        await asyncio.sleep(0)
        yield {"async_i": i}


@tool
def nothing() -> None:
    """Return nothing."""


@tool
def half_done() -> dict:
    """Return a result envelope."""
    return {"status": "partial", "data": [1], "message": "half"}


@tool
def plain_dict(kind: Literal["x", "y"] = "x") -> dict:
    """Return a plain dict (data, not an envelope)."""
    return {"status_code": 200, "kind": kind, "items": [1, 2]}


@tool
def explode(why: str) -> str:
    """Always raises."""
    raise ValueError(f"boom: {why}")


@tool
def touch(path: str, n: int) -> str:
    """Write n to a file."""
    with open(path, "w") as f:
        f.write(str(n))
    return "written"


def la_weather(city: str, unit: str = "C") -> str:
    return f"weather in {city}: 20 {unit}"


la_weather.tool_info = {
    "tool_name": "la_weather",
    "tool_title": "Weather",
    "tool_description": "Get the weather of a city.",
    "tool_params": [
        {"name": "city", "description": "the city name", "type": "string", "required": True},
        {"name": "unit", "description": "C or F", "type": "string", "required": False},
    ],
}


def helper_not_a_tool() -> int:
    return 1
'''

BROKEN = "def oops(:\n    pass\n"

BADSCHEMA = """
def bad(x):
    return x


bad.tool_info = {
    "tool_name": "bad",
    "tool_description": "bad type",
    "tool_params": [{"name": "x", "type": "not-a-type"}],
}
"""

BADNAME = """
from tooljail import tool


@tool
def from_bad_name() -> int:
    return 1
"""

GOOD_TOOLS = {
    "add",
    "async_greet",
    "count_up",
    "async_count",
    "nothing",
    "half_done",
    "plain_dict",
    "explode",
    "touch",
    "la_weather",
}


def _write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(textwrap.dedent(text))
    return directory


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "tools",
        {
            "good.py": GOOD,
            "broken.py": BROKEN,
            "badschema.py": BADSCHEMA,
            "bad-name.py": BADNAME,
        },
    )


@pytest.fixture
def tools_daemon(serve: Callable[..., ServedDaemon], tools_dir: Path) -> ServedDaemon:
    """An in-process daemon serving `tools_dir`."""
    return serve(tools_dirs=[tools_dir])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args], capture_output=True, text=True, timeout=60
    )


# --------------------------------------------------------------------- listing


def test_good_tools_are_listed_with_inferred_schemas(tools_daemon: ServedDaemon) -> None:
    with Client(tools_daemon.target) as client:
        tools = {t.name: t for t in client.list_tools()}
    assert set(tools) >= GOOD_TOOLS
    assert {"execute_python_code", "execute_python_code_stream"} <= set(tools)
    assert "helper_not_a_tool" not in tools
    assert "from_bad_name" not in tools
    assert "bad" not in tools
    assert {n for n, t in tools.items() if t.source == "user"} == GOOD_TOOLS

    add = tools["add"]
    assert add.description == "Add two numbers."
    assert add.input_schema["required"] == ["a"]
    assert add.input_schema["properties"]["a"] == {"type": "integer", "description": "the first"}
    assert add.input_schema["properties"]["b"] == {"type": "integer", "default": 2}
    assert add.input_schema["additionalProperties"] is False
    assert add.streaming is False

    assert tools["count_up"].streaming is True
    assert tools["async_count"].streaming is True
    assert tools["async_greet"].input_schema["required"] == ["name"]
    assert tools["plain_dict"].input_schema["properties"]["kind"]["enum"] == ["x", "y"]

    weather = tools["la_weather"]
    assert weather.description == "Get the weather of a city."
    assert weather.input_schema["required"] == ["city"]
    assert weather.input_schema["properties"]["city"] == {
        "type": "string",
        "description": "the city name",
    }


def test_diagnostics_name_each_broken_file(tools_daemon: ServedDaemon, tools_dir: Path) -> None:
    with Client(tools_daemon.target) as client:
        diagnostics = client.diagnostics()
    by_file: dict[str, list[tooljail.Diagnostic]] = {}
    for d in diagnostics:
        by_file.setdefault(Path(d.file).name, []).append(d)

    broken = by_file["broken.py"]
    assert [d.code for d in broken] == ["import_failed"]
    assert broken[0].severity == "error"
    assert "SyntaxError" in broken[0].message
    assert Path(broken[0].file) == tools_dir / "broken.py"

    bad_schema = [d for d in by_file["badschema.py"] if d.severity == "error"]
    assert len(bad_schema) == 1, by_file["badschema.py"]
    assert "not-a-type" in bad_schema[0].message
    assert Path(bad_schema[0].file) == tools_dir / "badschema.py"

    bad_name = by_file["bad-name.py"]
    assert [d.code for d in bad_name] == ["bad_file_name"]
    assert Path(bad_name[0].file) == tools_dir / "bad-name.py"

    assert not [d for d in by_file.get("good.py", []) if d.severity == "error"]


def test_openai_tools_cover_every_served_tool(tools_daemon: ServedDaemon) -> None:
    with Client(tools_daemon.target) as client:
        tools = {t.name: t for t in client.list_tools()}
        openai = client.openai_tools()
    assert len(openai) == len(tools)
    by_name = {entry["function"]["name"]: entry for entry in openai}
    assert set(by_name) == set(tools)
    for name, entry in by_name.items():
        assert entry["type"] == "function"
        assert entry["function"]["description"] == tools[name].description
        params = entry["function"]["parameters"]
        assert params == tools[name].input_schema
        assert params["type"] == "object"
    assert by_name["add"]["function"]["parameters"]["required"] == ["a"]


# --------------------------------------------------------------------- calling


def test_good_tools_work(tools_daemon: ServedDaemon) -> None:
    with Client(tools_daemon.target) as client:
        add = client.call("add", {"a": 3})
        assert add.status is CallStatus.SUCCESS
        assert add.effect is Effect.APPLIED
        assert add.data == 5  # a number is JSON: it stays a number
        assert add.tool == "add"
        assert client.call("add", {"a": 3, "b": 4}).data == 7

        assert client.call("async_greet", {"name": "bob"}).data == "hello bob"

        weather = client.call("la_weather", {"city": "Paris"})
        assert weather.ok and weather.data == "weather in Paris: 20 C"

        none = client.call("nothing")
        assert none.status is CallStatus.SUCCESS
        assert none.data is None
        assert none.message == "Tool executed successfully (no output)"

        partial = client.call("half_done")
        assert partial.status is CallStatus.PARTIAL
        assert partial.data == [1]
        assert partial.message == "half"

        plain = client.call("plain_dict", {"kind": "y"})
        assert plain.status is CallStatus.SUCCESS
        assert plain.data == {"status_code": 200, "kind": "y", "items": [1, 2]}


def test_a_raising_tool_is_an_error_result(tools_daemon: ServedDaemon) -> None:
    with Client(tools_daemon.target) as client:
        result = client.call("explode", {"why": "because"})
    assert result.status is CallStatus.ERROR
    assert result.error is not None
    assert result.error.type == "ValueError"
    assert result.error.message == "boom: because"
    assert "Traceback" in result.error.traceback
    assert "good.py" in result.error.traceback
    assert 'raise ValueError(f"boom: {why}")' in result.error.traceback
    for own in ("_runner.py", "_kinds.py", "_frames.py"):  # the runner's frames are left out
        assert own not in result.error.traceback
    assert "ValueError" in result.message


@pytest.mark.parametrize("tool", ["count_up", "async_count"])
def test_generator_items_arrive_in_order_as_yield_outputs(
    tools_daemon: ServedDaemon, tool: str
) -> None:
    with Client(tools_daemon.target) as client:
        items = list(client.stream(tool, {"n": 3}))
    result = items[-1]
    assert isinstance(result, ToolResult)
    assert result.status is CallStatus.SUCCESS
    outputs = [i for i in items[:-1] if isinstance(i, Output)]
    yields = [o for o in outputs if o.stream is StreamKind.YIELD]
    assert len(yields) == 3
    expected = (
        [{"i": i, "square": i * i} for i in range(3)]
        if tool == "count_up"
        else [{"async_i": i} for i in range(3)]
    )
    assert [o.value() for o in yields] == expected
    seqs = [o.seq for o in outputs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


# Tests that watch a tool's effects on the host run it without namespaces: under
# them, nothing a tool writes reaches the host (tests/security checks that).
HOST_WRITABLE = {"TOOLJAIL_ISOLATION": "none"}


def test_arguments_of_user_tools_are_validated_before_anything_runs(
    start_daemon: Callable[..., RunningDaemon], tools_dir: Path, host_dir: Path
) -> None:
    tools_daemon = start_daemon("--tools-dir", str(tools_dir), env=HOST_WRITABLE)
    target = host_dir / "touched.txt"
    with Client(tools_daemon.target) as client:
        with pytest.raises(tooljail.InvalidArgumentsError) as missing:
            client.call("add", {})
        assert (missing.value.parameter, missing.value.actual) == ("a", "missing")
        assert "'a'" in str(missing.value)

        with pytest.raises(tooljail.InvalidArgumentsError) as wrong:
            client.call("add", {"a": "x"})
        assert (wrong.value.parameter, wrong.value.expected, wrong.value.actual) == (
            "a",
            "integer",
            "string",
        )

        with pytest.raises(tooljail.InvalidArgumentsError) as unknown:
            client.call("add", {"a": 1, "c": 2})
        assert unknown.value.parameter == "c"

        with pytest.raises(tooljail.InvalidArgumentsError) as bad_enum:
            client.call("plain_dict", {"kind": "z"})
        assert bad_enum.value.parameter == "kind"

        # A tool with an effect: refused arguments never reach it.
        with pytest.raises(tooljail.InvalidArgumentsError):
            client.call("touch", {"path": str(target), "n": "seven"})
        with pytest.raises(tooljail.InvalidArgumentsError):
            client.call("touch", {"path": str(target), "n": 7, "mode": "w"})
        assert not target.exists()
        assert client.call("touch", {"path": str(target), "n": 7}).data == "written"
    assert target.read_text() == "7"


def test_user_tool_code_never_runs_in_the_daemon(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path, host_dir: Path
) -> None:
    pid_file = host_dir / "import_pids.txt"
    tools = _write(
        tmp_path / "pidtools",
        {
            "pidtool.py": f"""
                import os

                from tooljail import tool

                with open({str(pid_file)!r}, "a") as f:
                    f.write(f"{{os.getpid()}}\\n")


                @tool
                def my_pid() -> int:
                    \"\"\"The pid of the process running the tool.\"\"\"
                    return os.getpid()
            """
        },
    )
    daemon = start_daemon("--tools-dir", str(tools), env=HOST_WRITABLE)
    load_pids = [int(line) for line in pid_file.read_text().split()]
    assert load_pids, "the tool module was never imported"
    assert daemon.pid not in load_pids

    with Client(daemon.target) as client:
        result = client.call("my_pid")
    assert result.ok, result
    call_pid = int(result.data)
    assert call_pid != daemon.pid
    assert call_pid != os.getpid()
    all_pids = [int(line) for line in pid_file.read_text().split()]
    assert call_pid in all_pids  # the call imported the module in its sandbox
    assert daemon.pid not in all_pids


# --------------------------------------------------------------------- the CLI


def test_cli_tools_check_reports_good_tools_and_problems(tools_dir: Path) -> None:
    proc = _cli("tools", "--check", "--tools-dir", str(tools_dir))
    assert proc.returncode == 1, proc
    for name in GOOD_TOOLS:
        assert f"ok      {name}  " in proc.stdout, name
    assert "broken.py" in proc.stdout and "import_failed" in proc.stdout
    assert "SyntaxError" in proc.stdout
    assert "badschema.py" in proc.stdout and "not-a-type" in proc.stdout
    assert "bad-name.py" in proc.stdout and "bad_file_name" in proc.stdout
    assert f"{len(GOOD_TOOLS)} tools ok" in proc.stdout


def test_cli_tools_check_of_good_files_exits_0(tmp_path: Path) -> None:
    good_only = _write(tmp_path / "good_only", {"good.py": GOOD})
    proc = _cli("tools", "--check", "--tools-dir", str(good_only))
    assert proc.returncode == 0, proc
    assert f"{len(GOOD_TOOLS)} tools ok, 0 errors" in proc.stdout


def test_cli_tools_lists_the_daemons_tools(tools_daemon: ServedDaemon) -> None:
    proc = _cli("tools", "--target", tools_daemon.target)
    assert proc.returncode == 0, proc
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert GOOD_TOOLS | {"execute_python_code"} <= listed
    assert "Add two numbers." in proc.stdout
    # The load problems are shown too, on stderr.
    assert "broken.py" in proc.stderr


def test_a_value_json_cannot_carry_still_ends_with_one_result(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    tools = _write(
        tmp_path / "nantools",
        {
            "nantool.py": """
                from tooljail import tool


                @tool
                def ratio() -> dict:
                    \"\"\"A float JSON cannot carry.\"\"\"
                    return {"ratio": float("nan"), "limit": float("inf")}
            """
        },
    )
    daemon = start_daemon("--tools-dir", str(tools))
    with Client(daemon.target) as client:
        result = client.call("ratio", call_id="nan-1")
        assert result.call_id == "nan-1"
        assert result.status in (CallStatus.SUCCESS, CallStatus.ERROR)
        info = client.get_call("nan-1")
        assert info.result is not None
        assert info.result.status is result.status
    daemon.assert_serving()
