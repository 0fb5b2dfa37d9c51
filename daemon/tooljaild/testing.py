"""The test harness behind `tooljail.testing.daemon()`: a real daemon for a test.

Users reach it through the SDK's thin entry point, `tooljail.testing.daemon()`,
which imports this module by name when called (the SDK never imports the
daemon); see that module for the whole story. It lives here, on the daemon's
top floor, because it composes the whole daemon (`app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tooljail.testing import wait_for
from tooljaild.settings.config import Settings, load_settings
from tooljaild.settings.journal import DEPRECATED_KEYS

__all__ = ["DEFAULT_POOL_SIZE", "daemon"]

DEFAULT_POOL_SIZE = 1
"""The harness's pool: one warm sandbox keeps start-up short (the config's default is 4)."""


@contextlib.contextmanager
def daemon(
    *,
    in_process: bool = True,
    start_timeout_s: float = 60.0,
    stop_grace_s: float = 5.0,
    **settings: Any,
) -> Iterator[str]:
    """Run a tooljail daemon for the duration of the `with` block.

    The harness behind `tooljail.testing.daemon`, the public entry point, whose
    docstring is the contract (arguments, defaults, what it yields and raises).
    """
    base = Path(tempfile.mkdtemp(prefix="tooljail-test-"))
    try:
        # Sandboxes run as another uid, which must pass through to the state directory.
        base.chmod(0o711)
        merged: dict[str, Any] = {
            "listen": f"unix://{base / 'tooljail.sock'}",
            "state_dir": base / "state",
            "pool_size": DEFAULT_POOL_SIZE,
            **settings,
        }
        resolved = load_settings(**merged)
        if in_process:
            runner: _InProcess | _Child = _InProcess(resolved, stop_grace_s)
        else:
            runner = _Child(resolved, set(merged), base, stop_grace_s)
        target = runner.start(start_timeout_s)
        try:
            yield target
        finally:
            runner.stop()
    finally:
        # Workspaces may hold files of the sandbox uid; a leftover temp dir is no failure.
        shutil.rmtree(base, ignore_errors=True)


class _InProcess:
    """A `Daemon` on its own event loop in a background thread."""

    def __init__(self, settings: Settings, grace_s: float) -> None:
        self._settings = settings
        self._grace_s = grace_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop_error: BaseException | None = None
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(
            target=self._run, name="tooljail-testing-daemon", daemon=True
        )

    def start(self, timeout_s: float) -> str:
        """Start the daemon and return its target once it serves.

        Raises:
            Exception: What `Daemon.start` raised.
            TimeoutError: When it did not serve within `timeout_s`.
        """
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self._call_soon(lambda task: task.cancel())
            self._thread.join(30)
            raise TimeoutError(f"the daemon did not serve within {timeout_s}s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return _target(self._settings.listen, self._port)

    def stop(self) -> None:
        """Drain and stop the daemon; wait for its thread to end.

        Raises:
            Exception: What `Daemon.stop` raised.
        """
        self._call_soon(lambda _task: self._stop.set() if self._stop else None)
        self._thread.join()
        if self._stop_error is not None:
            raise self._stop_error

    def _call_soon(self, action: Callable[[asyncio.Task[None]], object]) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(action, task)

    def _run(self) -> None:
        # asyncio.run cancels what the daemon left running and shuts the
        # executors down, so nothing outlives the `with` block.
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # raised again in the caller's thread, by stop()
            self._stop_error = exc

    async def _main(self) -> None:
        from tooljaild.app.daemon import Daemon

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._task = asyncio.current_task()
        served = Daemon(self._settings)
        try:
            await served.start()
        except BaseException as exc:
            self._error = exc
            # Release what start() took before it failed (journal, zygote, socket).
            with contextlib.suppress(Exception):
                await served.stop(0)
            self._ready.set()
            return
        self._port = served.port
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await served.stop(self._grace_s)


class _Child:
    """`python -m tooljaild serve` in a child process, configured by environment."""

    def __init__(self, settings: Settings, keys: set[str], base: Path, grace_s: float) -> None:
        if not settings.listen.startswith("unix:") and settings.listen.endswith(":0"):
            raise ValueError("in_process=False needs a fixed port or a Unix socket, not port 0")
        self._settings = settings
        self._base = base
        self._grace_s = grace_s
        self._log = base / "daemon.log"
        # The checked values, in the form the environment source reads back. The
        # deprecated journal keys were folded into [journal] (and cleared): pass that.
        if keys & DEPRECATED_KEYS.keys():
            keys = (keys - DEPRECATED_KEYS.keys()) | {"journal"}
        dumped = settings.model_dump(mode="json", include=keys)
        self._env = {
            **os.environ,
            **{
                f"TOOLJAIL_{key.upper()}": value if isinstance(value, str) else json.dumps(value)
                for key, value in dumped.items()
            },
            "TOOLJAIL_SHUTDOWN_GRACE_S": str(grace_s),
        }
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> str:
        """Start the child and return its target once its health service says SERVING.

        Raises:
            tooljaild.app.errors.DaemonError: When the child exits first (with its log).
            TimeoutError: When it did not serve within `timeout_s`.
        """
        from tooljaild.app.errors import DaemonError

        with open(self._log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tooljaild", "serve"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        target = _target(self._settings.listen, 0)
        process = self._process

        def serving() -> bool:
            if process.poll() is not None:
                raise DaemonError(
                    f"tooljail serve exited with {process.returncode}: {self._log_tail()}"
                )
            return _health_serving(target)

        try:
            wait_for(serving, timeout_s, interval=0.02, what="tooljail serve to serve")
        except BaseException:
            self.stop()
            raise
        return target

    def stop(self) -> None:
        """SIGTERM (drain within the grace), then SIGKILL if it outlasts that by far."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(self._grace_s + 30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_tail(self) -> str:
        return self._log.read_text(errors="replace")[-4000:].strip()


def _health_serving(target: str) -> bool:
    """One bounded gRPC health check: does `target` say SERVING?"""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _target(listen: str, port: int) -> str:
    """What a client dials for `listen`; a TCP port 0 becomes the one bound."""
    if not listen.startswith("unix:") and listen.endswith(":0") and port:
        return f"{listen.rsplit(':', 1)[0]}:{port}"
    return listen
