"""The artifact store: what calls make, kept in the daemon's state directory.

Each artifact is one file (`tooljaild.artifacts.files`: written under a
temporary name, renamed when complete, private to the daemon) and one row of
an SQLite index (`tooljaild.artifacts.index`, `<root>/index.sqlite3`) with
its name, MIME type, size, the call, session and tool that made it, where it
came from, and its owner: the client whose call made it. Only the owner
reads, lists or deletes it; to anyone else it does not exist.

Bounds (`[artifacts]`) per owner and daemon-wide, and how writing makes room
by evicting the writing owner's own oldest artifacts, are
`tooljaild.artifacts.quotas`; `ArtifactWriter` holds each part to them. Age
(`max_age_s`) bounds everything. Every eviction is logged. A row is kept
after its file is gone (a tombstone, with why: "evicted", "expired",
"deleted") so that its owner learns it is gone rather than "not found"; the
tombstones are pruned with the same age bound and by count (per owner
`max_owner_count`, in all `max_count`, the oldest forgotten first).

Survives restarts: the index is a file; at open, files without a row (a
crash mid-write) are removed, and rows without a file are marked gone.

Thread: use it on one thread (the event loop); writes are small and local.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import time
from collections.abc import Generator
from pathlib import Path

from tooljail.errors import ArtifactGoneError, ArtifactNotFoundError
from tooljail.types import ArtifactInfo, ArtifactRef
from tooljaild.artifacts.files import CHUNK_BYTES, ArtifactFiles, safe_name
from tooljaild.artifacts.index import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    ArtifactIndex,
    Origin,
    Page,
)
from tooljaild.artifacts.quotas import ArtifactQuotaError, Quotas
from tooljaild.artifacts.writer import ArtifactWriter
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

INDEX_NAME = "index.sqlite3"
"""The index's file name, in the store's directory."""
PRUNE_INTERVAL_S = 60.0
"""How often the daemon expires artifacts past the age bound (`prune_periodically`).
Readers never see an expired one in between (`get`/`list` check the bound), so
this only bounds how long expired bytes stay on disk."""

_GONE = {
    "evicted": "artifact {id!r} is gone: it was evicted to keep the store within its size "
    "bound (oldest first)",
    "expired": "artifact {id!r} is gone: it passed the store's age bound",
    "deleted": "artifact {id!r} is gone: it was deleted",
}


class ArtifactStore:
    """The daemon's artifacts. Build it with `open`.

    Args:
        root: Its directory (made 0700; the sandboxes never see it).
        settings: Its bounds.
    """

    def __init__(self, root: Path, settings: ArtifactSettings, index: ArtifactIndex) -> None:
        self.root = root
        self.settings = settings
        self._index = index
        self._files = ArtifactFiles(root)
        self._quotas = Quotas(settings, self._evict_oldest)
        for owner, live, count, size in index.holdings():
            self._quotas.loaded(owner, live, count, size)

    @classmethod
    def open(cls, root: Path, settings: ArtifactSettings) -> ArtifactStore:
        """Open (or create) the store at `root`, and make it consistent with its files.

        Its directories, files and index are private to the daemon (0700, 0600)
        whatever the process's umask.

        Raises:
            OSError: The directory cannot be made or the index opened.
        """
        ArtifactFiles.make(root)
        store = cls(root, settings, ArtifactIndex.open(root / INDEX_NAME))
        store._repair()
        store.prune()
        return store

    def close(self) -> None:
        self._index.close()

    @property
    def live_bytes(self) -> int:
        """Bytes of the artifacts kept now (not those being written)."""
        return self._quotas.total.bytes

    @property
    def live_count(self) -> int:
        """Artifacts kept now (not those being written)."""
        return self._quotas.total.count

    def usage(self, owner: str) -> tuple[int, int]:
        """(bytes, artifacts) `owner` keeps now, those being written included."""
        return self._quotas.usage(owner)

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
        try:
            self._quotas.make_room_for_one(origin.owner)
            writer = ArtifactWriter(
                secrets.token_hex(16),
                safe_name(name),
                mime_type,
                origin,
                source,
                quotas=self._quotas,
                files=self._files,
                on_commit=self._committed,
            )
        except BaseException:
            self._quotas.forget_if_empty(origin.owner)
            raise
        self._quotas.started(origin.owner)
        return writer

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

    def _committed(self, writer: ArtifactWriter) -> None:
        self._index.insert(
            writer.artifact_id,
            writer.name,
            writer.mime_type,
            writer.size,
            writer.origin,
            writer.source,
            time.time(),
        )
        self._quotas.committed(writer.origin.owner, writer.size)

    # ------------------------------------------------------------------ read

    def get(self, artifact_id: str, owner: str) -> ArtifactInfo:
        """The artifact `artifact_id` of `owner`.

        Raises:
            ArtifactNotFoundError: No such artifact of `owner`'s (another
                owner's is not found either).
            ArtifactGoneError: It was `owner`'s and is gone (its `reason`).
        """
        found = self._index.find(artifact_id, owner)
        if found is None:
            raise ArtifactNotFoundError(
                f"no artifact {artifact_id[:80]!r} of this client's is known to this daemon"
            )
        info, gone = found
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
            return self._files.chunks(artifact_id, offset)
        except FileNotFoundError:
            self._gone(artifact_id, "evicted")
            message = _GONE["evicted"].format(id=artifact_id)
            raise ArtifactGoneError(message, reason="evicted") from None

    def read(self, artifact_id: str, owner: str) -> bytes:
        """The artifact's bytes, whole (for small ones; `chunks` for the rest)."""
        return b"".join(self.chunks(artifact_id, owner))

    def path(self, artifact_id: str, owner: str) -> Path:
        """Where the artifact's bytes are (for readers that seek: the artifact tools).

        Raises:
            ArtifactNotFoundError, ArtifactGoneError: As `get`.
        """
        self.get(artifact_id, owner)
        return self._files.path(artifact_id)

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

        Those past the age bound are left out (pruned or not yet); the rest is
        `ArtifactIndex.page` (its bounds, its token, its errors).

        Raises:
            InvalidRequestError: `page_size` is negative, or `page_token` is not
                one this store gave.
        """
        return self._index.page(
            owner,
            self._cutoff(None),
            call_id=call_id,
            session_id=session_id,
            page_size=page_size,
            page_token=page_token,
        )

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
        old = self._index.made_before(cutoff)
        for artifact_id in old:
            self._gone(artifact_id, "expired")
        for owner, count in self._index.forget_gone_before(cutoff):
            self._quotas.forgotten(owner, count)
        return len(old)

    def _cutoff(self, now: float | None) -> float:
        """Artifacts made before this time are past the age bound."""
        return (time.time() if now is None else now) - self.settings.max_age_s

    def _evict_oldest(self, owner: str) -> bool:
        """Evict `owner`'s oldest kept artifact; False when it keeps none.

        Only ever the owner's own (`Quotas`, which calls it, says why).
        """
        oldest = self._index.oldest(owner)
        if oldest is None:
            return False
        self._gone(oldest, "evicted")
        return True

    def _gone(self, artifact_id: str, why: str) -> None:
        was = self._index.mark_gone(artifact_id, why, time.time())
        if was is None:
            return
        size, owner, name = was
        self._quotas.removed(owner, size)
        self._files.remove(self._files.path(artifact_id))
        self._bound_tombstones(owner)
        if why != "deleted":
            log.info(
                "artifact %s",
                why,
                extra={
                    "artifact": artifact_id,
                    "owner": owner,
                    # not "name": a LogRecord attribute, which `extra` may not overwrite
                    "artifact_name": name,
                    "bytes": size,
                },
            )

    def _bound_tombstones(self, owner: str) -> None:
        """Forget the oldest tombstones past `max_owner_count` of `owner`'s and
        `max_count` in all: a client that churns artifacts leaves a bounded trail."""
        for whose in (owner, None):
            if n := self._quotas.tombstones_past_bounds(whose):
                for other, count in self._index.forget_oldest_gone(n, whose):
                    self._quotas.forgotten(other, count)
        self._quotas.forget_if_empty(owner)

    def _repair(self) -> None:
        """After a crash: remove files without a live row (never committed, or
        gone while the daemon died before removing the file: either way nobody
        may read them), mark live rows without a file gone ("evicted")."""
        live = self._index.live_ids()
        self._files.remove_strays(live)
        for artifact_id in live:
            if not self._files.path(artifact_id).exists():
                self._gone(artifact_id, "evicted")


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
