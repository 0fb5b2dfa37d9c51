"""An artifact being written: its parts held to the bounds as they come.

The store opens it (`ArtifactStore.writer`); it reserves each part's bytes
(`Quotas.reserve`) before they reach the disk, writes them to its `.part`
file (`ArtifactFiles`), and on `commit` hands itself back to the store,
which gives it its name and its index row.
"""

from __future__ import annotations

from collections.abc import Callable

from tooljail.types import ArtifactRef
from tooljaild.artifacts.files import ArtifactFiles
from tooljaild.artifacts.index import Origin
from tooljaild.artifacts.quotas import Quotas

__all__ = ["ArtifactWriter"]


class ArtifactWriter:
    """An artifact being written: `write` parts, then `commit` (or `abort`).

    Each part's bytes are reserved before they are written: bytes past
    `max_artifact_bytes`, or past the owner's or the daemon's bound when
    evicting the owner's oldest artifacts does not make room, are refused:
    `write` returns False and the rest is dropped; `truncated` says so and
    `cut_by` names the bound.

    Args:
        on_commit: Makes the complete artifact exist (its file named, its row
            written, its bytes counted as kept); called once, by `commit`.

    Raises:
        OSError: Its file cannot be made.
    """

    def __init__(
        self,
        artifact_id: str,
        name: str,
        mime_type: str,
        origin: Origin,
        source: str,
        *,
        quotas: Quotas,
        files: ArtifactFiles,
        on_commit: Callable[[ArtifactWriter], None],
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
        self._quotas = quotas
        self._files = files
        self._on_commit = on_commit
        self._ended = False
        self.part, self._file = files.create(artifact_id)
        """The file being written (renamed to the artifact's own at `commit`)."""

    def write(self, data: bytes) -> bool:
        """Append `data`, or as much of it as fits the bounds; False once something
        was cut (then and after)."""
        if self.truncated:
            return False
        limit = self._quotas.settings.max_artifact_bytes
        room = limit - self.size
        if len(data) > room:
            data = data[: max(0, room)]
            self.truncated = True
            self.cut_by = (
                f"the bound of {limit} bytes on one artifact ([artifacts] max_artifact_bytes)"
            )
        if data:
            granted, cut_by = self._quotas.reserve(self.origin.owner, len(data))
            if granted < len(data):
                data = data[:granted]
                self.truncated, self.cut_by = True, cut_by
            try:
                self._file.write(data)
            except BaseException:
                self._quotas.unreserve(self.origin.owner, granted)
                raise
            self.size += len(data)
        return not self.truncated

    def flush(self) -> None:
        """Hand what was written to the file (a reader of `part` sees it: a process's
        output spill is read back while it is still being written)."""
        self._file.flush()

    def commit(self) -> ArtifactRef:
        """Make the artifact exist (it was counted in its owner's bounds all along).

        Raises:
            OSError: Its file could not be completed; call `abort`.
        """
        self._file.close()
        self._files.finish(self.part, self.artifact_id)
        self._ended = True
        self._on_commit(self)
        return ArtifactRef(
            artifact_id=self.artifact_id,
            name=self.name,
            mime_type=self.mime_type,
            size_bytes=self.size,
        )

    def abort(self) -> None:
        """Forget it: nothing of it is kept, and what it reserved is free again."""
        self._file.close()
        self._files.remove(self.part)
        if not self._ended:
            self._ended = True
            self._quotas.released(self.origin.owner, self.size)
