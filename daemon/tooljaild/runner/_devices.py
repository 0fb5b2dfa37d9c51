"""A zygote's sandbox gets devices of its own: a devpts instance and its loopback.

Called by _zygote.py in each sandbox's worker while it still holds its
capabilities (in the zygote's user namespace), before any tool code runs.

- Every worker of a zygote shares bubblewrap's /dev, and so one devpts
  instance: a terminal of one sandbox's session (/dev/pts/N, the sandbox uid's
  own) could be opened from another sandbox. A new instance shows only the
  PTYs made in it. Where the kernel refuses one, an empty tmpfs hides the
  shared instance instead (the sandbox then has no terminals at all).
- A new network namespace starts with `lo` down: it is brought up, as
  bubblewrap's --unshare-net does, so a session's servers listen there and its
  forwarded ports reach them (_streams.py). No other interface, no route out.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import ctypes
import os

try:  # the daemon's view (mypy): tooljaild.runner._devices
    from . import _egress
except ImportError:  # a sandbox: top-level modules beside _runner.py, on the path it set
    import _egress  # type: ignore[import-not-found, no-redef]

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND = 2, 4, 8, 4096
_DEVPTS = b"newinstance,ptmxmode=0666,mode=0620"


def own_devices() -> None:
    """A devpts instance of the sandbox's own on /dev/pts (/dev/ptmx opening
    it), and the loopback up.

    Raises:
        OSError: A mount or the loopback failed (the worker then exits: no tool runs).
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: bytes, target: bytes, fstype: bytes | None, flags: int, data: bytes) -> int:
        result: int = libc.mount(source, target, fstype, flags, data or None)
        return result

    def check(result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mount {what}: {os.strerror(code)}")

    flags = _MS_NOSUID | _MS_NOEXEC
    if mount(b"devpts", b"/dev/pts", b"devpts", flags, _DEVPTS) != 0:
        tmpfs = b"size=4k,mode=0755"
        check(mount(b"tmpfs", b"/dev/pts", b"tmpfs", flags | _MS_NODEV, tmpfs), "/dev/pts")
    elif not os.path.islink("/dev/ptmx"):
        # bubblewrap's /dev/ptmx is a link to pts/ptmx; a device node (the
        # host's) would open the instance beside it, so it is bound over.
        check(mount(b"/dev/pts/ptmx", b"/dev/ptmx", None, _MS_BIND, b""), "/dev/ptmx")
    _egress.loopback_up()
