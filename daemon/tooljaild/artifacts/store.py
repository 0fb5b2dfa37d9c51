"""The artifact store: what calls make, kept in the daemon's state directory.

Each artifact is one file, `<root>/<id[:2]>/<id>`, written under a temporary
name and renamed when complete (a crash never leaves half an artifact under
its name), and one row of an SQLite index (`<root>/index.sqlite3`) with its
name, MIME type, size, the call, session and tool that made it, where it came
from, and its owner: the client whose call made it. Only the owner reads,
lists or deletes it; to anyone else it does not exist.

Bounds (`[artifacts]`): bytes in all (`max_bytes`: the oldest are evicted first
to make room) and age (`max_age_s`). Every eviction is logged. A row is kept
after its file is gone (a tombstone, with why: "evicted", "expired",
"deleted") so that its owner learns it is gone rather than "not found"; the
tombstones are pruned with the same age bound.

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
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tooljail._types import ArtifactInfo, ArtifactRef
from tooljail.errors import ArtifactGoneError, ArtifactNotFoundError
from tooljaild.artifacts.settings import ArtifactSettings

__all__ = [
    "CHUNK_BYTES",
    "PRUNE_INTERVAL_S",
    "ArtifactStore",
    "ArtifactWriter",
    "Origin",
    "prune_periodically",
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
        self._live_bytes = int(
            db.execute(
                "SELECT coalesce(sum(size_bytes), 0) FROM artifacts WHERE gone = ''"
            ).fetchone()[0]
        )

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
        """Bytes of the artifacts kept now."""
        return self._live_bytes

    # ------------------------------------------------------------------ write

    def writer(self, name: str, mime_type: str, origin: Origin, source: str) -> ArtifactWriter:
        """A new artifact, written in parts; it exists once `commit` is called."""
        return ArtifactWriter(self, secrets.token_hex(16), name, mime_type, origin, source)

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
        self._live_bytes += size
        self._make_room(keep=writer.artifact_id)

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
        """`owner`'s kept artifacts, newest first; of one call or session if given.

        Those past the age bound are left out (pruned or not yet).
        """
        query = f"SELECT {_COLUMNS} FROM artifacts WHERE owner = ? AND gone = '' AND created >= ?"
        params: list[str | float] = [owner, self._cutoff(None)]
        if call_id:
            query += " AND call_id = ?"
            params.append(call_id)
        if session_id:
            query += " AND session_id = ?"
            params.append(session_id)
        rows = self._db.execute(query + " ORDER BY created DESC, rowid DESC", params)
        return [_info(row) for row in rows]

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
        self._db.execute("DELETE FROM artifacts WHERE gone != '' AND gone_at < ?", (cutoff,))
        return len(old)

    def _cutoff(self, now: float | None) -> float:
        """Artifacts made before this time are past the age bound."""
        return (time.time() if now is None else now) - self.settings.max_age_s

    def _make_room(self, keep: str) -> None:
        """Evict the oldest artifacts until the store is within `max_bytes`."""
        while self._live_bytes > self.settings.max_bytes:
            row = self._db.execute(
                "SELECT artifact_id FROM artifacts WHERE gone = '' AND artifact_id != ? "
                "ORDER BY created, rowid LIMIT 1",
                (keep,),
            ).fetchone()
            if row is None:
                return
            self._gone(row[0], "evicted")

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
        self._live_bytes -= int(row[0])
        with contextlib.suppress(FileNotFoundError):
            self._path(artifact_id).unlink()
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

    Bytes past `max_artifact_bytes` are refused: `write` returns False and the
    rest is dropped; `truncated` says so.
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
        self._store = store
        final = store._path(artifact_id)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        self._tmp = final.with_name(final.name + ".part")
        self._file = self._tmp.open("wb")

    def write(self, data: bytes) -> bool:
        """Append `data`, or as much of it as fits the per-artifact bound
        (`max_artifact_bytes`); False once something was cut (then and after)."""
        room = self._store.settings.max_artifact_bytes - self.size
        if len(data) > room:
            data = data[: max(0, room)]
            self.truncated = True
        if data:
            self._file.write(data)
            self.size += len(data)
        return not self.truncated

    def commit(self) -> ArtifactRef:
        """Make the artifact exist; the store may evict older ones to make room."""
        self._file.close()
        os.replace(self._tmp, self._store._path(self.artifact_id))
        self._store._committed(self, self.size)
        return ArtifactRef(
            artifact_id=self.artifact_id,
            name=self.name,
            mime_type=self.mime_type,
            size_bytes=self.size,
        )

    def abort(self) -> None:
        """Forget it: nothing of it is kept."""
        self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


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
