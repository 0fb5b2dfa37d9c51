"""The process backend: each sandbox is a runner process tree on this host.

What it guarantees (see docs/decisions.md, "Killing the whole tree"):
- every process a tool starts is killed when the call ends, times out or is
  cancelled: by the per-sandbox cgroup where the host lets the daemon create
  one, and otherwise by the runner's keeper, a child subreaper that inherits
  and sweeps every orphan;
- rlimits (CPU, address space, processes, file size, open files, no core) and
  a scrubbed environment in a private working directory.
Namespaces and a read-only system are the isolation work's, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tooljail._types import StreamKind, ToolError
from tooljaild.runner import RUNNER_PATH
from tooljaild.sandbox.base import (
    OutputSink,
    RunOutcome,
    RunRequest,
    Sandbox,
    SandboxError,
    Termination,
)
from tooljaild.sandbox.cgroups import CgroupTracker

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 16 * 1024 * 1024 + 4096
READ_CHUNK = 64 * 1024


def default_python() -> str:
    """The interpreter binary sandboxes run: this one's, symlinks and shims resolved.

    A pyenv shim on PATH costs ~180 ms per start, and a venv's launcher would
    bring the daemon's packages along; the real binary has neither problem.
    """
    return os.path.realpath(sys.executable)


def _tooldef_path() -> str:
    import tooljail._tooldef

    return str(Path(tooljail._tooldef.__file__).resolve())


class ProcessSandboxConfig(BaseModel):
    """Settings of the process backend."""

    kind: Literal["process"] = "process"
    python: str = Field(default_factory=default_python)
    """The Python interpreter binary that runs the runner and the tools."""
    use_cgroups: bool = True
    """Track each sandbox in its own cgroup where the host allows it."""
    start_timeout_s: float = Field(default=20.0, gt=0)
    """How long a new sandbox may take to say it is ready."""

    def build(self, workspace_root: Path, tracker: CgroupTracker | None) -> ProcessSandbox:
        return ProcessSandbox(self, workspace_root, tracker if self.use_cgroups else None)


class ProcessSandbox(Sandbox):
    """A runner (keeper + worker) in its own session, working directory and cgroup."""

    def __init__(
        self, config: ProcessSandboxConfig, workspace_root: Path, tracker: CgroupTracker | None
    ) -> None:
        self.id = "sbx-" + uuid.uuid4().hex[:12]
        self.workspace = workspace_root / self.id
        self._config = config
        self._tracker = tracker
        self._cgroup: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._frames: asyncio.StreamReader | None = None
        self._frames_transport: asyncio.ReadTransport | None = None
        self._worker_pid: int | None = None
        self._used = False
        self._killed = False
        self._closed = False

    @property
    def alive(self) -> bool:
        return (
            self._proc is not None
            and self._proc.returncode is None
            and not self._used
            and not self._closed
        )

    @property
    def pids(self) -> tuple[int | None, int | None]:
        """(keeper, worker) process ids, for tests and diagnostics."""
        return (self._proc.pid if self._proc else None, self._worker_pid)

    def _base_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.workspace),
            "TMPDIR": str(self.workspace),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
        }

    async def start(self) -> None:
        if self._proc is not None:
            raise SandboxError(f"sandbox {self.id} was already started")
        self.workspace.mkdir(mode=0o700, parents=True)
        args = [self._config.python, "-I", "-B", str(RUNNER_PATH)]
        if self._tracker is not None:
            try:
                self._cgroup = await asyncio.to_thread(self._tracker.create, self.id)
            except OSError as exc:
                log.warning("no cgroup for %s: %s", self.id, exc)
        read_fd, write_fd = os.pipe()
        args += ["--frames-fd", str(write_fd)]
        if self._cgroup is not None:
            args += ["--cgroup", str(self._cgroup)]
        loop = asyncio.get_running_loop()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=self._base_env(),
                cwd=self.workspace,
                limit=READ_CHUNK,
            )
        except OSError as exc:
            os.close(read_fd)
            raise SandboxError(f"cannot start {self._config.python}: {exc}") from exc
        finally:
            os.close(write_fd)
        self._frames = asyncio.StreamReader(limit=MAX_FRAME_BYTES, loop=loop)
        protocol = asyncio.StreamReaderProtocol(self._frames, loop=loop)
        transport, _ = await loop.connect_read_pipe(
            lambda: protocol, os.fdopen(read_fd, "rb", buffering=0)
        )
        self._frames_transport = transport
        try:
            ready = await asyncio.wait_for(self._read_frame(), self._config.start_timeout_s)
        except TimeoutError:
            ready = None
        if ready is None or ready.get("t") != "ready":
            stderr = b""
            if self._proc.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    stderr = await asyncio.wait_for(self._proc.stderr.read(4096), 1.0)
            await self.close()
            raise SandboxError(
                f"sandbox {self.id} did not start: "
                + (stderr.decode(errors="replace").strip() or "no ready signal")
            )
        self._worker_pid = int(ready["worker"])

    async def _read_frame(self) -> dict[str, Any] | None:
        assert self._frames is not None
        while True:
            try:
                line = await self._frames.readline()
            except ValueError:
                # A line past the limit: not a frame the runner wrote. Skip it.
                log.warning("sandbox %s sent an oversized frame", self.id)
                continue
            if not line:
                return None
            try:
                frame = json.loads(line)
            except ValueError:
                continue  # tool code wrote junk into the frame pipe
            if isinstance(frame, dict):
                return frame

    async def run(self, request: RunRequest, sink: OutputSink) -> RunOutcome:
        if self._proc is None or self._used or self._closed:
            raise SandboxError(f"sandbox {self.id} is not ready for a request")
        self._used = True
        proc = self._proc
        assert proc.stdin and proc.stdout and proc.stderr
        message = {
            "kind": request.kind,
            **request.payload,
            "limits": request.limits.rlimits(),
            "cwd": str(self.workspace),
            "env": {**self._base_env(), **request.env},
            "tooldef": _tooldef_path(),
        }
        try:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the runner died before reading: reported as runner_lost below

        pumps = [
            asyncio.create_task(_pump(proc.stdout, StreamKind.STDOUT, sink)),
            asyncio.create_task(_pump(proc.stderr, StreamKind.STDERR, sink)),
        ]
        frames_task = asyncio.create_task(self._collect_frames(sink))
        keeper_task = asyncio.create_task(proc.wait())
        try:
            await asyncio.wait({frames_task, keeper_task}, return_when=asyncio.FIRST_COMPLETED)
            if not frames_task.done():
                # The keeper is gone; its last frame, if it wrote one, is already
                # in the pipe. Nothing left can report the tree's end: kill it.
                done, _ = await asyncio.wait({frames_task}, timeout=0.5)
                if not done:
                    await self._kill_tree()
            result, exit_frame, yields = await frames_task
            # Output still in flight drains; anything that keeps the pipes open
            # past this point escaped the keeper and is killed.
            _, pending = await asyncio.wait(pumps, timeout=2.0)
            if pending:
                await self._kill_tree()
                await asyncio.wait(pending, timeout=2.0)
        finally:
            for task in (*pumps, frames_task, keeper_task):
                if not task.done():
                    task.cancel()
        return self._outcome(result, exit_frame, yields)

    async def _collect_frames(
        self, sink: OutputSink
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
        result: dict[str, Any] | None = None
        yields = 0
        while True:
            frame = await self._read_frame()
            if frame is None:
                return result, None, yields
            kind = frame.get("t")
            if kind == "yield":
                yields += 1
                sink(StreamKind.YIELD, json.dumps(frame.get("v"), default=str).encode())
            elif kind == "result" and result is None:
                result = frame
            elif kind == "exit":
                return result, frame, yields

    def _outcome(
        self, result: dict[str, Any] | None, exit_frame: dict[str, Any] | None, yields: int
    ) -> RunOutcome:
        sig = exit_frame.get("signal") if exit_frame else None
        code = exit_frame.get("code") if exit_frame else None
        if self._killed:
            return RunOutcome(Termination.KILLED, exit_code=code, signal=sig, yields=yields)
        if result is not None:
            exit_code = int(result.get("exit_code", 0))
            if result.get("ok"):
                return RunOutcome(
                    Termination.RETURNED,
                    value_kind=result.get("kind", "none"),
                    value=result.get("value"),
                    exit_code=exit_code,
                    yields=yields,
                )
            err = result.get("error") or {}
            error = ToolError(
                type=str(err.get("type", "Error")),
                message=str(err.get("message", "")),
                traceback=str(err.get("traceback", "")),
            )
            termination = Termination.EXITED if error.type == "ExitCode" else Termination.RAISED
            return RunOutcome(termination, error=error, exit_code=exit_code, yields=yields)
        if sig:
            return _signal_outcome(int(sig), yields)
        if code is not None:
            return RunOutcome(
                Termination.EXITED,
                exit_code=int(code),
                yields=yields,
                error=ToolError(
                    type="ExitCode",
                    message=f"the process exited with code {code} before the tool returned",
                ),
            )
        return RunOutcome(
            Termination.RUNNER_LOST,
            yields=yields,
            error=ToolError(
                type="RunnerLost",
                message="the sandbox's runner ended without reporting the tool's outcome "
                "(the tool may have killed it)",
            ),
        )

    async def kill(self) -> None:
        self._killed = True
        await self._kill_tree()

    async def _kill_tree(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if self._cgroup is not None and self._tracker is not None:
            # Everything the tool started is in the cgroup, wherever it forked to.
            await asyncio.to_thread(self._tracker.kill_and_remove, self._cgroup)
            return
        # No cgroup: kill the worker's session at once, and let the keeper sweep
        # the orphans it inherited as subreaper.
        if self._worker_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._worker_pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                await asyncio.to_thread(_psutil_sweep, proc.pid)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()  # an unused runner exits on EOF
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), 0.05 if self._used else 0.5)
                except TimeoutError:
                    await self._kill_tree()
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 5.0)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.feed_eof()
        if self._cgroup is not None and self._tracker is not None:
            await asyncio.to_thread(self._tracker.kill_and_remove, self._cgroup)
        if self._frames_transport is not None:
            self._frames_transport.close()
        await asyncio.to_thread(shutil.rmtree, self.workspace, True)


async def _pump(stream: asyncio.StreamReader, kind: StreamKind, sink: OutputSink) -> None:
    while True:
        data = await stream.read(READ_CHUNK)
        if not data:
            return
        sink(kind, data)


_SIGNAL_REASONS: dict[int, tuple[Termination, str, str]] = {
    signal.SIGXCPU.value: (
        Termination.CPU_LIMIT,
        "CpuLimit",
        "the tool used up its CPU time limit",
    ),
    signal.SIGXFSZ.value: (
        Termination.FILE_SIZE_LIMIT,
        "FileSizeLimit",
        "the tool wrote a file past its size limit",
    ),
}


def _signal_outcome(sig: int, yields: int) -> RunOutcome:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    termination, type_, message = _SIGNAL_REASONS.get(
        sig,
        (Termination.SIGNALED, "Signal", f"the tool's process was killed by {name} ({sig})"),
    )
    return RunOutcome(
        termination,
        signal=sig,
        yields=yields,
        error=ToolError(type=type_, message=message),
    )


def _psutil_sweep(root_pid: int) -> None:
    """Last resort when the keeper does not answer: kill it and all below it."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.suspend()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
