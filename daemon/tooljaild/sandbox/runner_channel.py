"""The runner channel: what the daemon and a sandbox's runner say to each other.

Every backend speaks it, through the same pipes: the process backend hands a
runner its ends at start, the docker backend over a socket (decision 20); from
there on nothing differs, and this module is all of it.

Four pipes per sandbox, each one way (`RunnerPipes` holds the daemon's ends):

    request  daemon -> runner   one JSON line, once: what to run, and how
    stdout   runner -> daemon   the tool's stdout, raw bytes
    stderr   runner -> daemon   the tool's stderr, raw bytes
    frames   runner -> daemon   JSON objects, one per line (below)

The request (`request_message`) is the `RunRequest`'s kind and payload, plus
``limits`` (rlimits the worker applies), ``cwd``, ``env`` (the scrubbed
`sandbox_env` and the request's own variables: the worker's environment is
replaced by it), ``tooldef`` (where the sandbox sees _tooldef.py) and
``seal`` (whether the worker may seal its result: below) and, when the call
may reach out, ``egress`` (true: the runner starts its relay, runner/_egress.py,
before the tool runs).

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

How a hostile sandbox's frames are read, and why (bounds, the checks a frame
must pass, what a forged seal can and cannot do): `sandbox.frames`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tooljail.types import StreamKind
from tooljaild.sandbox.base import (
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
    OutputChannel,
    PipeReader,
    PipeWriter,
)
from tooljaild.sandbox.frames import (
    MAX_FRAME_BYTES,
    MAX_FRAME_BYTES_PER_CALL,
    MAX_FRAME_CONTAINERS,
    CallFrames,
    _is_int,
)
from tooljaild.settings.sandbox import Limits


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
    return runner_line(
        request.kind, request.payload, request.limits, request.env, spec, egress=request.egress
    )


def runner_line(
    kind: str,
    payload: dict[str, Any],
    limits: Limits,
    env: dict[str, str],
    spec: RunnerSpec,
    *,
    egress: bool = False,
) -> bytes:
    """A first request line of any kind (a session's too: see session_channel).

    Args:
        egress: The runner starts its egress relay before the tool runs (a
            session's interpreter: at the session's start).
    """
    message = {
        "kind": kind,
        **payload,
        "limits": limits.rlimits(),
        "cwd": spec.workdir,
        "env": {**sandbox_env(spec.workdir, spec.tmpdir), **env},
        "tooldef": spec.tooldef,
        "seal": spec.seal,
    }
    if egress:
        message["egress"] = True
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
