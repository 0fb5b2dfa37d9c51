"""One sandbox's door to the proxy: a Unix socket that takes connections as file descriptors.

The relay inside the sandbox accepts a TCP connection on 127.0.0.1:3128 and
sends its descriptor here: one message of 1 byte (b"c") and 1 descriptor
(SCM_RIGHTS) per connection. The gate checks what it got and hands each good
descriptor to the proxy as one client connection.

Everything here runs on the egress loop except the few methods documented as
thread-safe (`set_policy`, `mark`, `since`, `close`, `policy`).

Bounds, so a sandbox cannot grow the daemon: at most `MAX_RELAYS` relay
connections per gate (more are closed at once), at most `max_connections`
client connections open at once (more are refused at once with
`connection_limit`, a 503 line written only if the socket takes it without
waiting), every received descriptor is either served or closed before the
next message is read, and denials are kept in a bounded book.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.usage import EgressDenial, GateMark, NetUsage, UsageBook

log = logging.getLogger("tooljaild.egress")

SOCKET_NAME = "proxy.sock"
"""The gate's socket in the sandbox's egress directory."""

MAX_RELAYS = 4
"""Relay connections one gate keeps at once (the relay needs one; a restarted relay another)."""

MESSAGES_PER_WAKEUP = 64
"""Descriptors taken from one relay per loop wake-up, so one relay cannot hog the loop."""

LIMIT_RULE = "limits.max_egress_connections"
"""The `rule` named by a `connection_limit` denial."""

_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"

Serve = Callable[["EgressGate", socket.socket], Awaitable[None]]
"""Serves one client connection of a gate (the proxy's connection handler)."""

Denied = Callable[["EgressGate", str, int, str, str], None]
"""Records a denial of a gate: (gate, host, port, reason, rule)."""


class EgressGate:
    """A sandbox's gate: its policy, its usage, its socket and its open connections.

    Made by `EgressProxy.open_gate`; do not build one directly.
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        directory: Path,
        policy: EgressPolicy,
        max_connections: int,
        label: str,
        serve: Serve,
        denied: Denied,
        forget: Callable[[EgressGate], None] = lambda gate: None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self.label = label
        self.directory = directory
        self.path = directory / SOCKET_NAME
        self.max_connections = max_connections
        self.book = UsageBook()
        self._policy = policy
        self._loop = loop
        self._serve = serve
        self._denied = denied
        self._forget = forget
        self._listener: socket.socket | None = None
        self._relays: set[socket.socket] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._close_lock = threading.Lock()

    # -- thread-safe --------------------------------------------------------

    @property
    def policy(self) -> EgressPolicy:
        """The policy new connections are decided by."""
        return self._policy

    def set_policy(self, policy: EgressPolicy) -> None:
        """Decide every new connection (and every next plain-HTTP request) by `policy`.

        Thread-safe and immediate: one reference assignment; connections already
        tunnelled keep going.
        """
        self._policy = policy

    def mark(self) -> GateMark:
        """The current point of the gate's usage and denials (thread-safe)."""
        return self.book.mark()

    def since(self, mark: GateMark) -> tuple[NetUsage, tuple[EgressDenial, ...]]:
        """Usage and denials after `mark` (thread-safe)."""
        return self.book.since(mark)

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop listening, close relays and connections, unlink the socket.

        Idempotent and thread-safe, and never waits for the egress loop: from
        another thread (the daemon's gRPC loop) the socket is unlinked at once,
        so no new relay reaches the gate, and the rest is the egress loop's next
        turn. A loop busy with a flood of connections must not stall the
        thread that closes a call's gate.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._loop.is_closed():
            self._unlink()
            self._forget(self)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._shut()
            return
        self._unlink()
        try:
            self._loop.call_soon_threadsafe(self._shut)
        except RuntimeError:  # the loop stopped meanwhile
            self._forget(self)

    # -- on the loop --------------------------------------------------------

    def listen(self) -> None:
        """Create and listen on `proxy.sock`, and watch it; on the loop."""
        self.bind()
        self.watch()

    def bind(self) -> None:
        """Create and listen on `proxy.sock` (mode 0666: the directory is the secret).

        Any thread: plain system calls, no loop. A relay that connects before
        `watch` runs waits in the listen backlog.
        """
        self._unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _bind(listener, self.path)
            os.chmod(self.path, 0o666)
            listener.listen(MAX_RELAYS)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener

    def watch(self) -> None:
        """Accept relays from the bound socket; on the loop (closed meanwhile: nothing)."""
        listener = self._listener
        if listener is not None and not self._closed:
            self._loop.add_reader(listener.fileno(), self._accept_relays)

    def _accept_relays(self) -> None:
        listener = self._listener
        if listener is None:
            return
        for _ in range(MESSAGES_PER_WAKEUP):
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("egress gate %s: accept failed: %s", self.label, exc)
                return
            if len(self._relays) >= MAX_RELAYS:
                # A sandbox needs one relay; more would let it hold the loop's
                # readers without bound.
                conn.close()
                self._denied(self, "", 0, "bad_request", "relays")
                continue
            conn.setblocking(False)
            self._relays.add(conn)
            self._loop.add_reader(conn.fileno(), self._read_relay, conn)

    def _drop_relay(self, conn: socket.socket) -> None:
        if conn in self._relays:
            self._relays.discard(conn)
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(conn.fileno())
        conn.close()

    def _read_relay(self, conn: socket.socket) -> None:
        for _ in range(MESSAGES_PER_WAKEUP):
            try:
                # MSG_CMSG_CLOEXEC: the daemon starts sandboxes; a received
                # descriptor must never leak into one.
                data, fds, flags, _ = socket.recv_fds(conn, 1, 1, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop_relay(conn)
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                self._drop_relay(conn)
                return
            if data != b"c" or len(fds) != 1 or flags & socket.MSG_CTRUNC:
                # Not the relay's protocol: close what came and the relay
                # connection (a relay that sends a message without a
                # descriptor is broken or hostile). The kernel closes
                # descriptors past the one we asked for (MSG_CTRUNC).
                for fd in fds:
                    os.close(fd)
                self._denied(self, "", 0, "bad_request", "relay message")
                self._drop_relay(conn)
                return
            self._admit(fds[0])

    def _admit(self, fd: int) -> None:
        """Serve `fd` as a client connection, or close it and say why."""
        sock = _stream_socket(fd)
        if sock is None:
            self._denied(self, "", 0, "bad_request", "not a connected stream socket")
            return
        if self._closed:
            sock.close()
            return
        if len(self._tasks) >= self.max_connections:
            self._denied(self, "", 0, "connection_limit", f"{LIMIT_RULE} = {self.max_connections}")
            # Never wait on the sandbox's socket here: a 503 if it fits now.
            with contextlib.suppress(OSError):
                sock.send(_BUSY, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            sock.close()
            return
        sock.setblocking(False)
        task = self._loop.create_task(self._serve_one(sock))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_one(self, sock: socket.socket) -> None:
        try:
            await self._serve(self, sock)
        except asyncio.CancelledError:
            raise
        except OSError as exc:
            # The sandbox's end misbehaving (reset, not connected) is its own business.
            log.debug("egress gate %s: a connection ended: %s", self.label, exc)
        except Exception:
            log.exception("egress gate %s: a connection failed", self.label)
        finally:
            sock.close()

    def _shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(listener.fileno())
            listener.close()
        self._unlink()
        for conn in list(self._relays):
            self._drop_relay(conn)
        for task in list(self._tasks):
            task.cancel()
        self._forget(self)

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


_SUN_PATH_MAX = 107
"""The longest path a Unix socket address holds (sun_path, without its NUL)."""


def _bind(sock: socket.socket, path: Path) -> None:
    """Bind `sock` at `path`, however deep the state directory is.

    A socket address holds at most 107 bytes of path; a longer one is reached
    through the directory's descriptor (/proc/self/fd/N/name), which the
    kernel resolves to the same directory.
    """
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        sock.bind(str(path))
        return
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.bind(f"/proc/self/fd/{dirfd}/{path.name}")
    finally:
        os.close(dirfd)


def _stream_socket(fd: int) -> socket.socket | None:
    """`fd` as a socket when it is a connected stream socket; else None, `fd` closed."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        sock = socket.socket(fileno=fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
    try:
        ok = sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM and not (
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        )
        if ok:
            sock.getpeername()  # ENOTCONN: a socket that is connected to nothing
    except OSError:
        ok = False
    if not ok:
        sock.close()
        return None
    return sock
