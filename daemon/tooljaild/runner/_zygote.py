"""The zygote: a warm interpreter that forks one fresh sandbox per request.

Started once per daemon inside bubblewrap (read-only system, no network, no
capabilities, the daemon's sandbox uid), as
``python -I -B _zygote.py --control-fd C --seccomp-fd S``. Starting a sandbox is
then a fork of this already-warm interpreter instead of bubblewrap plus a new
interpreter: that is what lets the pool refill as fast as calls come.

At start-up it moves into a user namespace of its own (same uid), which gives
it the capabilities to make namespaces inside it and none outside. For each
spawn request on the control socket (a JSON message with the child's stdin,
stdout, stderr, frame pipe and cgroup descriptors attached), it clones a child
into new mount, pid, ipc, uts and net namespaces. The child is the sandbox's
pid 1. It:

1. joins the sandbox's cgroups (through the descriptors the daemon opened),
2. becomes the runner's keeper: it forks the worker, drops its own
   capabilities and waits. The worker mounts a fresh /proc, and size-capped
   tmpfs on /tmp, /dev/shm and /workspace, drops every capability, sets
   no-new-privileges and the seccomp filter, and only then waits for its call.

When pid 1 of a sandbox dies, the kernel kills everything in it, so killing that
one process ends the sandbox; it dies with the zygote too (PDEATHSIG). Replies:
{"id", "pid"} after the clone ({"id", "error"} when it failed), {"id", "exit"}
when the child has ended.
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
import _runner  # type: ignore[import-not-found]  # beside this file; path set above

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
PR_SET_PDEATHSIG = 1
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = 126  # x86_64; other arches are refused at start-up
SYS_CLONE = 56  # x86_64

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


def _clone(flags: int) -> int:
    """fork() into new namespaces in one step: the child is pid 1 of its pid namespace.

    os.fork() takes no namespace flags, and unshare() then fork() costs a second
    process per sandbox (its fork, its page faults, its exit). The raw clone
    syscall skips glibc's and Python's after-fork bookkeeping, which this
    single-threaded zygote does not need: no other thread can hold a lock, and
    the child never calls raise() (whose cached thread id is stale after a raw
    clone). The worker that runs tool code is a normal os.fork() of the child,
    with all of that bookkeeping done.

    Returns:
        0 in the child; the child's pid in the parent.

    Raises:
        OSError: When the kernel refuses.
    """
    pid = int(
        libc.syscall(
            ctypes.c_long(SYS_CLONE),
            ctypes.c_long(flags | signal.SIGCHLD),
            ctypes.c_long(0),  # same stack (copied, as by fork)
            ctypes.c_long(0),
            ctypes.c_long(0),
            ctypes.c_long(0),
        )
    )
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"clone: {os.strerror(errno)}")
    return pid


def _child(
    params: dict[str, Any], fds: list[int], seccomp: _Seccomp, zygote_fds: tuple[int, ...]
) -> None:
    """The cloned child, pid 1 of its namespaces: the keeper, with a worker that sets up.

    Every page either process writes after a fork is copied for it, at a page
    fault each: so pid 1 forks the worker before anything else, and the worker
    does everything only it needs (the zygote's signal state, the pipes, the
    cgroups, the mounts and filters).
    """
    stderr = fds[2] if len(fds) > 2 else 2
    try:
        stdin, stdout, stderr, frames, *cgroups = fds

        def zygote_signals_off() -> None:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)

        def worker_setup() -> None:
            os.dup2(stdin, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            zygote_signals_off()
            for fd in (stdin, stdout, stderr, *zygote_fds):
                if fd > 2:
                    os.close(fd)
            # Only the worker joins the sandbox's cgroups: all the tool starts
            # descends from it, and pid 1 runs none of it.
            for fd in cgroups:
                os.write(fd, b"0")
                os.close(fd)
            _setup_sandbox(params, seccomp)

        def keeper_setup() -> None:
            zygote_signals_off()
            # The keeper holds no pipe the tool writes through, so EOF on stdout
            # and stderr means the whole tree is gone. It keeps the capabilities
            # it holds in the zygote's user namespace (decision 29): it runs no
            # tool code, and they keep the capability-less worker from reading
            # or writing its memory, descriptors or environment.
            for fd in (stdin, stdout, stderr, *cgroups, *zygote_fds):
                os.close(fd)

        _runner.run_sandbox(frames, [], worker_setup=worker_setup, keeper_setup=keeper_setup)
    except BaseException as exc:  # nothing of a failed setup may run a tool
        try:
            os.write(stderr, f"sandbox setup failed: {exc}\n".encode())
        finally:
            os._exit(111)
    os._exit(0)


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
    sock = socket.socket(fileno=control)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, str] = {}
    # Every sandbox is a fork of this process: keep the collector of each from
    # walking (and so copying, page by page) the objects they all inherit.
    gc.freeze()
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        watched: list[Any] = [sock, wake_r]
        readable, _, _ = select.select(watched, [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            for pid, status in _runner._reap_all():
                ident = children.pop(pid, None)
                if ident is not None:
                    code = os.waitstatus_to_exitcode(status)
                    sock.send(json.dumps({"id": ident, "exit": code}).encode())
        if sock in readable:
            try:
                message, fds, _, _ = socket.recv_fds(sock, 65536, 16)
            except OSError:
                return
            if not message:
                return  # the daemon is gone: so are we (and, with us, nothing else)
            request = json.loads(message)
            if request.get("op") == "kill":
                target = next((p for p, i in children.items() if i == request["id"]), None)
                if target is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(target, signal.SIGKILL)
                continue
            flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
            if not request.get("network"):
                flags |= CLONE_NEWNET
            try:
                pid = _clone(flags)
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"id": request["id"], "error": str(exc)}).encode())
                continue
            if pid == 0:
                _child(request, fds, seccomp, (wake_r, wake_w, control))
            for fd in fds:
                os.close(fd)
            children[pid] = request["id"]
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


if __name__ == "__main__":
    main()
