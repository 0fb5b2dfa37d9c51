"""The journal records who made each call (schema 3), and older journals are
migrated in place: every row kept, in one transaction, never refused.

Older journals are built here from the DDL their tooljail versions ran (copied
from git history, not from the current schema), so a change to today's schema
cannot make these tests pass by building what it expects.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path

import pytest

from tooljail import CallState, CallStatus, Effect, ToolResult
from tooljaild.journal import file as journal_file
from tooljaild.journal.file import APPLICATION_ID, SCHEMA_VERSION
from tooljaild.journal.store import Journal, JournalEntry, JournalError

CALLS_DDL_V2 = """CREATE TABLE calls (
    call_id TEXT NOT NULL PRIMARY KEY,
    tool TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    started REAL,
    ended REAL,
    timeout_s REAL NOT NULL,
    idempotent INTEGER NOT NULL,
    sandbox_id TEXT NOT NULL DEFAULT '',
    arguments_bytes INTEGER NOT NULL,
    arguments TEXT NOT NULL,
    result TEXT
)"""
"""The calls table of schema versions 1 and 2 (journal_file.py at b23e546 and 7660287)."""
SESSIONS_DDL_V2 = """CREATE TABLE sessions (
    session_id TEXT NOT NULL PRIMARY KEY,
    client TEXT NOT NULL,
    created REAL NOT NULL,
    ended REAL,
    end_reason TEXT NOT NULL DEFAULT '',
    sandbox_id TEXT NOT NULL DEFAULT '',
    options TEXT NOT NULL
)"""
"""The sessions table schema version 2 added."""
INSERT_V2 = """INSERT INTO calls (call_id, tool, fingerprint, state, created, started, ended,
    timeout_s, idempotent, sandbox_id, arguments_bytes, arguments, result)
    VALUES (?, 'echo', ?, ?, 1000.0, ?, ?, 30.0, 0, 'sb', 2, '{}', ?)"""

RESULT = ToolResult(
    call_id="old-1",
    tool="echo",
    status=CallStatus.SUCCESS,
    effect=Effect.APPLIED,
    data={"stdout": "hi\n", "stderr": "", "exit_code": 0},
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.sqlite3"


def old_journal(path: Path, version: int, finished: int = 1) -> None:
    """A journal as tooljail wrote it at schema `version` (1 or 2): `finished`
    finished calls `old-0`..., one unfinished call `old-running`, and (at 2) a session."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(CALLS_DDL_V2)
        db.execute("CREATE INDEX calls_by_end ON calls (ended) WHERE ended IS NOT NULL")
        if version >= 2:
            db.execute(SESSIONS_DDL_V2)
            db.execute("CREATE INDEX sessions_by_end ON sessions (ended) WHERE ended IS NOT NULL")
            db.execute(
                "INSERT INTO sessions (session_id, client, created, options) "
                "VALUES ('s-old', 'agent-a', 1000.0, '{}')"
            )
        db.executemany(
            INSERT_V2,
            [
                (
                    f"old-{i}",
                    f"fp-{i}",
                    "succeeded",
                    1000.0,
                    1001.0 + i,
                    RESULT.model_copy(update={"call_id": f"old-{i}"}).model_dump_json(),
                )
                for i in range(finished)
            ],
        )
        db.execute(INSERT_V2, ("old-running", "fp-r", "running", 1000.0, None, None))
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute(f"PRAGMA user_version = {version}")


def schema_of(path: Path) -> tuple[int, list[str]]:
    """The file's schema version and its calls table's columns."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        columns = [str(row[1]) for row in db.execute("PRAGMA table_info(calls)")]
    return version, columns


def admit(journal: Journal, call_id: str, *, client: str = "", replace: bool = False) -> None:
    journal.admitted(
        call_id,
        tool="echo",
        fingerprint="f",
        arguments_json=json.dumps({}),
        timeout_s=5.0,
        idempotent=True,
        client=client,
        replace=replace,
    )


def entry(journal: Journal, call_id: str) -> JournalEntry:
    found = journal.get(call_id)
    assert found is not None, call_id
    return found


def test_each_call_records_who_made_it_and_a_rerun_records_its_own(path: Path) -> None:
    with Journal.open(path) as journal:
        assert journal.migrated_from is None
        admit(journal, "c1", client="agent-a")
        admit(journal, "c2")
        assert entry(journal, "c1").client == "agent-a"
        assert entry(journal, "c2").client == ""
        journal.finished("c1", CallState.LOST, RESULT.model_dump_json())
        admit(journal, "c1", client="agent-b", replace=True)
        assert entry(journal, "c1").client == "agent-b"
    version, columns = schema_of(path)
    assert (version, SCHEMA_VERSION, len(columns), columns[13]) == (4, 4, 17, "client")


def test_a_version_2_journal_is_migrated_in_place_and_keeps_every_row(path: Path) -> None:
    old_journal(path, version=2, finished=3)
    assert schema_of(path)[0] == 2
    with Journal.open(path) as journal:
        assert (journal.created, journal.migrated_from) == (False, 2)
        for i in range(3):
            old = entry(journal, f"old-{i}")
            # Its result as it was written; no owner, as none was recorded.
            assert (old.state, old.client, old.ended) == (CallState.SUCCEEDED, "", 1001.0 + i)
            result = old.result()
            assert result is not None and result.data["stdout"] == "hi\n"
        lost = journal.recover(now=2000.0)
        assert [(e.call_id, e.state, e.client) for e in lost] == [
            ("old-running", CallState.LOST, "")
        ]
        session = journal.get_session("s-old")
        assert session is not None and session.client == "agent-a"
        admit(journal, "new", client="agent-a")
        assert entry(journal, "new").client == "agent-a"
    version, columns = schema_of(path)
    assert version == 4 and columns[13] == "client"
    with Journal.open(path) as journal:  # now a version 4 journal: opened as it is
        assert journal.migrated_from is None
        assert entry(journal, "old-0").client == ""
        assert entry(journal, "new").client == "agent-a"
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_version_1_journal_is_brought_up_to_date_and_keeps_its_calls(path: Path) -> None:
    old_journal(path, version=1)
    with Journal.open(path) as journal:
        assert (journal.created, journal.migrated_from) == (False, 1)
        assert entry(journal, "old-0").state is CallState.SUCCEEDED
        journal.session_opened("s1", client="me", sandbox_id="sb", options_json="{}")
        assert journal.get_session("s1") is not None
    assert schema_of(path)[0] == 4


def test_a_migration_that_fails_leaves_the_journal_as_it_was(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_journal(path, version=2)
    # The column is added, then a later statement of the same migration fails.
    monkeypatch.setitem(
        journal_file.MIGRATIONS, 2, (journal_file.CLIENT_COLUMN, "UPDATE no_such_table SET x = 1")
    )
    with pytest.raises(JournalError) as failed:
        Journal.open(path)
    assert str(path) in failed.value.message
    monkeypatch.undo()
    version, columns = schema_of(path)
    assert version == 2 and "client" not in columns
    with Journal.open(path) as journal:  # and the real migration then succeeds
        assert journal.migrated_from == 2
        assert entry(journal, "old-0").state is CallState.SUCCEEDED


def test_a_version_3_journal_without_its_client_column_is_damaged(path: Path) -> None:
    old_journal(path, version=2)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version = 3")
    before = path.read_bytes()
    with pytest.raises(JournalError) as refused:
        Journal.open(path)
    assert refused.value.reason == "corrupt" and "has columns" in refused.value.message
    assert path.read_bytes() == before


def test_migrating_many_calls_costs_no_rewrite_of_them(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ADD COLUMN with a constant default changes the schema only: the rows are
    # read with the default, never rewritten. What opening costs is the check
    # that reads every page (quick_check), as for any journal, and (to version
    # 4) building the history's indexes: ~40 bytes per call, not a row's size.
    old_journal(path, version=2, finished=20_000)
    size = path.stat().st_size
    began = time.perf_counter()
    with Journal.open(path) as journal:
        opened_s = time.perf_counter() - began
        assert journal.migrated_from == 2
        assert entry(journal, "old-19999").client == ""
    assert path.stat().st_size <= size + 64 * 20_000
    with capsys.disabled():
        print(f"\n  opening (check + migration) a 20,000-call v2 journal: {opened_s * 1000:.1f} ms")
    assert opened_s < 5.0


def test_an_unfinished_call_keeps_its_client_through_recover(path: Path) -> None:
    with Journal.open(path) as journal:
        admit(journal, "c1", client="agent-a")
    with Journal.open(path) as journal:
        [lost] = journal.recover()
        assert (lost.state, lost.client) == (CallState.LOST, "agent-a")
        assert entry(journal, "c1").client == "agent-a"
