"""The egress relay: the sandbox's one way out, to the daemon's proxy on the host.

A sandbox with egress has no network interface but its own loopback. Its
clients are pointed (HTTP_PROXY and friends: tooljaild/egress/env.py) at
127.0.0.1:3128, where this relay listens. It reads nothing of what a client
sends: it hands each accepted connection's file descriptor to the daemon's
gate over the Unix socket /run/tooljail/proxy.sock (SCM_RIGHTS; one message
per connection: the byte b"c" with one descriptor), then closes its own copy.
The proxy on the host then talks to the client directly, through that
descriptor, and decides by the sandbox's policy.

The relay holds no authority: what it passes is a connection from inside the
sandbox, and the host proxy checks every descriptor it gets. Tool code that
kills or replaces the relay only cuts its own sandbox's access. When the
socket is absent (no gate: the call has no egress), a connection is closed at
once: no network.

One daemon thread per process (`ensure_relay` is idempotent and starts a new
one if the old one died). It blocks in accept(): it costs nothing while no
client connects.

Also here: what a zygote's worker does to see its own egress directory at
/run/tooljail and no other sandbox's (`enter`, before it drops its
capabilities). A sandbox bubblewrap starts gets the same from bubblewrap's
own binds; a container, from the engine's.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
import time

SOCKET_PATH = "/run/tooljail/proxy.sock"
PORT = 3128
_MESSAGE = b"c"
"""What each passed descriptor rides on (a stream socket carries no empty message)."""
_GONE = (errno.EBADF, errno.EINVAL, errno.ENOTSOCK)
"""accept() errors that mean the listening socket is gone: the relay ends."""

INSIDE_DIR = "/run/tooljail"
"""Where a sandbox sees its own egress directory (sandbox/bwrap.py's INSIDE_EGRESS)."""
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND = 32, 4096
MNT_DETACH = 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_lock = threading.Lock()
_thread: threading.Thread | None = None
_current: _Relay | None = None


def ensure_relay(sock_path: str = SOCKET_PATH, port: int = PORT) -> threading.Thread | None:
    """Make sure this process's relay runs; start it if it does not (or died).

    Args:
        sock_path: The daemon's gate (its Unix socket), connected to lazily.
        port: Where to listen on 127.0.0.1.

    Returns:
        The relay's thread, or None when it cannot listen (the port is taken,
        no loopback): then nothing reaches out, as without egress.
    """
    global _thread, _current
    with _lock:
        # In a fork of a process that ran one, the thread reads as not alive
        # (only the forking thread goes on in a child): a child starts its own.
        if _thread is not None and _thread.is_alive():
            return _thread
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen(128)
        except OSError:
            listener.close()
            return None
        relay = _Relay(listener, sock_path)
        thread = threading.Thread(target=relay.serve, name="tooljail-egress-relay", daemon=True)
        thread.start()
        _thread, _current = thread, relay
        return thread


def stop_relay(timeout_s: float = 0.1) -> bool:
    """End this process's relay, if it runs, and wait for its thread (bounded).

    A fresh sandbox's worker does this once the tool is done, before it seals
    its result: the seal needs the worker to be its process's only thread.

    Returns:
        True when no relay thread is left.
    """
    global _thread
    with _lock:
        thread, relay = _thread, _current
        if thread is None or relay is None:
            return True
        with contextlib.suppress(OSError):
            # Wakes its accept() (EINVAL): the thread ends.
            relay.listener.shutdown(socket.SHUT_RDWR)
        thread.join(timeout_s)
        if thread.is_alive():
            return False
        relay.close()
        _thread = None
        return True


class _Relay:
    """One listening socket, and the connection to the gate it passes descriptors over."""

    def __init__(self, listener: socket.socket, sock_path: str) -> None:
        self.listener = listener
        self.sock_path = sock_path
        self.gate: socket.socket | None = None

    def serve(self) -> None:
        """Accept and pass on, until the listening socket is gone."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError as exc:
                if exc.errno in _GONE:
                    return
                time.sleep(0.05)  # EMFILE and the like: let the sandbox close some
                continue
            with conn:
                self._pass(conn.fileno())

    def _pass(self, fd: int) -> None:
        """Send `fd` to the gate; reconnect once when the connection broke."""
        for _ in range(2):
            gate = self.gate or self._connect()
            if gate is None:
                return  # no gate: no network (the caller closes the connection)
            try:
                socket.send_fds(gate, [_MESSAGE], [fd])
                return
            except OSError:
                self._drop()

    def _connect(self) -> socket.socket | None:
        gate = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            gate.connect(self.sock_path)
        except OSError:
            gate.close()
            return None
        self.gate = gate
        return gate

    def close(self) -> None:
        """Close the listening socket and the connection to the gate."""
        self.listener.close()
        self._drop()

    def _drop(self) -> None:
        if self.gate is not None:
            with contextlib.suppress(OSError):
                self.gate.close()
            self.gate = None


def enter(view: str, name: str | None) -> None:
    """In a zygote's worker, with its capabilities still held: bind the
    sandbox's own egress directory (`name`, below the zygote's `view` of every
    sandbox's) at /run/tooljail, read-only, nosuid, nodev, noexec; bring the
    loopback interface up (the relay listens there); then hide `view`.

    The view cannot always be unmounted here: it came from bubblewrap's mount
    namespace, and a mount namespace made in a less privileged user namespace
    (the zygote's) gets the mounts it copies locked in place (the kernel
    refuses to unmount them: EINVAL). Then an empty, unreadable, read-only
    tmpfs is mounted over it: what lies below cannot be reached (nor through
    /proc/*/root: every process here shares this mount namespace), and no code
    in the sandbox can take it off (no capabilities; the seccomp filter denies
    mount and umount too).

    Args:
        view: Where the zygote sees the egress root (sandbox/bwrap.py's ZYGOTE_EGRESS).
        name: The sandbox's directory below it (32 hex digits); None: it has none.

    Raises:
        OSError: A mount failed (the worker then exits: no tool runs).
        ValueError: `name` is not a directory name the daemon makes.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
        typ = fstype.encode() if fstype else None
        opts = data.encode() if data else None
        if libc.mount(source.encode(), target.encode(), typ, flags, opts) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"mount {target}: {os.strerror(code)}")

    if name is not None:
        if len(name) != 32 or not all(c in "0123456789abcdef" for c in name):
            raise ValueError(f"not an egress directory name: {name!r}")
        mount(f"{view}/{name}", INSIDE_DIR, None, MS_BIND, None)
        sealed = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount("none", INSIDE_DIR, None, MS_REMOUNT | MS_BIND | sealed, None)
        loopback_up()
    if libc.umount2(view.encode(), MNT_DETACH) != 0:
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount("tmpfs", view, "tmpfs", flags, "size=4k,mode=0")


def loopback_up() -> None:
    """Bring `lo` up in this network namespace (a new one starts with it down).

    Raises:
        OSError: Without CAP_NET_ADMIN in the namespace's user namespace.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
