"""The workspace file tools through a real daemon over gRPC, outside a session:
each call acts on a fresh workspace of its own, in its sandbox.

(Inside a session, where files persist between calls, the same tools are
exercised by the sessions' own tests; the last test here runs when the SDK
has sessions.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import ServedDaemon
from tooljail import Client, ToolResult
from tooljail.errors import InvalidArgumentsError

MiB = 2**20


def _call(daemon: ServedDaemon, tool: str, args: dict[str, Any]) -> ToolResult:
    with Client(daemon.target) as client:
        return client.call(tool, args, tool_timeout_s=30)


def _failed(result: ToolResult, type_: str) -> str:
    assert result.status.value == "error" and result.error is not None, result
    assert result.error.type == type_, result
    assert result.data is None
    return result.error.message


def test_every_tool_works_on_the_calls_own_fresh_workspace(served: ServedDaemon) -> None:
    written = _call(served, "write_file", {"path": "src/a.py", "content": "x = 1\n"})
    assert written.ok and written.data == {
        "path": "src/a.py",
        "created": True,
        "size_bytes": 6,
        "lines": 1,
    }
    # The next call has a fresh workspace: the file is gone, each tool says so.
    assert _call(served, "ls", {}).data == {
        "path": ".",
        "entries": [],
        "note": "The directory is empty.",
    }
    for tool, args in [
        ("read_file", {"path": "src/a.py"}),
        ("edit_file", {"path": "src/a.py", "old_string": "1", "new_string": "2"}),
        ("insert_file", {"path": "src/a.py", "offset": 0, "content": "# hi"}),
        ("delete_file", {"path": "src/a.py"}),
        ("move_file", {"path": "src/a.py", "new_path": "b.py"}),
    ]:
        message = _failed(_call(served, tool, args), "FileNotFoundError")
        assert "'src/a.py'" in message, tool
    assert _call(served, "clear_files", {}).data == {
        "path": ".",
        "removed_files": 0,
        "removed_directories": 0,
    }
    assert _call(served, "glob", {"pattern": "**/*"}).data == {
        "pattern": "**/*",
        "matches": [],
        "note": "Nothing matches.",
    }
    grep = _call(served, "grep", {"pattern": "x"})
    assert grep.ok and grep.data["matches"] == [] and grep.data["files_searched"] == 0


def test_the_tools_are_listed_with_their_schemas(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        tools = {t.name: t for t in client.list_tools()}
    for name in ["ls", "read_file", "write_file", "edit_file", "insert_file", "delete_file"]:
        assert tools[name].source == "builtin"
        assert "nothing it writes persists" in tools[name].description
    assert tools["move_file"].input_schema["required"] == ["path", "new_path"]
    assert tools["grep"].input_schema["required"] == ["pattern"]


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        ("read_file", {"path": "../../etc/passwd"}, "leaves the workspace"),
        ("read_file", {"path": "/etc/passwd"}, "is absolute"),
        ("write_file", {"path": "../escaped.txt", "content": "x"}, "leaves the workspace"),
        ("ls", {"path": "/"}, "is absolute"),
        ("grep", {"pattern": "root", "path": "/etc"}, "is absolute"),
        ("move_file", {"path": "a", "new_path": "/tmp/x"}, "is absolute"),
        ("glob", {"pattern": "../*"}, "stay inside it"),
    ],
)
def test_paths_outside_the_workspace_are_refused(
    served: ServedDaemon, tool: str, args: dict[str, Any], says: str
) -> None:
    message = _failed(_call(served, tool, args), "InvalidPathError")
    assert says in message
    named = args.get("path") if tool != "move_file" else args["new_path"]
    assert repr(named if tool != "glob" else args["pattern"]) in message


def test_bad_arguments_are_refused_before_any_sandbox(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        with pytest.raises(InvalidArgumentsError) as info:
            client.call("edit_file", {"path": "a", "old": "x", "new_string": "y"})
        assert info.value.parameter == "old"
        with pytest.raises(InvalidArgumentsError) as info:
            client.call("insert_file", {"path": "a", "content": "x"})
        assert info.value.parameter == "offset"


def test_an_invalid_regex_is_a_clear_error(served: ServedDaemon) -> None:
    message = _failed(_call(served, "grep", {"pattern": "def ("}), "PatternError")
    assert "not a valid Python regular expression" in message


def test_writes_past_the_workspace_quota_are_refused(serve: Callable[..., ServedDaemon]) -> None:
    daemon = serve(limits={"workspace_bytes": MiB})
    ok = _call(daemon, "write_file", {"path": "small.txt", "content": "x" * (MiB // 2)})
    assert ok.ok, ok
    big = _call(daemon, "write_file", {"path": "big.txt", "content": "x" * (MiB + 1)})
    message = _failed(big, "WorkspaceFullError")
    assert "'big.txt'" in message and "quota of 1048576 bytes" in message


@pytest.mark.skipif(not hasattr(Client, "session"), reason="this tree's SDK has no sessions")
def test_in_a_session_write_edit_run_grep_and_download(served: ServedDaemon) -> None:
    """What users will try: write a file, edit it, run it, grep it, download it."""
    with Client(served.target) as client, client.session() as s:  # type: ignore[attr-defined]
        assert s.call("write_file", {"path": "f.py", "content": "print(41)\n"}).ok
        edited = s.call("edit_file", {"path": "f.py", "old_string": "41", "new_string": "42"})
        assert edited.ok and edited.data["line"] == 1
        ran = s.call("execute_python_code", {"code": "exec(open('f.py').read())"})
        assert ran.data["stdout"] == "42\n"
        assert s.call("grep", {"pattern": "42"}).data["matches"] == ["f.py:1:print(42)"]
        assert s.download("f.py") == b"print(42)\n"
        read = s.call("read_file", {"path": "f.py"})
        assert read.data["content"] == "     1\tprint(42)\n"
        png = b"\x89PNG\r\n\x1a\n" + bytes(1000)
        s.upload("data.bin", png)
        described = s.call("read_file", {"path": "data.bin"}).data
        assert described["binary"] is True and described["type"] == "PNG image"
        assert s.download("data.bin") == png
