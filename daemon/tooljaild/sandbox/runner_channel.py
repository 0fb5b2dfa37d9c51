"""The runner channel: what the daemon and a sandbox's runner say to each other.

Every backend speaks it, through the same pipes: the process backend hands a
runner its ends at start, the docker backend over a socket (decision 20); from
there on nothing differs, and this module is all of it.

It is over 500 lines because it is one contract: every frame, the checks a
hostile sandbox's frames must pass and a call's life over the pipes are read
together, and split they would each name the others' rules.

Four pipes per sandbox, each one way (`RunnerPipes` holds the daemon's ends):

    request  daemon -> runner   one JSON line, once: what to run, and how
    stdout   runner -> daemon   the tool's stdout, raw bytes
    stderr   runner -> daemon   the tool's stderr, raw bytes
    frames   runner -> daemon   JSON objects, one per line (below)

The request (`request_message`) is the `RunRequest`'s kind and payload, plus
``limits`` (rlimits the worker applies), ``cwd``, ``env`` (the scrubbed
`sandbox_env` and the request's own variables: the worker's environment is
replaced by it), ``tooldef`` (where the sandbox sees _tooldef.py) and
``seal`` (whether the worker may seal its result: below).

The frames, each on a line of its own (the runner writes a newline before
each, which ends any partial line tool code left in the pipe):

    {"t": "ready", "worker": pid, "keeper": pid}
        start-up, once: the worker waits for its request.
    {"t": "yield", "v": <json>}
        one value from a generator tool (kind "user" only).
    {"t": "result", "ok": true, "kind": "none"|"json"|"text", "value": ...,
     "exit_code": int}
    {"t": "result", "ok": false, "error": {"type", "message", "traceback"},
     "exit_code": int}
        how the tool ended, once; with "sealed": true when the request allowed
        a seal and the worker has already killed every other process of the
        sandbox (decision 18): then it is the call's last word.
    {"t": "exit", "code": int|null, "signal": int|null}
        from the keeper, last, once it has swept the tree: sandboxes with a
        keeper only (a zygote's sandbox has none: the zygote reports the
        worker's end on its own socket, see sandbox/zygote.py).
    {"t": "artifact", "name": str, "mime_type": str,
     "source": "outputs"|"figure"|"display", "data_b64": str, "part": int,
     "last": bool}
        one part (at most `MAX_ARTIFACT_PART_BYTES` of data) of a file the
        call made (kinds code, file and user only), before its result frame,
        in the order they were made; the parts of one artifact are
        consecutive, numbered from 0, the last one says so. Each part goes to
        the request's `ArtifactSink` as it comes. At most
        `MAX_ARTIFACTS_PER_CALL` artifacts; the bytes of the parts the sink
        keeps do not count against the call's frame budget (the store bounds
        them, `max_artifact_bytes` each), the bytes of the others do.

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

import abc
import asyncio
import base64
import binascii
import contextlib
import json
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tooljail.types import StreamKind
from tooljaild.sandbox.base import (
    ArtifactPart,
    ArtifactSink,
    OutputSink,
    RunOutcome,
    RunRequest,
    Sandbox,
    SandboxError,
)
from tooljaild.sandbox.channels import (
    Frame,
    FrameChannel,
    FrameItem,
    Malformed,
    OutputChannel,
    PipeReader,
    PipeWriter,
)
from tooljaild.settings.sandbox import Limits

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
_ARTIFACT_KINDS = frozenset({"code", "file", "user"})
_SHORT = 60


def sandbox_env(home: str, tmpdir: str) -> dict[str, str]:
    """The environment every tool starts from: nothing of the daemon's."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


@dataclass(frozen=True)
class RunnerSpec:
    """How a backend's runner sees its sandbox, and what its process tree allows."""

    workdir: str
    """The workspace as the tool sees it (its cwd and HOME)."""
    tmpdir: str
    """TMPDIR as the tool sees it."""
    tooldef: str
    """Where the sandbox sees _tooldef.py."""
    seal: bool
    """The worker may seal its result: only where its sandbox has a pid namespace
    of its own whose init is not the worker (decision 18)."""
    keeper: bool
    """A keeper writes the exit frame on the frame pipe (not in a zygote's sandbox)."""


def request_message(request: RunRequest, spec: RunnerSpec) -> bytes:
    """The request line for the runner (see the module docstring)."""
    return runner_line(request.kind, request.payload, request.limits, request.env, spec)


def runner_line(
    kind: str, payload: dict[str, Any], limits: Limits, env: dict[str, str], spec: RunnerSpec
) -> bytes:
    """A first request line of any kind (a session's too: see session_channel)."""
    message = {
        "kind": kind,
        **payload,
        "limits": limits.rlimits(),
        "cwd": spec.workdir,
        "env": {**sandbox_env(spec.workdir, spec.tmpdir), **env},
        "tooldef": spec.tooldef,
        "seal": spec.seal,
    }
    return json.dumps(message).encode() + b"\n"


class PipeEnds:
    """A sandbox's four pipes while they are handed over: theirs go, ours stay.

    A context manager: on the way out theirs (and anything appended to them)
    are closed, as the sandbox has them by then or failed to start; ours are
    closed too when an exception leaves.
    """

    def __init__(self) -> None:
        self.ours: list[int] = []
        """Request write end, stdout, stderr and frame read ends: `RunnerPipes`'s."""
        self.theirs: list[int] = []
        """Request read end, stdout, stderr and frame write ends, in that order."""

    def __enter__(self) -> PipeEnds:
        try:
            for i in range(4):
                r, w = os.pipe()  # close-on-exec; pass_fds or SCM_RIGHTS hands them over
                # The request goes to the runner; the other three come from it.
                self.ours.append(w if i == 0 else r)
                self.theirs.append(r if i == 0 else w)
        except BaseException:
            self.__exit__(OSError, None, None)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        for fd in self.theirs if exc_type is None else self.theirs + self.ours:
            with contextlib.suppress(OSError):
                os.close(fd)


class RunnerPipes:
    """The daemon's ends of one sandbox's four pipes, read and written on the loop.

    Args:
        stdin_w, stdout_r, stderr_r, frames_r: The pipe ends; this object owns them.
    """

    def __init__(self, stdin_w: int, stdout_r: int, stderr_r: int, frames_r: int) -> None:
        loop = asyncio.get_running_loop()
        self.stdout = OutputChannel(StreamKind.STDOUT)
        self.stderr = OutputChannel(StreamKind.STDERR)
        self.frames = FrameChannel(self._on_start_frame, MAX_FRAME_BYTES, MAX_FRAME_CONTAINERS)
        self._first: asyncio.Future[FrameItem] = loop.create_future()
        self._stdin = PipeWriter(stdin_w)
        self._output = (PipeReader(stdout_r, self.stdout), PipeReader(stderr_r, self.stderr))
        self._pipes: list[PipeReader | PipeWriter] = [
            self._stdin,
            *self._output,
            PipeReader(frames_r, self.frames),
        ]

    @property
    def ended(self) -> bool:
        """The frame pipe has ended: nothing in the sandbox can answer any more."""
        return self.frames.ended

    def _on_start_frame(self, item: FrameItem) -> None:
        if not self._first.done():
            self._first.set_result(item)

    async def ready(self, timeout_s: float) -> Frame | None:
        """The runner's ready frame, or None when it wrote another first, ended or
        said nothing within `timeout_s`."""
        # A timer rather than wait_for(): no task wrapped around the wait.
        timer = asyncio.get_running_loop().call_later(timeout_s, self._on_start_frame, None)
        try:
            first = await self._first
        finally:
            timer.cancel()
        if isinstance(first, dict) and first.get("t") == "ready" and _is_int(first.get("worker")):
            return first
        return None

    def begin(self, request: RunRequest, spec: RunnerSpec, sink: OutputSink) -> CallFrames:
        """Send the call's output to `sink`, and the request to the runner.

        Returns:
            The call's frames, whose `done` says when the call is over (a
            runner that died before reading the request is reported there).
        """
        frames = CallFrames(
            request.kind,
            sink,
            self.frames,
            seal=spec.seal,
            keeper=spec.keeper,
            artifacts=request.artifacts,
        )
        self.frames.on_frame = frames.on_frame
        self.frames.limit(MAX_FRAME_BYTES_PER_CALL)
        self.stdout.attach(sink)
        self.stderr.attach(sink)
        self._stdin.write_and_close(request_message(request, spec))
        return frames

    def send(self, line: bytes) -> None:
        """Write one more request line; the pipe stays open (a session's requests)."""
        self._stdin.write(line)

    def read_output_now(self) -> None:
        """Deliver what stdout and stderr hold now to their sinks, before anything
        else is acted on (see `PipeReader.read_now`)."""
        for reader in self._output:
            reader.read_now()

    async def drain(self, kill: Callable[[], Awaitable[None]], timeout_s: float = 2.0) -> None:
        """Let output still in flight arrive; kill what keeps the pipes open past
        `timeout_s` (it escaped the sandbox's end), then wait as long again."""
        pipes = {self.stdout.closed, self.stderr.closed}
        _, pending = await asyncio.wait(pipes, timeout=timeout_s)
        if pending:
            await kill()
            await asyncio.wait(pending, timeout=timeout_s)

    def close_request(self) -> None:
        """Close the request pipe unless a request is in it: an unused runner exits."""
        if not self._stdin.is_closing():
            self._stdin.close()

    def close(self) -> None:
        """Close every pipe now."""
        for pipe in self._pipes:
            pipe.close()


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


class RunnerSandbox(Sandbox):
    """A sandbox whose runner waits behind `RunnerPipes`: a call's life over the
    channel, the same for every backend.

    A backend starts its runner, sets `_pipes` once it has the daemon's ends,
    and supplies what differs: how its runner sees things (`_runner_spec`), how
    it waits for a call's end (`_until_end`), how it kills (`_kill_now`,
    `_kill_all`) and what an end means (`_outcome`).
    """

    _drain_s = 2.0
    """How long output may keep flowing after the call's end before what holds
    the pipes open is killed."""

    def __init__(self) -> None:
        self._pipes: RunnerPipes | None = None
        self._used = False
        self._killed = False
        """The daemon stopped the sandbox (`kill`: timeout, cancel, shutdown)."""
        self._closed = False

    async def run(self, request: RunRequest, sink: OutputSink) -> RunOutcome:
        return await self.begin(request, sink)

    def begin(self, request: RunRequest, sink: OutputSink) -> Coroutine[Any, Any, RunOutcome]:
        """Write the request into the runner's pipe now; return what waits for the end."""
        if self._pipes is None or self._used or self._closed:
            raise SandboxError(f"sandbox {self.id} is not ready for a request")
        self._used = True
        return self._run_to_end(self._pipes.begin(request, self._runner_spec(), sink))

    async def _run_to_end(self, end: CallFrames) -> RunOutcome:
        assert self._pipes is not None
        await self._until_end(end)
        if end.broken is not None:
            await self._kill_all()  # it broke the protocol: nothing it says counts
        elif end.sealed or end.exit_frame is not None:
            # A frame proves nothing (tool code can write one): the daemon ends
            # the sandbox itself, without waiting (decision 31). After a true
            # seal or exit frame only an exiting process is left to kill.
            self._kill_now()
        # Output still in flight drains; anything that keeps the pipes open
        # past this point escaped the sandbox's end and is killed.
        await self._pipes.drain(self._kill_all, self._drain_s)
        return await self._outcome(end)

    async def kill(self) -> None:
        self._killed = True
        await self._kill_all()

    def hand_over(self) -> tuple[RunnerPipes, RunnerSpec]:
        """The runner's pipes and how it sees things, for a conversation longer
        than one request (a session: see session_channel). The sandbox counts as
        used from now on; `kill` and `close` still end it.

        Raises:
            SandboxError: The sandbox is not started, is used or is closed.
        """
        if self._pipes is None or self._used or self._closed:
            raise SandboxError(f"sandbox {self.id} is not ready for a session")
        self._used = True
        return self._pipes, self._runner_spec()

    async def outcome_of(self, end: CallFrames) -> RunOutcome:
        """What `end` means, as this backend reads it (see `_outcome`)."""
        return await self._outcome(end)

    def usage_from_now(self) -> None:
        """A session's call starts now: what the backend measures itself (not
        the runner's figures) counts from here for `measure`. No-op by default."""

    def measure(self, outcome: RunOutcome) -> None:
        """Put what the backend measured itself since `usage_from_now` (or the
        start) into `outcome`. No-op by default: the runner's figures stand."""

    @abc.abstractmethod
    def _runner_spec(self) -> RunnerSpec:
        """How this sandbox's runner sees things, for the request."""

    async def _until_end(self, end: CallFrames) -> None:
        """Return once the call is over (`end.done`, unless the backend knows more)."""
        await end.done

    @abc.abstractmethod
    def _kill_now(self) -> None:
        """End the sandbox's process tree where one call does it, without waiting."""

    @abc.abstractmethod
    async def _kill_all(self) -> None:
        """Kill everything in the sandbox, waiting where the backend must."""

    @abc.abstractmethod
    async def _outcome(self, end: CallFrames) -> RunOutcome:
        """The call's outcome from its frames and what the backend knows besides."""


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
    if kind in ("code", "file") and value_kind != "none":
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
