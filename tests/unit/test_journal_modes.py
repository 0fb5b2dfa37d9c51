"""The journal's files are 0600 whatever the umask; an older 0644 journal is narrowed."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tooljaild.journal.store import Journal, JournalError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _admit(journal: Journal, call_id: str) -> None:
    journal.admitted(
        call_id,
        tool="t",
        fingerprint="fp",
        arguments_json='{"code": "secret"}',
        timeout_s=1.0,
        idempotent=False,
    )


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The loosest usual umask (an embedded daemon's host process may have it)."""
    old = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_a_new_journal_and_its_wal_are_private_under_any_umask(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal.open(path)
    try:
        assert journal.created
        _admit(journal, "c1")
        assert _mode(path) == 0o600
        assert _mode(path.with_name("journal.sqlite3-wal")) == 0o600
    finally:
        journal.close()


@pytest.mark.usefixtures("open_umask")
def test_an_older_world_readable_journal_and_wal_are_narrowed_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal.open(path)
    _admit(journal, "c1")
    journal.close()
    wal = path.with_name("journal.sqlite3-wal")
    wal.write_bytes(b"")  # as a killed daemon may leave it
    for p in (path, wal):
        p.chmod(0o644)
    journal = Journal.open(path)
    try:
        assert not journal.created and journal.get("c1") is not None
        assert (_mode(path), _mode(wal)) == (0o600, 0o600)
    finally:
        journal.close()


def test_a_foreign_database_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    path.chmod(0o644)
    with pytest.raises(JournalError) as refused:
        Journal.open(path)
    assert refused.value.reason == "incompatible" and _mode(path) == 0o644
