"""Assembling the daemon: settings -> sandboxes, tools, calls, server; and its life.

`Daemon.start` makes everything ready (the pool warm before the socket says
SERVING); `Daemon.stop` drains: it refuses new calls, lets running calls finish
within the grace period, stops the rest and answers their callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from tooljaild.calls import CallManager
from tooljaild.config import Settings
from tooljaild.loader import load_registry
from tooljaild.registry import Registry
from tooljaild.sandbox.base import Sandbox, SandboxError
from tooljaild.sandbox.isolation import (
    Isolation,
    IsolationError,
    install_runner,
    reachable,
    sandbox_python,
)
from tooljaild.sandbox.isolation import resolve as resolve_isolation
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.sandbox.process import SandboxContext, zygote_for
from tooljaild.server import SERVICE_NAME, create_server

log = logging.getLogger(__name__)


class DaemonError(Exception):
    """The daemon cannot start; the message says why and what to do."""


class Daemon:
    """One tooljail daemon: its pool, registry, call manager and gRPC server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = 0
        self.isolation: Isolation | None = None
        self.context: SandboxContext | None = None
        self.pool: SandboxPool | None = None
        self.manager: CallManager | None = None
        self._server: grpc.aio.Server | None = None
        self._health: object | None = None
        self._socket_path: Path | None = None

    def _new_sandbox(self) -> Sandbox:
        assert self.context is not None
        return self.settings.sandbox.build(self.context, self.settings.limits)

    async def start(self) -> None:
        """Start serving.

        Raises:
            DaemonError: When the address or state directory cannot be used.
        """
        s = self.settings
        try:
            # 0711: a sandbox's uid may pass through to its own workspace (by name),
            # and list nothing.
            for directory in (s.state_dir, s.workspace_root):
                directory.mkdir(parents=True, exist_ok=True, mode=0o711)
                directory.chmod(0o711)
        except OSError as exc:
            raise DaemonError(f"cannot create state directory {s.state_dir}: {exc}") from exc
        if s.listen.startswith("unix:"):
            self._socket_path = _prepare_socket(s.listen)
        elif not s.allow_insecure_tcp and not _is_loopback(s.listen):
            raise DaemonError(
                f"refusing to serve plaintext TCP on {s.listen}: anyone who reaches it could "
                "run code here. Listen on a Unix socket or a loopback address "
                "(127.0.0.1:PORT, [::1]:PORT, localhost:PORT), or set allow_insecure_tcp = "
                "true (TOOLJAIL_ALLOW_INSECURE_TCP=true) on a network you trust"
            )
        try:
            self.isolation = await asyncio.to_thread(
                resolve_isolation,
                s.isolation,
                bwrap=s.sandbox.bwrap,
                sandbox_user=s.sandbox.user,
                use_cgroups=s.sandbox.use_cgroups,
            )
        except IsolationError as exc:
            raise DaemonError(str(exc)) from exc
        shared = tuple(d.resolve() for d in (*s.tools_dirs, *s.files_dirs))
        try:
            python = sandbox_python(s.sandbox.python, self.isolation)
        except IsolationError as exc:
            raise DaemonError(str(exc)) from exc
        if python != s.sandbox.python:
            s.sandbox = s.sandbox.model_copy(update={"python": python})
        _check_reachable(self.isolation, (s.state_dir, *shared))
        self.context = SandboxContext(
            workspace_root=s.workspace_root,
            runner_dir=await asyncio.to_thread(install_runner, s.state_dir),
            isolation=self.isolation,
            shared_dirs=shared,
        )
        if self.isolation.namespaces and s.sandbox.zygote:
            zygote = zygote_for(s.sandbox, self.context, s.limits)
            try:
                await zygote.start()
            except SandboxError as exc:
                log.warning("no zygote, sandboxes start one by one: %s", exc)
            else:
                self.context = dataclasses.replace(self.context, zygote=zygote)
        log.info(
            "isolation",
            extra={
                "isolation": s.isolation,
                "python": s.sandbox.python,
                "features": {f.name: f.status for f in self.isolation.features},
            },
        )
        registry = await self._load_tools()
        for d in registry.diagnostics:
            log.warning(
                "tool problem: %s",
                d.message,
                extra={"code": d.code, "file": d.file, "tool": d.tool},
            )
        self.pool = SandboxPool(self._new_sandbox, s.pool_size, idle_ttl_s=s.pool_idle_ttl_s)
        self.pool.start()
        self.manager = CallManager(s, registry, self.pool)
        try:
            server, self.port, health = create_server(
                self.manager, s.listen, max_request_bytes=s.max_request_bytes
            )
        except RuntimeError as exc:
            await self.pool.close()
            raise DaemonError(f"cannot listen on {s.listen}: {exc}") from exc
        self._server, self._health = server, health
        # grpc's health servicer starts with "" SERVING; we are not, until the pool is warm.
        await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        if self._socket_path is not None:
            os.chmod(self._socket_path, 0o660)
        if not await self.pool.wait_ready(timeout_s=30.0):
            log.warning("the sandbox pool is not full after 30s; serving anyway")
        for name in (SERVICE_NAME, ""):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving",
            extra={
                "listen": s.listen,
                "port": self.port,
                "tools": len(registry.tools()),
                "pool_size": s.pool_size,
            },
        )
        _sd_notify("READY=1")

    async def _load_tools(self) -> Registry:
        if not self.settings.tools_dirs:
            return Registry()
        sandbox = self._new_sandbox()
        try:
            await sandbox.start()
            return await load_registry(self.settings.tools_dirs, sandbox)
        finally:
            await sandbox.close()

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop. Every call in flight gets its result before this returns."""
        _sd_notify("STOPPING=1")
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        if self._health is not None:
            await self._health.enter_graceful_shutdown()  # type: ignore[attr-defined]
        if self.manager is not None:
            await self.manager.drain(grace)
        if self._server is not None:
            # Calls are answered; give the streams a moment to deliver their results.
            await self._server.stop(2.0)
        if self.pool is not None:
            await self.pool.close()
        if self.context is not None and self.context.zygote is not None:
            await self.context.zygote.close()
        if self.isolation is not None and self.isolation.tracker is not None:
            await asyncio.to_thread(self.isolation.tracker.remove_spares)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
        log.info("stopped")

    async def serve_until_signalled(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then drain and stop."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        log.info("signal received: draining")
        await self.stop()


def _check_reachable(iso: Isolation, paths: tuple[Path, ...]) -> None:
    """Under namespaces the sandbox uid must be able to walk down to what it binds."""
    if not iso.namespaces or iso.uid is None:
        return
    gid = iso.gid if iso.gid is not None else iso.uid
    for path in paths:
        if path.exists() and not reachable(path, iso.uid, gid):
            raise DaemonError(
                f"the sandbox user (uid {iso.uid}) cannot reach {path}: every directory "
                "above it needs the search bit for others (chmod o+x), or choose a "
                "directory under /var/lib, /srv or /opt"
            )


def _is_loopback(listen: str) -> bool:
    import ipaddress

    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _prepare_socket(listen: str) -> Path:
    path = Path(listen.removeprefix("unix://").removeprefix("unix:"))
    if not path.is_absolute():
        raise DaemonError(f"the Unix socket path must be absolute: {listen}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        raise DaemonError(f"cannot create {path.parent}: {exc}") from exc
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # left by a daemon that died: nobody listens on it
        else:
            raise DaemonError(f"another process is already listening on {path}")
        finally:
            probe.close()
    return path


def _sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) about our state; nothing when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(state.encode(), address)
