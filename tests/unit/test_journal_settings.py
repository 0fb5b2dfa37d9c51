"""`[journal]`: its keys, the old top-level keys they replace, retention as the
daemon runs it (with `now=`, and hourly on an idle daemon), and the WAL's group
commit ("power") on real files."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path

import pytest

from tooljail import CallState, CallStatus, Effect, ToolResult
from tooljaild.app import journal as app_journal
from tooljaild.app.reload import compare
from tooljaild.journal.store import Journal, JournalError
from tooljaild.settings.config import ConfigError, Settings, load_settings

DAY = 86_400.0


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _admit(journal: Journal, call_id: str, created: float = 0.0) -> None:
    journal.admitted(
        call_id,
        tool="echo",
        fingerprint=f"fp-{call_id}",
        arguments_json=json.dumps({"id": call_id}),
        timeout_s=30.0,
        idempotent=False,
        created=created,
    )


def _finish(journal: Journal, call_id: str, ended: float) -> None:
    result = ToolResult(call_id=call_id, tool="echo", status=CallStatus.SUCCESS, effect=Effect.NONE)
    journal.finished(call_id, CallState.SUCCEEDED, result.model_dump_json(), ended=ended)


# ---------------------------------------------------------------------- settings


def test_journal_table_defaults() -> None:
    s = Settings().journal
    assert (s.durability, s.keep_days, s.max_rows, s.max_session_rows) == (
        "crash",
        7.0,
        100_000,
        10_000,
    )
    assert s.max_age_s == 7 * DAY


def test_journal_table_from_a_config_file(tmp_path: Path) -> None:
    text = '[journal]\ndurability = "power"\nkeep_days = 0.5\nmax_rows = 500\n'
    s = load_settings(_config(tmp_path, text)).journal
    assert (s.durability, s.max_age_s, s.max_rows) == ("power", 0.5 * DAY, 500)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[journal]\ndurability = "disk"\n', "journal.durability"),
        ("[journal]\nkeep_days = 0\n", "journal.keep_days"),
        ("[journal]\nmax_rows = 10\n", "journal.max_rows"),
        ("[journal]\nkeep = 3\n", "journal.keep"),
    ],
)
def test_bad_journal_keys_are_refused_by_name(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_settings(_config(tmp_path, text))


def test_the_old_top_level_keys_still_start_a_daemon(tmp_path: Path) -> None:
    text = "journal_max_age_s = 3600\njournal_max_rows = 500\njournal_max_session_rows = 20\n"
    settings = load_settings(_config(tmp_path, text))
    assert settings.journal.max_age_s == pytest.approx(3600)
    assert (settings.journal.max_rows, settings.journal.max_session_rows) == (500, 20)
    assert set(settings.deprecated_keys) == {
        "journal_max_age_s",
        "journal_max_rows",
        "journal_max_session_rows",
    }
    # Folded in and cleared: one value in force, under its new name.
    assert settings.journal_max_age_s is None and settings.journal_max_rows is None


def test_old_and_new_keys_agreeing_are_fine_and_differing_are_refused(tmp_path: Path) -> None:
    same = "journal_max_age_s = 172800\n[journal]\nkeep_days = 2\n"
    assert load_settings(_config(tmp_path, same)).journal.keep_days == pytest.approx(2)
    differ = "journal_max_rows = 500\n[journal]\nmax_rows = 600\n"
    with pytest.raises(ConfigError, match=r"journal_max_rows \(deprecated\).*\[journal\] max_rows"):
        load_settings(_config(tmp_path, differ))


def test_every_journal_key_is_applied_by_a_reload() -> None:
    running = Settings()
    read = Settings(journal={"durability": "power", "keep_days": 1, "max_rows": 200})
    change = compare(running, read)
    assert set(change.live) == {"journal.durability", "journal.keep_days", "journal.max_rows"}
    assert change.restart == ()
    assert change.settings.journal == read.journal


def test_a_reload_changing_an_old_key_applies_it_live() -> None:
    change = compare(Settings(journal_max_rows=500), Settings(journal_max_rows=700))
    assert change.live == ("journal.max_rows",) and change.restart == ()


def test_configure_applies_a_reload_to_the_open_journal(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite3") as journal:
        app_journal.configure(
            journal, Settings(journal={"durability": "power", "keep_days": 2}).journal
        )
        assert journal.durability == "power" and journal.max_age_s == 2 * DAY
        app_journal.configure(journal, Settings().journal)
        assert journal.durability == "crash"


# ---------------------------------------------------------------------- retention


def test_retention_age_and_rows_prune_the_oldest_ended_never_an_unfinished_call(
    tmp_path: Path,
) -> None:
    keep = Settings(journal={"keep_days": 1, "max_rows": 100}).journal
    with Journal.open(
        tmp_path / "j.sqlite3", max_age_s=keep.max_age_s, max_rows=keep.max_rows
    ) as journal:
        _admit(journal, "queued-long-ago")
        _admit(journal, "running-long-ago")
        journal.running("running-long-ago", "sb", started=1.0)
        for i in range(150):  # ended at day 0.5 + i seconds: all older than a day at day 3
            _admit(journal, f"old-{i}")
            _finish(journal, f"old-{i}", ended=0.5 * DAY + i)
        for i in range(120):  # ended at day 2.5: within a day at day 3
            _admit(journal, f"new-{i}")
            _finish(journal, f"new-{i}", ended=2.5 * DAY + i)

        # The age bound: the 150 old ones; then the row bound: the 20 that ended first.
        assert journal.prune(now=3 * DAY) == 150 + 20
        assert journal.get("old-149") is None
        assert [journal.get(f"new-{i}") is None for i in (0, 19, 20, 119)] == [
            True,
            True,
            False,
            False,
        ]
        # Unfinished: past both bounds, and kept.
        for call_id in ("queued-long-ago", "running-long-ago"):
            found = journal.get(call_id)
            assert found is not None and found.ended is None


def test_prune_in_batches_removes_at_most_that_many_per_bound(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite3", max_age_s=10.0, max_rows=100) as journal:
        for i in range(250):
            _admit(journal, f"c{i}")
            _finish(journal, f"c{i}", ended=float(i))
        assert journal.prune(now=50.0, at_most=30) == 30 + 30  # age, then rows
        assert journal.prune(now=50.0, at_most=-1) == 250 - 60 - 100


def test_an_idle_daemon_still_prunes(tmp_path: Path) -> None:
    """No call ends, so the every-1,000-ends prune never comes: the periodic one does."""

    async def idle() -> None:
        with Journal.open(tmp_path / "j.sqlite3", max_age_s=DAY) as journal:
            for i in range(2500):  # ended long ago; more than one batch
                _admit(journal, f"c{i}")
                _finish(journal, f"c{i}", ended=1.0 + i)
            _admit(journal, "still-queued")
            task = asyncio.create_task(app_journal.prune_periodically(journal, interval_s=0.01))
            for _ in range(500):
                await asyncio.sleep(0.01)
                if journal.get("c2499") is None:
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert journal.get("c0") is None and journal.get("c2499") is None
            assert journal.get("still-queued") is not None

    asyncio.run(idle())


# ---------------------------------------------------------------------- "power"


def test_power_group_commit_shares_flushes_and_covers_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        real(fd)
        flushed.append(fd)

    async def many() -> None:
        with Journal.open(tmp_path / "j.sqlite3", durability="power") as journal:
            monkeypatch.setattr(os, "fdatasync", counting)
            await journal.durable()  # nothing written since open: no flush
            assert flushed == []
            waits = []
            for i in range(50):
                _admit(journal, f"c{i}")
                waits.append(asyncio.create_task(journal.durable()))
            await asyncio.gather(*waits)
            assert 1 <= len(flushed) <= 2  # one for the 50, or one more after the first
            _admit(journal, "late")
            await journal.durable()
            assert len(flushed) <= 3

    asyncio.run(many())


def test_power_a_failed_flush_refuses_every_later_admission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def failing() -> None:
        with Journal.open(tmp_path / "j.sqlite3", durability="power") as journal:
            monkeypatch.setattr(os, "fdatasync", broken)
            _admit(journal, "c1")
            with pytest.raises(JournalError, match="stable storage") as caught:
                await journal.durable()
            assert caught.value.reason == "io"
            monkeypatch.undo()  # a later flush would succeed: no matter, the pages may be gone
            with pytest.raises(JournalError, match="stable storage"):
                _admit(journal, "c2")
            with pytest.raises(JournalError):
                await journal.durable()

    asyncio.run(failing())


def test_crash_durability_never_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(fd: int) -> None:
        raise AssertionError("crash durability flushed")

    async def crash() -> None:
        with Journal.open(tmp_path / "j.sqlite3") as journal:
            monkeypatch.setattr(os, "fdatasync", forbidden)
            _admit(journal, "c1")
            await journal.durable()
            assert journal.durability == "crash"

    asyncio.run(crash())
