"""The zygote: a warm interpreter that forks one fresh sandbox per request.

Started once per daemon inside bubblewrap (read-only system, no network, no
capabilities, the daemon's sandbox uid), as
``python -I -B _zygote.py --control-fd C --seccomp-fd S``. Starting a sandbox is
then a fork of this already-warm interpreter instead of bubblewrap plus a new
interpreter: that is what lets the pool refill as fast as calls come.

At start-up it moves into a user namespace of its own (same uid), which gives
it the capabilities to make namespaces inside it and none outside. For each
spawn request on the control socket (a JSON message with the child's stdin,
stdout, stderr, frame pipe and cgroup descriptors attached) it makes two
processes:

1. pid 1, in new mount, pid, ipc, uts and net namespaces: a clone that shares
   the zygote's memory and only sleeps in pause() (no Python runs in it, so it
   copies no page, and it is never scheduled again until it is killed);
2. the worker, forked from the zygote straight into pid 1's pid namespace
   (pid 2 there), which joins pid 1's other namespaces and the sandbox's
   cgroups, mounts a fresh /proc and size-capped tmpfs on /tmp, /dev/shm and
   /workspace, drops every capability, sets no-new-privileges and the seccomp
   filter, and only then waits for its call.

The zygote is the worker's parent, so it hears how the worker ended; it then
kills pid 1, and when pid 1 of a sandbox dies the kernel kills everything left
in it. Killing pid 1 is also how the daemon ends a sandbox early. If the zygote
dies, bubblewrap's init exits, and its pid namespace, every sandbox's included,
goes with it. Replies: {"id", "pid"} once both processes exist ({"id", "error"}
when they could not be made), then {"id", "exit", "worker"} when pid 1 has ended
(and so everything in the sandbox): "worker" says how the worker ended,
{"code", "signal"}, or null.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _devices  # type: ignore[import-not-found]  # beside this file; path set above
import _egress  # type: ignore[import-not-found]  # beside this file; path set above
import _keeper  # type: ignore[import-not-found]  # beside this file; path set above
import _runner  # type: ignore[import-not-found]  # beside this file; path set above
import _session  # type: ignore[import-not-found]  # noqa: F401  # loaded once, for every session

CLONE_VM = 0x00000100
CLONE_FILES = 0x00000400
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_CAPBSET_DROP = 24
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = 126  # x86_64; other arches are refused at start-up
SYS_PIDFD_OPEN = 434  # the same on every architecture
PID1_STACK_BYTES = 16 * 1024

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


class _Seccomp:
    """The filter program, made ready for prctl once, in the zygote."""

    def __init__(self, program: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(program)  # kept alive with the struct
        self.prog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))


def _apply_seccomp(seccomp: _Seccomp) -> None:
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(seccomp.prog), 0, 0),
        "seccomp",
    )


_CAP_HEADER = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
_NO_CAPS = bytes(24)  # two zeroed {effective, permitted, inheritable}


def _drop_bounding_set() -> None:
    """Empty the bounding set: no exec of anything this process starts gains a capability.

    Done once, in the zygote (which never execs, and whose own capabilities the
    bounding set does not touch): every sandbox inherits it empty.
    """
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22:
                break  # EINVAL: past the last capability this kernel knows
            _check(-1, f"drop capability {cap} from the bounding set")


def _drop_capabilities() -> None:
    """Drop every capability this process has (effective, permitted, inheritable)."""
    _check(libc.syscall(SYS_CAPSET, _CAP_HEADER, _NO_CAPS), "capset")


def _setup_sandbox(params: dict[str, Any], seccomp: _Seccomp) -> None:
    """In the worker, before anything else: mounts, hostname, capabilities, seccomp."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for path, size in (
        ("/tmp", params["tmp_bytes"]),
        ("/dev/shm", params["tmp_bytes"]),
        ("/workspace", params["workspace_bytes"]),
    ):
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size)},mode=1777")
    # Tool and files directories that lay under a path just mounted afresh are
    # bound again, read-only, from where the zygote keeps a second view of them.
    fresh = ("/tmp/", "/dev/shm/", "/workspace/")
    for source, target in params.get("shared", []):
        if target.startswith(fresh):
            os.makedirs(target, exist_ok=True)
            _mount(source, target, None, MS_BIND | MS_REC, None)
            _mount(
                "none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None
            )
    if params.get("egress_view"):
        _egress.enter(params["egress_view"], params.get("egress"))
    _devices.own_devices()  # a devpts instance, the loopback up
    os.chdir("/workspace")
    _check(libc.sethostname(b"tooljail", 8), "sethostname")
    _drop_capabilities()
    _apply_seccomp(seccomp)


def _own_user_namespace() -> None:
    """Move into a user namespace of our own, as the same uid and gid.

    Its creator holds every capability in it, and the namespaces each sandbox
    gets (mount, pid, net, ipc, uts) are made by clone() as its children: so
    no sandbox needs a user namespace (and uid and gid maps) of its own. The
    capabilities stop at this namespace's edge: nothing outside it is ours to
    change. Each sandbox's pid 1 drops them all before any tool code runs.
    """
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


# pid 1 runs libc's pause() and nothing else: its address, for clone().
_PAUSE = ctypes.cast(libc.pause, ctypes.c_void_p)
libc.clone.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
libc.clone.restype = ctypes.c_int


def _start_pid1(flags: int, stack: ctypes.Array[ctypes.c_char]) -> int:
    """Make a sandbox's pid 1: a clone sharing this process's memory that only sleeps.

    It runs libc's pause() on `stack` (which must outlive it) and no Python:
    sharing the memory costs no copy of the page tables and no page fault, and
    its exit unmaps nothing. It shares the descriptor table too, so it holds
    none of the sandbox's pipes once the zygote has closed its own: the daemon
    sees their end as soon as the worker and what it started are gone.

    It is unreachable from the sandbox: a process cannot signal its pid
    namespace's init unless the init handles the signal (SIGCHLD is blocked and
    SIGINT ignored here, so it handles none), nor trace it or open its memory,
    descriptors or environment without holding every capability it holds (it
    keeps the zygote's; the worker drops all of them).
    Orphans the tool leaves are re-parented to it and stay zombies until the
    sandbox ends.

    Raises:
        OSError: When the kernel refuses.
    """
    top = (ctypes.addressof(stack) + len(stack)) & ~15
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        pid = int(libc.clone(_PAUSE, top, flags | CLONE_VM | CLONE_FILES | signal.SIGCHLD, None))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    return pid


def _pidfd_open(pid: int) -> int:
    fd = int(libc.syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_long(pid), ctypes.c_long(0)))
    if fd < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"pidfd_open: {os.strerror(errno)}")
    return fd


def _setns(fd: int, nstype: int) -> None:
    _check(libc.setns(fd, nstype), "setns")


def _start_worker(pid1: int, own_pid_ns: int) -> tuple[int, int]:
    """Fork the worker into pid 1's pid namespace, where it is pid 2.

    Returns:
        (0, a pidfd of pid 1, to join its other namespaces by) in the worker;
        (the worker's pid, -1) here.

    Raises:
        OSError: When pid 1 is gone or the fork fails (nothing is left changed).
        SystemExit: When this process cannot point its children's pid namespace
            back at its own: it could make no more sandboxes, so it ends, and
            the daemon starts another zygote.
    """
    pidfd = _pidfd_open(pid1)
    try:
        _setns(pidfd, CLONE_NEWPID)  # where this process's children go; not itself
    except BaseException:
        os.close(pidfd)
        raise
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # the worker inherits them: nothing of ours may reach a call
    try:
        worker = os.fork()
    except BaseException:
        _pid_ns_back(own_pid_ns)
        os.close(pidfd)
        raise
    if worker == 0:
        return 0, pidfd
    _pid_ns_back(own_pid_ns)
    os.close(pidfd)
    return worker, -1


def _pid_ns_back(own_pid_ns: int) -> None:
    try:
        _setns(own_pid_ns, CLONE_NEWPID)
    except OSError as exc:
        raise SystemExit(f"the zygote cannot return to its pid namespace: {exc}") from exc


def _worker(
    params: dict[str, Any],
    fds: list[int],
    seccomp: _Seccomp,
    pidfd: int,
    zygote_fds: tuple[int, ...],
) -> None:
    """The worker, just forked: into the sandbox, then the runner's worker. Never returns."""
    try:
        stdin, stdout, stderr, frames, *cgroups = fds

        def setup() -> None:
            os.dup2(stdin, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            namespaces = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
            if not params.get("network"):
                namespaces |= CLONE_NEWNET
            _setns(pidfd, namespaces)
            for fd in (pidfd, stdin, stdout, stderr, *zygote_fds):
                if fd > 2:
                    os.close(fd)
            for fd in cgroups:
                os.write(fd, b"0")
                os.close(fd)
            _setup_sandbox(params, seccomp)

        _runner.run_worker(frames, setup)
    except BaseException as exc:  # nothing of a failed setup may run a tool
        try:
            os.write(2, f"sandbox setup failed: {exc}\n".encode())
        finally:
            os._exit(111)


def _become_init(control: int) -> None:
    """Go on as pid 1 of a pid namespace of our own; the process we were only waits.

    Each worker is forked into its sandbox's pid namespace by pointing the
    namespace our children get at it (setns) and back. Back must be the
    namespace we live in, and only one that our user namespace owns lets us
    in; bubblewrap's does not. Ours then holds every sandbox's, and ends (with
    all of them) when we do.
    """
    _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    zygote = os.fork()
    if zygote == 0:
        return
    os.close(control)  # the daemon must see the zygote's end when it comes
    while True:
        try:
            _, status = os.waitpid(zygote, 0)
        except InterruptedError:
            continue
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _end_of(status: int | None) -> dict[str, int | None] | None:
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return {"code": None, "signal": os.WTERMSIG(status)}
    return {"code": os.WEXITSTATUS(status), "signal": None}


class _Box:
    """One sandbox as the zygote knows it."""

    __slots__ = ("ident", "pid1", "stack", "worker", "worker_status")

    def __init__(self, ident: str, pid1: int, stack: ctypes.Array[ctypes.c_char]) -> None:
        self.ident = ident
        self.pid1 = pid1
        self.stack = stack  # pid 1 runs on it: kept until pid 1 is reaped
        self.worker = 0
        self.worker_status: int | None = None


class _Zygote:
    """The zygote at work: its control socket, and the sandboxes it has made."""

    def __init__(self, control: int, seccomp: _Seccomp) -> None:
        self.seccomp = seccomp
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        _check_setns_on_pidfd()
        self.sock = socket.socket(fileno=control)
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.boxes: dict[str, _Box] = {}
        self.by_pid1: dict[int, _Box] = {}
        self.by_worker: dict[int, _Box] = {}
        self.zygote_fds = (self.wake_r, wake_w, control, self.own_pid_ns)
        """What a worker closes first: the zygote's own descriptors."""

    def serve(self) -> None:
        """Answer the daemon until it is gone. Returns then (the zygote ends)."""
        _runner._text_streams()  # the workers' sys.stdout and sys.stderr, made once
        # Every sandbox is a fork of this process: keep the collector of each from
        # walking (and so copying, page by page) the objects they all inherit.
        gc.freeze()
        self.sock.send(json.dumps({"ready": os.getpid()}).encode())
        while True:
            watched: list[Any] = [self.sock, self.wake_r]
            readable, _, _ = select.select(watched, [], [])
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
                self._reap()
            if self.sock in readable and not self._answer():
                return

    def _reap(self) -> None:
        """Kill the sandbox of each worker that ended; report each sandbox gone."""
        reaped = _keeper.reap_all()
        gone = {pid for pid, _ in reaped}
        for pid, status in reaped:
            box = self.by_worker.pop(pid, None)
            if box is not None:
                box.worker_status = status
                if box.pid1 not in gone:  # (a reaped pid may be anyone's now)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(box.pid1, signal.SIGKILL)
        for pid, status in reaped:
            box = self.by_pid1.pop(pid, None)
            if box is not None:
                self.boxes.pop(box.ident, None)
                self.by_worker.pop(box.worker, None)
                ended = {
                    "id": box.ident,
                    "exit": os.waitstatus_to_exitcode(status),
                    "worker": _end_of(box.worker_status),
                }
                self.sock.send(json.dumps(ended).encode())

    def _answer(self) -> bool:
        """Serve one request of the daemon's; False when the daemon is gone."""
        try:
            message, fds, _, _ = socket.recv_fds(self.sock, 65536, 16)
        except OSError:
            return False
        if not message:
            return False  # the daemon is gone: so are we (and, with us, nothing else)
        request = json.loads(message)
        if request.get("op") == "kill":
            box = self.boxes.get(request["id"])
            if box is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(box.pid1, signal.SIGKILL)
        else:
            self._spawn(request, fds)
        return True

    def _spawn(self, request: dict[str, Any], fds: list[int]) -> None:
        """Make a sandbox (pid 1, then its worker); say which, or why not."""
        ident = request["id"]
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if not request.get("network"):
            flags |= CLONE_NEWNET
        try:
            stack = ctypes.create_string_buffer(PID1_STACK_BYTES)
            box = _Box(ident, _start_pid1(flags, stack), stack)
        except OSError as exc:
            self._refuse(ident, fds, exc)
            return
        self.boxes[ident] = box
        self.by_pid1[box.pid1] = box
        try:
            worker, pidfd = _start_worker(box.pid1, self.own_pid_ns)
        except OSError as exc:
            os.kill(box.pid1, signal.SIGKILL)  # its exit is reported as it comes
            self._refuse(ident, fds, exc)
            return
        if worker == 0:
            _worker(request, fds, self.seccomp, pidfd, self.zygote_fds)
        for fd in fds:
            os.close(fd)
        box.worker = worker
        self.by_worker[worker] = box
        self.sock.send(json.dumps({"id": ident, "pid": box.pid1}).encode())

    def _refuse(self, ident: str, fds: list[int], exc: OSError) -> None:
        for fd in fds:
            os.close(fd)
        self.sock.send(json.dumps({"id": ident, "error": str(exc)}).encode())


def _check_setns_on_pidfd() -> None:
    """setns() on a pidfd (Linux >= 5.8) is how workers get into their sandbox:
    fail here, at start-up, where the daemon falls back to one bubblewrap per
    sandbox, rather than at every spawn."""
    self_fd = _pidfd_open(os.getpid())
    try:
        _setns(self_fd, CLONE_NEWPID)  # our own: changes nothing
    finally:
        os.close(self_fd)


def main() -> None:
    argv = sys.argv[1:]
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    control = int(options["--control-fd"])
    with os.fdopen(int(options["--seccomp-fd"]), "rb") as f:
        seccomp = _Seccomp(f.read())
    if os.uname().machine != "x86_64":
        raise SystemExit("the zygote knows capset's number on x86_64 only")
    _own_user_namespace()
    _drop_bounding_set()
    _become_init(control)
    # pid 1 gets our signal dispositions: none may make it run Python.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _Zygote(control, seccomp).serve()


if __name__ == "__main__":
    main()
