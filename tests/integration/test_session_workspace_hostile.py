"""A session's workspace as a hostile model would leave it: a FIFO, a pattern that
backtracks for ever, a 1 GiB sparse file. Each is a clear tool error (or simply
works), and the session survives: the next call still sees its variables.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import ServedDaemon
from tooljail import Client, ToolResult

MiB = 1024 * 1024


@pytest.fixture
def client(served: ServedDaemon) -> Iterator[Client]:
    with Client(served.target) as c:
        yield c


def _run(session: object, code: str) -> str:
    result = session.call("execute_python_code", {"code": code}, tool_timeout_s=30)  # type: ignore[attr-defined]
    assert result.ok, result
    return str(result.data["stdout"])


def _failed(result: ToolResult, type_: str) -> str:
    assert result.status.value == "error" and result.error is not None, result
    assert result.error.type == type_, result
    return result.error.message


def _alive(session: object) -> None:
    assert _run(session, "print(kept)") == "42\n"


def test_grep_over_a_fifo_returns_and_the_session_lives(client: Client) -> None:
    with client.session() as s:
        _run(s, "import os; kept = 42; os.mkfifo('pipe'); os.symlink('pipe', 'link')")
        s.call("write_file", {"path": "notes.txt", "content": "needle here\n"})
        for path in ("", "pipe", "link"):
            start = time.monotonic()
            found = s.call("grep", {"pattern": "needle", "path": path}, tool_timeout_s=30)
            assert found.ok, found
            assert time.monotonic() - start < 5
        assert found.ok
        everything = s.call("grep", {"pattern": "needle"}, tool_timeout_s=30)
        assert everything.data["matches"] == ["notes.txt:1:needle here"]
        _alive(s)


def test_a_backtracking_pattern_is_a_clear_error_and_the_session_lives(client: Client) -> None:
    with client.session() as s:
        _run(s, "kept = 42")
        s.call("write_file", {"path": "a.txt", "content": "a" * 40 + "b\n"})
        start = time.monotonic()
        slow = s.call("grep", {"pattern": "(a+)+$"}, tool_timeout_s=60)
        assert time.monotonic() - start < 15
        message = _failed(slow, "PatternTimeoutError")
        assert "Simplify the pattern" in message
        bad = s.call("grep", {"pattern": "(unclosed"}, tool_timeout_s=30)
        assert "not a valid Python regular expression" in _failed(bad, "PatternError")
        huge = s.call("grep", {"pattern": "x" * 10_000}, tool_timeout_s=30)
        assert "at most" in _failed(huge, "PatternError")
        _alive(s)


def test_a_sparse_file_does_not_block_later_writes(client: Client) -> None:
    with client.session() as s:
        _run(s, "kept = 42\nwith open('sparse.bin', 'wb') as f: f.truncate(1 << 30)")
        written = s.call("write_file", {"path": "after.txt", "content": "still room\n"})
        assert written.ok, written
        assert s.upload("uploaded.bin", b"u" * MiB) == MiB
        _alive(s)


def test_a_full_workspace_names_its_largest_files(client: Client) -> None:
    with client.session(workspace_bytes=2 * MiB) as s:
        assert s.upload("big.bin", b"b" * (3 * MiB // 2)) == 3 * MiB // 2
        full = s.call("write_file", {"path": "more.txt", "content": "m" * MiB})
        message = _failed(full, "WorkspaceFullError")
        assert "'big.bin' (1572864 bytes)" in message and "delete_file" in message
