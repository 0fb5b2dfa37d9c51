"""`Journal.cached`: the latest success a tool's cache may give again, one index lookup."""

from __future__ import annotations

from pathlib import Path

from tooljail import CallState, CallStatus, Effect, ToolResult
from tooljaild.journal.store import Journal

SHA = "a" * 64


def ended(
    journal: Journal,
    call_id: str,
    at: float,
    *,
    fingerprint: str = "plain",
    client: str = "agent-a",
    status: CallStatus = CallStatus.SUCCESS,
) -> None:
    journal.admitted(
        call_id,
        tool="lookup",
        fingerprint=fingerprint,
        arguments_json='{"key": "k"}',
        timeout_s=30.0,
        idempotent=False,
        client=client,
        arguments_sha256=SHA,
        created=at - 1,
    )
    result = ToolResult(call_id=call_id, tool="lookup", status=status, effect=Effect.APPLIED)
    state = CallState.SUCCEEDED if status is CallStatus.SUCCESS else CallState.FAILED
    journal.finished(call_id, state, result.model_dump_json(), ended=at, status=status.value)


def found(journal: Journal, since: float, **asked: str) -> str | None:
    asked = {"client": "agent-a", "tool": "lookup", "arguments_sha256": SHA, **asked}
    entry = journal.cached(since=since, **asked)
    return None if entry is None else entry.call_id


def test_the_latest_success_of_the_same_question_is_found(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "journal.sqlite3") as journal:
        ended(journal, "old", 100.0)
        ended(journal, "run", 200.0)
        ended(journal, "failed", 300.0, status=CallStatus.ERROR)
        ended(journal, "someone-else", 300.0, client="agent-b")
        ended(journal, "in-a-session", 400.0, fingerprint="with-session")
        # Another caller's, a failure: never; a session's only for its fingerprint.
        assert found(journal, 0.0) == "in-a-session"
        assert found(journal, 0.0, fingerprint="plain") == "run"
        assert found(journal, 0.0, fingerprint="with-session") == "in-a-session"
        assert found(journal, 0.0, client="agent-b") == "someone-else"
        # Within the time asked only: by the end of the run.
        assert found(journal, 200.0, fingerprint="plain") == "run"
        assert found(journal, 200.5, fingerprint="plain") is None
        assert found(journal, 0.0, tool="other") is None
        assert found(journal, 0.0, arguments_sha256="") is None
