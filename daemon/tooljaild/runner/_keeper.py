"""How a sandbox's processes end: the keeper's sweep, and the worker's seal.

The *keeper* (the process the daemon started, a child subreaper) forks the
worker and then only waits (`keep`): every process the tool leaves behind is
re-parented to it, and once the worker is gone it kills the whole tree
(`_kill_tree`) before it tells the daemon how the worker ended, so that nothing
the tool started is still running when the caller hears of the call's end.

The worker can do it itself, sooner, where the sandbox has a pid namespace of
its own (`seal`): then its result frame is the call's last word.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
import types

try:  # the daemon's view (mypy): tooljaild.runner._keeper
    from . import _frames
except ImportError:  # a sandbox: a top-level module; _runner.py imported _frames first
    import _frames  # type: ignore[import-not-found, no-redef]

# Made once here, in the zygote: valid_signals() builds an enum per signal (0.2 ms).
_ALL_SIGNALS = signal.valid_signals()


def _descendants(root: int) -> list[int]:
    """Every live process below `root`, found by walking /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            found.append(pid)
            stack.append(pid)
    return found


def _kill_tree(me: int) -> None:
    """SIGKILL everything below the keeper until nothing is left.

    Stopping first keeps a fork loop from outrunning the sweep; because the
    keeper is a subreaper, whatever a killed process leaves re-parents here and
    is found by the next pass.
    """
    for _ in range(1000):
        pids = _descendants(me)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        reap_all()
    reap_all()


def reap_all() -> list[tuple[int, int]]:
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


def keep(worker: int) -> None:
    """Be `worker`'s keeper: wait for it, sweep the tree, say how it ended. Never returns."""
    me = os.getpid()
    # The keeper holds no pipe the tool writes through, so EOF on stdout and
    # stderr means the whole tree is gone.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)

    stopping = False

    def on_term(signum: int, frame: types.FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status: int | None = None
    while status is None:
        try:
            pid, st = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if pid == worker:
            status = st
    # Sweep first, then report: when the caller hears how the call ended,
    # nothing the tool started is still running.
    _kill_tree(me)
    if status is None:
        _frames.write_frame({"t": "exit", "code": None, "signal": int(signal.SIGKILL)})
    elif os.WIFSIGNALED(status):
        _frames.write_frame({"t": "exit", "code": None, "signal": os.WTERMSIG(status)})
    else:
        _frames.write_frame({"t": "exit", "code": os.WEXITSTATUS(status), "signal": None})
    os._exit(0)


def seal() -> bool:
    """End the rest of the sandbox now, so that the result can be the last word.

    Without this, the daemon learns that a call is over from the keeper, after
    the worker has exited and the keeper has swept the tree: about a millisecond
    later. Here the worker does it itself, before it tells the result:

    - it blocks every signal (no handler of the tool's can run after this) and
      makes sure it is the only thread left (else: False, the keeper's way);
    - it closes every descriptor but the frame pipe, so the daemon's stdout and
      stderr pipes reach end-of-file once the others are dead;
    - it SIGKILLs every other process in the sandbox and waits until each is
      dead (a zombie for the keeper to reap).

    This needs a pid namespace of the sandbox's own, whose init is not this
    worker: the keeper as pid 1 (containers), or the zygote's sleeping pid 1
    with the worker's parent outside the namespace (where getppid() is 0).
    There, kill(-1) reaches exactly the tool's processes, and never pid 1 or
    anything outside. Elsewhere, False.

    Returns:
        True when nothing but this worker (about to exit) and pid 1 is alive.
    """
    if os.getpid() == 1 or os.getppid() not in (0, 1):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
        _, max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)
    except OSError:
        return False
    top = min(max_fds, 1 << 20) if max_fds != resource.RLIM_INFINITY else 1 << 20
    frame_fd = _frames.get_fd()
    os.closerange(0, frame_fd)
    os.closerange(frame_fd + 1, top)
    for _ in range(2000):  # ~2 s at most; a process stuck in the kernel loses this race
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True  # no other process at all
        except OSError:
            return False
        if not _others_alive():
            return True
        time.sleep(0.001)
    return False


def _others_alive() -> bool:
    """Whether a process other than pid 1 and this one is alive (zombies are not)."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in ("1", me):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone already
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X"):
            return True
    return False
