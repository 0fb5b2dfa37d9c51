"""Assembling the daemon: settings -> sandboxes, tools, calls, server; and its life.

`Daemon.start` makes everything ready (the pools warm before the socket says
SERVING); `Daemon.stop` drains: it refuses new calls, lets running calls finish
within the grace period, stops the rest and answers their callers.

Backends. Each tool runs in its sandbox profile's pool (`tooljaild.pools`): the
daemon's default backend (`backend`, `serve --backend`) unless the tool names
another. The Docker engine is connected only when some profile uses it; when it
first answers, the daemon removes the sandbox containers earlier runs with the
same state directory left behind (a crash), and at shutdown it removes its own.
With `backend = "docker"` the daemon refuses to start while no engine answers or
the image is missing; with the process default it starts anyway, and each call
of a docker-backed tool fails, saying why, until the engine answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from tooljail.errors import TooljailError
from tooljaild.calls import CallManager
from tooljaild.config import Settings
from tooljaild.journal import Journal, JournalError
from tooljaild.loader import load_registry
from tooljaild.pools import PoolSet, Profile
from tooljaild.registry import Registry
from tooljaild.sandbox.base import Sandbox, SandboxError
from tooljaild.sandbox.cgroups import cgroup_name_for
from tooljaild.sandbox.docker import (
    DockerContext,
    DockerEngine,
    EngineUnavailableError,
    new_daemon_id,
    remove_own_containers,
    remove_stale_containers,
)
from tooljaild.sandbox.docker_engine import explain, image_missing_message
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

JOURNAL_FILE = "journal.sqlite3"


class DaemonError(TooljailError):
    """The daemon cannot start; the message says why and what to do.

    Args:
        message: Why, and what to do.
        unavailable: Something it needs does not answer (the Docker engine),
            rather than being misconfigured: `serve` then exits 3, not 2.
    """

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


class Daemon:
    """One tooljail daemon: its pool, registry, call manager and gRPC server."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = 0
        self.isolation: Isolation | None = None
        self.context: SandboxContext | None = None
        self.pools: PoolSet | None = None
        self.manager: CallManager | None = None
        self.journal: Journal | None = None
        self.daemon_id = new_daemon_id()
        """Labels this run's containers (`org.tooljail.daemon`), to tell them from leftovers."""
        self.docker_context: DockerContext | None = None
        self._engine: DockerEngine | None = None
        self._server: grpc.aio.Server | None = None
        self._health: object | None = None
        self._socket_path: Path | None = None

    @property
    def pool(self) -> SandboxPool | None:
        """The default profile's pool (the built-ins')."""
        return None if self.pools is None else self.pools.pool(self.pools.default)

    def _factory(self, profile: Profile) -> Callable[[], Sandbox]:
        """What makes one sandbox of `profile` (for its pool)."""
        s = self.settings
        limits = profile.sandbox_limits(s.limits)
        if profile.backend == "docker":
            update = {"image": profile.image, "network": profile.network}
            config = s.docker.model_copy(update=update)
            context = self.docker_context
            assert context is not None
            return lambda: config.build(context, limits)

        def process_sandbox() -> Sandbox:
            # Read at each build: start() may still swap the python or add the zygote.
            assert self.context is not None
            return s.sandbox.build(self.context, limits)

        return process_sandbox

    def _new_sandbox(self) -> Sandbox:
        """A sandbox of the default profile (to describe the user tools)."""
        assert self.pools is not None
        return self._factory(self.pools.default)()

    def _sweep(self, client: Any) -> None:
        """Remove containers of earlier runs (a crash); on an engine thread, once."""
        assert self.docker_context is not None
        removed = remove_stale_containers(
            client, self.daemon_id, state_dir=self.docker_context.state_dir
        )
        if removed:
            log.info("removed %d sandbox containers left by an earlier run", removed)

    async def _engine_check(self, images: list[str]) -> dict[str, str]:
        """Connect to the engine (which sweeps leftovers) and look for `images`.

        Returns:
            Why each image cannot be used now (no engine, or not in it); {}: all can.
        """
        assert self._engine is not None
        try:
            client = await self._engine.client()
        except EngineUnavailableError as exc:
            return dict.fromkeys(images, str(exc))
        from docker.errors import DockerException, ImageNotFound

        problems: dict[str, str] = {}
        for image in images:
            try:
                await self._engine.call(client.images.get, image)
            except ImageNotFound as exc:
                problems[image] = image_missing_message(image, exc)
            except (DockerException, OSError) as exc:
                where = self._engine.where
                problems[image] = f"the Docker engine at {where} failed: {explain(exc)}"
        return problems

    async def _start_zygote(self) -> None:
        s = self.settings
        assert self.context is not None and self.isolation is not None
        if not (self.isolation.namespaces and s.sandbox.zygote) or self.context.zygote:
            return
        zygote = zygote_for(s.sandbox, self.context, s.limits)
        try:
            await zygote.start()
        except SandboxError as exc:
            log.warning("no zygote, sandboxes start one by one: %s", exc)
        else:
            self.context = dataclasses.replace(self.context, zygote=zygote)

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
        self._open_journal()
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
                cgroup_name=cgroup_name_for(s.state_dir),
            )
        except IsolationError as exc:
            raise DaemonError(str(exc)) from exc
        if self.isolation.tracker is not None:
            # What a killed daemon on this state directory left: kill and remove.
            swept = await asyncio.to_thread(self.isolation.tracker.sweep_stale)
            if swept:
                log.warning("removed %d sandbox cgroups a previous daemon left behind", swept)
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
        # The engine connects on first use (never, when no profile is docker's).
        self._engine = s.docker.engine(on_connect=self._sweep)
        self.docker_context = DockerContext.from_process_context(
            self.context,
            engine=self._engine,
            state_dir=s.state_dir.resolve(),
            daemon_id=self.daemon_id,
        )
        self.pools = PoolSet(s, self._factory)
        if s.backend == "process":
            await self._start_zygote()
        else:
            problem = (await self._engine_check([s.docker.image])).get(s.docker.image)
            if problem is not None:
                unavailable = not self._engine.connected
                self._engine.close()
                raise DaemonError(
                    f"the default backend is docker, but {problem}; or serve with "
                    '--backend process (backend = "process")',
                    unavailable=unavailable,
                )
        log.info(
            "isolation",
            extra={
                "isolation": s.isolation,
                "backend": s.backend,
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
        warm = await self._start_pools(registry)
        self.manager = CallManager(s, registry, self.pools.pool_for, journal=self.journal)
        try:
            server, self.port, health = create_server(
                self.manager, s.listen, max_request_bytes=s.max_request_bytes
            )
        except RuntimeError as exc:
            await self._close_sandboxes()
            raise DaemonError(f"cannot listen on {s.listen}: {exc}") from exc
        self._server, self._health = server, health
        # grpc's health servicer starts with "" SERVING; we are not, until the pool is warm.
        await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        if self._socket_path is not None:
            os.chmod(self._socket_path, 0o660)
        late = await self.pools.wait_ready(warm, timeout_s=30.0)
        if late:
            log.warning(
                "sandbox pools not full after 30s; serving anyway: %s",
                "; ".join(p.describe() for p in late),
            )
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

    async def _start_pools(self, registry: Registry) -> list[Profile]:
        """Start the pools of the default profile and of every served tool's profile.

        A docker profile's pool starts only when the engine answers and has its
        image; otherwise the pool is made at the tool's first call, which then
        fails saying why (and the pool keeps trying, with its back-off).

        Returns:
            The profiles whose pools were started.
        """
        assert self.pools is not None
        profiles = self.pools.profiles(registry.tools())
        if self.settings.backend != "process" and any(p.backend == "process" for p in profiles):
            await self._start_zygote()
        images = sorted({p.image for p in profiles if p.backend == "docker" and p.image})
        problems = await self._engine_check(images) if images else {}
        for image, problem in problems.items():
            names = [t.name for t in registry.tools() if self.pools.profile_for(t).image == image]
            log.warning(
                "docker-backed tools will fail until this is fixed: %s",
                problem,
                extra={"tools": names},
            )
        started = [p for p in profiles if p.image not in problems]
        for profile in started:
            self.pools.pool(profile)
        return started

    async def _close_sandboxes(self) -> None:
        """Close every pool, then remove whatever container of ours is left."""
        if self.pools is not None:
            await self.pools.close()
        engine = self._engine
        if engine is None:
            return
        if engine.connected:
            try:
                client = await engine.client()
                removed = await asyncio.wait_for(
                    engine.call(
                        remove_own_containers,
                        client,
                        self.daemon_id,
                        state_dir=self.docker_context.state_dir if self.docker_context else None,
                    ),
                    engine.request_timeout_s,
                )
                if removed:
                    log.info("removed %d sandbox containers at shutdown", removed)
            except Exception as exc:  # the next start sweeps them
                log.warning("cannot remove this daemon's containers: %s", explain(exc))
        engine.close()

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
        await self._close_sandboxes()
        if self.context is not None and self.context.zygote is not None:
            await self.context.zygote.close()
        if self.isolation is not None and self.isolation.tracker is not None:
            await asyncio.to_thread(self.isolation.tracker.close)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
        if self.journal is not None:
            self.journal.close()
        log.info("stopped")

    def _open_journal(self) -> None:
        """Open the journal, and mark what a dead predecessor left running as lost.

        Raises:
            DaemonError: The journal is damaged, foreign, unwritable or in use.
        """
        s = self.settings
        try:
            self.journal = Journal.open(
                s.state_dir / JOURNAL_FILE,
                max_age_s=s.journal_max_age_s,
                max_rows=s.journal_max_rows,
            )
            lost = self.journal.recover()
            self.journal.prune()
        except JournalError as exc:
            raise DaemonError(str(exc)) from exc
        if self.journal.created and (s.state_dir / "runner").exists():
            # This state directory served before, and its journal is gone.
            log.warning(
                "no call journal was found in %s, which a daemon used before: a new one "
                "is started, and calls made before are no longer known",
                s.state_dir,
            )
        for entry in lost:
            log.warning(
                "call lost: the daemon stopped while it ran",
                extra={"call_id": entry.call_id, "tool": entry.tool, "sandbox": entry.sandbox_id},
            )

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
