"""The call journal on real SQLite files: writes, reads, crashes, retention, bad disks."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tooljail import CallState, CallStatus, Effect, ToolResult
from tooljaild.journal.store import (
    LOST_MESSAGE,
    WAL_SIZE_LIMIT,
    Journal,
    JournalEntry,
    JournalError,
)

RESULT = ToolResult(
    call_id="c1",
    tool="echo",
    status=CallStatus.SUCCESS,
    effect=Effect.APPLIED,
    data={"stdout": "hi\n", "stderr": "", "exit_code": 0},
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.sqlite3"


def admit(journal: Journal, call_id: str, created: float = 1000.0, **fields: Any) -> None:
    fields = {
        "tool": "echo",
        "fingerprint": f"fp-{call_id}",
        "arguments_json": json.dumps({"text": call_id}),
        "timeout_s": 30.0,
        "idempotent": False,
        **fields,
    }
    journal.admitted(call_id, created=created, **fields)


def finish(journal: Journal, call_id: str, ended: float) -> None:
    result = RESULT.model_copy(update={"call_id": call_id})
    journal.finished(call_id, CallState.SUCCEEDED, result.model_dump_json(), ended=ended)


def entry(journal: Journal, call_id: str) -> JournalEntry:
    found = journal.get(call_id)
    assert found is not None, call_id
    return found


def make_journal(path: Path, calls: int = 0) -> None:
    with Journal.open(path) as journal:
        for i in range(calls):
            admit(journal, f"c{i}", arguments_json=json.dumps({"text": "x" * 500}))
            finish(journal, f"c{i}", ended=1000.0 + i)


# ---------------------------------------------------------------------- writes and reads


def test_the_three_writes_round_trip(path: Path) -> None:
    with Journal.open(path) as journal:
        assert journal.created
        assert journal.get("c1") is None
        admit(journal, "c1", created=10.0, idempotent=True, timeout_s=12.5)
        queued = entry(journal, "c1")
        assert (queued.state, queued.created, queued.started, queued.ended) == (
            CallState.QUEUED,
            10.0,
            None,
            None,
        )
        assert (queued.tool, queued.fingerprint, queued.timeout_s, queued.idempotent) == (
            "echo",
            "fp-c1",
            12.5,
            True,
        )
        assert queued.result() is None
        journal.running("c1", "sb-7", started=11.0)
        running = entry(journal, "c1")
        assert (running.state, running.sandbox_id, running.started) == (
            CallState.RUNNING,
            "sb-7",
            11.0,
        )
        finish(journal, "c1", ended=12.0)
    with Journal.open(path) as journal:
        done = entry(journal, "c1")
    assert not journal.created
    assert (done.state, done.started, done.ended) == (CallState.SUCCEEDED, 11.0, 12.0)
    assert json.loads(done.arguments_json) == {"text": "c1"}
    assert not done.arguments_truncated
    assert done.result() == RESULT
    info = done.info()
    assert (info.call_id, info.tool, info.state, info.result) == (
        "c1",
        "echo",
        CallState.SUCCEEDED,
        RESULT,
    )


def test_arguments_are_cut_at_the_bound_on_a_character_boundary(path: Path) -> None:
    arguments = json.dumps({"text": "é" * 100}, ensure_ascii=False)
    with Journal.open(path, max_argument_bytes=51) as journal:
        admit(journal, "long", arguments_json=arguments)
        admit(journal, "short", arguments_json="{}")
        long, short = entry(journal, "long"), entry(journal, "short")
    assert long.arguments_truncated
    assert long.arguments_bytes == len(arguments.encode())
    assert arguments.startswith(long.arguments_json)
    assert len(long.arguments_json.encode()) == 50  # the 51st byte would split an "é"
    assert not short.arguments_truncated
    assert short.arguments_json == "{}"


def test_a_call_id_is_admitted_once_unless_a_finished_call_is_replaced(path: Path) -> None:
    with Journal.open(path) as journal:
        admit(journal, "c1")
        with pytest.raises(ValueError, match="already in the journal"):
            admit(journal, "c1")
        with pytest.raises(ValueError, match="already in the journal"):
            admit(journal, "c1", replace=True)  # unfinished: never replaced
        journal.running("c1", "sb-1", started=1001.0)
        journal.finished("c1", CallState.LOST, "{}", ended=1002.0)
        with pytest.raises(ValueError, match="already in the journal"):
            admit(journal, "c1")
        admit(journal, "c1", created=2000.0, replace=True)
        again = entry(journal, "c1")
    assert (again.state, again.created, again.started, again.ended) == (
        CallState.QUEUED,
        2000.0,
        None,
        None,
    )
    assert (again.sandbox_id, again.result_json) == ("", None)


def test_writes_refuse_unknown_or_finished_calls_and_unfinished_states(path: Path) -> None:
    with Journal.open(path) as journal:
        with pytest.raises(ValueError, match="no unfinished call 'nope'"):
            journal.running("nope", "sb-1")
        admit(journal, "c1")
        with pytest.raises(ValueError, match="not a final state"):
            journal.finished("c1", CallState.RUNNING, "{}")
        finish(journal, "c1", ended=1001.0)
        with pytest.raises(ValueError, match="no unfinished call 'c1'"):
            finish(journal, "c1", ended=1002.0)
        with pytest.raises(ValueError, match="no unfinished call 'c1'"):
            journal.running("c1", "sb-1")
        assert entry(journal, "c1").ended == 1001.0


def test_it_is_used_from_one_thread_only(path: Path) -> None:
    errors: list[BaseException] = []
    with Journal.open(path) as journal:

        def use() -> None:
            try:
                journal.get("c1")
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=use)
        thread.start()
        thread.join()
    assert len(errors) == 1
    assert isinstance(errors[0], sqlite3.ProgrammingError)


# ---------------------------------------------------------------------- crashes


def test_recover_marks_unfinished_calls_lost_and_leaves_finished_ones(path: Path) -> None:
    with Journal.open(path) as journal:
        admit(journal, "queued", created=1.0)
        admit(journal, "running", created=2.0)
        journal.running("running", "sb-2", started=3.0)
        admit(journal, "done", created=4.0)
        finish(journal, "done", ended=5.0)
        done_before = entry(journal, "done")

        lost = journal.recover(now=100.0)

        assert [e.call_id for e in lost] == ["queued", "running"]
        assert lost == [entry(journal, "queued"), entry(journal, "running")]
        assert entry(journal, "done") == done_before
        for e in lost:
            assert (e.state, e.ended) == (CallState.LOST, 100.0)
            assert e.result_json is not None
            result = ToolResult.model_validate_json(e.result_json)
            assert result.call_id == e.call_id
            assert result.tool == "echo"
            assert (result.status, result.effect) == (CallStatus.LOST, Effect.UNKNOWN)
            assert result.message == LOST_MESSAGE
            assert not result.still_running
        assert entry(journal, "running").sandbox_id == "sb-2"
        assert journal.recover(now=200.0) == []


CRASHING_WRITER = """
import os, signal, sys
from tooljail import CallState
from tooljaild.journal.store import Journal

journal = Journal.open(sys.argv[1])
def admit(call_id):
    journal.admitted(call_id, tool="echo", fingerprint="fp", arguments_json="{}",
                     timeout_s=30.0, idempotent=False, created=1.0)
admit("done")
journal.running("done", "sb-1", started=2.0)
journal.finished("done", CallState.SUCCEEDED, sys.argv[2], ended=3.0)
admit("running")
journal.running("running", "sb-2", started=4.0)
admit("queued")
print("committed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_committed_writes_survive_a_sigkill(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(path), RESULT.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout == "committed\n"
    # Nothing was checkpointed: the rows live only in the WAL the dead process left.
    assert Path(f"{path}-wal").stat().st_size > 0

    with Journal.open(path) as journal:
        assert not journal.created
        assert entry(journal, "done").result() == RESULT
        assert entry(journal, "running").state is CallState.RUNNING
        assert entry(journal, "queued").state is CallState.QUEUED
        lost = journal.recover(now=10.0)
        assert {e.call_id for e in lost} == {"running", "queued"}


def test_a_second_opener_is_refused_while_the_journal_is_open(path: Path) -> None:
    with Journal.open(path):
        with pytest.raises(JournalError) as caught:
            Journal.open(path)
        assert caught.value.reason == "busy"
        assert "another tooljail daemon" in caught.value.message
    Journal.open(path).close()


# ---------------------------------------------------------------------- retention


def test_prune_by_age_never_removes_unfinished_calls(path: Path) -> None:
    with Journal.open(path, max_age_s=100.0) as journal:
        admit(journal, "old-queued", created=0.0)
        admit(journal, "old-running", created=0.0)
        journal.running("old-running", "sb-1", started=1.0)
        for i, ended in enumerate([10.0, 50.0, 150.0, 250.0]):
            admit(journal, f"done-{i}", created=0.0)
            finish(journal, f"done-{i}", ended=ended)

        assert journal.prune(now=200.0) == 2  # ended before 100

        ids = ["old-queued", "old-running", *(f"done-{i}" for i in range(4))]
        kept = {c for c in ids if journal.get(c) is not None}
        assert kept == {"old-queued", "old-running", "done-2", "done-3"}
        assert journal.prune(now=200.0) == 0


def test_prune_by_row_count_removes_the_oldest_finished_first(path: Path) -> None:
    with Journal.open(path, max_rows=3) as journal:
        admit(journal, "queued", created=0.0)
        ended = [5.0, 1.0, 4.0, 2.0, 3.0, 3.0]
        for i, when in enumerate(ended):
            admit(journal, f"done-{i}")
            finish(journal, f"done-{i}", ended=when)

        assert journal.prune(now=10.0) == 3

        kept = {f"done-{i}" for i in range(len(ended)) if journal.get(f"done-{i}") is not None}
        assert kept == {"done-0", "done-2", "done-5"}  # ended 5, 4, and the later of the 3s
        assert journal.get("queued") is not None
        assert journal.prune(now=10.0) == 0


def test_pruned_space_is_reused_so_the_file_stops_growing(path: Path) -> None:
    sizes, wal_sizes = [], []
    with Journal.open(path, max_rows=200) as journal:
        for round_ in range(6):
            for i in range(400):
                call_id = f"r{round_}-{i}"
                admit(journal, call_id, arguments_json=json.dumps({"text": "x" * 2000}))
                finish(journal, call_id, ended=round_ * 1000.0 + i)
            journal.prune(now=round_ * 1000.0 + 500)
            sizes.append(path.stat().st_size)
            wal_sizes.append(Path(f"{path}-wal").stat().st_size)
    assert sizes[-1] <= sizes[2] * 1.05, sizes
    assert max(wal_sizes) <= WAL_SIZE_LIMIT, wal_sizes


# ---------------------------------------------------------------------- bad files


def random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(5).randbytes(16 * 1024))


def truncated_journal(path: Path) -> None:
    make_journal(path, calls=200)
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size // 2)


def other_program(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE calls (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO calls (name) VALUES ('theirs')")


def newer_version(path: Path) -> None:
    make_journal(path, calls=1)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version = 99")


def wrong_columns(path: Path) -> None:
    make_journal(path, calls=1)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("ALTER TABLE calls DROP COLUMN result")


@pytest.mark.parametrize(
    ("spoil", "reason", "says"),
    [
        (random_bytes, "corrupt", "file is not a database"),
        (truncated_journal, "corrupt", "damaged"),
        (wrong_columns, "corrupt", "has columns"),
        (other_program, "incompatible", "not a tooljail call journal"),
        (newer_version, "incompatible", "schema version 99"),
    ],
)
def test_a_file_that_is_no_usable_journal_is_reported_and_left_untouched(
    path: Path, spoil: Any, reason: str, says: str
) -> None:
    spoil(path)
    before = path.read_bytes()
    with pytest.raises(JournalError) as caught:
        Journal.open(path)
    error = caught.value
    assert error.reason == reason
    assert error.path == path
    assert str(path) in error.message
    assert says in error.message
    assert "move the file aside" in error.message or "move it aside" in error.message
    assert path.read_bytes() == before
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0


def test_an_empty_file_becomes_a_new_journal(path: Path) -> None:
    path.touch()  # a first start killed before its first write
    with Journal.open(path) as journal:
        assert journal.created
        admit(journal, "c1")
    with Journal.open(path) as journal:
        assert entry(journal, "c1").state is CallState.QUEUED


def test_a_directory_at_the_journal_path_is_reported(path: Path) -> None:
    path.mkdir()
    with pytest.raises(JournalError, match="is a directory") as caught:
        Journal.open(path)
    assert caught.value.reason == "unwritable"


# ---------------------------------------------------------------------- bad disks

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def mounted(*args: str, where: Path) -> Iterator[None]:
    try:
        run("mount", *args, str(where))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount here: {exc}")
    try:
        yield
    finally:
        run("umount", str(where))


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` as a read-only bind mount of itself: as root, chmod stops no write."""
    with mounted("--bind", str(directory), where=directory):
        run("mount", "-o", "remount,bind,ro", str(directory))
        yield


@needs_root
def test_a_read_only_directory_is_reported_at_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with read_only(state), pytest.raises(JournalError) as caught:
        Journal.open(state / "journal.sqlite3")
    assert caught.value.reason == "unwritable"
    assert "read-only" in caught.value.message
    assert not (state / "journal.sqlite3").exists()


@needs_root
def test_an_existing_journal_on_a_read_only_disk_is_reported_at_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / "journal.sqlite3"
    make_journal(path, calls=3)
    before = path.read_bytes()
    with read_only(state), pytest.raises(JournalError) as caught:
        Journal.open(path)
    assert caught.value.reason == "unwritable"
    assert str(path) in caught.value.message
    assert path.read_bytes() == before


@needs_root
def test_an_immutable_journal_file_is_reported_at_open(path: Path) -> None:
    make_journal(path, calls=3)
    try:
        run("chattr", "+i", str(path))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"chattr +i does not work here: {exc}")
    try:
        with pytest.raises(JournalError) as caught:
            Journal.open(path)
    finally:
        run("chattr", "-i", str(path))
    assert caught.value.reason == "unwritable"


def fill_up(path: Path) -> None:
    with path.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    assert shutil.disk_usage(path.parent).free < 4096


@needs_root
def test_a_full_disk_makes_writes_fail_clearly_and_keeps_the_journal_readable(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", where=disk):
        path = disk / "journal.sqlite3"
        with Journal.open(path) as journal:
            admit(journal, "before")
            fill_up(disk / "filler")
            with pytest.raises(JournalError) as caught:
                for i in range(1000):  # the WAL's last free pages get used first
                    admit(journal, f"c{i}", arguments_json=json.dumps({"text": "x" * 8000}))
            error = caught.value
            assert error.reason == "full"
            assert str(path) in error.message
            assert "disk" in error.message and "full" in error.message
            assert error.__cause__ is not None
            assert entry(journal, "before").state is CallState.QUEUED
            failed = f"c{i}"
            assert journal.get(failed) is None  # the failed write left no half row

            (disk / "filler").unlink()
            admit(journal, failed)  # space is back: so are writes
        with Journal.open(path) as journal:
            assert entry(journal, failed).state is CallState.QUEUED


# ---------------------------------------------------------------------- cost


def test_the_cost_of_the_three_writes_is_printed(path: Path, capsys: Any) -> None:
    """Not asserted: printed, for the record (`pytest -s` or the summary shows it)."""
    arguments = json.dumps({"code": "print('hello')\n" * 10})
    result = RESULT.model_copy(update={"data": {"stdout": "hello\n" * 50, "stderr": ""}})
    result_json = result.model_dump_json()
    costs: dict[str, list[float]] = {"admitted": [], "running": [], "finished": []}
    with Journal.open(path) as journal:
        for i in range(3000):
            call_id = f"call-{i:06d}"
            t0 = time.perf_counter()
            journal.admitted(
                call_id,
                tool="execute_python_code",
                fingerprint="ab" * 32,
                arguments_json=arguments,
                timeout_s=30.0,
                idempotent=False,
            )
            t1 = time.perf_counter()
            journal.running(call_id, "sb-1")
            t2 = time.perf_counter()
            journal.finished(call_id, CallState.SUCCEEDED, result_json)
            t3 = time.perf_counter()
            for name, cost in zip(costs, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                costs[name].append(cost * 1e6)
        t0 = time.perf_counter()
        journal.prune(now=time.time() + 1e9)
        prune_ms = (time.perf_counter() - t0) * 1e3
    lines = [
        f"{name:>8}: p50 {statistics.median(v):6.1f} µs, mean {statistics.fmean(v):6.1f} µs, "
        f"p99 {sorted(v)[int(len(v) * 0.99)]:7.1f} µs, max {max(v):7.1f} µs"
        for name, v in costs.items()
    ]
    with capsys.disabled():
        print("\njournal writes, 3000 calls:\n  " + "\n  ".join(lines))
        print(f"  prune of 3000 calls: {prune_ms:.1f} ms")


# ---------------------------------------------------------------------- sessions


# The migration from schema versions 1 and 2: tests/unit/test_journal_owners.py


def test_sessions_open_at_a_crash_are_ended_for_the_restart(path: Path) -> None:
    with Journal.open(path) as journal:
        journal.session_opened("s1", client="a", sandbox_id="x", options_json="{}", created=5.0)
        journal.session_opened("s2", client="b", sandbox_id="y", options_json="{}", created=6.0)
        journal.session_ended("s2", "closed", ended=7.0)
    with Journal.open(path) as journal:
        lost = journal.recover_sessions("daemon_restart", now=9.0)
        assert [r.session_id for r in lost] == ["s1"]
        s1, s2 = journal.get_session("s1"), journal.get_session("s2")
        assert s1 is not None and (s1.ended, s1.end_reason) == (9.0, "daemon_restart")
        assert s2 is not None and (s2.ended, s2.end_reason) == (7.0, "closed")
        journal.session_ended("s2", "idle_ttl")  # the first end stands
        again = journal.get_session("s2")
        assert again is not None and again.end_reason == "closed"
        assert journal.recover_sessions("daemon_restart") == []
        assert journal.get_session("never") is None
