"""The artifact store: what calls make, kept in the daemon's state directory.

Each artifact is one file, `<root>/<id[:2]>/<id>`, written under a temporary
name and renamed when complete (a crash never leaves half an artifact under
its name), and one row of an SQLite index (`<root>/index.sqlite3`) with its
name, MIME type, size, the call, session and tool that made it, where it came
from, and its owner: the client whose call made it. Only the owner reads,
lists or deletes it; to anyone else it does not exist.

Bounds (`[artifacts]`), per owner and daemon-wide, in bytes and in count:
an owner's bytes (`max_owner_bytes`) and artifacts (`max_owner_count`), and
the daemon's (`max_bytes`, `max_count`). Bytes are counted as they are
written (reserved by `ArtifactWriter.write`, before they reach the disk), not
at commit: a call still writing is held to the bounds. Making room evicts the
writing owner's own oldest artifacts and nobody else's: past what they free,
a write is cut and a new artifact refused (`ArtifactQuotaError`). Age
(`max_age_s`) bounds everything. Every eviction is logged. A row is kept
after its file is gone (a tombstone, with why: "evicted", "expired",
"deleted") so that its owner learns it is gone rather than "not found"; the
tombstones are pruned with the same age bound and by count (per owner
`max_owner_count`, in all `max_count`, the oldest forgotten first).

Names are the sandbox's words: `safe_name` keeps a relative path without
"." or ".." parts and without control characters, so no name leads out of
`outputs/` when a client saves it, nor drives a terminal that lists it.

Survives restarts: the index is a file; at open, files without a row (a
crash mid-write) are removed, and rows without a file are marked gone.

Thread: use it on one thread (the event loop); writes are small and local.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sqlite3
import time
import unicodedata
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tooljail.errors import (
    ArtifactGoneError,
    ArtifactNotFoundError,
    InvalidRequestError,
    TooljailError,
)
from tooljail.types import ArtifactInfo, ArtifactRef
from tooljaild.settings.artifacts import ArtifactSettings

__all__ = [
    "CHUNK_BYTES",
    "MAX_PAGE_SIZE",
    "PRUNE_INTERVAL_S",
    "ArtifactQuotaError",
    "ArtifactStore",
    "ArtifactWriter",
    "Origin",
    "Page",
    "prune_periodically",
    "safe_name",
]

log = logging.getLogger(__name__)

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
CHUNK_BYTES = 1024 * 1024
"""Bytes per chunk when an artifact is read back (`chunks`)."""
PRUNE_INTERVAL_S = 60.0
"""How often the daemon expires artifacts past the age bound (`prune_periodically`).
Readers never see an expired one in between (`get`/`list` check the bound), so
this only bounds how long expired bytes stay on disk."""


MAX_PAGE_SIZE = 1000
"""The most artifacts one page of `list` holds (ListArtifacts' `page_size` bound):
each answer, and the loop's time to build it, stay bounded whatever the store holds."""
DEFAULT_PAGE_SIZE = 200
"""Artifacts a page holds when the caller names no size."""
MAX_NAME_CHARS = 255
"""Characters of an artifact's name kept (the end of a longer one is cut)."""


class ArtifactQuotaError(TooljailError):
    """A new artifact or its bytes do not fit the bounds even after evicting the
    owner's own oldest artifacts; `str()` says which bound, for the call's result."""


@dataclass(frozen=True)
class Page:
    """One page of an owner's artifacts (`ArtifactStore.list`), newest first."""

    artifacts: list[ArtifactInfo]
    next_page_token: str
    """Pass it to read the next page; empty on the last page."""


@dataclass
class _Usage:
    """What one owner (or the whole store) holds now."""

    bytes: int = 0
    """Of committed, live artifacts."""
    count: int = 0
    """Committed, live artifacts."""
    reserved: int = 0
    """Bytes written by writers not committed yet."""
    writing: int = 0
    """Writers open (each will be one more artifact)."""
    tombstones: int = 0

    @property
    def empty(self) -> bool:
        return not (self.bytes or self.count or self.reserved or self.writing or self.tombstones)


@dataclass(frozen=True)
class Origin:
    """Who and what made an artifact."""

    owner: str
    """The client whose call made it: the only one who may read it."""
    call_id: str = ""
    session_id: str = ""
    tool: str = ""


class ArtifactStore:
    """The daemon's artifacts. Build it with `open`.

    Args:
        root: Its directory (made 0700; the sandboxes never see it).
        settings: Its bounds.
    """

    def __init__(self, root: Path, settings: ArtifactSettings, db: sqlite3.Connection) -> None:
        self.root = root
        self.settings = settings
        self._db = db
        self._total = _Usage()
        self._owners: dict[str, _Usage] = {}
        """Per owner with anything in the store; an owner left with nothing is dropped."""
        for owner, live, count, size in db.execute(
            "SELECT owner, gone = '', count(*), coalesce(sum(size_bytes), 0) FROM artifacts "
            "GROUP BY owner, gone = ''"
        ):
            for usage in (self._usage(owner), self._total):
                if live:
                    usage.count += int(count)
                    usage.bytes += int(size)
                else:
                    usage.tombstones += int(count)

    @classmethod
    def open(cls, root: Path, settings: ArtifactSettings) -> ArtifactStore:
        """Open (or create) the store at `root`, and make it consistent with its files.

        Raises:
            OSError: The directory cannot be made or the index opened.
        """
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        root.chmod(0o700)
        db = sqlite3.connect(root / "index.sqlite3", isolation_level=None)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.executescript(_SCHEMA)
        store = cls(root, settings, db)
        store._repair()
        store.prune()
        return store

    def close(self) -> None:
        self._db.close()

    @property
    def live_bytes(self) -> int:
        """Bytes of the artifacts kept now (not those being written)."""
        return self._total.bytes

    @property
    def live_count(self) -> int:
        """Artifacts kept now (not those being written)."""
        return self._total.count

    def usage(self, owner: str) -> tuple[int, int]:
        """(bytes, artifacts) `owner` keeps now, those being written included."""
        usage = self._owners.get(owner)
        return (
            (0, 0) if usage is None else (usage.bytes + usage.reserved, usage.count + usage.writing)
        )

    def _usage(self, owner: str) -> _Usage:
        return self._owners.setdefault(owner, _Usage())

    def _forget_if_empty(self, owner: str) -> None:
        usage = self._owners.get(owner)
        if usage is not None and usage.empty:
            del self._owners[owner]

    # ------------------------------------------------------------------ write

    def writer(self, name: str, mime_type: str, origin: Origin, source: str) -> ArtifactWriter:
        """A new artifact, written in parts; it exists once `commit` is called.

        It counts as one of its owner's artifacts from now on (until `abort`):
        past `max_owner_count` or `max_count`, the owner's oldest are evicted.

        Raises:
            ArtifactQuotaError: The store holds `max_count` artifacts and none
                of them is the owner's to evict, or every one of the owner's
                `max_owner_count` is still being written.
            OSError: Its file cannot be made.
        """
        owner = origin.owner
        usage = self._usage(owner)
        try:
            while usage.count + usage.writing >= self.settings.max_owner_count:
                if not self._evict_oldest(owner):
                    raise ArtifactQuotaError(
                        f"its owner has {self.settings.max_owner_count} artifacts being written "
                        "([artifacts] max_owner_count)"
                    )
            while self._total.count + self._total.writing >= self.settings.max_count:
                if not self._evict_oldest(owner):
                    raise ArtifactQuotaError(
                        f"the daemon keeps {self.settings.max_count} artifacts, the most it "
                        "keeps in all ([artifacts] max_count), none of them this owner's: "
                        "delete some, or wait for them to expire"
                    )
            writer = ArtifactWriter(
                self, secrets.token_hex(16), safe_name(name), mime_type, origin, source
            )
        except BaseException:
            self._forget_if_empty(owner)
            raise
        usage.writing += 1
        self._total.writing += 1
        return writer

    def _reserve(self, owner: str, want: int) -> tuple[int, str]:
        """Room for `want` more bytes of a writer of `owner`'s, evicting the owner's
        oldest artifacts as needed (and nobody else's).

        Returns:
            The bytes granted (reserved now: `_release` or `_committed` gives
            them back), and when fewer than `want`, which bound cut them.
        """
        s = self.settings
        usage = self._usage(owner)
        while usage.bytes + usage.reserved + want > s.max_owner_bytes:
            if not self._evict_oldest(owner):
                break
        while self._total.bytes + self._total.reserved + want > s.max_bytes:
            if not self._evict_oldest(owner):
                break
        room = min(
            s.max_owner_bytes - usage.bytes - usage.reserved,
            s.max_bytes - self._total.bytes - self._total.reserved,
        )
        granted = max(0, min(want, room))
        usage.reserved += granted
        self._total.reserved += granted
        if granted == want:
            return granted, ""
        if s.max_owner_bytes - usage.bytes - usage.reserved <= 0:
            return (
                granted,
                f"its owner's bound of {s.max_owner_bytes} bytes ([artifacts] max_owner_bytes)",
            )
        return granted, (
            f"the daemon's bound of {s.max_bytes} bytes of artifacts in all ([artifacts] "
            "max_bytes), held by other owners' artifacts"
        )

    def _unreserve(self, owner: str, size: int) -> None:
        """Give back `size` reserved bytes that were not written after all."""
        self._usage(owner).reserved -= size
        self._total.reserved -= size

    def _release(self, owner: str, reserved: int) -> None:
        """A writer of `owner`'s that reserved `reserved` bytes ended without a commit."""
        usage = self._usage(owner)
        for u in (usage, self._total):
            u.reserved -= reserved
            u.writing -= 1
        self._forget_if_empty(owner)

    def put(
        self, name: str, mime_type: str, data: bytes, origin: Origin, source: str
    ) -> ArtifactRef:
        """A new artifact holding `data`, whole."""
        writer = self.writer(name, mime_type, origin, source)
        try:
            writer.write(data)
        except BaseException:
            writer.abort()
            raise
        return writer.commit()

    def _path(self, artifact_id: str) -> Path:
        return self.root / artifact_id[:2] / artifact_id

    def _committed(self, writer: ArtifactWriter, size: int) -> None:
        self._db.execute(
            f"INSERT INTO artifacts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')",
            (
                writer.artifact_id,
                writer.origin.owner,
                writer.name,
                writer.mime_type,
                size,
                writer.origin.call_id,
                writer.origin.session_id,
                writer.origin.tool,
                writer.source,
                time.time(),
            ),
        )
        usage = self._usage(writer.origin.owner)
        for u in (usage, self._total):
            u.reserved -= size
            u.writing -= 1
            u.bytes += size
            u.count += 1

    # ------------------------------------------------------------------ read

    def get(self, artifact_id: str, owner: str) -> ArtifactInfo:
        """The artifact `artifact_id` of `owner`.

        Raises:
            ArtifactNotFoundError: No such artifact of `owner`'s (another
                owner's is not found either).
            ArtifactGoneError: It was `owner`'s and is gone (its `reason`).
        """
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM artifacts WHERE artifact_id = ? AND owner = ?",
            (artifact_id, owner),
        ).fetchone()
        if row is None:
            raise ArtifactNotFoundError(
                f"no artifact {artifact_id[:80]!r} of this client's is known to this daemon"
            )
        info, gone = _info(row), row[10]
        if not gone and info.created_unix < self._cutoff(None):
            # Past the age bound but not pruned yet: expire it now, so the bound
            # is exact for readers whatever the pruning period.
            self._gone(artifact_id, "expired")
            gone = "expired"
        if gone:
            raise ArtifactGoneError(_GONE.get(gone, gone).format(id=artifact_id), reason=gone)
        return info

    def chunks(
        self, artifact_id: str, owner: str, *, offset: int = 0
    ) -> Generator[bytes, None, None]:
        """The artifact's bytes from `offset`, in chunks of `CHUNK_BYTES`.

        Raises:
            ArtifactNotFoundError, ArtifactGoneError: As `get`, at once.
        """
        self.get(artifact_id, owner)
        try:
            f = self._path(artifact_id).open("rb")
        except FileNotFoundError:
            self._gone(artifact_id, "evicted")
            message = _GONE["evicted"].format(id=artifact_id)
            raise ArtifactGoneError(message, reason="evicted") from None
        return _read(f, offset)

    def read(self, artifact_id: str, owner: str) -> bytes:
        """The artifact's bytes, whole (for small ones; `chunks` for the rest)."""
        return b"".join(self.chunks(artifact_id, owner))

    def path(self, artifact_id: str, owner: str) -> Path:
        """Where the artifact's bytes are (for readers that seek: the artifact tools).

        Raises:
            ArtifactNotFoundError, ArtifactGoneError: As `get`.
        """
        self.get(artifact_id, owner)
        return self._path(artifact_id)

    def list(self, owner: str, *, call_id: str = "", session_id: str = "") -> list[ArtifactInfo]:
        """`owner`'s newest kept artifacts (at most `MAX_PAGE_SIZE`), newest first; of
        one call or session if given. `page` reads on."""
        return self.page(
            owner, call_id=call_id, session_id=session_id, page_size=MAX_PAGE_SIZE
        ).artifacts

    def page(
        self,
        owner: str,
        *,
        call_id: str = "",
        session_id: str = "",
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str = "",
    ) -> Page:
        """A page of `owner`'s kept artifacts, newest first; of one call or session if given.

        Those past the age bound are left out (pruned or not yet). A page costs
        time in its size, not the store's (an index walk from the token on).

        Args:
            page_size: Artifacts at most (0: `DEFAULT_PAGE_SIZE`); past
                `MAX_PAGE_SIZE`, that many.
            page_token: Where the page starts: the `next_page_token` of the page
                before it ("": the newest).

        Raises:
            InvalidRequestError: `page_size` is negative, or `page_token` is not
                one this store gave.
        """
        if page_size < 0:
            raise InvalidRequestError(f"page_size must be 0 or more, not {page_size}")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        query = (
            f"SELECT {_COLUMNS}, rowid FROM artifacts "
            "WHERE owner = ? AND gone = '' AND created >= ?"
        )
        params: list[str | float | int] = [owner, self._cutoff(None)]
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
        rows = self._db.execute(query, params).fetchall()
        more = len(rows) > size
        rows = rows[:size]
        token = f"{rows[-1][9]!r}/{rows[-1][11]}" if more else ""
        return Page([_info(row[:11]) for row in rows], token)

    # ------------------------------------------------------------------ remove

    def delete(self, artifact_id: str, owner: str) -> bool:
        """Delete `owner`'s artifact; False when it was gone already.

        Raises:
            ArtifactNotFoundError: No such artifact of `owner`'s.
        """
        try:
            self.get(artifact_id, owner)
        except ArtifactGoneError:
            return False
        self._gone(artifact_id, "deleted")
        return True

    def prune(self, now: float | None = None) -> int:
        """Expire artifacts past `max_age_s`; forget tombstones as old. Returns how many expired.

        The daemon calls it periodically (`prune_periodically`); `get` and
        `list` apply the age bound themselves in between.
        """
        cutoff = self._cutoff(now)
        old = [
            r[0]
            for r in self._db.execute(
                "SELECT artifact_id FROM artifacts WHERE gone = '' AND created < ?", (cutoff,)
            )
        ]
        for artifact_id in old:
            self._gone(artifact_id, "expired")
        forgotten = self._db.execute(
            "SELECT owner, count(*) FROM artifacts WHERE gone != '' AND gone_at < ? GROUP BY owner",
            (cutoff,),
        ).fetchall()
        self._db.execute("DELETE FROM artifacts WHERE gone != '' AND gone_at < ?", (cutoff,))
        for owner, count in forgotten:
            self._usage(owner).tombstones -= int(count)
            self._total.tombstones -= int(count)
            self._forget_if_empty(owner)
        return len(old)

    def _cutoff(self, now: float | None) -> float:
        """Artifacts made before this time are past the age bound."""
        return (time.time() if now is None else now) - self.settings.max_age_s

    def _evict_oldest(self, owner: str) -> bool:
        """Evict `owner`'s oldest kept artifact; False when it keeps none.

        Only ever the owner's own: one client's writes never make room with
        another's artifacts (a quota is per owner; the daemon-wide ceiling is
        met by refusing, not by evicting others).
        """
        row = self._db.execute(
            "SELECT artifact_id FROM artifacts WHERE owner = ? AND gone = '' "
            "ORDER BY created, rowid LIMIT 1",
            (owner,),
        ).fetchone()
        if row is None:
            return False
        self._gone(row[0], "evicted")
        return True

    def _gone(self, artifact_id: str, why: str) -> None:
        row = self._db.execute(
            "SELECT size_bytes, owner, name FROM artifacts WHERE artifact_id = ? AND gone = ''",
            (artifact_id,),
        ).fetchone()
        if row is None:
            return
        self._db.execute(
            "UPDATE artifacts SET gone = ?, gone_at = ? WHERE artifact_id = ?",
            (why, time.time(), artifact_id),
        )
        owner = str(row[1])
        for usage in (self._usage(owner), self._total):
            usage.bytes -= int(row[0])
            usage.count -= 1
            usage.tombstones += 1
        with contextlib.suppress(FileNotFoundError):
            self._path(artifact_id).unlink()
        self._bound_tombstones(owner)
        if why != "deleted":
            log.info(
                "artifact %s",
                why,
                extra={
                    "artifact": artifact_id,
                    "owner": row[1],
                    # not "name": a LogRecord attribute, which `extra` may not overwrite
                    "artifact_name": row[2],
                    "bytes": row[0],
                },
            )

    def _bound_tombstones(self, owner: str) -> None:
        """Forget the oldest tombstones past `max_owner_count` of `owner`'s and
        `max_count` in all: a client that churns artifacts leaves a bounded trail.

        Forgets a tenth more than needed at once, so the deletes come in batches.
        """
        usage = self._usage(owner)
        limit = self.settings.max_owner_count
        if usage.tombstones > limit:
            n = usage.tombstones - limit + limit // 10
            self._db.execute(
                "DELETE FROM artifacts WHERE rowid IN (SELECT rowid FROM artifacts "
                "WHERE owner = ? AND gone != '' ORDER BY gone_at LIMIT ?)",
                (owner, n),
            )
            usage.tombstones -= n
            self._total.tombstones -= n
        limit = self.settings.max_count
        if self._total.tombstones > limit:
            n = self._total.tombstones - limit + limit // 10
            rows = self._db.execute(
                "SELECT owner, count(*) FROM (SELECT owner FROM artifacts WHERE gone != '' "
                "ORDER BY gone_at LIMIT ?) GROUP BY owner",
                (n,),
            ).fetchall()
            self._db.execute(
                "DELETE FROM artifacts WHERE rowid IN (SELECT rowid FROM artifacts "
                "WHERE gone != '' ORDER BY gone_at LIMIT ?)",
                (n,),
            )
            for other, count in rows:
                self._usage(other).tombstones -= int(count)
                self._total.tombstones -= int(count)
                self._forget_if_empty(other)
        self._forget_if_empty(owner)

    def _repair(self) -> None:
        """After a crash: remove files without a live row (never committed, or
        gone while the daemon died before removing the file: either way nobody
        may read them), mark live rows without a file gone ("evicted")."""
        known = {
            r[0] for r in self._db.execute("SELECT artifact_id FROM artifacts WHERE gone = ''")
        }
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name not in known:
                    with contextlib.suppress(OSError):
                        f.unlink()
        for (artifact_id,) in list(
            self._db.execute("SELECT artifact_id FROM artifacts WHERE gone = ''")
        ):
            if not self._path(artifact_id).exists():
                self._gone(artifact_id, "evicted")


class ArtifactWriter:
    """An artifact being written: `write` parts, then `commit` (or `abort`).

    Each part's bytes are reserved in the store before they are written
    (`ArtifactStore._reserve`): bytes past `max_artifact_bytes`, or past the
    owner's or the daemon's bound when evicting the owner's oldest artifacts
    does not make room, are refused: `write` returns False and the rest is
    dropped; `truncated` says so and `cut_by` names the bound.
    """

    def __init__(
        self,
        store: ArtifactStore,
        artifact_id: str,
        name: str,
        mime_type: str,
        origin: Origin,
        source: str,
    ) -> None:
        self.artifact_id = artifact_id
        self.name = name
        self.mime_type = mime_type
        self.origin = origin
        self.source = source
        self.size = 0
        self.truncated = False
        self.cut_by = ""
        """Which bound cut it, in words (empty while nothing was cut)."""
        self._store = store
        self._ended = False
        final = store._path(artifact_id)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        self._tmp = final.with_name(final.name + ".part")
        self._file = self._tmp.open("wb")

    def write(self, data: bytes) -> bool:
        """Append `data`, or as much of it as fits the bounds; False once something
        was cut (then and after)."""
        if self.truncated:
            return False
        limit = self._store.settings.max_artifact_bytes
        room = limit - self.size
        if len(data) > room:
            data = data[: max(0, room)]
            self.truncated = True
            self.cut_by = (
                f"the bound of {limit} bytes on one artifact ([artifacts] max_artifact_bytes)"
            )
        if data:
            granted, cut_by = self._store._reserve(self.origin.owner, len(data))
            if granted < len(data):
                data = data[:granted]
                self.truncated, self.cut_by = True, cut_by
            try:
                self._file.write(data)
            except BaseException:
                self._store._unreserve(self.origin.owner, granted)
                raise
            self.size += len(data)
        return not self.truncated

    def commit(self) -> ArtifactRef:
        """Make the artifact exist (it was counted in its owner's bounds all along).

        Raises:
            OSError: Its file could not be completed; call `abort`.
        """
        self._file.close()
        os.replace(self._tmp, self._store._path(self.artifact_id))
        self._ended = True
        self._store._committed(self, self.size)
        return ArtifactRef(
            artifact_id=self.artifact_id,
            name=self.name,
            mime_type=self.mime_type,
            size_bytes=self.size,
        )

    def abort(self) -> None:
        """Forget it: nothing of it is kept, and what it reserved is free again."""
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
        if not self._ended:
            self._ended = True
            self._store._release(self.origin.owner, self.size)


_GONE = {
    "evicted": "artifact {id!r} is gone: it was evicted to keep the store within its size "
    "bound (oldest first)",
    "expired": "artifact {id!r} is gone: it passed the store's age bound",
    "deleted": "artifact {id!r} is gone: it was deleted",
}


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


def safe_name(name: str) -> str:
    """`name` as the store keeps it: a relative path, "/"-separated, without empty,
    "." or ".." parts, and with every control character (C0, C1, DEL, and the
    Unicode format characters that reorder text) written as an escape, at most
    `MAX_NAME_CHARS`. "../../../../tmp/x" is kept as "tmp/x"; "" as "artifact".
    """
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    kept = "".join(_escape(c) for c in "/".join(parts))[:MAX_NAME_CHARS]
    return kept or "artifact"


def _escape(char: str) -> str:
    """`char`, or its escape when a terminal or a text viewer would act on it."""
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
        return char.encode("unicode_escape").decode("ascii")
    return char


def _read_token(token: str) -> tuple[float, int]:
    """The (created, rowid) a page token of `list` names.

    Raises:
        InvalidRequestError: It is not one `list` made.
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


def _read(f: BinaryIO, offset: int) -> Generator[bytes, None, None]:
    with f:
        if offset:
            f.seek(offset)
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


async def prune_periodically(store: ArtifactStore, interval_s: float = PRUNE_INTERVAL_S) -> None:
    """Run `store.prune()` every `interval_s` seconds until cancelled.

    Each expiry is logged by the store. A prune that fails (a full or read-only
    disk) is logged and tried again at the next tick: the store stays readable.
    """
    while True:
        await asyncio.sleep(interval_s)
        try:
            store.prune()
        except (OSError, sqlite3.Error):
            log.warning("artifact pruning failed; trying again later", exc_info=True)
