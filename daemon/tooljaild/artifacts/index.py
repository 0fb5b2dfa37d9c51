"""The artifact store's index: one SQLite table, a row per artifact, kept or gone.

A row holds an artifact's name, MIME type, size, the call, session and tool
that made it, where it came from, and its owner. A row outlives its file as a
tombstone (`gone`: "evicted", "expired", "deleted", with `gone_at`), so that
its owner learns it is gone rather than "not found"; the store decides when a
tombstone is forgotten (`tooljaild.artifacts.store`).

The index holds every owner's names and calls: it is made `FILE_MODE` before
SQLite opens it, and SQLite gives its `-wal` and `-shm` the same mode, whatever
the umask of the process the daemon runs in (`tooljaild.testing` embeds it in
a test's). One left looser by an older tooljail is narrowed at open.

Paging (`page`) walks an index from a token on: a page costs time in its size,
not the store's.

Thread: one thread (the event loop's); each statement is small and local.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tooljail.errors import InvalidRequestError
from tooljail.types import ArtifactInfo

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FILE_MODE",
    "MAX_PAGE_SIZE",
    "ArtifactIndex",
    "Origin",
    "Page",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT NOT NULL PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    mime_type TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    source TEXT NOT NULL,
    created REAL NOT NULL,
    gone TEXT NOT NULL DEFAULT '',
    gone_at REAL
);
CREATE INDEX IF NOT EXISTS artifacts_by_owner ON artifacts (owner, created);
CREATE INDEX IF NOT EXISTS artifacts_live ON artifacts (created) WHERE gone = '';
CREATE INDEX IF NOT EXISTS artifacts_tombstones ON artifacts (gone_at) WHERE gone != '';
CREATE INDEX IF NOT EXISTS artifacts_tombstones_by_owner ON artifacts (owner, gone_at)
    WHERE gone != '';
"""
_COLUMNS = (
    "artifact_id, owner, name, mime_type, size_bytes, call_id, session_id, tool, source, "
    "created, gone"
)
FILE_MODE = 0o600
"""The index's mode (and so its `-wal`'s and `-shm`'s): the daemon's alone."""
_SIDE_FILES = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps next to a database."""

MAX_PAGE_SIZE = 1000
"""The most artifacts one page of `page` holds (ListArtifacts' `page_size` bound):
each answer, and the loop's time to build it, stay bounded whatever the store holds."""
DEFAULT_PAGE_SIZE = 200
"""Artifacts a page holds when the caller names no size."""


@dataclass(frozen=True)
class Origin:
    """Who and what made an artifact."""

    owner: str
    """The client whose call made it: the only one who may read it."""
    call_id: str = ""
    session_id: str = ""
    tool: str = ""


@dataclass(frozen=True)
class Page:
    """One page of an owner's artifacts (`ArtifactStore.page`), newest first."""

    artifacts: list[ArtifactInfo]
    next_page_token: str
    """Pass it to read the next page; empty on the last page."""


class ArtifactIndex:
    """The rows of the artifact store. Build it with `open`.

    It keeps no count of its own: the store counts what each owner holds
    (`tooljaild.artifacts.quotas`) from what these methods return.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        """The connection (autocommit: each statement is its own transaction)."""

    @classmethod
    def open(cls, path: Path) -> ArtifactIndex:
        """Open (or create) the index at `path`, private to the daemon (`FILE_MODE`).

        Raises:
            OSError: It cannot be made, or its mode set.
            sqlite3.Error: It cannot be opened as an index.
        """
        # Made before SQLite opens it: SQLite's side files then take its mode, not the umask's.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
        for target in (path, *(path.with_name(path.name + s) for s in _SIDE_FILES)):
            try:
                if os.stat(target).st_mode & 0o7777 != FILE_MODE:
                    os.chmod(target, FILE_MODE)
            except FileNotFoundError:
                continue
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.executescript(_SCHEMA)
        except BaseException:
            db.close()
            raise
        return cls(db)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ rows

    def holdings(self) -> Iterator[tuple[str, bool, int, int]]:
        """(owner, live, artifacts, bytes) for each owner: its kept artifacts (live)
        and its tombstones (not live; bytes 0 that count)."""
        for owner, live, count, size in self.db.execute(
            "SELECT owner, gone = '', count(*), coalesce(sum(size_bytes), 0) FROM artifacts "
            "GROUP BY owner, gone = ''"
        ):
            yield str(owner), bool(live), int(count), int(size)

    def insert(
        self,
        artifact_id: str,
        name: str,
        mime_type: str,
        size: int,
        origin: Origin,
        source: str,
        created: float,
    ) -> None:
        """Add a kept artifact's row."""
        self.db.execute(
            f"INSERT INTO artifacts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')",
            (
                artifact_id,
                origin.owner,
                name,
                mime_type,
                size,
                origin.call_id,
                origin.session_id,
                origin.tool,
                source,
                created,
            ),
        )

    def find(self, artifact_id: str, owner: str) -> tuple[ArtifactInfo, str] | None:
        """`owner`'s artifact and why it is gone ("" while kept); None if it has none
        of that id (another owner's is not found either)."""
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM artifacts WHERE artifact_id = ? AND owner = ?",
            (artifact_id, owner),
        ).fetchone()
        return None if row is None else (_info(row), str(row[10]))

    def live_ids(self) -> set[str]:
        """The ids of every kept artifact."""
        return {r[0] for r in self.db.execute("SELECT artifact_id FROM artifacts WHERE gone = ''")}

    def made_before(self, cutoff: float) -> list[str]:
        """The ids of the kept artifacts made before `cutoff`."""
        return [
            r[0]
            for r in self.db.execute(
                "SELECT artifact_id FROM artifacts WHERE gone = '' AND created < ?", (cutoff,)
            )
        ]

    def oldest(self, owner: str) -> str | None:
        """The id of `owner`'s oldest kept artifact; None when it keeps none."""
        row = self.db.execute(
            "SELECT artifact_id FROM artifacts WHERE owner = ? AND gone = '' "
            "ORDER BY created, rowid LIMIT 1",
            (owner,),
        ).fetchone()
        return None if row is None else str(row[0])

    def mark_gone(self, artifact_id: str, why: str, at: float) -> tuple[int, str, str] | None:
        """Make a kept artifact's row a tombstone: gone, `why`, at `at`.

        Returns:
            Its (size, owner, name); None when it was not kept (gone already, or unknown).
        """
        row = self.db.execute(
            "SELECT size_bytes, owner, name FROM artifacts WHERE artifact_id = ? AND gone = ''",
            (artifact_id,),
        ).fetchone()
        if row is None:
            return None
        self.db.execute(
            "UPDATE artifacts SET gone = ?, gone_at = ? WHERE artifact_id = ?",
            (why, at, artifact_id),
        )
        return int(row[0]), str(row[1]), str(row[2])

    def forget_gone_before(self, cutoff: float) -> list[tuple[str, int]]:
        """Delete the tombstones of artifacts gone before `cutoff`.

        Returns:
            (owner, tombstones forgotten) for each owner that had any.
        """
        forgotten = self.db.execute(
            "SELECT owner, count(*) FROM artifacts WHERE gone != '' AND gone_at < ? GROUP BY owner",
            (cutoff,),
        ).fetchall()
        self.db.execute("DELETE FROM artifacts WHERE gone != '' AND gone_at < ?", (cutoff,))
        return [(str(owner), int(count)) for owner, count in forgotten]

    def forget_oldest_gone(self, n: int, owner: str | None = None) -> list[tuple[str, int]]:
        """Delete the `n` oldest tombstones (of `owner`'s, or anyone's when None).

        Returns:
            (owner, tombstones forgotten) for each owner that had any.
        """
        where, params = ("gone != '' AND owner = ?", [owner]) if owner else ("gone != ''", [])
        oldest = f"FROM artifacts WHERE {where} ORDER BY gone_at LIMIT ?"
        forgotten = self.db.execute(
            f"SELECT owner, count(*) FROM (SELECT owner {oldest}) GROUP BY owner", (*params, n)
        ).fetchall()
        self.db.execute(
            f"DELETE FROM artifacts WHERE rowid IN (SELECT rowid {oldest})", (*params, n)
        )
        return [(str(who), int(count)) for who, count in forgotten]

    # ------------------------------------------------------------------ pages

    def page(
        self,
        owner: str,
        made_since: float,
        *,
        call_id: str = "",
        session_id: str = "",
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
    ) -> Page:
        """A page of `owner`'s kept artifacts made since `made_since`, newest first;
        of one call or session if given.

        Args:
            page_size: Artifacts at most (0: `DEFAULT_PAGE_SIZE`); past
                `MAX_PAGE_SIZE`, that many.
            page_token: Where the page starts: the `next_page_token` of the page
                before it ("": the newest).

        Raises:
            InvalidRequestError: `page_size` is negative, or `page_token` is not
                one this index gave.
        """
        if page_size < 0:
            raise InvalidRequestError(f"page_size must be 0 or more, not {page_size}")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        query = (
            f"SELECT {_COLUMNS}, rowid FROM artifacts "
            "WHERE owner = ? AND gone = '' AND created >= ?"
        )
        params: list[str | float | int] = [owner, made_since]
        if call_id:
            query += " AND call_id = ?"
            params.append(call_id)
        if session_id:
            query += " AND session_id = ?"
            params.append(session_id)
        if page_token:
            created, rowid = _read_token(page_token)
            query += " AND (created < ? OR (created = ? AND rowid < ?))"
            params += [created, created, rowid]
        query += " ORDER BY created DESC, rowid DESC LIMIT ?"
        params.append(size + 1)
        rows = self.db.execute(query, params).fetchall()
        more = len(rows) > size
        rows = rows[:size]
        token = f"{rows[-1][9]!r}/{rows[-1][11]}" if more else ""
        return Page([_info(row[:11]) for row in rows], token)


def _info(row: tuple[object, ...]) -> ArtifactInfo:
    artifact_id, _owner, name, mime, size, call_id, session_id, tool, source, created, _ = row
    return ArtifactInfo(
        artifact_id=str(artifact_id),
        name=str(name),
        mime_type=str(mime),
        size_bytes=int(size),  # type: ignore[call-overload]
        call_id=str(call_id),
        session_id=str(session_id),
        tool=str(tool),
        source=str(source),
        created_unix=float(created),  # type: ignore[arg-type]
    )


def _read_token(token: str) -> tuple[float, int]:
    """The (created, rowid) a page token of `page` names.

    Raises:
        InvalidRequestError: It is not one `page` made.
    """
    created, _, rowid = token.partition("/")
    try:
        at, row = float(created), int(rowid)
        if 0 <= row < 2**63 and len(token) <= 64:
            return at, row
    except ValueError:
        pass
    raise InvalidRequestError(
        f"page_token {token[:80]!r} is not one this daemon gave: pass the "
        "next_page_token of the page before, or none for the first page"
    )
