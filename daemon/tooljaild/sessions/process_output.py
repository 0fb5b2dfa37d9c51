"""A background process's output as the daemon keeps it (`OutputLog`).

Offsets are absolute over the process's whole output, stdout and stderr
together in arrival order, so a reader re-attaches from the last
`next_offset` it saw and gets each byte once. The log keeps the newest
`[sessions] process_output_ring_bytes` in memory (the ring). When the ring
first has to drop a byte, the whole output so far, and then everything after
it, is written to an artifact of the session's client (`ArtifactStore`,
source "process"): offsets below the ring are read back from it (from its
`.part` file while it is written, from the artifact once committed). The
store's quotas bound it; bytes it refuses are neither kept nor spilled, and a
read that needed them says how many it skipped (`skipped`) rather than grow
the daemon's memory. Which stream each spilled byte came from is remembered
as runs (9 bytes per switch between stdout and stderr, at most `MAX_RUNS`
switches; past that the spill stops, and the rest is skipped the same way).

Writes go to a local file on the event loop, as a call's output spill does
(`calls.artifacts`): a chunk is at most a pipe read, written into the page cache.
"""

from __future__ import annotations

import array
import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tooljail.errors import InvalidRequestError, TooljailError
from tooljaild.artifacts.store import ArtifactQuotaError, ArtifactWriter

__all__ = ["MAX_RUNS", "Chunk", "OutputLog", "Select"]

log = logging.getLogger(__name__)

Select = Literal["both", "stdout", "stderr"]
"""Which of a process's streams a read returns (offsets count both, always)."""

MAX_RUNS = 65536
"""Switches between stdout and stderr remembered for the spilled part of an output."""
READ_FROM_SPILL_BYTES = 1024 * 1024
"""The most one read takes from the spilled artifact at a time."""

_STREAM_CODES = {"stdout": 1, "stderr": 2, "pty": 3}
_STREAM_NAMES = {code: name for name, code in _STREAM_CODES.items()}


@dataclass(frozen=True)
class Chunk:
    """Bytes of a process's output: from `offset`, of one stream."""

    offset: int
    stream: str
    """"stdout", "stderr" (or "pty")."""
    data: bytes
    skipped: int = 0
    """Bytes before it that are no longer kept (the read asked for them)."""

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


MIN_RING_BYTES = 16 * 1024
"""What a process's ring keeps while the daemon-wide budget is spent."""


class RingBudget:
    """The bytes every ring of the daemon holds together, against one bound
    (`[sessions] process_output_memory_bytes`). Past it, the ring that is
    written to lets go of its oldest bytes down to `MIN_RING_BYTES`: the
    process writing now pays, and what it lets go is in its artifact."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @property
    def spent(self) -> bool:
        return self.held > self.limit


class OutputLog:
    """A process's output: a ring of the newest bytes, the whole spilled past it.

    Args:
        ring_bytes: The most the ring keeps.
        spill: Opens the artifact the whole output goes to once the ring drops
            bytes (None: no store; what the ring drops is gone).
        budget: The daemon's bound on every ring together (None: none).
    """

    def __init__(
        self,
        ring_bytes: int,
        spill: Callable[[], ArtifactWriter] | None,
        budget: RingBudget | None = None,
    ) -> None:
        self._ring_bytes = max(1, ring_bytes)
        self._spill = spill
        self._budget = budget or RingBudget(1 << 62)
        self._records: deque[Chunk] = deque()
        self._held = 0
        self.end = 0
        """Bytes of output so far: the end of its offsets."""
        self.ring_start = 0
        """The offset of the first byte the ring keeps."""
        self.eof = False
        """Every byte of the output has come (the process's streams are at EOF)."""
        self._writer: ArtifactWriter | None = None
        self._spilling = False
        """The ring dropped bytes once: the spill was opened (or tried)."""
        self.spilled = 0
        """Bytes of the output in the artifact: offsets [0, spilled)."""
        self.spill_note = ""
        """Why the spill stopped short, in words ("" while it did not)."""
        self.artifact_id = ""
        """The committed artifact holding [0, spilled) ("" until committed)."""
        self._path: Path | None = None
        self._artifact_path: Callable[[], Path] | None = None
        self._run_starts = array.array("q")
        self._run_streams = bytearray()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------- writing

    def append(self, stream: str, data: bytes) -> None:
        """Add a chunk the process wrote, at the end."""
        if not data or self.eof:
            return
        chunk = Chunk(self.end, stream, data)
        self.end += len(data)
        if self._spilling:
            self._spill_chunk(chunk)
        self._records.append(chunk)
        self._held += len(data)
        self._budget.held += len(data)
        bound = self._ring_bytes
        if self._budget.spent and self._spill is not None:
            bound = min(bound, MIN_RING_BYTES)
        while self._held > bound:
            self._drop_first(bound)
        self._wake()

    def _drop_first(self, bound: int) -> None:
        if not self._spilling:
            self._start_spill()
        first = self._records[0]
        over = self._held - bound
        if len(first.data) > over:
            # Keep the record's tail: the ring holds exactly its bound.
            self._records[0] = Chunk(first.offset + over, first.stream, first.data[over:])
            dropped = over
        else:
            self._records.popleft()
            dropped = len(first.data)
        self._held -= dropped
        self._budget.held -= dropped
        self.ring_start = self._records[0].offset if self._records else self.end

    def _start_spill(self) -> None:
        """The ring is about to drop its first byte: everything so far (all still
        in the ring) goes to the artifact, and everything after it."""
        self._spilling = True
        if self._spill is None:
            self.spill_note = "this daemon keeps no artifacts"
            return
        try:
            self._writer = self._spill()
        except (ArtifactQuotaError, OSError) as exc:
            self.spill_note = f"the artifact store refused it ({exc})"
            log.warning("a process's output could not be spilled: %s", exc)
            return
        self._path = self._writer.part
        for chunk in self._records:
            self._spill_chunk(chunk)

    def _spill_chunk(self, chunk: Chunk) -> None:
        writer = self._writer
        if writer is None or chunk.offset != self.spilled:
            return
        code = _STREAM_CODES.get(chunk.stream, 1)
        if not self._run_streams or self._run_streams[-1] != code:
            if len(self._run_streams) >= MAX_RUNS:
                self._stop_spill(
                    f"its output switched between stdout and stderr more than {MAX_RUNS} times"
                )
                return
            self._run_starts.append(chunk.offset)
            self._run_streams.append(code)
        try:
            complete = writer.write(chunk.data)
        except OSError as exc:
            self._stop_spill(f"writing it failed ({exc})")
            return
        self.spilled = writer.size
        if not complete:
            self._stop_spill(writer.cut_by or "the artifact store's bounds")
        else:
            writer.flush()

    def _stop_spill(self, why: str) -> None:
        self.spill_note = why
        log.warning("a process's output spill stopped: %s", why)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.flush()
            self._commit(writer)

    def _commit(self, writer: ArtifactWriter) -> None:
        try:
            ref = writer.commit()
        except OSError as exc:
            log.warning("a process's output artifact could not be kept: %s", exc)
            writer.abort()
            self._path, self.spilled = None, 0
            return
        self.artifact_id = ref.artifact_id
        self._path = None  # `artifact_path` finds it under its own name now

    def close(self, artifact_path: Callable[[str], Path] | None = None) -> None:
        """Every byte has come: keep the spill as an artifact, wake every follower.

        When the artifact holds the whole output, the ring is let go: an ended
        process's output is read from disk, and a session's ended processes
        hold no memory beyond their rings of those that never outgrew them.

        Args:
            artifact_path: Where a committed artifact of this id is (for reads
                of the spilled part after the process ended).
        """
        if self.eof:
            return
        self.eof = True
        if artifact_path is not None:
            self._artifact_path = lambda: artifact_path(self.artifact_id)
        writer, self._writer = self._writer, None
        if writer is not None:
            self._commit(writer)
        if self.artifact_id and self.spilled == self.end:
            self._records.clear()
            self._budget.held -= self._held
            self._held, self.ring_start = 0, self.end
        self._wake()

    def release(self) -> None:
        """Let go of the ring (the process is forgotten, or its session ended):
        its bytes leave the daemon's budget. Reads of it find nothing after."""
        self._records.clear()
        self._budget.held -= self._held
        self._held, self.ring_start = 0, self.end

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------- reading

    def read(
        self, offset: int, limit: int = 0, select: Select = "both"
    ) -> tuple[list[Chunk], int, int]:
        """What the log holds from `offset`: (chunks, next offset, skipped bytes).

        Never waits. Chunks of a stream `select` leaves out are passed over (the
        next offset moves past them). `limit` > 0 bounds the bytes returned (and
        passed over). Offsets below the ring come from the spill; those neither
        keeps are skipped: the first chunk starts past `offset` by `skipped`.

        Raises:
            InvalidRequestError: `offset` or `limit` is negative.
        """
        if offset < 0:
            raise InvalidRequestError(
                f"offset {offset} is negative: offsets count output bytes from 0"
            )
        if limit < 0:
            raise InvalidRequestError(f"limit {limit} is negative (0: no bound)")
        if offset >= self.end:
            return [], offset, 0
        budget = limit or (self.end - offset)
        chunks: list[Chunk] = []
        skipped = 0
        position = offset
        if position < self.ring_start:
            if position < self.spilled:
                chunks = self._read_spill(position, min(self.ring_start, self.spilled), budget)
                got = sum(len(c.data) for c in chunks)
                budget -= got
                position += got
            if position < self.ring_start and not chunks:
                skipped = self.ring_start - position
                position = self.ring_start
        if position >= self.ring_start:
            for record in self._records:
                if budget <= 0:
                    break
                if record.end <= position:
                    continue
                start = position - record.offset
                piece = record.data[start : start + budget]
                chunks.append(Chunk(position, record.stream, piece))
                position += len(piece)
                budget -= len(piece)
        wanted = [c for c in chunks if select == "both" or c.stream == select]
        if skipped and wanted:
            first = wanted[0]
            wanted[0] = Chunk(first.offset, first.stream, first.data, skipped)
        return wanted, position, skipped

    def _read_spill(self, start: int, stop: int, budget: int) -> list[Chunk]:
        path = self._path
        if path is None and self._artifact_path is not None and self.artifact_id:
            try:
                path = self._artifact_path()
            except TooljailError:  # evicted, expired or deleted since
                return []
        if path is None:
            return []
        stop = min(stop, start + budget, start + READ_FROM_SPILL_BYTES)
        try:
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(stop - start)
        except OSError:
            return []
        chunks: list[Chunk] = []
        position = start
        while data:
            stream, run_end = self._run_at(position)
            piece, data = data[: run_end - position], data[run_end - position :]
            chunks.append(Chunk(position, stream, piece))
            position += len(piece)
        return chunks

    def _run_at(self, offset: int) -> tuple[str, int]:
        """The stream of the spilled byte at `offset`, and where its run ends."""
        starts = self._run_starts
        lo, hi = 0, len(starts)
        while lo < hi:  # the last run starting at or before `offset`
            mid = (lo + hi) // 2
            if starts[mid] <= offset:
                lo = mid + 1
            else:
                hi = mid
        i = max(0, lo - 1)
        end = starts[i + 1] if i + 1 < len(starts) else self.spilled
        return _STREAM_NAMES.get(self._run_streams[i] if self._run_streams else 1, "stdout"), end

    def watch(self) -> asyncio.Event:
        """An event set when new output comes, or the last did (a fresh one each time
        something came: take it before reading, then wait on it)."""
        if self.eof:
            done = asyncio.Event()
            done.set()
            return done
        return self._changed
