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
import logging
import os
import shutil
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tooljaild.egress.dirs import EgressDirs
from tooljaild.sandbox import bwrap as bw
from tooljaild.sandbox import interpreter
from tooljaild.sandbox.base import RunOutcome, SandboxError
from tooljaild.sandbox.cgroups import CgroupLimits, SandboxCgroup
from tooljaild.sandbox.file_modes import SANDBOX_UMASK
from tooljaild.sandbox.frames import CallFrames
from tooljaild.sandbox.isolation import Isolation
from tooljaild.sandbox.outcome import outcome_of
from tooljaild.sandbox.runner_channel import (
    PipeEnds,
    RunnerPipes,
    RunnerSandbox,
    RunnerSpec,
    sandbox_env,
)
from tooljaild.sandbox.zygote import Zygote, ZygoteChild
from tooljaild.settings.sandbox import Limits, ProcessSandboxConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxContext:
    """What the daemon decided once, that every sandbox it builds shares."""

    workspace_root: Path
    runner_dir: Path
    """Host directory holding the runner (`_runner.py` and the modules beside it) and
    `_tooldef.py` (see `isolation.install_runner`)."""
    isolation: Isolation
    shared_dirs: tuple[Path, ...] = ()
    """Tool and files directories: visible read-only, at the same paths, inside."""
    zygote: Zygote | None = None
    """When set (under namespaces), sandboxes are forked by it instead of started."""
    egress_root: Path | None = None
    """Where each sandbox's egress directory is made (egress/dirs.py); None: no
    egress on this daemon (no sandbox gets a directory, nothing is bound)."""


def build_process_sandbox(
    config: ProcessSandboxConfig, context: SandboxContext, limits: Limits | None = None
) -> ProcessSandbox:
    """A process sandbox, not yet started, from the backend's settings.

    Here and not on the settings: settings are plain data (`tooljaild.settings`).
    """
    return ProcessSandbox(config, context, limits or Limits())


class ProcessSandbox(RunnerSandbox):
    """A runner (keeper + worker) in its own namespaces, session, workspace and cgroup."""

    def __init__(
        self, config: ProcessSandboxConfig, context: SandboxContext, limits: Limits
    ) -> None:
        super().__init__()
        self.id = "sbx-" + uuid.uuid4().hex[:12]
        self.workspace = context.workspace_root / self.id
        self._config = config
        self._context = context
        self._iso = context.isolation
        self._limits = limits
        self._cgroup: SandboxCgroup | None = None
        self._cpu_base: float | None = None
        """The cgroup's CPU seconds once the runner was ready, or a session's call
        started (see `measure`)."""
        self._peak_fresh = False
        """The cgroup's memory peak counts from this sandbox's start only."""
        self._proc: asyncio.subprocess.Process | ZygoteChild | None = None
        self._exited: asyncio.Future[int] | None = None
        """Done when the sandbox's first process (bubblewrap, or pid 1) has ended."""
        self._worker_pid: int | None = None
        self._forked = False

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
        """(host pid of the sandbox's first process, worker pid as the runner sees it).

        Under namespaces the worker's pid is the one inside its pid namespace.
        """
        return (self._proc.pid if self._proc else None, self._worker_pid)

    @property
    def namespaced(self) -> bool:
        return self._iso.namespaces

    @property
    def workdir(self) -> str:
        """The workspace as the tool sees it."""
        return bw.INSIDE_WORKSPACE if self.namespaced else str(self.workspace)

    @property
    def _tmpdir(self) -> str:
        return "/tmp" if self.namespaced else self.workdir

    def _runner_file(self, name: str) -> str:
        if self.namespaced:
            return f"{bw.INSIDE_RUNNER_DIR}/{name}"
        return str(self._context.runner_dir / name)

    async def start(self) -> None:
        if self._proc is not None:
            raise SandboxError(f"sandbox {self.id} was already started")
        if self._context.egress_root is not None and self.namespaced:
            # Without namespaces a sandbox shares the host's network (and
            # loopback: one relay port for all): it gets no egress directory.
            # A mkdir and a link: made here, not on a thread, so that a
            # cancelled start cannot leave a directory that close() misses.
            try:
                self.egress_dir = EgressDirs(self._context.egress_root).new()
            except OSError as exc:
                raise SandboxError(f"cannot make the egress directory of {self.id}: {exc}") from exc
        if not self.namespaced:
            # Under namespaces the workspace is a size-capped tmpfs inside the sandbox.
            self.workspace.mkdir(mode=0o700, parents=True)
            if self._iso.uid is not None:
                os.chown(self.workspace, self._iso.uid, self._iso.gid or self._iso.uid)
        tracker = self._iso.tracker if self._config.use_cgroups else None
        if tracker is not None:
            limits = self._cgroup_limits()
            self._cgroup = tracker.take_spare(limits)
            if self._cgroup is None:
                try:
                    self._cgroup = await asyncio.to_thread(tracker.create, self.id, limits)
                    self._peak_fresh = True
                except OSError as exc:
                    log.warning("no cgroup for %s: %s", self.id, exc)
        with PipeEnds() as ends:
            if self.namespaced and self._context.zygote is not None:
                if self._cgroup is not None:
                    ends.theirs += self._cgroup.open_procs()
                await self._start_from_zygote(self._context.zygote, ends.theirs)
            else:
                await self._start_process(ends.theirs)
        self._pipes = RunnerPipes(*ends.ours)
        await self._await_ready(self._pipes)
        if self._cgroup is not None:
            # Ready and idle until its call: what it uses from here on is the call's.
            self._cpu_base = self._cgroup.cpu_s()
            self._peak_fresh = self._cgroup.reset_memory_peak() or self._peak_fresh

    async def _start_process(self, theirs: list[int]) -> None:
        """Start the runner as a process of its own (under bubblewrap when namespaced)."""
        stdin_r, stdout_w, stderr_w, frames_w = theirs[:4]
        runner_args = [self._runner_file("_runner.py"), "--frames-fd", str(frames_w)]
        if self._cgroup is not None:
            cgroup_fds = self._cgroup.open_procs()
            theirs += cgroup_fds
            runner_args += ["--cgroup-fds", ",".join(map(str, cgroup_fds))]
        if self.namespaced:
            spec = self._bwrap_spec(theirs)
            argv = spec.argv(runner_args)
            theirs += spec.fds()
            env: dict[str, str] = {}
        else:
            argv = [self._config.python, "-I", "-B", *runner_args]
            env = sandbox_env(self.workdir, self._tmpdir)
        if self._iso.uid is not None:
            argv = [*_drop_privileges(self._iso.uid, self._iso.gid), *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=stdin_r,
                stdout=stdout_w,
                stderr=stderr_w,
                pass_fds=tuple(fd for fd in theirs if fd not in (stdin_r, stdout_w, stderr_w)),
                start_new_session=True,
                env=env,
                # Not the daemon's own (0077): a tool's files as in any container.
                umask=SANDBOX_UMASK,
                cwd="/" if self.namespaced else self.workspace,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc
        self._proc = proc
        self._exited = asyncio.ensure_future(proc.wait())

    async def _start_from_zygote(self, zygote: Zygote, theirs: list[int]) -> None:
        params: dict[str, Any] = {
            "tmp_bytes": self._limits.tmp_bytes,
            "workspace_bytes": self._limits.workspace_bytes,
            "shared": zygote_shared(self._config, self._context),
        }
        if self._context.egress_root is not None:
            # The zygote sees every sandbox's directory (read-only) at
            # ZYGOTE_EGRESS; the worker binds its own at /run/tooljail and
            # then hides the zygote's view (runner/_zygote.py).
            params["egress_view"] = bw.ZYGOTE_EGRESS
            if self.egress_dir is not None:
                params["egress"] = self.egress_dir.name
        pid = await zygote.spawn(self.id, params, theirs)
        child = ZygoteChild(zygote, self.id, pid)
        self._proc = child
        self._exited = child.exited
        self._forked = True

    async def _await_ready(self, pipes: RunnerPipes) -> None:
        ready = await pipes.ready(self._config.start_timeout_s)
        if ready is None:
            # What it printed on its way down says why.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipes.stderr.closed), 1.0)
            said = pipes.stderr.said()
            await self.close()
            raise SandboxError(f"sandbox {self.id} did not start: {said or 'no ready signal'}")
        self._worker_pid = int(ready["worker"])

    def _cgroup_limits(self) -> CgroupLimits:
        lim = self._limits
        return CgroupLimits(
            memory_bytes=lim.sandbox_memory_bytes or None,
            pids=lim.sandbox_pids or None,
            cpu_cores=lim.cpus or None,
        )

    def _bwrap_spec(self, passed: list[int]) -> bw.BwrapSpec:
        return build_bwrap_spec(
            self._config, self._context, self._limits, passed, egress_dir=self.egress_dir
        )

    def _runner_spec(self) -> RunnerSpec:
        return RunnerSpec(
            workdir=self.workdir,
            tmpdir=self._tmpdir,
            tooldef=self._runner_file("_tooldef.py"),
            # Only the zygote's sandboxes have the keeper as pid 1 of their own
            # pid namespace, which the worker's seal needs; and no keeper of
            # theirs writes frames (the zygote reports the worker's end).
            seal=self._forked,
            keeper=not self._forked,
        )

    async def _until_end(self, end: CallFrames) -> None:
        assert self._exited is not None
        either: set[asyncio.Future[Any]] = {end.done, self._exited}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if self._forked and end.broken is None and not end.sealed:
            await self._zygote_exit_frame(end)
        if not end.done.done():
            # The keeper is gone; its last frame, if it wrote one, is already
            # in the pipe. Nothing left can report the tree's end: kill it.
            done, _ = await asyncio.wait({end.done}, timeout=0.5)
            if not done:
                await self._kill_all()

    async def _zygote_exit_frame(self, end: CallFrames) -> None:
        """A zygote sandbox has no keeper to write the exit frame: the zygote says
        how the worker ended, once everything in the sandbox is gone."""
        assert isinstance(self._proc, ZygoteChild) and self._exited is not None
        if not self._exited.done():
            # The worker is gone (end of file) or said its result unsealed: the
            # zygote is killing the rest. Bounded, in case it cannot.
            await asyncio.wait({self._exited}, timeout=self._config.start_timeout_s)
        worker_end = self._proc.worker_end
        ended = worker_end.result() if worker_end.done() else None
        if ended is not None:
            end.exited({"t": "exit", **ended})

    async def _outcome(self, end: CallFrames) -> RunOutcome:
        sig = end.exit_frame.get("signal") if end.exit_frame else None
        outcome = outcome_of(
            end.result,
            end.exit_frame,
            end.yields,
            killed=self._killed,
            out_of_memory=end.result is None
            and sig == signal.SIGKILL
            and self._cgroup is not None
            and self._cgroup.oom_killed(),
            memory_bytes=self._limits.sandbox_memory_bytes,
            protocol_error=end.broken,
        )
        self.measure(outcome)
        return outcome

    def usage_from_now(self) -> None:
        """A session's call starts: the cgroup's CPU counts from here, and so does
        its memory peak where it can be reset (v1). Where it cannot (v2), the
        peak the session's supervisor measured for the call stands (runner/_usage.py
        `CallUsage`): the cgroup's would be the whole session's."""
        if self._cgroup is not None:
            self._cpu_base = self._cgroup.cpu_s()
            self._peak_fresh = self._cgroup.reset_memory_peak()

    def measure(self, outcome: RunOutcome) -> None:
        """The cgroup's usage over the runner's rusage, where the cgroup knows it: it
        counts every process of the sandbox (also those nobody waited for, and a
        run killed before its worker could report)."""
        cgroup = self._cgroup
        if cgroup is None:
            return
        cpu = cgroup.cpu_s()
        if cpu is not None and self._cpu_base is not None:
            outcome.cpu_s = max(outcome.cpu_s or 0.0, cpu - self._cpu_base)
        peak = cgroup.memory_peak() if self._peak_fresh else None
        if peak:
            outcome.memory_peak_bytes = peak

    def _kill_now(self) -> None:
        """End a namespaced sandbox without waiting: its pid namespace's end kills all."""
        if self.namespaced and self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    async def _kill_all(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if self.namespaced and proc.returncode is None:
            # bubblewrap's pid namespace: when it goes, the kernel kills every
            # process inside, however it forked.
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if self._cgroup is not None:
            # Everything the tool started is in the cgroup, wherever it forked to.
            await asyncio.to_thread(self._cgroup.kill_all)
            return
        if self.namespaced:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5.0)
            return
        # No namespaces, no cgroup: kill the worker's session at once, and let the
        # keeper sweep the orphans it inherited as subreaper.
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
        if self._pipes is not None:
            self._pipes.close_request()  # an unused runner exits on EOF
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 0.05 if self._used else 0.5)
            except TimeoutError:
                await self._kill_all()
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5.0)
        if self._pipes is not None:
            self._pipes.close()
        if self._exited is not None and not self._exited.done():
            self._exited.cancel()
        if self._cgroup is not None and self._cgroup.release_if_empty():
            self._cgroup = None  # given back without a wait: the common case
        if self._cgroup is not None or not self.namespaced or self.egress_dir is not None:
            # One trip to a thread for all (under namespaces the workspace is a
            # tmpfs inside the sandbox: nothing to remove on the host).
            await asyncio.to_thread(self._remove_leftovers)

    def _remove_leftovers(self) -> None:
        if self._cgroup is not None:
            self._cgroup.release()
        if not self.namespaced:
            shutil.rmtree(self.workspace, ignore_errors=True)
        if self.egress_dir is not None and self._context.egress_root is not None:
            EgressDirs(self._context.egress_root).remove(self.egress_dir)


def build_bwrap_spec(
    config: ProcessSandboxConfig,
    context: SandboxContext,
    limits: Limits,
    passed: list[int],
    *,
    zygote: bool = False,
    egress_dir: Path | None = None,
) -> bw.BwrapSpec:
    """Open what a sandbox binds; every descriptor is appended to `passed` at once.

    Args:
        zygote: For the zygote: nested user namespaces allowed, no seccomp here
            (each sandbox it forks applies the filter itself); it sees the
            egress root (every sandbox's egress directory) at ZYGOTE_EGRESS.
        egress_dir: A sandbox's own egress directory, bound read-only at
            /run/tooljail (a sandbox bubblewrap starts itself).
    """
    iso = context.isolation
    assert iso.bwrap is not None

    def open_dir(path: Path | str) -> int:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        passed.append(fd)
        return fd

    bound = bound_dirs(config, context)
    seccomp_fd = None
    if iso.seccomp and not zygote:
        from tooljaild.sandbox import seccomp

        seccomp_fd = seccomp.filter_fd()
        passed.append(seccomp_fd)
    data = []
    for text in (bw.PASSWD, bw.GROUP):
        r, w = os.pipe()
        passed.append(r)
        os.write(w, text.encode())
        os.close(w)
        data.append(r)
    return bw.BwrapSpec(
        bwrap=iso.bwrap,
        python=config.python,
        runner_dir_fd=open_dir(context.runner_dir),
        extra_ro=[(open_dir(d), d) for d in bound],
        zygote_ro=[open_dir(d) for d in bound] if zygote else [],
        tmp_bytes=limits.tmp_bytes,
        workspace_bytes=limits.workspace_bytes,
        seccomp_fd=seccomp_fd,
        data_fds=(data[0], data[1]),
        zygote=zygote,
        egress_fd=open_dir(egress_dir) if egress_dir is not None and not zygote else None,
        zygote_egress_fd=(
            open_dir(context.egress_root) if zygote and context.egress_root is not None else None
        ),
    )


def bound_dirs(config: ProcessSandboxConfig, context: SandboxContext) -> list[str]:
    """What bubblewrap binds read-only at the same path, in order: the interpreter's
    directories outside /usr (a virtualenv, its base's prefix), then the tool and
    files directories that exist.

    Raises:
        SandboxError: The interpreter is gone since the daemon started.
    """
    try:
        python_dirs = interpreter.inspect(config.python).bind_dirs()
    except interpreter.InterpreterError as exc:
        raise SandboxError(str(exc)) from exc
    return [*python_dirs, *(str(d) for d in context.shared_dirs if d.is_dir())]


def zygote_shared(config: ProcessSandboxConfig, context: SandboxContext) -> list[tuple[str, str]]:
    """(where the zygote sees it, where the tool must see it) for each bound directory.

    The same order as the binds `build_bwrap_spec` makes (see `bound_dirs`):
    a sandbox binds again those its fresh /tmp, /dev/shm or /workspace hide
    (a virtualenv under /tmp, say).
    """
    return [(f"{bw.ZYGOTE_SHARED}/{i}", d) for i, d in enumerate(bound_dirs(config, context))]


def zygote_for(config: ProcessSandboxConfig, context: SandboxContext, limits: Limits) -> Zygote:
    """A zygote that runs in the same bubblewrap sandbox a runner would."""

    def make_argv(runner_args: list[str]) -> tuple[list[str], list[int]]:
        passed: list[int] = []
        spec = build_bwrap_spec(config, context, limits, passed, zygote=True)
        argv = spec.argv(runner_args)
        iso = context.isolation
        if iso.uid is not None:
            argv = [*_drop_privileges(iso.uid, iso.gid), *argv]
        return argv, passed

    return Zygote(make_argv)


def _drop_privileges(uid: int, gid: int | None) -> list[str]:
    """The command prefix that runs what follows as uid:gid with no extra groups.

    setpriv (util-linux) does it after exec, so the daemon can spawn with vfork
    instead of copying its whole address space (Python must fork to set ids).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxError("setpriv (util-linux) is needed to drop to the sandbox uid")
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid if gid is not None else uid}",
        "--clear-groups",
        "--",
    ]


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
