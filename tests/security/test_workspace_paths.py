"""The workspace file tools attacked through a real `tooljail serve`: paths that
climb out, absolute paths, and symlinks made in the workspace to /etc/shadow or
to the daemon's state directory. Each is refused with an error naming the path,
and no result ever holds the host's content.

Outside a session every call has a fresh workspace, so a symlink made by one
call is gone by the next. The symlink attacks therefore run in ONE sandbox: the
attack code makes the links and then runs the very op a workspace call runs,
`_workspace.run` as installed in the sandbox; with sessions (when the SDK has
them) the same attack goes through the tools themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.security.conftest import SecurityDaemon, output_of, report, run_code
from tooljail import Client, ToolResult
from tooljail.errors import InvalidPathError


def _call(daemon: SecurityDaemon, tool: str, args: dict[str, Any]) -> ToolResult:
    with Client(daemon.target) as client:
        return client.call(tool, args, tool_timeout_s=30)


def _state_file(daemon: SecurityDaemon) -> Path:
    """A file of the daemon's state directory (its journal, most likely)."""
    files = sorted(p for p in daemon.state_dir.rglob("*") if p.is_file())
    assert files, f"nothing in the state directory {daemon.state_dir}"
    return files[0]


def _assert_refused(result: ToolResult, path: str) -> None:
    assert result.status.value == "error" and result.error is not None, result
    assert result.error.type == "InvalidPathError", result
    assert repr(path) in result.error.message, result.error.message
    text = json.dumps(result.model_dump(mode="json"))
    assert "root:" not in text and "SQLite format" not in text, text


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "../" * 30 + "etc/shadow",
        "/etc/passwd",
        "/etc/shadow",
        "a/../../../etc/shadow",
    ],
)
def test_read_file_never_reaches_host_files(daemon: SecurityDaemon, path: str) -> None:
    """Attack: read_file of the host's account files, climbing out or absolute."""
    _assert_refused(_call(daemon, "read_file", {"path": path}), path)


def test_the_daemons_state_directory_cannot_be_named(daemon: SecurityDaemon) -> None:
    """Attack: read, list, search and overwrite the daemon's journal by its host path,
    absolute and as a climb from the workspace."""
    target = _state_file(daemon)
    before = target.stat()
    climbing = "../" * 30 + str(target).lstrip("/")
    for tool, args, named in [
        ("read_file", {"path": str(target)}, str(target)),
        ("read_file", {"path": climbing}, climbing),
        ("ls", {"path": str(daemon.state_dir)}, str(daemon.state_dir)),
        ("grep", {"pattern": ".", "path": climbing}, climbing),
        ("write_file", {"path": climbing, "content": "pwned"}, climbing),
        ("delete_file", {"path": str(target)}, str(target)),
        ("clear_files", {"path": str(daemon.state_dir)}, str(daemon.state_dir)),
    ]:
        _assert_refused(_call(daemon, tool, args), named)
    after = target.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    daemon.assert_serving()


def symlink_attack(daemon: SecurityDaemon) -> None:
    """In one sandbox, symlink /etc/shadow, /etc/passwd and the daemon's state
    directory into the workspace, run the workspace ops on the links, and check
    that each was refused by name and that nothing of the host came back."""
    target = _state_file(daemon)
    code = f"""
import json, os, sys
for d in ("/opt/tooljail", "/opt/tooljail/runner", {str(daemon.state_dir / "runner")!r}):
    if os.path.exists(os.path.join(d, "_workspace.py")):
        sys.path.insert(0, d)
        break
import _workspace
links = {{"shadow": "/etc/shadow", "passwd": "/etc/passwd", "state": {str(target)!r},
         "statedir": {str(daemon.state_dir)!r}}}
for name, to in links.items():
    os.symlink(to, name)
out = {{}}
for op, args in [
    ("read_file", {{"path": "shadow"}}), ("read_file", {{"path": "passwd"}}),
    ("read_file", {{"path": "state"}}), ("ls", {{"path": "statedir"}}),
    ("grep", {{"pattern": "root", "path": "passwd"}}),
    ("download_chunk", {{"path": "state"}}),
    ("write_file", {{"path": "state", "content": "pwned"}}),
    ("clear_files", {{"path": "statedir"}}),
]:
    try:
        value = _workspace.run(op, args, os.getcwd(), 0)
        out[op + " " + args["path"]] = "ALLOWED " + json.dumps(value)[:200]
    except _workspace.WorkspaceError as e:
        out[op + " " + args["path"]] = e.type + ": " + e.message
print("REPORT " + json.dumps(out))
"""
    before = target.stat()
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert len(got) == 8, got
    for what, said in got.items():
        assert said.startswith("InvalidPathError: "), (what, said)
        assert "outside the workspace" in said and repr(what.split()[1]) in said, said
    assert "root:" not in output_of(result)
    after = target.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)


def test_symlinks_made_in_the_workspace_are_refused(daemon: SecurityDaemon) -> None:
    """Attack: symlinks to /etc/shadow and the daemon's state, read by the workspace ops."""
    symlink_attack(daemon)


@pytest.mark.skipif(not hasattr(Client, "session"), reason="this tree's SDK has no sessions")
def test_symlinks_made_in_a_session_are_refused_by_the_tools(daemon: SecurityDaemon) -> None:
    """Attack: in a session, make the links with execute_python_code, then read them
    with read_file in the next call."""
    target = _state_file(daemon)
    links = {"shadow": "/etc/shadow", "state": str(target), "statedir": str(daemon.state_dir)}
    with Client(daemon.target) as client, client.session() as s:  # type: ignore[attr-defined]
        made = s.call(
            "execute_python_code",
            {
                "code": "import os\n"
                + "".join(f"os.symlink({t!r}, {n!r})\n" for n, t in links.items())
            },
        )
        assert made.ok, made
        _assert_refused(s.call("read_file", {"path": "shadow"}), "shadow")
        _assert_refused(s.call("read_file", {"path": "state"}), "state")
        _assert_refused(s.call("ls", {"path": "statedir"}), "statedir")
        with pytest.raises(InvalidPathError, match="shadow"):
            s.download("shadow")
