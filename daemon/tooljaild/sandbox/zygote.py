"""The daemon's side of the zygote (see runner/_zygote.py): start it, ask it for sandboxes.

Starting a sandbox through bubblewrap costs a bubblewrap and an interpreter
start (~50 ms here); asking the zygote costs a fork of a warm interpreter and
a few namespace and mount calls. The pool's refill rate, and so the sustained
call rate, follows from that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from tooljaild.sandbox import bwrap as bw
from tooljaild.sandbox.base import SandboxError, first_words
from tooljaild.sandbox.file_modes import SANDBOX_UMASK

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0


class Zygote:
    """One zygote process and the requests in flight to it.

    Args:
        make_argv: Builds the zygote's command line (privilege drop and
            bubblewrap included) from its runner arguments, and returns the
            descriptors bubblewrap must inherit.
    """

    def __init__(self, make_argv: Callable[[list[str]], tuple[list[str], list[int]]]) -> None:
        self._make_argv = make_argv
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._pending: dict[str, asyncio.Future[int]] = {}
        self._exits: dict[str, asyncio.Future[int]] = {}
        self._worker_ends: dict[str, asyncio.Future[dict[str, Any] | None]] = {}
        self._ready: asyncio.Future[int] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._sock is not None

    async def start(self) -> None:
        """Start the zygote and wait until it says it is ready.

        Raises:
            SandboxError: It could not be started.
        """
        from tooljaild.sandbox import seccomp

        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp_fd = seccomp.filter_fd()
        passed = [theirs.fileno(), seccomp_fd]
        try:
            runner_args = [f"{bw.INSIDE_RUNNER_DIR}/_zygote.py", "--control-fd"]
            runner_args += [str(theirs.fileno()), "--seccomp-fd", str(seccomp_fd)]
            argv, fds = self._make_argv(runner_args)
            passed += fds
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=tuple(passed),
                    start_new_session=True,
                    env={},
                    # Not the daemon's own (0077): a tool's files as in any container.
                    umask=SANDBOX_UMASK,
                )
            except OSError as exc:
                raise SandboxError(f"cannot start the zygote: {exc}") from exc
        finally:
            theirs.close()
            for fd in passed[1:]:
                with contextlib.suppress(OSError):
                    os.close(fd)
        ours.setblocking(False)
        self._sock = ours
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_message)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except (TimeoutError, SandboxError) as exc:
            said = await first_words(self._proc.stderr)
            await self.close()
            raise SandboxError(f"the zygote did not start: {said or exc}") from exc
        log.info("zygote ready", extra={"pid": self._proc.pid})

    def _on_message(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message: dict[str, Any] = json.loads(data)
            if "ready" in message and self._ready is not None and not self._ready.done():
                self._ready.set_result(int(message["ready"]))
            elif "pid" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(int(message["pid"]))
            elif "error" in message:
                future = self._pending.pop(message["id"], None)
                self._exits.pop(message["id"], None)
                self._worker_ends.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_exception(
                        SandboxError(f"the zygote cannot make a sandbox: {message['error']}")
                    )
            elif "exit" in message:
                worker = self._worker_ends.pop(message["id"], None)
                if worker is not None and not worker.done():
                    worker.set_result(message.get("worker"))
                done = self._exits.pop(message["id"], None)
                if done is not None and not done.done():
                    done.set_result(int(message["exit"]))

    def _lost(self) -> None:
        """The zygote is gone: every sandbox it made is gone with its namespaces."""
        if self._sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        error = SandboxError("the zygote ended")
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for future in self._exits.values():
            if not future.done():
                future.set_result(-9)
        for worker in self._worker_ends.values():
            if not worker.done():
                worker.set_result(None)
        self._worker_ends.clear()
        self._pending.clear()
        self._exits.clear()

    async def spawn(self, ident: str, params: dict[str, Any], fds: list[int]) -> int:
        """Ask for a sandbox; `fds` are its stdin, stdout, stderr, frames, cgroups.

        Returns:
            The child's pid as the zygote sees it (for messages, not for signals).

        Raises:
            SandboxError: The zygote is not running and cannot be restarted.
        """
        async with self._lock:
            if not self.alive and not self._closed:
                log.warning("restarting the zygote")
                await self.start()
        if self._sock is None:
            raise SandboxError("the zygote is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending[ident] = future
        self._exits[ident] = loop.create_future()
        self._worker_ends[ident] = loop.create_future()
        message = json.dumps({"op": "spawn", "id": ident, **params}).encode()
        socket.send_fds(self._sock, [message], fds)
        return await asyncio.wait_for(future, START_TIMEOUT_S)

    def exited(self, ident: str) -> asyncio.Future[int]:
        """Resolves with the child's exit code when it has ended."""
        return self._exits[ident]

    def worker_end(self, ident: str) -> asyncio.Future[dict[str, Any] | None]:
        """Resolves with how the worker ended, {"code", "signal"}, once the sandbox has."""
        return self._worker_ends[ident]

    def kill(self, ident: str) -> None:
        """End a sandbox: its pid 1 dies, and the kernel kills the rest."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"op": "kill", "id": ident}).encode())

    async def close(self) -> None:
        self._closed = True
        if self._sock is not None:
            self._lost()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5.0)


class ZygoteChild:
    """A sandbox made by the zygote, shaped like the asyncio process it replaces."""

    def __init__(self, zygote: Zygote, ident: str, pid: int) -> None:
        self._zygote = zygote
        self._ident = ident
        self.pid = pid
        self.exited = zygote.exited(ident)
        """Resolves with pid 1's exit code when the sandbox has ended."""
        self.worker_end = zygote.worker_end(ident)
        """Resolves with how its worker ended ({"code", "signal"}, or None), just before."""

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() and not self.exited.cancelled() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)

    def kill(self) -> None:
        self._zygote.kill(self._ident)

    def send_signal(self, sig: int) -> None:
        self.kill()
