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
call's list. A call leaves at most `[artifacts] max_call_artifacts` of them
(an empty file costs an inode and a row as a big one does): the rest are
dropped, and the result names them. The store holds each owner to its quota
(`ArtifactQuotaError`, a cut `ArtifactWriter`): what does not fit is said in
the result too.

Failing to write (a full disk, a full quota) loses the artifact, not the call:
it is logged, and the result says what it can.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from tooljail.types import ArtifactRef, StreamKind
from tooljaild.artifacts.store import (
    ArtifactQuotaError,
    ArtifactStore,
    ArtifactWriter,
    Origin,
    safe_name,
)
from tooljaild.calls.output import HeadTail
from tooljaild.sandbox.base import ArtifactPart

log = logging.getLogger(__name__)

PREVIEW_BYTES = 4096
"""The most of an offloaded result the caller gets in `data`."""
_STREAM_NAMES = {StreamKind.STDOUT: "stdout.txt", StreamKind.STDERR: "stderr.txt"}
_NAMED_DROPS = 10
"""Dropped artifacts the result names one by one; the rest are counted."""


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
        self._from_sandbox = 0
        """Artifacts the sandbox began sending (kept or not)."""
        self._dropped: list[str] = []
        """Names of those past `max_call_artifacts`, in order."""
        self._dropping = False
        """The artifact being sent now is one of them."""
        self._sent = 0
        """Bytes of the artifact being sent, as sent (kept or not)."""
        self._refused = False
        """The artifact being sent was refused by the store's quotas."""
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
        except ArtifactQuotaError as exc:
            self.notes.append(f"The whole {stream.value} could not be kept as an artifact: {exc}.")
            self._spills[stream] = None
            return
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
        """Make the spills artifacts (once; output after this is not in them), and say
        in `notes` which artifacts of the sandbox's were dropped: the call has ended."""
        self._dropped_note()
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
                + (f" It was cut by {writer.cut_by}." if writer.cut_by else "")
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
            writer = self._store.writer("result.json", "application/json", self._origin(), "result")
        except (OSError, ArtifactQuotaError) as exc:
            log.error("cannot offload a call's result to an artifact: %s", exc)
            return None
        try:
            whole = writer.write(text)
            if not whole:  # cut JSON is no result: the data stays in the result
                log.error("cannot offload a call's result to an artifact: cut by %s", writer.cut_by)
                writer.abort()
                return None
            ref = writer.commit()
        except OSError as exc:
            log.error("cannot offload a call's result to an artifact: %s", exc)
            writer.abort()
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
            True when the store took charge of the part: kept it, or dropped it
            by its own quotas while the artifact is within `max_artifact_bytes`
            (which the runner is told, `limits`: an honest runner never sends
            more, so a full quota never breaks its call's frame budget). False
            when the part was past that bound, past `max_call_artifacts`, or
            could not be written: its bytes count against the frame budget.
        """
        writer = self._part
        if part.part == 0:
            self.abort()  # an artifact left unfinished is dropped (CallFrames refuses it)
            self._sent, self._refused = 0, False
            self._from_sandbox += 1
            self._dropping = self._from_sandbox > self._store.settings.max_call_artifacts
            if self._dropping:
                self._dropped.append(safe_name(part.name))
                return False
            try:
                writer = self._part = self._store.writer(
                    part.name, part.mime_type, self._origin(), part.source
                )
            except ArtifactQuotaError as exc:
                self.notes.append(f"Artifact {safe_name(part.name)!r} was not kept: {exc}.")
                self._part, self._refused = None, True
                writer = None
            except OSError as exc:
                log.error("cannot store an artifact of a call: %s", exc)
                return False
        self._sent += len(part.data)
        within = self._sent <= self._store.settings.max_artifact_bytes
        if writer is None or self._dropping:  # its first part was not stored
            return within and self._refused
        try:
            kept = writer.write(part.data)
            if part.last:
                self._part = None
                ref = writer.commit()
                self._refs.append(ref)
                if writer.truncated:
                    self.notes.append(
                        f"Artifact {ref.name!r} was cut at {ref.size_bytes} bytes "
                        f"(by {writer.cut_by})."
                    )
        except OSError as exc:
            log.error("cannot store an artifact of a call: %s", exc)
            self.abort()
            return False
        return kept or within

    def limits(self) -> dict[str, int]:
        """The runner's `artifact_limits`: it sends no more artifacts, and none larger,
        than the store keeps for one call (`runner._artifacts.limits_of`)."""
        s = self._store.settings
        return {"max_count": s.max_call_artifacts, "max_bytes": s.max_artifact_bytes}

    def abort(self) -> None:
        """Drop an artifact left unfinished (the call ended during it)."""
        writer, self._part = self._part, None
        if writer is not None:
            writer.abort()

    def _dropped_note(self) -> None:
        """Name in `notes` the artifacts dropped past `max_call_artifacts` (once, at the end)."""
        if not self._dropped:
            return
        names = ", ".join(repr(n) for n in self._dropped[:_NAMED_DROPS])
        more = len(self._dropped) - _NAMED_DROPS
        self.notes.append(
            f"{len(self._dropped)} artifacts were dropped, not kept: a call leaves at most "
            f"{self._store.settings.max_call_artifacts} ([artifacts] max_call_artifacts). "
            f"Dropped: {names}" + (f" and {more} more" if more > 0 else "") + "."
        )
        self._dropped.clear()

    def close(self) -> None:
        """The call is over: drop whatever was not committed."""
        self.abort()
        for stream, writer in self._spills.items():
            if writer is not None:
                writer.abort()
                self._spills[stream] = None
