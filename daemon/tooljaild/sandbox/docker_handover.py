"""How a container's runner gets its pipes: over a socket in a directory bound into it.

A container cannot inherit the daemon's pipes, so the daemon hands them over
(decision 20): before the container starts it listens on a Unix socket in a
per-sandbox host directory (``<state_dir>/docker/<sandbox id>/``, bind-mounted
read-only at /run/tooljail-channel, reachable by the sandbox uid only); the runner
connects once (`_runner.connect_sandbox`) and receives the request, stdout,
stderr and frame pipes as descriptors (SCM_RIGHTS). The daemon checks that the
peer is the container's first process (its cgroup names the container), then
closes the socket and unlinks it. From there on the sandbox speaks the runner
channel (runner_channel) exactly as a process sandbox does, and tool code sees
the same kind of stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from pathlib import Path

from tooljaild.sandbox.file_modes import make_dirs
from tooljaild.sandbox.runner_channel import PipeEnds

log = logging.getLogger(__name__)

INSIDE_CHANNEL_DIR = "/run/tooljail-channel"
"""Where the channel directory is bound inside the container."""
SOCKET_NAME = "sandbox.sock"
INSIDE_SOCKET = f"{INSIDE_CHANNEL_DIR}/{SOCKET_NAME}"
"""The path the runner connects to (``_runner.py --connect``)."""


class Handover:
    """The daemon's listening end for one container's runner, until it has its pipes.

    Made before the container starts: it makes `directory` (its parent too) and
    listens in it.

    Args:
        directory: The sandbox's channel directory on the host (must not exist).
        uid, gid: The sandbox's user: the only one (with root) let in.
    """

    def __init__(self, directory: Path, uid: int, gid: int) -> None:
        self.directory = directory
        self._listener: socket.socket | None = _listen(directory, uid, gid)

    async def accept(self, container_id: str, timeout_s: float) -> tuple[socket.socket, int] | None:
        """The runner's connection and host pid, once a process of `container_id`
        connects; None when none did within `timeout_s` (others are turned away)."""
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            try:
                conn, _ = await asyncio.wait_for(loop.sock_accept(self._listener), remaining)
            except TimeoutError:
                return None
            pid = peer_pid(conn, container_id)
            if pid is not None:
                return conn, pid
            conn.close()
        return None

    def hand_over(self, conn: socket.socket) -> list[int]:
        """Send the runner its ends of the four pipes; return ours (`RunnerPipes`'s)."""
        with PipeEnds() as ends:
            # One byte and four descriptors into a fresh socket: never blocks.
            socket.send_fds(conn, [b"\0"], ends.theirs)
        return ends.ours

    def close(self) -> None:
        """Stop listening and remove the socket (the directory stays: its owner removes it)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                (self.directory / SOCKET_NAME).unlink()


def peer_pid(conn: socket.socket, container_id: str) -> int | None:
    """The peer's host pid if it runs in the container `container_id`, else None."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = int(struct.unpack("3i", creds)[0])
    try:
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        cgroups = None
    if cgroups is not None and container_id not in cgroups:
        log.warning(
            "a process (pid %d) not in container %s connected to its channel",
            pid,
            container_id[:12],
        )
        return None
    return pid


def _listen(directory: Path, uid: int, gid: int) -> socket.socket:
    """Make the channel directory and listen in it."""
    make_dirs(directory.parent, 0o711)  # as such: the daemon's umask is 0077
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        # Only the sandbox uid (and root) may reach the socket.
        os.chown(directory, uid, gid)
        socket_mode = 0o600
    else:
        # A daemon in the docker group cannot give the directory away: let
        # anyone pass through it; `accept` checks who connected.
        directory.chmod(0o711)
        socket_mode = 0o666
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # Bound through a descriptor of the directory: a state directory deep
        # enough would make the full path longer than sun_path's 108 bytes.
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            listener.bind(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
        finally:
            os.close(dir_fd)
        path = directory / SOCKET_NAME
        os.chmod(path, socket_mode)
        if os.geteuid() == 0:
            os.chown(path, uid, gid)
        listener.listen(4)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
