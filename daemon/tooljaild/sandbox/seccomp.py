"""A seccomp filter for sandboxes, compiled with the system's libseccomp.

The filter allows every system call by default and denies, with ``EPERM``, the
ones no tool needs and that widen the kernel's attack surface: mounting,
tracing other processes, loading kernel code, keyrings, io_uring, new
namespaces and the like (see ``DENIED_SYSCALLS``). Denied calls fail cleanly
(Python raises ``PermissionError``) instead of killing the process, so a tool
that probes for a feature gets an answer it can handle.

Three calls get finer rules:

- ``personality`` may only query the persona or set PER_LINUX32 and UNAME26
  (see ``PERSONALITY_ALLOWED_BITS``);
- ``clone`` with any ``CLONE_NEW*`` namespace flag fails with ``EPERM``, while
  ordinary ``fork()``, threads and ``posix_spawn`` keep working;
- ``clone3`` fails with ``ENOSYS``. Its flags live in a struct in memory, which
  a seccomp filter cannot read, so it cannot be filtered by flag; ``ENOSYS``
  makes glibc fall back to ``clone``, which is filtered.

System calls of a foreign ABI (i386 ``int 0x80`` or x32 on x86_64) kill the
process: no tool has a reason to use them, and they would bypass the rules,
which are written for the native ABI only.

The program is compiled once per process (``build_filter``) and handed to
bubblewrap as ``bwrap --seccomp FD``; bwrap reads the fd to its end and applies
the program right before it executes the sandbox's command, so every sandbox
needs a fresh fd (``filter_fd``).

A deny list cannot name system calls newer than the libseccomp that compiles
it; those stay allowed. This is a hardening layer on top of namespaces, dropped
capabilities and a read-only system, not the only wall.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import threading
import types
from collections.abc import Mapping
from pathlib import Path

from tooljaild.sandbox.base import SandboxError

__all__ = [
    "CLONE3_ERRNO",
    "CLONE_NAMESPACE_FLAGS",
    "DENIED_ERRNO",
    "DENIED_SYSCALLS",
    "PERSONALITY_ALLOWED_BITS",
    "PERSONALITY_QUERY",
    "SeccompError",
    "available",
    "build_filter",
    "filter_fd",
    "write_filter",
]

LIBRARY_NAME = "libseccomp.so.2"
MIN_VERSION = (2, 5, 0)
"""2.5.0 is the first libseccomp that knows ``clone3``; without a rule for it
the ``clone`` rules could be bypassed."""

INSTALL_HINT = (
    "install it with `apt-get install libseccomp2` (Debian, Ubuntu) "
    "or `dnf install libseccomp` (Fedora)"
)

DENIED_ERRNO = errno.EPERM
"""What a denied system call returns: Python raises ``PermissionError``."""
CLONE3_ERRNO = errno.ENOSYS
"""What ``clone3`` returns, so that libc falls back to the filtered ``clone``."""

DENIED_SYSCALLS: tuple[str, ...] = (
    # Filesystem layout: mounts and root changes. Sandboxes get their view of
    # the filesystem from bwrap; nothing inside may rearrange it.
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    # The new mount API (Linux 5.2+): the same power as mount(2) by other names.
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    # Reading or steering other processes: tracing, cross-process memory,
    # stealing file descriptors, comparing kernel objects (a kernel pointer
    # oracle), advising on another process's memory.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
    # Namespaces: entering or making new ones. unshare(CLONE_NEWUSER) gives a
    # process capabilities over a fresh namespace, the way into most kernel
    # privilege escalations (clone's namespace flags are filtered separately).
    "unshare",
    "setns",
    # Large in-kernel attack surfaces that tools do not need: eBPF programs,
    # io_uring (its operations bypass this filter altogether), kernel keyrings,
    # performance counters, userfaultfd (a classic exploit helper).
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "userfaultfd",
    # Loading, replacing or stopping the kernel.
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    # Host-wide administration: swap, process accounting, quotas, the kernel
    # log, the system clock, raw I/O ports, old profiling and a.out loading.
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "uselib",
    "vhangup",
    # Opening files by handle goes around path-based access checks (the
    # "shocker" container escape); fanotify watches whole mounts.
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
)

CLONE_NAMESPACE_FLAGS: Mapping[str, int] = types.MappingProxyType(
    {
        "CLONE_NEWNS": 0x00020000,
        "CLONE_NEWCGROUP": 0x02000000,
        "CLONE_NEWUTS": 0x04000000,
        "CLONE_NEWIPC": 0x08000000,
        "CLONE_NEWUSER": 0x10000000,
        "CLONE_NEWPID": 0x20000000,
        "CLONE_NEWNET": 0x40000000,
    }
)
"""``clone`` flags that make new namespaces; any of them means ``EPERM``.
(``CLONE_NEWTIME``, 0x80, only exists for ``clone3`` and ``unshare``: in
``clone``'s flags that bit is part of the exit signal.)"""

PERSONALITY_QUERY = 0xFFFFFFFF
"""``personality(0xffffffff)`` changes nothing and returns the current persona."""
PERSONALITY_ALLOWED_BITS = 0x0008 | 0x20000
"""Persona bits a sandbox may set: PER_LINUX32 (uname says i686) and UNAME26,
alone or together, as Docker's default profile allows. Any other bit, such as
ADDR_NO_RANDOMIZE (turns off ASLR), READ_IMPLIES_EXEC or MMAP_PAGE_ZERO, makes
``personality`` fail with ``EPERM``; querying always works."""

# libseccomp's ABI, from seccomp.h (stable since 2.4).
_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_FLTATR_ACT_BADARCH = 2
_SCMP_CMP_MASKED_EQ = 7
_AUDIT_ARCH_S390 = 0x00000016
_AUDIT_ARCH_S390X = 0x80000016


def _scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class SeccompError(SandboxError):
    """libseccomp is missing or too old, or it refused to build the filter."""


class _ArgCmp(ctypes.Structure):
    """``struct scmp_arg_cmp``: compare argument ``arg`` with ``op``."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    """Load libseccomp once and declare the functions we call.

    Raises:
        SeccompError: When the library cannot be loaded or is older than
            ``MIN_VERSION``.
    """
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        try:
            lib = ctypes.CDLL(LIBRARY_NAME, use_errno=True)
        except OSError as exc:
            raise SeccompError(f"cannot load {LIBRARY_NAME} ({exc}); {INSTALL_HINT}") from exc
        try:
            lib.seccomp_version.restype = ctypes.POINTER(_Version)
            lib.seccomp_version.argtypes = []
            lib.seccomp_init.restype = ctypes.c_void_p
            lib.seccomp_init.argtypes = [ctypes.c_uint32]
            lib.seccomp_release.restype = None
            lib.seccomp_release.argtypes = [ctypes.c_void_p]
            lib.seccomp_arch_native.restype = ctypes.c_uint32
            lib.seccomp_arch_native.argtypes = []
            lib.seccomp_attr_set.restype = ctypes.c_int
            lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
            lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
            lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
            # The array form of seccomp_rule_add: ctypes cannot portably pass
            # structs through C varargs.
            lib.seccomp_rule_add_array.restype = ctypes.c_int
            lib.seccomp_rule_add_array.argtypes = [
                ctypes.c_void_p,
                ctypes.c_uint32,
                ctypes.c_int,
                ctypes.c_uint,
                ctypes.POINTER(_ArgCmp),
            ]
            lib.seccomp_export_bpf.restype = ctypes.c_int
            lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
        except AttributeError as exc:
            raise SeccompError(
                f"{LIBRARY_NAME} lacks a function this module needs ({exc}); {INSTALL_HINT}"
            ) from exc
        version = lib.seccomp_version().contents
        found = (int(version.major), int(version.minor), int(version.micro))
        if found < MIN_VERSION:
            raise SeccompError(
                f"libseccomp {'.'.join(map(str, found))} is too old: "
                f"{'.'.join(map(str, MIN_VERSION))} or newer is needed to filter clone3; "
                f"{INSTALL_HINT}"
            )
        _lib = lib
        return lib


def available() -> tuple[bool, str]:
    """Whether a filter can be built on this host.

    Returns:
        ``(True, "libseccomp X.Y.Z")``, or ``(False, reason)`` when libseccomp
        cannot be loaded or is too old. The reason says how to install it.
    """
    try:
        lib = _load()
    except SeccompError as exc:
        return False, str(exc)
    version = lib.seccomp_version().contents
    return True, f"libseccomp {version.major}.{version.minor}.{version.micro}"


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise SeccompError(f"libseccomp: {what} failed: {os.strerror(-rc)}")


def _resolve(lib: ctypes.CDLL, name: str) -> int | None:
    """The native number of a system call, or None when this arch has none."""
    nr = int(lib.seccomp_syscall_resolve_name(name.encode()))
    # -1 is "unknown name"; other negative numbers are libseccomp's
    # placeholders for calls that exist on other architectures only.
    return nr if nr >= 0 else None


def _add(lib: ctypes.CDLL, ctx: int, action: int, nr: int, *cmps: _ArgCmp) -> None:
    array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
    _check(rc, f"adding a rule for system call {nr}")


def _personality_denials() -> list[tuple[int, int]]:
    """``(mask, value)`` pairs: personality is denied when ``arg & mask == value`` for any.

    libseccomp cannot AND two comparisons of one argument, and separate rules
    are ORed, so "neither the query nor allowed bits only" is spelled with
    two-bit masks. A persona other than ``PERSONALITY_QUERY`` is denied exactly
    when it has a bit outside ``PERSONALITY_ALLOWED_BITS`` set and:

    - bit 31 clear: matched by "bit b set, bit 31 clear" for that bit b;
    - bit 31 set: then, not being the query, some bit c below 31 is clear,
      matched by "bit 31 set, bit c clear".

    The masks cover the low 32 bits only, like the kernel, which takes the
    persona as an ``unsigned int``.
    """
    top = 1 << 31
    pairs = [
        (top | 1 << bit, 1 << bit) for bit in range(31) if not PERSONALITY_ALLOWED_BITS & (1 << bit)
    ]
    pairs += [(top | 1 << bit, top) for bit in range(31)]
    return pairs


@functools.cache
def build_filter() -> bytes:
    """Compile the sandbox filter into a classic-BPF program.

    The result is cached for the life of the process: it depends only on this
    module and the host's libseccomp.

    Returns:
        The program as ``struct sock_filter`` records, 8 bytes each, in native
        byte order: what ``bwrap --seccomp FD`` reads.

    Raises:
        SeccompError: When libseccomp is missing or too old, does not know
            ``clone`` or ``clone3``, or rejects a rule.
    """
    lib = _load()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompError("libseccomp: seccomp_init failed")
    try:
        # seccomp_init already covers the native architecture. Calls made
        # through any other ABI (i386 int 0x80, x32) kill the process instead
        # of slipping past rules keyed on native numbers.
        _check(
            lib.seccomp_attr_set(ctx, _SCMP_FLTATR_ACT_BADARCH, _SCMP_ACT_KILL_PROCESS),
            "setting the bad-architecture action",
        )
        deny = _scmp_act_errno(DENIED_ERRNO)
        for name in DENIED_SYSCALLS:
            nr = _resolve(lib, name)
            if nr is not None:
                _add(lib, ctx, deny, nr)

        personality = _resolve(lib, "personality")
        if personality is not None:
            for mask, value in _personality_denials():
                _add(lib, ctx, deny, personality, _ArgCmp(0, _SCMP_CMP_MASKED_EQ, mask, value))

        clone = _resolve(lib, "clone")
        clone3 = _resolve(lib, "clone3")
        if clone is None or clone3 is None:
            raise SeccompError("libseccomp does not know clone or clone3 on this architecture")
        # s390 swaps clone's first two arguments: the flags come second.
        flags_arg = 1 if lib.seccomp_arch_native() in (_AUDIT_ARCH_S390, _AUDIT_ARCH_S390X) else 0
        # One rule per flag: separate rules are ORed, so any flag matches.
        for flag in CLONE_NAMESPACE_FLAGS.values():
            _add(lib, ctx, deny, clone, _ArgCmp(flags_arg, _SCMP_CMP_MASKED_EQ, flag, flag))
        _add(lib, ctx, _scmp_act_errno(CLONE3_ERRNO), clone3)

        fd = os.memfd_create("tooljail-seccomp-build", os.MFD_CLOEXEC)
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "exporting the BPF program")
            size = os.fstat(fd).st_size
            program = os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not program or len(program) % 8:
        raise SeccompError(f"libseccomp exported a malformed program ({len(program)} bytes)")
    return program


def filter_fd() -> int:
    """A fresh file descriptor holding the program, for ``bwrap --seccomp FD``.

    The fd is a sealed memfd positioned at offset 0 and marked close-on-exec:
    pass it to the child explicitly (``pass_fds``), and close it in the parent
    once bwrap has started. bwrap reads it to the end, so each sandbox needs
    its own.

    Returns:
        The file descriptor; the caller owns it.

    Raises:
        SeccompError: When the filter cannot be built.
    """
    program = build_filter()
    fd = os.memfd_create("tooljail-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        # Sealed, so that nothing holding the fd can change the program
        # between here and bwrap's read.
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_filter(path: str | os.PathLike[str]) -> Path:
    """Write the program to a file, for inspection or for ``bwrap --seccomp 3 3<FILE``.

    Args:
        path: Where to write it; an existing file is replaced.

    Returns:
        The path written, as a ``Path``.

    Raises:
        SeccompError: When the filter cannot be built.
        OSError: When the file cannot be written.
    """
    target = Path(path)
    target.write_bytes(build_filter())
    return target
