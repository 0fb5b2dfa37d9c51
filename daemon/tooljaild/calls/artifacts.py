"""What one call makes into artifacts: its whole output once it outgrows the
result, a result too large for the model's context, and the files its sandbox
sends.

Output spill. A call's result keeps the head and tail of each stream
(`HeadTail`), which drops the middle as it goes. A stream that outgrows its
`HeadTail` is written whole to an artifact of its own ("stdout.txt",
"stderr.txt"): at the chunk that would make the `HeadTail` drop its first byte,
what it holds (then still all of the stream) is written, and every chunk after
it appended. A call whose output stays small costs nothing: no file, no
copy. One artifact per stream rather than one interleaved: each is the stream
byte for byte as the tool wrote it (a chunk boundary between two pipes says
nothing of the order the tool wrote them in), and a model reading stdout
with `read_artifact` does not page through warnings. Writes go to a local
file on the event loop: a chunk is at most a pipe read (64 KiB), written into
the page cache in microseconds; a thread would cost more, and keeping order
for free is why it is not used.

Result offload. A result whose data, as JSON, is longer than
`[artifacts] offload_bytes` is stored as "result.json", indented one space a
level so that a model pages through it by line (`read_artifact`); the result's
data becomes its first `PREVIEW_BYTES` (whole lines, a string), and its message
names the artifact and how to read on.

Artifacts from the sandbox. Each part of an artifact frame (checked by
runner_channel's `CallFrames`) goes to `part`, which writes it to the store as
it comes and, at its last part, appends the committed `ArtifactRef` to the
call's list.

Failing to write (a full disk) loses the artifact, not the call: it is logged,
and the result says what it can.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from tooljail._types import ArtifactRef, StreamKind
from tooljaild.artifacts.store import ArtifactStore, ArtifactWriter, Origin
from tooljaild.output import HeadTail
from tooljaild.sandbox.base import ArtifactPart

log = logging.getLogger(__name__)

PREVIEW_BYTES = 4096
"""The most of an offloaded result the caller gets in `data`."""
_STREAM_NAMES = {StreamKind.STDOUT: "stdout.txt", StreamKind.STDERR: "stderr.txt"}


class CallArtifacts:
    """The artifacts of one call, written to `store` as the call goes.

    Args:
        store: Where they go.
        origin: Who and what makes them (called at each new artifact: a call's
            session is known only once it is admitted).
        refs: The call's list of artifacts (`Call.artifacts`), appended in order.
        spill_limit: Output bytes spilled at most, both streams together
            (`output_limit_bytes`; 0: only the store's per-artifact bound).
    """

    def __init__(
        self,
        store: ArtifactStore,
        origin: Callable[[], Origin],
        refs: list[ArtifactRef],
        spill_limit: int,
    ) -> None:
        self._store = store
        self._origin = origin
        self._refs = refs
        self._spill_limit = spill_limit
        self._spills: dict[StreamKind, ArtifactWriter | None] = {}
        """Per stream: its spill, or None once it failed or was committed."""
        self._spilled = 0
        self._part: ArtifactWriter | None = None
        self.notes: list[str] = []
        """What the result's message should say about them (spills, cuts)."""

    # ------------------------------------------------------------ output spill

    def spill(self, stream: StreamKind, kept: HeadTail, data: bytes) -> None:
        """Take `data`, about to go into `kept`, which it overflows (or did before).

        The first time for a stream, what `kept` holds is all of the stream so
        far: it is written first.
        """
        if stream in self._spills:
            writer = self._spills[stream]
            if writer is not None:
                self._spill_write(stream, writer, data)
            return
        try:
            writer = self._store.writer(
                _STREAM_NAMES[stream], "text/plain", self._origin(), "output"
            )
        except OSError as exc:
            log.error("cannot spill a call's %s to an artifact: %s", stream.value, exc)
            self._spills[stream] = None
            return
        self._spills[stream] = writer
        if self._spill_write(stream, writer, kept.whole()):
            self._spill_write(stream, writer, data)

    def _spill_write(self, stream: StreamKind, writer: ArtifactWriter, data: bytes) -> bool:
        """Append to a stream's spill within the bounds; False once it takes no more."""
        if self._spill_limit:
            data = data[: max(0, self._spill_limit - self._spilled)]
        try:
            kept = writer.write(data)
        except OSError as exc:
            log.error("cannot spill a call's %s to an artifact: %s", stream.value, exc)
            writer.abort()
            self._spills[stream] = None
            return False
        self._spilled += len(data)
        return kept

    def commit_spills(self) -> None:
        """Make the spills artifacts (once; output after this is not in them)."""
        for stream, writer in self._spills.items():
            if writer is None:
                continue
            self._spills[stream] = None
            try:
                ref = writer.commit()
            except OSError as exc:
                log.error("cannot spill a call's %s to an artifact: %s", stream.value, exc)
                writer.abort()
                continue
            self._refs.append(ref)
            whole = "the first" if writer.truncated else "the whole"
            self.notes.append(
                f"The {stream.value} was truncated in the result (head and tail kept); "
                f"{whole} {ref.size_bytes} bytes of it are artifact "
                f"{ref.artifact_id!r} ({ref.name}): read it with read_artifact, "
                "tail_artifact or search_artifact."
            )

    # ------------------------------------------------------------ offload

    def offload(self, data: Any) -> tuple[str, str] | None:
        """Store `data` as an artifact when its JSON is longer than `[artifacts]
        offload_bytes`.

        Returns:
            None when it is short enough (or 0 was given, or it cannot be
            stored); else its preview (the first lines of the stored JSON, at
            most `PREVIEW_BYTES`) and a sentence for the result's message.
        """
        limit = self._store.settings.offload_bytes
        if not limit:
            return None
        compact = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        if len(compact) <= limit:
            return None
        # One element or member a line: `read_artifact` pages by line.
        text = json.dumps(data, ensure_ascii=False, indent=1).encode()
        try:
            ref = self._store.put("result.json", "application/json", text, self._origin(), "result")
        except OSError as exc:
            log.error("cannot offload a call's result to an artifact: %s", exc)
            return None
        self._refs.append(ref)
        cut = text.rfind(b"\n", 0, PREVIEW_BYTES + 1) if len(text) > PREVIEW_BYTES else len(text)
        preview = text[: cut if cut > 0 else PREVIEW_BYTES].decode("utf-8", "replace")
        lines, total_lines = preview.count("\n") + 1, text.count(b"\n") + 1
        note = (
            f"The result ({len(compact)} bytes of JSON) is too large to return whole: data "
            f"holds its first {lines} lines as text; the whole is artifact {ref.artifact_id!r} "
            f"(result.json, {ref.size_bytes} bytes, {total_lines} lines, indented). "
            f"Read on with read_artifact (artifact_id, offset and limit in lines) or "
            "search_artifact."
        )
        return preview, note

    # ------------------------------------------------------------ from the sandbox

    def part(self, part: ArtifactPart) -> bool:
        """Write one part of an artifact the sandbox sent (`ArtifactSink`).

        Returns:
            True when the part was kept whole; False when the store cut it
            (past `max_artifact_bytes`: the rest of it is dropped) or failed.
        """
        writer = self._part
        if part.part == 0:
            self.abort()  # an artifact left unfinished is dropped (CallFrames refuses it)
            try:
                writer = self._part = self._store.writer(
                    part.name, part.mime_type, self._origin(), part.source
                )
            except OSError as exc:
                log.error("cannot store an artifact of a call: %s", exc)
                return False
        if writer is None:  # its first part could not be stored
            return False
        try:
            kept = writer.write(part.data)
            if part.last:
                self._part = None
                ref = writer.commit()
                self._refs.append(ref)
                if writer.truncated:
                    self.notes.append(
                        f"Artifact {ref.name!r} was cut at {ref.size_bytes} bytes (the "
                        "store's bound on one artifact)."
                    )
        except OSError as exc:
            log.error("cannot store an artifact of a call: %s", exc)
            self.abort()
            return False
        return kept

    def abort(self) -> None:
        """Drop an artifact left unfinished (the call ended during it)."""
        writer, self._part = self._part, None
        if writer is not None:
            writer.abort()

    def close(self) -> None:
        """The call is over: drop whatever was not committed."""
        self.abort()
        for stream, writer in self._spills.items():
            if writer is not None:
                writer.abort()
                self._spills[stream] = None
