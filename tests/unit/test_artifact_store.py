"""The artifact store on its own: files and an SQLite index in a temporary directory."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tooljail import ArtifactGoneError, ArtifactNotFoundError, InvalidRequestError
from tooljaild.artifacts.store import (
    CHUNK_BYTES,
    ArtifactQuotaError,
    ArtifactStore,
    Origin,
    prune_periodically,
    safe_name,
)
from tooljaild.settings.artifacts import ArtifactSettings

MIB = 1024**2
ALICE = Origin(owner="alice", call_id="c1", session_id="s1", tool="execute_python_code")
BOB = Origin(owner="bob", call_id="c2")


def _open(root: Path, **bounds: float) -> ArtifactStore:
    return ArtifactStore.open(root, ArtifactSettings(**bounds))  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ArtifactStore]:
    s = _open(tmp_path / "artifacts")
    yield s
    s.close()


def _files(root: Path) -> list[Path]:
    return sorted(f for sub in root.iterdir() if sub.is_dir() for f in sub.iterdir())


def test_put_then_read_back_as_its_owner(store: ArtifactStore) -> None:
    ref = store.put("out.txt", "text/plain", b"hello", ALICE, "output")
    assert len(ref.artifact_id) == 32 and int(ref.artifact_id, 16) >= 0  # 128 random bits
    assert (ref.name, ref.mime_type, ref.size_bytes) == ("out.txt", "text/plain", 5)
    assert store.read(ref.artifact_id, "alice") == b"hello"
    info = store.get(ref.artifact_id, "alice")
    assert (info.call_id, info.session_id, info.tool, info.source) == (
        "c1",
        "s1",
        "execute_python_code",
        "output",
    )
    assert abs(info.created_unix - time.time()) < 60
    assert store.live_bytes == 5
    # The directory and the files are the daemon's alone.
    assert (store.root.stat().st_mode & 0o777) == 0o700


def test_writer_in_parts_and_chunks_from_an_offset(store: ArtifactStore) -> None:
    writer = store.writer("big.bin", "application/octet-stream", ALICE, "outputs")
    data = bytes(range(256)) * (CHUNK_BYTES // 256) * 2 + b"tail"
    for i in range(0, len(data), 300_000):
        assert writer.write(data[i : i + 300_000])
    assert store.list("alice") == []  # not there before commit
    ref = writer.commit()
    assert ref.size_bytes == len(data)
    chunks = list(store.chunks(ref.artifact_id, "alice"))
    assert [len(c) for c in chunks] == [CHUNK_BYTES, CHUNK_BYTES, 4]
    assert b"".join(chunks) == data
    assert b"".join(store.chunks(ref.artifact_id, "alice", offset=len(data) - 4)) == b"tail"
    assert store.path(ref.artifact_id, "alice").read_bytes() == data


def test_an_aborted_writer_leaves_nothing(store: ArtifactStore) -> None:
    writer = store.writer("x", "text/plain", ALICE, "output")
    writer.write(b"half")
    writer.abort()
    assert _files(store.root) == []
    assert store.list("alice") == []
    assert store.live_bytes == 0


def test_an_empty_artifact(store: ArtifactStore) -> None:
    ref = store.put("empty", "text/plain", b"", ALICE, "output")
    assert ref.size_bytes == 0
    assert list(store.chunks(ref.artifact_id, "alice")) == []
    assert store.read(ref.artifact_id, "alice") == b""


def test_only_the_owner_sees_it_and_to_others_it_does_not_exist(store: ArtifactStore) -> None:
    mine = store.put("a", "text/plain", b"a", ALICE, "output")
    theirs = store.put("b", "text/plain", b"b", BOB, "output")
    for read in (store.get, store.read, store.path, store.delete):
        with pytest.raises(ArtifactNotFoundError) as caught:
            read(mine.artifact_id, "bob")  # type: ignore[operator]
        # The same answer as for an id never made: nothing tells them apart.
        with pytest.raises(ArtifactNotFoundError) as never:
            read("0" * 32, "bob")  # type: ignore[operator]
        assert str(caught.value).replace(mine.artifact_id, "0" * 32) == str(never.value)
    assert [a.artifact_id for a in store.list("alice")] == [mine.artifact_id]
    assert [a.artifact_id for a in store.list("bob")] == [theirs.artifact_id]
    assert store.read(mine.artifact_id, "alice") == b"a"  # bob's tries changed nothing


def test_list_is_newest_first_and_filters_by_call_and_session(store: ArtifactStore) -> None:
    first = store.put("1", "text/plain", b"1", ALICE, "output")
    second = store.put("2", "text/plain", b"2", Origin("alice", call_id="c9"), "result")
    third = store.put("3", "text/plain", b"3", ALICE, "figure")
    assert [a.artifact_id for a in store.list("alice")] == [
        third.artifact_id,
        second.artifact_id,
        first.artifact_id,
    ]
    assert [a.name for a in store.list("alice", call_id="c1")] == ["3", "1"]
    assert [a.name for a in store.list("alice", call_id="c9")] == ["2"]
    assert [a.name for a in store.list("alice", session_id="s1")] == ["3", "1"]
    assert store.list("alice", call_id="c1", session_id="nope") == []


def test_delete_leaves_a_tombstone_that_says_deleted(store: ArtifactStore) -> None:
    ref = store.put("x", "text/plain", b"xyz", ALICE, "output")
    assert store.delete(ref.artifact_id, "alice") is True
    assert store.delete(ref.artifact_id, "alice") is False  # gone already: no error
    with pytest.raises(ArtifactGoneError) as gone:
        store.read(ref.artifact_id, "alice")
    assert gone.value.reason == "deleted"
    assert "deleted" in str(gone.value)
    assert store.list("alice") == []
    assert _files(store.root) == []
    assert store.live_bytes == 0
    with pytest.raises(ArtifactNotFoundError):  # a tombstone is its owner's only
        store.get(ref.artifact_id, "bob")


def test_eviction_by_bytes_oldest_first_each_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _open(tmp_path / "a", max_bytes=MIB, max_artifact_bytes=MIB)
    try:
        half = b"x" * (MIB // 2)
        old = store.put("old", "text/plain", half, ALICE, "output")
        mid = store.put("mid", "text/plain", half, BOB, "output")  # another owner's counts too
        with caplog.at_level(logging.INFO, logger="tooljaild.artifacts.store"):
            new = store.put("new", "text/plain", half, ALICE, "output")
        assert store.live_bytes == MIB
        with pytest.raises(ArtifactGoneError) as gone:
            store.get(old.artifact_id, "alice")
        assert gone.value.reason == "evicted"
        assert "size bound" in str(gone.value)
        assert store.read(mid.artifact_id, "bob") == half
        assert store.read(new.artifact_id, "alice") == half
        evictions = [r for r in caplog.records if r.getMessage() == "artifact evicted"]
        assert len(evictions) == 1
        assert evictions[0].artifact == old.artifact_id  # type: ignore[attr-defined]
        assert evictions[0].bytes == len(half)  # type: ignore[attr-defined]
        assert len(_files(store.root)) == 2
    finally:
        store.close()


def test_an_artifact_past_the_per_artifact_bound_is_cut_and_says_so(tmp_path: Path) -> None:
    store = _open(tmp_path / "a", max_artifact_bytes=4096)
    try:
        writer = store.writer("big", "text/plain", ALICE, "output")
        assert writer.write(b"a" * 4000) is True
        assert writer.write(b"b" * 200) is False  # 96 of them fit
        assert writer.write(b"c") is False
        assert writer.truncated
        ref = writer.commit()
        assert ref.size_bytes == 4096
        assert store.read(ref.artifact_id, "alice") == b"a" * 4000 + b"b" * 96
    finally:
        store.close()


def test_expiry_by_age_on_read_list_and_prune(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _open(tmp_path / "a", max_age_s=3600)
    try:
        old = store.put("old", "text/plain", b"old", ALICE, "output")
        kept = store.put("kept", "text/plain", b"kept", ALICE, "output")
        unread = store.put("unread", "text/plain", b"unread", ALICE, "output")
        # Age them: as if made two hours ago.
        store._index.db.execute(
            "UPDATE artifacts SET created = created - 7200 WHERE artifact_id IN (?, ?)",
            (old.artifact_id, unread.artifact_id),
        )
        # Readers see the bound at once, before any prune.
        assert [a.name for a in store.list("alice")] == ["kept"]
        with caplog.at_level(logging.INFO, logger="tooljaild.artifacts.store"):
            with pytest.raises(ArtifactGoneError) as gone:
                store.read(old.artifact_id, "alice")
            assert gone.value.reason == "expired"
            assert store.prune() == 1  # the one nobody read
        assert [r.getMessage() for r in caplog.records].count("artifact expired") == 2
        with pytest.raises(ArtifactGoneError) as gone:
            store.get(unread.artifact_id, "alice")
        assert gone.value.reason == "expired"
        assert store.read(kept.artifact_id, "alice") == b"kept"
        assert store.live_bytes == 4
        assert len(_files(store.root)) == 1
        # Tombstones are forgotten after the same bound: then it is not found.
        assert store.prune(now=time.time() + 7200) == 1  # `kept` expires too
        with pytest.raises(ArtifactNotFoundError):
            store.get(old.artifact_id, "alice")
    finally:
        store.close()


async def test_the_daemon_prunes_periodically(tmp_path: Path) -> None:
    store = _open(tmp_path / "a", max_age_s=3600)
    try:
        ref = store.put("old", "text/plain", b"old", ALICE, "output")
        store._index.db.execute("UPDATE artifacts SET created = created - 7200")
        task = asyncio.create_task(prune_periodically(store, interval_s=0.05))
        try:
            deadline = time.monotonic() + 10
            while _files(store.root) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert _files(store.root) == []
        assert store.live_bytes == 0
        with pytest.raises(ArtifactGoneError):
            store.get(ref.artifact_id, "alice")
    finally:
        store.close()


def test_it_survives_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "a"
    store = _open(root)
    kept = store.put("kept", "text/plain", b"kept", ALICE, "output")
    deleted = store.put("deleted", "text/plain", b"d", ALICE, "output")
    store.delete(deleted.artifact_id, "alice")
    store.close()

    again = _open(root)
    try:
        assert again.read(kept.artifact_id, "alice") == b"kept"
        assert again.live_bytes == 4
        with pytest.raises(ArtifactGoneError) as gone:
            again.get(deleted.artifact_id, "alice")
        assert gone.value.reason == "deleted"
    finally:
        again.close()


def test_reopen_after_a_crash_repairs_files_and_rows(tmp_path: Path) -> None:
    root = tmp_path / "a"
    store = _open(root)
    kept = store.put("kept", "text/plain", b"kept", ALICE, "output")
    lost = store.put("lost", "text/plain", b"lost", ALICE, "output")
    tomb = store.put("tomb", "text/plain", b"tomb", ALICE, "output")
    # A crash mid-write: a .part file, never committed.
    half = store.writer("half", "text/plain", ALICE, "output")
    half.write(b"half")
    half._file.flush()
    # A crash between os.replace and the index row: a whole file without a row.
    orphan = root / "ab" / ("ab" + "0" * 30)
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"orphan")
    # A row whose file is gone (lost with the disk, or removed by hand).
    store._files.path(lost.artifact_id).unlink()
    # A crash between a row marked gone and its file's removal.
    tomb_file = store._files.path(tomb.artifact_id)
    store._index.db.execute(
        "UPDATE artifacts SET gone = 'deleted', gone_at = ? WHERE artifact_id = ?",
        (time.time(), tomb.artifact_id),
    )
    half._file.close()
    store._index.db.close()  # no orderly close: the process died

    again = _open(root)
    try:
        assert _files(root) == [again._files.path(kept.artifact_id)]
        assert not tomb_file.exists()
        assert again.read(kept.artifact_id, "alice") == b"kept"
        with pytest.raises(ArtifactGoneError) as gone:
            again.get(lost.artifact_id, "alice")
        assert gone.value.reason == "evicted"
        assert again.live_bytes == 4
        assert [a.name for a in again.list("alice")] == ["kept"]
    finally:
        again.close()


def test_a_file_removed_under_a_live_row_reads_as_gone(store: ArtifactStore) -> None:
    ref = store.put("x", "text/plain", b"x", ALICE, "output")
    store._files.path(ref.artifact_id).unlink()
    with pytest.raises(ArtifactGoneError) as gone:
        store.read(ref.artifact_id, "alice")
    assert gone.value.reason == "evicted"
    assert store.live_bytes == 0


def test_the_index_is_sqlite_in_the_root(store: ArtifactStore) -> None:
    store.put("x", "text/plain", b"x", ALICE, "output")
    db = sqlite3.connect(store.root / "index.sqlite3")
    try:
        assert db.execute("SELECT count(*) FROM artifacts").fetchone() == (1,)
    finally:
        db.close()


# ------------------------------------------------------------------ quotas (issue 21)


def test_a_write_evicts_only_its_owners_and_is_cut_past_the_ceiling(tmp_path: Path) -> None:
    store = _open(tmp_path / "a", max_bytes=2 * MIB, max_owner_bytes=MIB)
    try:
        theirs = store.put("b", "text/plain", b"b" * MIB, BOB, "output")
        first = store.put("a1", "text/plain", b"a" * (MIB // 2), ALICE, "output")
        store.put("a2", "text/plain", b"a" * (MIB // 2), ALICE, "output")
        store.put("a3", "text/plain", b"a" * (MIB // 2), ALICE, "output")  # evicts a1
        with pytest.raises(ArtifactGoneError):
            store.get(first.artifact_id, "alice")
        assert store.usage("alice") == (MIB, 2) and store.usage("bob") == (MIB, 1)
        # A third owner finds the ceiling held by others: refused, never evicting.
        carol = store.writer("c", "text/plain", Origin("carol"), "output")
        assert carol.write(b"c" * 10) is False
        assert "max_bytes" in carol.cut_by and "other owners" in carol.cut_by
        assert carol.commit().size_bytes == 0
        assert store.read(theirs.artifact_id, "bob") == b"b" * MIB
    finally:
        store.close()


def test_bytes_being_written_are_reserved_and_given_back(tmp_path: Path) -> None:
    store = _open(tmp_path / "a", max_bytes=MIB)
    try:
        one = store.writer("1", "text/plain", ALICE, "output")
        two = store.writer("2", "text/plain", BOB, "output")
        assert one.write(b"x" * (MIB - 10))
        assert store.usage("alice") == (MIB - 10, 1) and store.live_bytes == 0
        assert two.write(b"y" * 20) is False  # 10 fit; alice's are being written
        one.abort()
        assert store.usage("alice") == (0, 0)
        three = store.writer("3", "text/plain", BOB, "output")
        assert three.write(b"z" * 1000)
        two.abort()
        three.abort()
    finally:
        store.close()


def test_counts_per_owner_and_in_all_and_tombstones_by_count(tmp_path: Path) -> None:
    store = _open(tmp_path / "a", max_count=10, max_owner_count=5)
    try:
        for i in range(40):
            store.put(f"a{i}", "text/plain", b"", ALICE, "outputs")
        assert store.usage("alice") == (0, 5)
        kept = [a.name for a in store.list("alice")]
        assert kept == ["a39", "a38", "a37", "a36", "a35"]
        tombstones = store._index.db.execute(
            "SELECT count(*) FROM artifacts WHERE gone != ''"
        ).fetchone()[0]
        assert tombstones <= 5
        for i in range(5):
            store.put(f"b{i}", "text/plain", b"", BOB, "outputs")
        with pytest.raises(ArtifactQuotaError, match="max_count"):
            store.writer("c", "text/plain", Origin("carol"), "outputs")
    finally:
        store.close()


def test_pages_walk_newest_first_and_bad_tokens_are_refused(store: ArtifactStore) -> None:
    for i in range(25):
        store.put(f"n{i}", "text/plain", b"", ALICE, "outputs")
    names: list[str] = []
    token = ""
    while True:
        page = store.page("alice", page_size=10, page_token=token)
        assert len(page.artifacts) <= 10
        names += [a.name for a in page.artifacts]
        token = page.next_page_token
        if not token:
            break
    assert names == [f"n{i}" for i in reversed(range(25))]
    assert len(store.page("alice", page_size=10**6).artifacts) == 25
    for bad in ("x", "1.0/-1", "1.0/99999999999999999999", "a" * 100):
        with pytest.raises(InvalidRequestError):
            store.page("alice", page_token=bad)


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("../../../../tmp/x", "tmp/x"),
        ("/etc/passwd", "etc/passwd"),
        ("outputs/./sub//n.bin", "outputs/sub/n.bin"),
        ("..", "artifact"),
        ("a\\..\\b", "a/b"),
        ("\x1b]0;t\x07x", "\\x1b]0;t\\x07x"),
        ("evil\u202etxt.exe", "evil\\u202etxt.exe"),
        ("x" * 300, "x" * 255),
    ],
)
def test_names_are_kept_safe(store: ArtifactStore, name: str, kept: str) -> None:
    assert safe_name(name) == kept
    assert store.put(name, "text/plain", b"", ALICE, "outputs").name == kept


def test_nested_bounds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"max_artifact_bytes .* is more than max_bytes"):
        ArtifactSettings(max_bytes=MIB, max_artifact_bytes=2 * MIB)
    with pytest.raises(ValueError, match=r"max_owner_bytes .* is more than max_bytes"):
        ArtifactSettings(max_bytes=MIB, max_owner_bytes=2 * MIB)
    lowered = ArtifactSettings(max_bytes=MIB)
    assert lowered.max_owner_bytes == lowered.max_artifact_bytes == MIB


def test_the_store_is_private_whatever_the_umask_and_narrows_an_older_ones_modes(
    tmp_path: Path,
) -> None:
    """Made 0700/0600 as such (an embedded daemon has its host's umask); what an
    older tooljail left looser is narrowed at the next open."""
    root = tmp_path / "artifacts"
    before = os.umask(0)
    try:
        store = _open(root)
        ref = store.put("x", "text/plain", b"x", ALICE, "output")
        half = store.writer("half", "text/plain", ALICE, "output")
        half.write(b"half")
        made = {p: stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}
        half.abort()
        store.close()
    finally:
        os.umask(before)
    assert {p.name for p in made} >= {"index.sqlite3", "index.sqlite3-wal", ref.artifact_id}
    assert any(p.name.endswith(".part") for p in made)
    assert {p.name: m for p, m in made.items() if m not in (0o600, 0o700)} == {}

    index, kept = root / "index.sqlite3", root / ref.artifact_id[:2] / ref.artifact_id
    for path, mode in ((index, 0o644), (kept, 0o644), (kept.parent, 0o755)):
        path.chmod(mode)
    again = _open(root)
    try:
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (index, kept, kept.parent)}
        assert modes == {index: 0o600, kept: 0o600, kept.parent: 0o700}
        assert again.read(ref.artifact_id, "alice") == b"x"
    finally:
        again.close()
