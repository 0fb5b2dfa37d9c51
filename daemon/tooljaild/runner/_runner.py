"""The runner: the stdlib-only program that waits inside every sandbox.

It is started ahead of demand by the daemon's pool, as
``python -I -B _runner.py --frames-fd N [--cgroup-fds A,B]`` (under bubblewrap
when the host allows), with these file descriptors:

    0  request pipe   the daemon writes one JSON line: what to run, and how
    1  stdout pipe    the tool's stdout, raw bytes
    2  stderr pipe    the tool's stderr, raw bytes
    N  frame pipe     JSON lines from the runner to the daemon (the protocol: below)
    A, B              the sandbox's cgroup.procs files, opened by the daemon

Two processes make one sandbox. The *keeper* (the process the daemon started)
marks itself a child subreaper, forks the *worker* and then only waits: every
process the tool leaves behind — daemonized, double-forked, setsid'd — is
re-parented to the keeper, which kills the whole tree once the worker is gone
or when the daemon sends it SIGTERM. The worker reads the request, applies the
limits and runs the tool in-process, so the call path starts no interpreter.

The zygote's sandboxes (see _zygote.py) have no keeper: the zygote forks the
worker itself (`run_worker`), reaps it, and sweeps the sandbox by killing its
pid 1, which takes every process in the sandbox's pid namespace with it.

The request, the frames and what the daemon accepts of them (it treats the
sandbox as hostile: tool code can write into the frame pipe too) are described
once, in the daemon's tooljaild/sandbox/runner_channel.py.

Here: the entry point, the keeper, and the worker's life (limits, the
request, the seal). Beside it, imported at start: the frame writer and what
frames hold (_frames.py) and the request kinds the worker runs (_kinds.py).
A session's supervisor and interpreter are in _session.py, imported only when
a session starts (`_serve_session`); what calls send as artifacts is in
_artifacts.py, loaded before the call.

This file must stay importable and runnable with nothing but the standard
library of Python 3.11+: it runs in whatever interpreter the sandbox has. It
runs as a script under ``-I``, where its own directory is not on sys.path:
its siblings are imported with that directory put there for the import only
(install_runner copies and precompiles them all, so each is one small file
read at a sandbox's start outside the zygote).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import io
import json
import os
import resource
import signal
import sys
import types
from collections.abc import Callable
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._runner
    from . import _frames, _keeper, _kinds
except ImportError:  # a sandbox: top-level modules beside this file
    _BESIDE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _BESIDE)  # for these imports only (under -I it is not there)
    try:
        import _frames  # type: ignore[import-not-found, no-redef]
        import _keeper  # type: ignore[import-not-found, no-redef]
        import _kinds  # type: ignore[import-not-found, no-redef]
    finally:
        sys.path.remove(_BESIDE)

# traceback, importlib.util, inspect and asyncio are imported where they are
# needed: every sandbox in the pool pays for what is imported at start-up, and
# most calls never raise, load a module or run a coroutine.

_frames.OWN_FILES.add(__file__)

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4

_streams_made = False


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# Loaded once, at start-up (in the zygote, before any fork): not per sandbox.
_libc = _load_libc()


def _prctl(option: int, value: int) -> bool:
    if _libc is None:
        return False
    try:
        return int(_libc.prctl(option, value, 0, 0, 0)) == 0
    except AttributeError:
        return False


# --------------------------------------------------------------------------- worker

_LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "fsize_bytes": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
}


def _apply_limits(limits: dict[str, int]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in _LIMITS.items():
        value = limits.get(key)
        if not value:
            continue
        soft, hard = int(value), int(value)
        if which == resource.RLIMIT_CPU:
            hard = soft + 1  # SIGXCPU at the soft limit, SIGKILL one second later
        _, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(which, (soft, hard))


def _read_request() -> dict[str, Any]:
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    if not chunks:
        # The daemon closed the pipe without a request: the sandbox is discarded.
        os._exit(0)
    request: dict[str, Any] = json.loads(b"".join(chunks))
    return request


def _worker() -> None:
    os.setsid()
    # Keep the frame pipe away from the low descriptors tool code is likely to
    # reuse, and out of programs it execs.
    inherited = _frames.get_fd()
    _frames.set_fd(_fcntl_dup_high(inherited))
    os.close(inherited)
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    # The handlers tool code starts with, as under `python -c`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _warm()
    # Loaded now (a no-op in the zygote's workers), not on the call's path.
    _kinds.import_beside("_artifacts")
    _frames.write_frame({"t": "ready", "worker": os.getpid(), "keeper": os.getppid()})

    request = _read_request()
    if request.get("kind") == "session":
        _serve_session(request)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if request.get("egress"):
        # Before the limits: its thread must not count against a tight nproc.
        _kinds.import_beside("_egress").ensure_relay()
    _apply_limits(request.get("limits", {}))
    workdir = request.get("cwd")
    if workdir:
        os.chdir(workdir)
    workspace = os.getcwd()  # outputs/ is where the call starts, wherever it goes
    os.environ.clear()
    os.environ.update(request.get("env", {}))
    if request.get("egress"):  # pip installs into the workspace (see _packages.py)
        _kinds.import_beside("_packages").activate(workspace)

    kind = request.get("kind")
    write_frame = _frames.write_frame
    sender = _kinds.artifact_sender(request, write_frame) if kind in _kinds.CALL_KINDS else None
    try:
        frame = _kinds.run(request, write_frame)
    except SystemExit as exc:
        frame = _frames.system_exit_frame(exc)
    except BaseException as exc:
        frame = {"t": "result", "ok": False, "exit_code": 1, "error": _frames.error(exc)}
    if sender is not None:
        _kinds.end_artifacts(sender, workspace, rich=kind == "code")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if request.get("egress"):
        # The call is over, and a seal needs this to be the only thread left.
        _kinds.import_beside("_egress").stop_relay()
    if request.get("seal") and _keeper.seal():
        frame["sealed"] = True
    frame["usage"] = _usage()
    write_frame(frame)
    os._exit(int(frame.get("exit_code", 0)) & 0xFF)


def _usage() -> dict[str, float]:
    """What the worker and the children it waited for used, by rusage.

    The daemon prefers the sandbox's cgroup where it has one (it also counts
    processes nobody waited for); this is what a sandbox without one reports.
    A worker is a fresh fork, so its counters start at the call.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
    # ru_maxrss is in KiB on Linux: the largest single process, not their sum.
    return {"cpu_s": cpu, "memory_peak_bytes": max(me.ru_maxrss, children.ru_maxrss) * 1024}


def _serve_session(request: dict[str, Any]) -> None:
    """Become a session's supervisor (see _session.py). Never returns.

    _session.py sits beside this file; under ``-I`` its directory is not on
    sys.path, so it is put there for the import only (the zygote imports
    _session at start: then this finds it loaded).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import _session  # type: ignore[import-not-found]  # beside this file
    finally:
        sys.path.remove(here)
    _session.serve(request, sys.modules[__name__])


def _warm() -> None:
    """Walk the call's path once, on a dummy request, before the call comes.

    The worker is a fork: every memory page it writes to is copied then, at a
    page fault each (expensive on small VMs). Touching the objects the call path
    uses now moves those copies from the call to the pool's refill.
    """
    request = json.loads(_WARM_REQUEST)
    for which in _LIMITS.values():
        resource.getrlimit(which)
    # The environment is replaced by the request's anyway: clear it now.
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.clear()
    main = types.ModuleType("__main__")
    exec(compile(request["code"], "<code>", "exec"), main.__dict__)
    text = json.dumps(
        {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0},
        default=str,
        ensure_ascii=False,
    )
    ("\n" + text + "\n").encode("utf-8", "replace")


_WARM_REQUEST = json.dumps(
    {
        "kind": "code",
        "code": "x = [1]\nx.append(len(x))",
        "limits": {"cpu_s": 1},
        "cwd": "/",
        "env": {"PATH": "/usr/bin", "LANG": "C.UTF-8"},
        "seal": True,
    }
)


def _fcntl_dup_high(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def run_sandbox(
    frames_fd: int,
    cgroup_fds: list[int],
    *,
    keeper_setup: Callable[[], None] | None = None,
) -> None:
    """Become a sandbox's keeper, with a worker waiting for its request. Never returns.

    Args:
        frames_fd: Where frames go (stdin, stdout and stderr are already the pipes).
        cgroup_fds: The sandbox's cgroup.procs files, opened by the daemon.
        keeper_setup: Run by the keeper once the worker is forked.
    """
    _frames.set_fd(frames_fd)
    # Join the sandbox's cgroups before forking, so the worker and all it starts
    # are counted. The daemon opened their cgroup.procs files; writing "0" moves
    # the writer itself, which works from inside pid and user namespaces too.
    for fd in cgroup_fds:
        os.write(fd, b"0")
        os.close(fd)
    if os.getpid() != 1:  # pid 1 of a pid namespace inherits every orphan anyway
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        _be_worker(None)
    if keeper_setup is not None:
        keeper_setup()
    os.close(0)
    _keeper.keep(pid)
    os._exit(0)


def run_worker(frames_fd: int, setup: Callable[[], None]) -> None:
    """Be a sandbox's worker, with no keeper: the zygote's sandboxes. Never returns.

    There the zygote is the worker's parent (it reaps it and sweeps the sandbox
    by killing its pid 1), so nothing needs a keeper process.

    Args:
        frames_fd: Where frames go.
        setup: Run first (descriptors, namespaces, mounts, filters): when it
            raises, the worker reports it on stderr and exits 111.
    """
    _frames.set_fd(frames_fd)
    _be_worker(setup)


def _be_worker(setup: Callable[[], None] | None) -> None:
    """Set up (if asked), then wait for the request and run it. Never returns."""
    if setup is not None:
        try:
            setup()
        except BaseException as exc:  # nothing of a failed setup may run a tool
            os.write(2, f"sandbox setup failed: {exc}\n".encode())
            os._exit(111)
    if not _streams_made:
        _text_streams()
    _worker()
    os._exit(0)


def _text_streams() -> None:
    """Text streams that flush at each newline, so streamed lines arrive as printed.

    They write to descriptors 1 and 2, whatever those are when they write: the
    zygote makes them once, for every worker it forks.
    """
    global _streams_made
    _streams_made = True
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _shield_keeper() -> None:
    """Keep the worker, same uid and no capabilities either, out of the keeper.

    A process that is not dumpable cannot be ptraced, nor its memory,
    environment or descriptors opened through /proc, by one without
    CAP_SYS_PTRACE: tool code cannot take over the process that outlives it.
    (A zygote sandbox has no keeper; its pid 1 keeps capabilities the worker
    lacks, which shields it the same way.)
    """
    if not _prctl(PR_SET_DUMPABLE, 0):
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> None:
    argv = sys.argv[1:]
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    if "--connect" in options:
        connect_sandbox(options["--connect"])
    cgroup_fds = [int(fd) for fd in options.get("--cgroup-fds", "").split(",") if fd]
    run_sandbox(int(options["--frames-fd"]), cgroup_fds, keeper_setup=_shield_keeper)


def connect_sandbox(path: str, timeout_s: float = 60.0) -> None:
    """Fetch the sandbox's pipes from the daemon over a Unix socket, then run_sandbox.

    The start mode for containers (``_runner.py --connect PATH``), which cannot
    inherit descriptors from the daemon: the daemon listens on PATH (a socket in
    a directory bind-mounted into the container) before the container starts,
    and answers the one connection with four descriptors (SCM_RIGHTS), in this
    order: the request pipe's read end, the stdout and stderr pipes' write ends
    and the frame pipe's write end. They become descriptors 0, 1, 2 and the
    frame descriptor, exactly as a runner the daemon spawned would have them;
    from there on nothing differs. Never returns.
    """
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        _, fds, _, _ = socket.recv_fds(sock, 16, 4, socket.MSG_CMSG_CLOEXEC)
    if len(fds) != 4:
        raise SystemExit(f"tooljail runner: expected 4 descriptors from {path}, got {len(fds)}")
    # Above every standard descriptor first, so that no dup2 below overwrites
    # a received one that happens to sit at 0, 1 or 2.
    high = [_fcntl_dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(high[:3]):
        os.dup2(fd, target)
        os.close(fd)
    run_sandbox(high[3], [], keeper_setup=_shield_keeper)


if __name__ == "__main__":
    main()
