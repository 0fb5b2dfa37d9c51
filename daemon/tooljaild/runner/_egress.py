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

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time

SOCKET_PATH = "/run/tooljail/proxy.sock"
PORT = 3128
_MESSAGE = b"c"
"""What each passed descriptor rides on (a stream socket carries no empty message)."""
_GONE = (errno.EBADF, errno.EINVAL, errno.ENOTSOCK)
"""accept() errors that mean the listening socket is gone: the relay ends."""

_lock = threading.Lock()
_thread: threading.Thread | None = None


def ensure_relay(sock_path: str = SOCKET_PATH, port: int = PORT) -> threading.Thread | None:
    """Make sure this process's relay runs; start it if it does not (or died).

    Args:
        sock_path: The daemon's gate (its Unix socket), connected to lazily.
        port: Where to listen on 127.0.0.1.

    Returns:
        The relay's thread, or None when it cannot listen (the port is taken,
        no loopback): then nothing reaches out, as without egress.
    """
    global _thread
    with _lock:
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
        thread = threading.Thread(
            target=_Relay(listener, sock_path).serve, name="tooljail-egress-relay", daemon=True
        )
        thread.start()
        _thread = thread
        return thread


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

    def _drop(self) -> None:
        if self.gate is not None:
            with contextlib.suppress(OSError):
                self.gate.close()
            self.gate = None


def _reset_after_fork() -> None:
    """A forked child has no relay thread (only its parent's record of one)."""
    global _lock, _thread
    _lock = threading.Lock()
    _thread = None


os.register_at_fork(after_in_child=_reset_after_fork)
