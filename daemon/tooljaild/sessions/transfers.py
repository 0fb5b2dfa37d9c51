"""The files API's bounds: how many uploads and downloads run at once, and where
an upload waits (on disk, never in memory).

What it guarantees:

- places: at most `max_transfers` uploads and downloads in progress on the
  daemon, `max_transfers_per_client` per client, `max_transfers_per_session`
  per session; past any, `OverloadedError` (RESOURCE_EXHAUSTED) with a retry
  hint. A place is taken before the first chunk is read, so a stream that
  never sends one holds one place of its client's, no more;
- spooling: an upload's chunks go to a private file (mode 0600) in the spool
  directory as they come, coalesced into large writes made off the event loop;
  only then does the upload wait for its session's turn. What one upload holds
  in memory is bounded by `SPOOL_BUFFER_BYTES` and one message, whatever the
  file's size and however long the session is busy;
- bounds of one upload: at most its session's workspace size in bytes, and
  (`upload_min_chunk_bytes`) a number of chunks that grows with its bytes.

It knows nothing of gRPC: the servicer reads the stream, this counts and stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tooljail.errors import InvalidRequestError, OverloadedError, WorkspaceFullError
from tooljaild.settings.sessions import SessionSettings

__all__ = ["FREE_CHUNKS", "SPOOL_BUFFER_BYTES", "Spool", "TransferPlace", "Transfers"]

log = logging.getLogger(__name__)

SPOOL_BUFFER_BYTES = 1024 * 1024
"""Bytes of an upload gathered in memory before one write to its spool file."""
FREE_CHUNKS = 1024
"""Chunks an upload may send whatever their size (`upload_min_chunk_bytes`)."""
_SPOOL_PREFIX = "upload-"


class TransferPlace:
    """One upload's or download's place; `bind` it to its session, `release` it once."""

    def __init__(self, transfers: Transfers, client: str) -> None:
        self._transfers = transfers
        self.client = client
        self.session_id = ""
        self._released = False

    def bind(self, session_id: str) -> None:
        """Count this place against `session_id` too.

        Raises:
            OverloadedError: The session has all the transfers it may.
        """
        self._transfers._bind(self, session_id)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._transfers._release(self)


class Transfers:
    """The places of uploads and downloads in progress, and the spool directory.

    Args:
        settings: `[sessions]`, whose `max_transfers*` keys bound the places.
        spool_dir: Where uploads wait on disk; made (0700) and emptied of a
            previous run's leftovers by `start`.
    """

    def __init__(self, settings: SessionSettings, spool_dir: Path) -> None:
        self._settings = settings
        self.spool_dir = spool_dir
        self._all = 0
        self._by_client: Counter[str] = Counter()
        self._by_session: Counter[str] = Counter()

    @property
    def in_progress(self) -> int:
        return self._all

    def start(self) -> None:
        """Make the spool directory private, and remove what a killed daemon left in it."""
        self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.spool_dir, 0o700)
        for leftover in self.spool_dir.glob(_SPOOL_PREFIX + "*"):
            with contextlib.suppress(OSError):
                leftover.unlink()

    def take(self, client: str) -> TransferPlace:
        """A place for one more transfer of `client`.

        Raises:
            OverloadedError: The daemon, or this client, has all the transfers it may.
        """
        s = self._settings
        if self._all >= s.max_transfers:
            raise OverloadedError(
                f"this daemon has {self._all} uploads and downloads in progress, all it "
                f"may ([sessions] max_transfers = {s.max_transfers}): try again shortly",
                retry_after_s=1.0,
            )
        if self._by_client[client] >= s.max_transfers_per_client:
            raise OverloadedError(
                f"this client has {self._by_client[client]} uploads and downloads in "
                "progress, all one client may ([sessions] max_transfers_per_client = "
                f"{s.max_transfers_per_client}): let one finish first",
                retry_after_s=1.0,
            )
        self._all += 1
        self._by_client[client] += 1
        return TransferPlace(self, client)

    def _bind(self, place: TransferPlace, session_id: str) -> None:
        s = self._settings
        if self._by_session[session_id] >= s.max_transfers_per_session:
            raise OverloadedError(
                f"session {session_id!r} has {self._by_session[session_id]} uploads and "
                "downloads in progress, all one session may ([sessions] "
                f"max_transfers_per_session = {s.max_transfers_per_session}): its file "
                "operations run one at a time; let one finish first",
                retry_after_s=1.0,
            )
        self._by_session[session_id] += 1
        place.session_id = session_id

    def _release(self, place: TransferPlace) -> None:
        self._all -= 1
        self._by_client[place.client] -= 1
        if not self._by_client[place.client]:
            del self._by_client[place.client]
        if place.session_id:
            self._by_session[place.session_id] -= 1
            if not self._by_session[place.session_id]:
                del self._by_session[place.session_id]

    @contextlib.contextmanager
    def held(self, client: str) -> Iterator[TransferPlace]:
        """`take`, released at the block's end."""
        place = self.take(client)
        try:
            yield place
        finally:
            place.release()

    def spool(self, *, max_bytes: int, path: str) -> Spool:
        """A new spool file for an upload of at most `max_bytes` to `path`."""
        return Spool(
            self.spool_dir / f"{_SPOOL_PREFIX}{uuid.uuid4().hex}",
            max_bytes=max_bytes,
            min_chunk_bytes=self._settings.upload_min_chunk_bytes,
            path=path,
        )


class Spool:
    """One upload's bytes on disk, written as they come and read back in pieces.

    Created with O_EXCL and mode 0600 (only the daemon reads it); removed by
    `close`. Writes and reads run off the event loop.

    Args:
        file: Its path (in the spool directory).
        max_bytes: The most it may hold (the session's workspace size).
        min_chunk_bytes: The average chunk size past `FREE_CHUNKS` chunks (0: any).
        path: The workspace path the upload goes to (for messages).
    """

    def __init__(self, file: Path, *, max_bytes: int, min_chunk_bytes: int, path: str) -> None:
        self.file = file
        self.size = 0
        self.chunks = 0
        self._max_bytes = max_bytes
        self._min_chunk_bytes = min_chunk_bytes
        self._path = path
        self._buffer = bytearray()
        self._fd = os.open(
            file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )

    async def add(self, data: bytes) -> None:
        """Take one chunk.

        Raises:
            WorkspaceFullError: The upload passes its session's workspace size.
            InvalidRequestError: Too many chunks for the bytes they carry.
        """
        self.chunks += 1
        self.size += len(data)
        if self.size > self._max_bytes:
            raise WorkspaceFullError(
                f"the upload to {self._path!r} passes the session's workspace size of "
                f"{self._max_bytes} bytes: nothing was written. Upload a smaller file, or "
                "open a session with a larger workspace_bytes."
            )
        past = self.chunks - FREE_CHUNKS
        if self._min_chunk_bytes and past > 0 and self.size < past * self._min_chunk_bytes:
            raise InvalidRequestError(
                f"the upload to {self._path!r} sent {self.chunks} chunks for "
                f"{self.size} bytes: past {FREE_CHUNKS} chunks they must average "
                f"{self._min_chunk_bytes} bytes or more. Send larger chunks (the SDK "
                "sends 1 MiB ones)."
            )
        if not self._buffer and len(data) >= SPOOL_BUFFER_BYTES:
            await asyncio.to_thread(_write_all, self._fd, data)  # large: no copy
            return
        self._buffer += data
        if len(self._buffer) >= SPOOL_BUFFER_BYTES:
            await self.flush()

    async def flush(self) -> None:
        """Write what is gathered to the file (off the event loop)."""
        if self._buffer:
            data, self._buffer = bytes(self._buffer), bytearray()
            await asyncio.to_thread(_write_all, self._fd, data)

    async def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes taken so far, from `offset` (off the event loop)."""
        await self.flush()
        return await asyncio.to_thread(os.pread, self._fd, size, offset)

    def close(self) -> None:
        """Remove the file (idempotent)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                os.unlink(self.file)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
