"""The frames a sandbox's runner sends, and how the daemon reads them from a hostile sandbox.

The frame types are listed in `sandbox.runner_channel` (the whole channel);
this module holds their bounds and `CallFrames`, which checks each frame
against the call's request.

A hostile sandbox. The frame pipe is open in the worker, and so in the tool
code it runs (at a high, close-on-exec descriptor, but reachable: os.write(64,
...)). Whatever arrives on it is therefore read as the tool's own words:

- bounded: a line is held up to `MAX_FRAME_BYTES` (the rest of a longer one is
  dropped unread), one with more than `MAX_FRAME_CONTAINERS` arrays and
  objects is not parsed (16 MiB of ``[]`` would be 300 MB of lists), and a
  call may send `MAX_FRAMES_PER_CALL` lines and `MAX_FRAME_BYTES_PER_CALL`
  bytes; past either the call ends with a ProtocolError. The yields it may
  send go to the call's event log (output.py), bounded in bytes of data, and
  by the frame count in their bookkeeping (~200 bytes each, 20 MB at most);
- a line that is no frame (not UTF-8, not JSON, not an object, too long,
  too deep) is skipped: the runner never writes one (`FrameChannel`);
- a frame must fit the request (`CallFrames`): no `yield` but from a user
  tool, a result of the right shape for its kind, once, a seal only where
  one was asked for, an `exit` only where a keeper writes it, no other type.
  The first that does not ends the call with a ``ProtocolError`` (effect
  unknown, status error), the sandbox is killed, and nothing more from its
  pipe is parsed.

A frame cannot prove that the tree is gone. So after a sealed result or an
exit frame the daemon kills the sandbox itself at once, where that is one
call that waits for nothing (`RunnerSandbox._kill_now`: a message to the
zygote, a kill of bubblewrap, a pidfd signal to a container's pid 1), before
it answers: a forged seal leaves no process running on past the kernel's
teardown of the sandbox's pid namespace, and whatever holds the call's pipes
delays the answer until it is dead. (Without a pid namespace, isolation
"none", a forged exit frame ends the call and the rest is killed when the
sandbox is closed, as before.)

What tool code can still do on the pipe: claim its own call's result (as it
could by printing it), or end its call with a ProtocolError. Keeping the pipe
out of its reach needs the result to come from a process other than the one
that runs the code: a process per call, or (for code and files) the
keeper's or zygote's report of the worker's exit status, which loses the
seal (decision 18, ~1 ms a call) and the error's type and message (only
the traceback on stderr would remain). Both were rejected for the call
path's latency (decision 31).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

from tooljail.types import StreamKind
from tooljaild.sandbox.base import (
    ArtifactPart,
    ArtifactSink,
    OutputSink,
)
from tooljaild.sandbox.channels import (
    Frame,
    FrameChannel,
    FrameItem,
    Malformed,
)

MAX_FRAME_BYTES = 16 * 1024 * 1024 + 4096
"""The longest frame line: the runner's own limit on a result (16 MiB) and room."""
MAX_FRAMES_PER_CALL = 100_000
"""Frames one call may send (its yields, mostly): each yield becomes an event of
the call's log, ~200 bytes of bookkeeping however small its value."""
MAX_FRAME_BYTES_PER_CALL = 64 * 1024 * 1024
"""Bytes one call may write into its frame pipe, frames and anything else."""
MAX_ARTIFACTS_PER_CALL = 64
"""Artifacts one call may send (files of its outputs directory, figures, displays)."""
MAX_ARTIFACT_PART_BYTES = 4 * 1024 * 1024
"""Decoded bytes in one artifact frame: its base64 stays well under `MAX_FRAME_BYTES`."""
ARTIFACT_SOURCES = ("outputs", "figure", "display")
"""Where a sandbox's artifacts may say they come from."""
MAX_ARTIFACT_LABEL = 255
"""The longest artifact name or MIME type, in characters."""
MAX_FRAME_CONTAINERS = 250_000
"""JSON arrays and objects (counted as ``[`` and ``{`` bytes) in one long line."""
VALUE_KINDS = ("none", "json", "text")
"""The kinds of a result's value (`RunOutcome.value_kind`)."""

_YIELDING_KINDS = frozenset({"user"})
_ARTIFACT_KINDS = frozenset({"code", "file", "user", "command"})
_SHORT = 60


class CallFrames:
    """One call's frames, checked as the tool's own words, turned into its end.

    Yielded values go to the sink as they come, artifact parts to
    `artifacts`; `done` resolves when the call is over: a sealed result, the
    keeper's exit frame, the end of the pipe, or the first frame that breaks
    the protocol (`broken` then says how).

    Args:
        kind: The request's kind: which frames it may send.
        sink: Where yielded values go.
        channel: The frame pipe, told to stop parsing once the call is over.
        seal: Whether the request allowed a sealed result.
        keeper: Whether a keeper writes the exit frame on this pipe.
        artifacts: Where artifact parts go; None: checked and dropped.
    """

    def __init__(
        self,
        kind: str,
        sink: OutputSink,
        channel: FrameChannel,
        *,
        seal: bool,
        keeper: bool,
        artifacts: ArtifactSink | None = None,
    ) -> None:
        self.result: Frame | None = None
        self.exit_frame: Frame | None = None
        self.yields = 0
        self.broken: str | None = None
        """Why the sandbox's frames were refused; None while they keep the protocol."""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._kind = kind
        self._sink = sink
        self._channel = channel
        self._seal = seal
        self._keeper = keeper
        self._count = 0
        self._artifacts = artifacts
        self.artifact_count = 0
        """Artifacts begun (their first part accepted)."""
        self._open: ArtifactPart | None = None
        """The last part of the artifact being sent, until its last part."""
        # The call's frame budget starts here (the caller sets it to
        # MAX_FRAME_BYTES_PER_CALL next); kept artifact bytes are added to it.
        self._budget_base = channel.received
        self._credit = 0

    @property
    def sealed(self) -> bool:
        """The call ended on a sealed result (the worker says nothing else lives)."""
        return self.result is not None and self.result.get("sealed") is True

    def on_frame(self, item: FrameItem) -> None:
        if self.done.done():
            return
        if item is None:
            self._end()
            return
        self._count += 1
        if self._count > MAX_FRAMES_PER_CALL:
            self._refuse(f"more than {MAX_FRAMES_PER_CALL} lines of frames")
        elif isinstance(item, Malformed):
            if item.fatal:
                self._refuse(item.reason)
            # Else a line that is no frame at all: skipped, as the runner's
            # frames are never such (the newline it writes before each ends
            # anything tool code left in the pipe). It counts against the bounds.
        else:
            kind = item.get("t")
            if kind == "yield":
                self._on_yield(item)
            elif kind == "result":
                self._on_result(item)
            elif kind == "artifact":
                self._on_artifact(item)
            elif kind == "exit" and self._keeper:
                problem = _exit_problem(item)
                if problem:
                    self._refuse(problem)
                    return
                self.exit_frame = item
                self._end()
            else:
                self._refuse(f"a frame of type {_short(kind)} during a call")

    def _on_yield(self, frame: Frame) -> None:
        if self._kind not in _YIELDING_KINDS:
            self._refuse(f"a yield frame from a {self._kind!r} request, which cannot yield")
        elif "v" not in frame:
            self._refuse("a yield frame without a value")
        else:
            self.yields += 1
            self._sink(StreamKind.YIELD, json.dumps(frame["v"]).encode())

    def _on_artifact(self, frame: Frame) -> None:
        if self._kind not in _ARTIFACT_KINDS:
            self._refuse(f"an artifact frame from a {self._kind!r} request, which makes none")
            return
        if self.result is not None:
            self._refuse("an artifact frame after the result frame")
            return
        part = _artifact_part(frame)
        if isinstance(part, str):
            self._refuse(part)
            return
        problem = self._order_problem(part)
        if problem:
            self._refuse(problem)
            return
        if part.part == 0:
            self.artifact_count += 1
        self._open = None if part.last else part
        if self._artifacts is not None and self._artifacts(part):
            # Kept by the store, which bounds it: not the frame budget's to bound.
            self._credit += len(frame["data_b64"])
            budget = self._budget_base + MAX_FRAME_BYTES_PER_CALL + self._credit
            self._channel.limit(budget - self._channel.received)

    def _order_problem(self, part: ArtifactPart) -> str | None:
        """What is wrong with `part` coming now, or None."""
        previous = self._open
        if part.part == 0:
            if previous is not None:
                return f"a new artifact before the last part of {_short(previous.name)}"
            if self.artifact_count >= MAX_ARTIFACTS_PER_CALL:
                return f"more than {MAX_ARTIFACTS_PER_CALL} artifacts"
            return None
        if previous is None or part.part != previous.part + 1:
            return f"artifact part {part.part} of {_short(part.name)} out of order"
        if (part.name, part.mime_type, part.source) != (
            previous.name,
            previous.mime_type,
            previous.source,
        ):
            return f"artifact part {part.part} of {_short(part.name)} names another artifact"
        return None

    def _on_result(self, frame: Frame) -> None:
        problem = _result_problem(frame, self._kind, self._seal)
        if self.result is not None:
            problem = "a second result frame"
        elif self._open is not None:
            problem = f"a result frame before the last part of artifact {_short(self._open.name)}"
        if problem:
            self._refuse(problem)
            return
        self.result = frame
        if self.sealed:
            self._end()

    def exited(self, frame: Frame) -> None:
        """The worker's end as another process told it (the zygote): the call is
        over, and (unless a frame was refused) this is how it ended."""
        if self.broken is None and self.exit_frame is None:
            self.exit_frame = frame
        if not self.done.done():
            self._end()

    def _refuse(self, reason: str) -> None:
        self.broken = reason
        self._end()

    def _end(self) -> None:
        self._channel.discard()
        self.done.set_result(None)


def _result_problem(frame: Frame, kind: str, seal: bool) -> str | None:
    """What is wrong with a result frame for a request of `kind`, or None."""
    ok = frame.get("ok")
    if not isinstance(ok, bool) or not _is_int(frame.get("exit_code")):
        return "a result frame without a boolean ok and an integer exit_code"
    sealed = frame.get("sealed", False)
    if not isinstance(sealed, bool) or (sealed and not seal):
        return "a sealed result where no seal was asked for"
    if not ok:
        error = frame.get("error")
        if not isinstance(error, dict) or not all(
            isinstance(error.get(key), str) for key in ("type", "message", "traceback")
        ):
            return "a failed result frame without a well-formed error"
        return None
    value_kind, value = frame.get("kind"), frame.get("value")
    if value_kind not in VALUE_KINDS:
        return f"a result value of kind {_short(value_kind)}"
    if kind in ("code", "file", "command") and value_kind != "none":
        return f"a result value from a {kind!r} request, which returns none"
    if kind == "describe" and (value_kind != "json" or not isinstance(value, list)):
        return "a describe result that is not a list"
    if kind == "workspace" and value_kind != "json":
        return "a workspace result that is not a JSON value"
    if (value_kind == "none" and value is not None) or (
        value_kind == "text" and not isinstance(value, str)
    ):
        return f"a result value that is not of its kind {value_kind!r}"
    return None


def _artifact_part(frame: Frame) -> ArtifactPart | str:
    """The part an artifact frame carries, or what is wrong with the frame."""
    name, mime, source = frame.get("name"), frame.get("mime_type"), frame.get("source")
    data, part, last = frame.get("data_b64"), frame.get("part"), frame.get("last")
    for label, value in (("name", name), ("mime_type", mime)):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ARTIFACT_LABEL:
            return f"an artifact frame whose {label} is not a string of 1 to {MAX_ARTIFACT_LABEL}"
    assert isinstance(name, str) and isinstance(mime, str)
    if source not in ARTIFACT_SOURCES:
        return f"an artifact frame from source {_short(source)}"
    if not isinstance(part, int) or isinstance(part, bool) or part < 0:
        return "an artifact frame without an integer part and a boolean last"
    if not isinstance(last, bool):
        return "an artifact frame without an integer part and a boolean last"
    if not isinstance(data, str) or len(data) > (MAX_ARTIFACT_PART_BYTES + 2) // 3 * 4:
        return f"an artifact frame without base64 data of at most {MAX_ARTIFACT_PART_BYTES} bytes"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "an artifact frame whose data is not base64"
    return ArtifactPart(name, mime, str(source), raw, part, last)


def _exit_problem(frame: Frame) -> str | None:
    code, sig = frame.get("code"), frame.get("signal")
    if (code is None or _is_int(code)) and (sig is None or _is_int(sig)):
        return None
    return "an exit frame without integer code or signal"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    """`value` for a message, bounded: it came from the sandbox."""
    text = repr(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."
