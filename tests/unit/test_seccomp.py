"""The sandbox seccomp filter: its verdicts, and its effect under real bubblewrap.

The first half runs the compiled program in a small classic-BPF interpreter
(only libseccomp needed). The second half starts `bwrap --seccomp FD` as root
and as `nobody` and checks, from inside, that the dangerous calls fail with
EPERM while ordinary work (fork, subprocess, threads, multiprocessing, files,
sockets) still succeeds, and that without the filter the same probes do not
fail with EPERM, so it is the filter that stops them.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import struct
import subprocess
import textwrap
from collections.abc import Iterator

import pytest

from tooljaild.sandbox import seccomp
from tooljaild.sandbox.seccomp import SeccompError

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
SANDBOX_PYTHON = "/usr/bin/python3"
NOBODY = 65534

HAVE_SECCOMP, SECCOMP_REASON = seccomp.available()
needs_libseccomp = pytest.mark.skipif(not HAVE_SECCOMP, reason=SECCOMP_REASON)

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_EPERM = 0x00050000 | errno.EPERM
RET_ENOSYS = 0x00050000 | errno.ENOSYS
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
SIGCHLD = 17
CLONE_THREAD_FLAGS = 0x3D0F00  # what glibc's pthread_create passes


def nr(name: str) -> int:
    number = seccomp._resolve(seccomp._load(), name)
    assert number is not None, name
    return number


def native_arch() -> int:
    return int(seccomp._load().seccomp_arch_native())


def run_bpf(
    program: bytes, syscall: int, args: tuple[int, ...] = (), arch: int | None = None
) -> int:
    """Run a seccomp classic-BPF program on one system call; return its verdict."""
    data = struct.pack(
        "=IIQ6Q",
        syscall & 0xFFFFFFFF,
        native_arch() if arch is None else arch,
        0,
        *(list(args) + [0] * (6 - len(args))),
    )
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    acc = 0
    pc = 0
    for _ in range(len(insns) + 1):  # classic BPF only jumps forward
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:  # and #k
            acc &= k
        elif code == 0x06:  # ret #k
            return int(k)
        elif code == 0x05:  # ja
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):  # jeq, jgt, jge, jset #k
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"opcode {code:#x} not handled by this interpreter")
    raise AssertionError("program did not return")


# -- the program itself ---------------------------------------------------------------


@needs_libseccomp
def test_program_is_cached_and_well_formed() -> None:
    program = seccomp.build_filter()
    assert program and len(program) % 8 == 0
    assert len(program) // 8 < 4096  # the kernel's BPF_MAXINSNS
    assert seccomp.build_filter() is program


@needs_libseccomp
def test_denied_syscalls_return_eperm() -> None:
    program = seccomp.build_filter()
    lib = seccomp._load()
    checked = 0
    for name in seccomp.DENIED_SYSCALLS:
        number = seccomp._resolve(lib, name)
        if number is None:
            continue  # not on this architecture
        assert run_bpf(program, number) == RET_EPERM, name
        checked += 1
    assert checked >= len(seccomp.DENIED_SYSCALLS) - 5


@needs_libseccomp
@pytest.mark.parametrize(
    "name", ["read", "write", "openat", "mmap", "execve", "socket", "wait4", "seccomp"]
)
def test_ordinary_syscalls_are_allowed(name: str) -> None:
    assert run_bpf(seccomp.build_filter(), nr(name)) == RET_ALLOW


@needs_libseccomp
def test_clone_is_denied_only_with_namespace_flags() -> None:
    program = seccomp.build_filter()
    clone = nr("clone")
    assert run_bpf(program, clone, (SIGCHLD,)) == RET_ALLOW
    assert run_bpf(program, clone, (CLONE_THREAD_FLAGS,)) == RET_ALLOW
    assert run_bpf(program, clone, (0x4111,)) == RET_ALLOW  # vfork-style CLONE_VM|CLONE_VFORK
    for name, flag in seccomp.CLONE_NAMESPACE_FLAGS.items():
        assert run_bpf(program, clone, (flag | SIGCHLD,)) == RET_EPERM, name
        assert run_bpf(program, clone, (flag | CLONE_THREAD_FLAGS,)) == RET_EPERM, name
    # The kernel reads legacy clone's flags as 32 bits; junk above them changes nothing.
    assert run_bpf(program, clone, ((0xABCD << 32) | 0x10000000 | SIGCHLD,)) == RET_EPERM
    assert run_bpf(program, nr("clone3")) == RET_ENOSYS


@needs_libseccomp
def test_personality_allows_only_query_and_harmless_personas() -> None:
    program = seccomp.build_filter()
    personality = nr("personality")

    def expected(value: int) -> int:
        low = value & 0xFFFFFFFF
        harmless = low & ~seccomp.PERSONALITY_ALLOWED_BITS == 0
        return RET_ALLOW if low == seccomp.PERSONALITY_QUERY or harmless else RET_EPERM

    values = {0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF, 2**64 - 1, 0x40000, 0x400000, 0xFFFFFFFE}
    for a in range(32):
        values.add(1 << a)
        values.add(0xFFFFFFFF ^ (1 << a))
        for b in range(32):
            values.add((1 << a) | (1 << b))
            values.add(0xFFFFFFFF ^ (1 << a) ^ (1 << b))
    values.add((0x5 << 32) | 0x8)
    for value in sorted(values):
        assert run_bpf(program, personality, (value,)) == expected(value), hex(value)
    assert run_bpf(program, personality, (0x40000,)) == RET_EPERM  # ADDR_NO_RANDOMIZE


@needs_libseccomp
def test_foreign_abis_are_killed() -> None:
    program = seccomp.build_filter()
    if native_arch() != AUDIT_ARCH_X86_64:
        pytest.skip("the foreign ABIs checked here are x86_64's")
    assert run_bpf(program, 0, arch=AUDIT_ARCH_I386) == RET_KILL_PROCESS
    x32_unshare = 0x40000000 | 272
    assert run_bpf(program, x32_unshare) == RET_KILL_PROCESS


@needs_libseccomp
def test_filter_fd_is_fresh_sealed_and_rewound() -> None:
    program = seccomp.build_filter()
    fds = [seccomp.filter_fd(), seccomp.filter_fd()]
    try:
        assert fds[0] != fds[1]
        for fd in fds:
            assert os.lseek(fd, 0, os.SEEK_CUR) == 0
            assert os.read(fd, len(program) + 1) == program
            assert not os.get_inheritable(fd)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
            with pytest.raises(PermissionError):
                os.pwrite(fd, b"\0" * 8, 0)
    finally:
        for fd in fds:
            os.close(fd)


@needs_libseccomp
def test_write_filter(tmp_path: os.PathLike[str]) -> None:
    path = seccomp.write_filter(os.path.join(tmp_path, "filter.bpf"))
    assert path.read_bytes() == seccomp.build_filter()


@pytest.fixture
def no_libseccomp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    seccomp.build_filter.cache_clear()
    monkeypatch.setattr(seccomp, "_lib", None)
    monkeypatch.setattr(seccomp, "LIBRARY_NAME", "libseccomp-not-here.so.2")
    yield
    seccomp.build_filter.cache_clear()


def test_missing_libseccomp_is_a_clear_error(no_libseccomp: None) -> None:
    ok, reason = seccomp.available()
    assert not ok
    assert "libseccomp-not-here.so.2" in reason and "apt-get install libseccomp2" in reason
    with pytest.raises(SeccompError, match="apt-get install libseccomp2"):
        seccomp.build_filter()
    with pytest.raises(SeccompError):
        seccomp.filter_fd()


# -- under bubblewrap ---------------------------------------------------------------

PROBES = textwrap.dedent(
    """
    import ctypes, errno, json, os, sys

    NR = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    L = ctypes.c_long

    def result(ret):
        return ctypes.get_errno() if ret == -1 else 0

    def sys_call(name, *args):
        ctypes.set_errno(0)
        return result(libc.syscall(L(NR[name]), *[L(a) for a in args]))

    def clone(flags):
        ctypes.set_errno(0)
        ret = libc.syscall(L(NR["clone"]), L(flags | 17), L(0), L(0), L(0), L(0))
        if ret == 0:
            os._exit(0)  # the child, should there be one
        if ret > 0:
            os.waitpid(ret, 0)
        return result(ret)

    def traceme():
        # In a child, so that nothing else runs traced.
        pid = os.fork()
        if pid == 0:
            ctypes.set_errno(0)
            os._exit(result(libc.ptrace(L(0), L(0), L(0), L(0))))
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    out = {
        "clone(CLONE_NEWUSER)": clone(0x10000000),
        "clone(CLONE_NEWNS)": clone(0x00020000),
        "mount": result(libc.mount(b"none", None, b"tmpfs", L(0), None)),
        "ptrace(PTRACE_TRACEME)": traceme(),
        "keyctl": sys_call("keyctl", 0, -3, 0),
        "bpf": sys_call("bpf", 0, 0, 0),
        "io_uring_setup": sys_call("io_uring_setup", 1, 0),
        "setns": sys_call("setns", -1, 0),
        "personality(ADDR_NO_RANDOMIZE)": sys_call("personality", 0x40000),
        "personality(query)": sys_call("personality", 0xFFFFFFFF),
        "clone3": sys_call("clone3", 0, 0),
        # Last: without the filter it succeeds, and the new namespace would
        # change what the probes above see.
        "unshare(CLONE_NEWUSER)": result(libc.unshare(0x10000000)),
    }
    print(json.dumps(out))
    """
)

WORK = textwrap.dedent(
    """
    import json, multiprocessing, os, socket, subprocess, tempfile, threading

    def child(queue):
        queue.put(os.getpid())

    if __name__ == "__main__":
        done = {}
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        done["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        done["subprocess"] = subprocess.run(["/bin/true"], timeout=30).returncode

        box = []
        thread = threading.Thread(target=box.append, args=(42,))
        thread.start()
        thread.join(30)
        done["thread"] = box

        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        child_pid = queue.get(timeout=30)
        proc.join(30)
        done["multiprocessing"] = [proc.exitcode, child_pid != os.getpid()]

        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            path = os.path.join(tmp, "a.txt")
            with open(path, "w") as f:
                f.write("hello")
            os.rename(path, path + ".2")
            with open(path + ".2") as f:
                done["file"] = f.read()

        left, right = socket.socketpair()
        with left, right:
            left.sendall(b"ping")
            done["socketpair"] = right.recv(4).decode()

        print(json.dumps(done))
    """
)

WORK_EXPECTED = {
    "fork": 7,
    "subprocess": 0,
    "thread": [42],
    "multiprocessing": [0, True],
    "file": "hello",
    "socketpair": "ping",
}

USERS = [pytest.param(None, id="root"), pytest.param(NOBODY, id="nobody")]


def _bwrap_missing() -> str | None:
    if not os.access(BWRAP, os.X_OK):
        return f"bubblewrap is not installed ({BWRAP}); apt-get install bubblewrap"
    if not os.access(SANDBOX_PYTHON, os.X_OK):
        return f"{SANDBOX_PYTHON} is missing"
    if not HAVE_SECCOMP:
        return SECCOMP_REASON
    return None


def run_in_bwrap(
    code: str, *args: str, uid: int | None, with_filter: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `python3 -c code args...` in bubblewrap, optionally as another user."""
    reason = _bwrap_missing()
    if reason:
        pytest.skip(reason)
    if uid is not None and os.geteuid() != 0:
        pytest.skip("switching to nobody needs root")
    fd = seccomp.filter_fd() if with_filter else -1
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    if with_filter:
        argv += ["--seccomp", str(fd)]
    argv += [SANDBOX_PYTHON, "-I", "-c", code, *args]
    try:
        proc: subprocess.CompletedProcess[str] = subprocess.run(
            argv,
            pass_fds=(fd,) if with_filter else (),
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            user=uid,
            group=uid,
            extra_groups=None if uid is None else [],
        )
    finally:
        if with_filter:
            os.close(fd)
    assert proc.returncode == 0, f"bwrap failed ({proc.returncode}):\n{proc.stderr}"
    return proc


def _probe(uid: int | None, with_filter: bool = True) -> dict[str, int]:
    numbers = {name: nr(name) for name in ("clone", "keyctl", "bpf", "io_uring_setup")}
    numbers |= {name: nr(name) for name in ("setns", "personality", "clone3")}
    proc = run_in_bwrap(PROBES, json.dumps(numbers), uid=uid, with_filter=with_filter)
    results: dict[str, int] = json.loads(proc.stdout)
    return results


@pytest.mark.isolation
@pytest.mark.parametrize("uid", USERS)
def test_dangerous_calls_fail_with_eperm_in_bwrap(uid: int | None) -> None:
    results = _probe(uid)
    named = {key: errno.errorcode.get(value, str(value)) for key, value in results.items()}
    expected = {key: "EPERM" for key in results}
    expected["personality(query)"] = "0"
    expected["clone3"] = "ENOSYS"
    assert named == expected


@pytest.mark.isolation
@pytest.mark.parametrize("uid", USERS)
def test_without_the_filter_the_probes_do_not_get_eperm(uid: int | None) -> None:
    """A control: the filter, not bwrap's dropped capabilities, causes the EPERMs."""
    results = _probe(uid, with_filter=False)
    for key in ("mount", "ptrace(PTRACE_TRACEME)", "keyctl", "io_uring_setup", "setns", "clone3"):
        assert results[key] != errno.EPERM, (key, results)
    assert results["clone3"] == errno.EINVAL  # reached the kernel's own argument check


@pytest.mark.isolation
@pytest.mark.parametrize("uid", USERS)
def test_ordinary_work_still_succeeds_in_bwrap(uid: int | None) -> None:
    proc = run_in_bwrap(WORK, uid=uid)
    assert json.loads(proc.stdout) == WORK_EXPECTED, proc.stderr
