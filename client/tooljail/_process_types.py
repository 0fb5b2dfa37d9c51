"""The types of a session's background processes' output (`session.processes.read`).

Plain data (pydantic), apart from the wire (`tooljail._process_base`): the
daemon's floors import `tooljail.types` and must not reach the generated code.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from tooljail._types import ProcessInfo, StreamKind

__all__ = ["ProcessChunk", "ProcessOutputPage", "ProcessStream"]

ProcessStream = Literal["both", "stdout", "stderr"]
"""Which of a process's streams a read returns; offsets count both, always."""


class ProcessChunk(BaseModel):
    """Bytes of a background process's output, from `offset` to `next_offset`."""

    model_config = ConfigDict(frozen=True)

    offset: int
    next_offset: int
    """Where the next read starts: re-attach here after a dropped stream."""
    stream: StreamKind
    """STDOUT or STDERR (a terminal's output is STDOUT)."""
    data: bytes
    skipped: int = 0
    """Bytes before `offset` that were asked for and are no longer kept."""


class ProcessOutputPage(BaseModel):
    """One read of a background process's output (`session.processes.read`)."""

    model_config = ConfigDict(frozen=True)

    data: bytes
    """The chunks' bytes, joined (both streams interleaved, unless one was asked for)."""
    chunks: tuple[ProcessChunk, ...]
    next_offset: int
    """Where to read on: nothing is missed or repeated from there."""
    skipped: int = 0
    """Bytes asked for that are no longer kept (past the ring, with no artifact)."""
    process: ProcessInfo | None = None
    """The process as it was when the read ended."""
