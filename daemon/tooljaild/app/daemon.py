"""Assembling the daemon: settings -> sandboxes, tools, calls, server; and its life.

`Daemon.start` makes everything ready (the pools warm before the socket says
SERVING), in named steps; `Daemon.stop` drains: it refuses new calls, lets
running calls finish within the grace period, stops the rest and answers their
callers.

Backends. Each tool runs in its sandbox profile's pool (`tooljaild.app.pools`): the
daemon's default backend (`backend`, `serve --backend`) unless the tool names
another. Every backend comes from one table (`sandbox.backends`), assembled by
`open_sandboxes`, which `tooljail tools --check` uses too. The Docker engine is
connected only when some profile uses it; when it first answers, the daemon
removes the sandbox containers earlier runs with the same state directory left
behind (a crash), and at shutdown it removes its own. When the default
backend's sandboxes cannot be made (no engine answers, the image is missing)
the daemon refuses to start; when only some tools' cannot, it starts anyway,
and each call of those tools fails, saying why, until they can.

Life under systemd (`tooljaild.app.systemd`): STATUS at each step of `start`,
READY=1 once serving, WATCHDOG=1 from the event loop until `stop` ends,
STOPPING=1 when the drain begins; SIGHUP runs `reload` (`tooljaild.app.reload`).

The steps that need no running daemon (opening the backends' sandboxes,
loading the tools, `tooljail tools --check`) are functions of the settings in
`app.start`; this module puts the parts together and takes them apart in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2

from tooljaild.app.egress import DaemonEgress, identities_of
from tooljaild.app.errors import DaemonError
from tooljaild.app.journal import JOURNAL_FILE as JOURNAL_FILE  # tests read it here
from tooljaild.app.journal import configure, open_journal, prune_periodically
from tooljaild.app.listen import SocketPlan, prepare_socket
from tooljaild.app.pools import PoolSet, Profile
from tooljaild.app.relay import PeerRelay
from tooljaild.app.reload import Reloader
from tooljaild.app.start import STATE_DIR_MODE, load_tools, open_sandboxes
from tooljaild.app.systemd import Notifier
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.artifacts.store import prune_periodically as prune_store_periodically
from tooljaild.auth.policy import Identities
from tooljaild.calls import CallManager
from tooljaild.edge.drain import LINGER_MAX_S, Refusals
from tooljaild.edge.server import create_health_server, create_server
from tooljaild.edge.servicer import SERVICE_NAME
from tooljaild.edge.transport import ListenerSecurity, SecurityConfigError, listener_security
from tooljaild.journal.store import Journal
from tooljaild.sandbox.backends import BACKENDS, Backend, Sandboxes
from tooljaild.sandbox.docker import new_daemon_id
from tooljaild.sandbox.file_modes import DAEMON_UMASK, make_dirs
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.sessions.manager import SessionManager
from tooljaild.settings.addresses import default_daemon_id, is_loopback
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.catalog import builtin_tools
from tooljaild.tools.in_daemon import Services
from tooljaild.tools.registry import Registry

if TYPE_CHECKING:
    from tooljaild.app.metrics import Metrics

log = logging.getLogger(__name__)


class Daemon:
    """One tooljail daemon: its sandboxes, registry, call manager and gRPC server.

    Args:
        settings: What the operator set.
        backends: The backend table; tests may swap in `sandbox.backends.FakeBackend`.
        reload_settings: Reads the settings again for a reload (SIGHUP), as they
            were read at start (file, environment, flags); None: a reload keeps
            the settings and reloads only the tools.
        notifier: Tells systemd how the daemon is doing; None: from the environment.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backends: Mapping[str, type[Backend]] = BACKENDS,
        reload_settings: Callable[[], Settings] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings
        self.notifier = notifier or Notifier()
        self._watchdog: asyncio.Task[None] | None = None
        self._reloader = Reloader(
            running=lambda: self.settings,
            read_settings=reload_settings or (lambda: self.settings),
            load_tools=self._load_tools,
            apply=self._apply,
            registry=self._registry,
            security=lambda: self._security,
            on_identities=self._revoke,
            reload_egress=self._reload_egress,
        )
        self._reload_lock = asyncio.Lock()
        self._reloads: set[asyncio.Task[bool]] = set()
        self.port = 0
        self.sandboxes: Sandboxes | None = None
        self.pools: PoolSet | None = None
        self.manager: CallManager | None = None
        self.sessions: SessionManager | None = None
        self.artifacts: ArtifactStore | None = None
        self._pruning: asyncio.Task[None] | None = None
        """Expires artifacts past their age bound while serving (`prune_periodically`)."""
        self.journal: Journal | None = None
        self._journal_pruning: asyncio.Task[None] | None = None
        self.run_id = new_daemon_id()
        """Labels this run's containers (`org.tooljail.daemon`), to tell them from leftovers
        (not the `daemon_id` setting, which stays the same across runs)."""
        self.started_unix = time.time()
        """When this daemon started (GetDaemonInfo): a change tells a client it restarted."""
        self._refusals = Refusals()
        """New work refused while draining: `stop` listens on while it comes (`edge.drain`)."""
        self._table = backends
        self._server: grpc.aio.Server | None = None
        self._health: object | None = None
        self._health_server: grpc.aio.Server | None = None
        """Health checks alone, in plaintext, on `health_listen` (None: not set)."""
        self.health_port = 0
        self._socket: SocketPlan | None = None
        self._security: ListenerSecurity | None = None
        self._socket_path: Path | None = None
        """Where the socket was published (removed at stop)."""
        self._relay: PeerRelay | None = None
        """Serves the public Unix socket (None on TCP)."""
        self.metrics: Metrics | None = None
        """Served on `metrics_listen` (tooljaild.app.metrics); None when not configured."""
        self.egress: DaemonEgress | None = None
        """The egress proxy and policy (`[egress]`); None: none, no network."""

    @property
    def pool(self) -> SandboxPool | None:
        """The default profile's pool (the built-ins')."""
        return None if self.pools is None else self.pools.pool(self.pools.default)

    async def start(self) -> None:
        """Start serving: each step below, in order.

        Raises:
            DaemonError: When the address, the state directory, the journal or
                the default backend cannot be used; the message says why.
        """
        # From the start: a start slower than WatchdogSec is not taken for a hang.
        self._watchdog = asyncio.create_task(self.notifier.keep_alive())
        status = self.notifier.status
        status("opening the state directory and the journal")
        self._make_state_dirs()
        self.journal = open_journal(self.settings)
        self._open_artifacts()
        self._check_listen()
        s = self.settings
        try:
            status("starting the egress proxy" if s.egress else "preparing the sandbox backends")
            self.egress = await DaemonEgress.start(s, identities=identities_of(self._security))
            status("preparing the sandbox backends")
            self.sandboxes = await open_sandboxes(
                s, state_dir=s.state_dir, daemon_id=self.run_id, table=self._table
            )
            self.pools = PoolSet(s, self.sandboxes.factory, self._table)
            await self._ready_default_backend()
            status("loading the tools")
            registry = await self._load_tools()
            status("warming the sandbox pools")
            warm = await self._start_pools(registry)
            await self._serve(registry, warm)
        except BaseException:
            if self._socket is not None:
                self._socket.discard()  # the private bind directory, if still there
            if self.egress is not None:
                self.egress.stop()
            raise

    async def _reload_egress(self, settings: Settings) -> None:
        """A reload's `[egress]` and secrets file (see `DaemonEgress.reload`)."""
        if self.egress is not None:
            await self.egress.reload(settings, identities_of(self._security))

    def _make_state_dirs(self) -> None:
        s = self.settings
        try:
            # 0711: a sandbox's uid may pass through to the runner and to its own
            # workspace (by name), and list nothing; what is in them is private
            # (tooljaild.sandbox.file_modes). Parents the daemon makes too: it would be
            # stopped at them.
            for directory in (s.state_dir, s.workspace_root):
                make_dirs(directory, STATE_DIR_MODE)
                directory.chmod(STATE_DIR_MODE)
        except OSError as exc:
            raise DaemonError(f"cannot create state directory {s.state_dir}: {exc}") from exc

    def _check_listen(self) -> None:
        """A Unix socket's place is checked and prepared; TCP only on loopback unless allowed."""
        s = self.settings
        try:
            self._security = security = listener_security(s)
        except SecurityConfigError as exc:
            raise DaemonError(str(exc)) from exc
        if s.listen.startswith("unix:"):
            p = security.socket
            self._socket = prepare_socket(s.listen, p.mode, p.uid, p.gid)
        elif not (
            s.allow_insecure_tcp
            or is_loopback(s.listen)
            # TLS alone hides the traffic but admits anyone: it needs an authenticator too.
            or (s.tls.enabled and security.authenticator.required)
        ):
            what = "TCP without tokens or client certificates" if s.tls.enabled else "plaintext TCP"
            raise DaemonError(
                f"refusing to serve {what} on {s.listen}: anyone who reaches it could "
                "run code here. Serve TLS ([tls] cert_file and key_file) with [auth] tokens_file "
                "or [tls] client_ca_file, listen on a Unix socket or a loopback address "
                "(127.0.0.1:PORT, [::1]:PORT, localhost:PORT), or set allow_insecure_tcp = "
                "true (TOOLJAIL_ALLOW_INSECURE_TCP=true) on a network you trust"
            )

    async def _ready_default_backend(self) -> None:
        """Refuse to start unless the default profile's sandboxes can be made; warm it.

        Raises:
            DaemonError: They cannot (no engine, no image): the built-ins could not run.
        """
        assert self.sandboxes is not None and self.pools is not None
        s, default = self.settings, self.pools.default
        problem = (await self.sandboxes.unusable([default])).get(default)
        if problem is not None:
            await self._close_sandboxes()
            raise DaemonError(
                f"the default backend is {default.backend}, but {problem.why}; or serve with "
                '--backend process (backend = "process")',
                unavailable=problem.unavailable,
            )
        await self.sandboxes.warm([default])
        fields = {"isolation": s.isolation, "backend": s.backend}
        for backend in self.sandboxes.backends.values():
            fields.update(backend.log_fields())
        log.info("isolation", extra=fields)

    async def _load_tools(self, settings: Settings | None = None) -> Registry:
        """Built-ins described for this daemon, user tools described in a sandbox.

        Args:
            settings: Whose `tools_dirs` to load (a reload's); None: the daemon's.
        """
        assert self.sandboxes is not None and self.pools is not None
        s, default = settings or self.settings, self.pools.default
        dirs, packages = [d.resolve() for d in s.files_dirs], s.egress is not None
        builtins = builtin_tools(self.sandboxes.promises(default), dirs, packages=packages)
        registry = await load_tools(s, self.sandboxes, default, builtins)
        for d in registry.diagnostics:
            log.warning(
                "tool problem: %s",
                d.message,
                extra={"code": d.code, "file": d.file, "tool": d.tool},
            )
        return registry

    async def _start_pools(self, registry: Registry) -> list[Profile]:
        """Start the pools of the default profile and of every served tool's profile.

        A profile's pool starts only when its backend can make its sandboxes (a
        docker profile: the engine answers and has its image); otherwise the
        pool is made at the tool's first call, which then fails saying why (and
        the pool keeps trying, with its back-off).

        Returns:
            The profiles whose pools were started.
        """
        assert self.sandboxes is not None and self.pools is not None
        profiles = self.pools.profiles(registry.tools())
        await self.sandboxes.warm(profiles)
        problems = await self.sandboxes.unusable(profiles)
        failing: dict[tuple[str, str], list[str]] = {}
        for tool in registry.tools():
            profile = self.pools.profile_for(tool)
            if profile in problems:
                failing.setdefault((profile.backend, problems[profile].why), []).append(tool.name)
        for (kind, why), names in failing.items():
            log.warning(
                "%s-backed tools will fail until this is fixed: %s",
                kind,
                why,
                extra={"tools": names},
            )
        started = [p for p in profiles if p not in problems]
        for profile in started:
            self.pools.pool(profile)
        return started

    async def _serve(self, registry: Registry, warm: list[Profile]) -> None:
        """Listen, wait (bounded) for the warm pools, then say SERVING."""
        assert self.pools is not None
        s = self.settings
        self.sessions = SessionManager(
            s.sessions,
            s.limits,
            self.pools.session_sandbox,
            self.journal,
            open_timeout_s=s.sandbox.start_timeout_s,
            spool_dir=s.state_dir / "spool",
            egress=None if self.egress is None else self.egress.service,
            artifacts=self.artifacts,
        )
        self.sessions.start()
        cache = None if self.egress is None else self.egress.cache  # install_packages's
        self.manager = CallManager(
            s,
            registry,
            self.pools.pool_for,
            journal=self.journal,
            sessions=self.sessions,
            session_misfit=self.pools.session_misfit,
            services=Services(s, artifacts=self.artifacts, sessions=self.sessions, packages=cache),
            egress=None if self.egress is None else self.egress.service,
        )
        try:
            self._serve_metrics()
        except DaemonError:
            await self._close_sandboxes()
            raise
        address = s.listen if self._socket is None else self._socket.bind_address
        try:
            server, self.port, health = create_server(
                self.manager,
                address,
                max_request_bytes=s.max_request_bytes,
                sessions=self.sessions,
                artifacts=self.artifacts,
                authenticator=None if self._security is None else self._security.authenticator,
                credentials=None if self._security is None else self._security.credentials,
                daemon_id=s.daemon_id,
                listen=s.listen,
                started_unix=self.started_unix,
                refusals=self._refusals,
                max_health_watches=s.health_max_watches,
                max_health_watches_per_peer=s.health_max_watches_per_peer,
            )
        except RuntimeError as exc:
            await self._close_sandboxes()
            raise DaemonError(f"cannot listen on {s.listen}: {exc}") from exc
        self._server, self._health = server, health
        # grpc's health servicer starts with "" SERVING; we are not, until the pool is warm.
        await health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        if self._socket is not None:
            await self._publish_socket(self._socket)
        await self._serve_health(health)
        if self.artifacts is not None:
            self._pruning = asyncio.create_task(prune_store_periodically(self.artifacts))
        if self.journal is not None:  # off every call's path; an idle daemon prunes too
            self._journal_pruning = asyncio.create_task(prune_periodically(self.journal))
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
                "daemon_id": self.name,
                "tools": len(registry.tools()),
                "pool_size": s.pool_size,
            },
        )
        self.notifier.ready(self._serving_status())

    async def _publish_socket(self, plan: SocketPlan) -> None:
        """Put the public socket in place and relay it to gRPC's private one
        (`tooljaild.app.relay`: each connection then names its caller's uid).

        Raises:
            DaemonError: The socket cannot be put in place (what was started is stopped).
        """
        s = self.settings
        try:
            listening = plan.publish()
        except DaemonError:
            if self._server is not None:
                await self._server.stop(None)
            await self._close_sandboxes()
            raise
        self._socket_path = plan.path
        self._relay = PeerRelay(
            plan.grpc_socket,
            max_connections=s.socket_max_connections,
            max_per_uid=s.socket_max_connections_per_uid,
        )
        await self._relay.start(listening)

    @property
    def name(self) -> str:
        """The daemon_id it answers with (the setting, else the default of its
        address; `create_server` names the servicer the same way)."""
        return self.settings.daemon_id or default_daemon_id(self.settings.listen, self.port)

    def _serving_status(self) -> str:
        """The STATUS= line while serving."""
        tools = 0 if self.manager is None else len(self.manager.registry.tools())
        status = f"serving {tools} tools on {self.settings.listen}"
        if self._reloader.kept:  # until a reload uses them all: `systemctl status` shows it
            status += f"; the last reload kept {', '.join(self._reloader.kept)} (see the log)"
        return status

    def _registry(self) -> Registry:
        assert self.manager is not None
        return self.manager.registry

    def _apply(self, settings: Settings, registry: Registry) -> None:
        """A reload's settings and tools, for the calls admitted from now on."""
        assert self.manager is not None
        self.settings = settings
        self.manager.reconfigure(settings, registry)
        if self.journal is not None:
            configure(self.journal, settings.journal)

    def _revoke(self, identities: Identities) -> None:
        """Stop what `identities` (a reload's) no longer allow: calls not run, approval watches."""

        def may_call(client: str, tool: str) -> bool:
            identity = identities.by_name.get(client)
            return identity is not None and identity.may_use(tool)

        if self.manager is not None:
            self.manager.approvals.feed.reauthorize(identities.by_name.get)
            self.manager.revoke(may_call)

    async def reload(self) -> bool:
        """Re-read the settings and the tools and apply what can change live
        (`tooljaild.app.reload`); calls running or queued are left alone.

        Reloads run one at a time; one asked for during another runs after it
        (it may see a file the first one missed).

        Returns:
            Whether all that was re-read could be used (False: what could not
            stays as it was; the log says why).
        """
        async with self._reload_lock:
            if self.manager is None or self.manager.draining:
                # Starting: nothing to reload yet. Stopping: a READY=1 now would
                # tell systemd the daemon it is stopping serves again.
                log.warning("reload ignored: the daemon is not serving (starting or stopping)")
                return False
            self.notifier.reloading()
            try:
                return await self._reloader.reload()
            finally:
                self.notifier.ready(self._serving_status())

    def _reload_soon(self) -> None:
        """SIGHUP's handler: a reload task (kept referenced until it ends)."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _close_sandboxes(self) -> None:
        """Close every pool, then every backend (which removes what is left of ours)."""
        if self.pools is not None:
            await self.pools.close()
        if self.sandboxes is not None:
            await self.sandboxes.close()

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop. Every call in flight gets its result before this returns."""
        self.notifier.stopping()
        grace = self.settings.shutdown_grace_s if grace_s is None else grace_s
        began = time.monotonic()
        # New calls and sessions are refused from now, before health says
        # NOT_SERVING: a client that sees either (GetDaemonInfo answers
        # `draining`) sends nothing new here.
        if self.manager is not None:
            self.manager.draining = True
        if self.sessions is not None:
            self.sessions.draining = True
        if self._health is not None:
            await self._health.enter_graceful_shutdown()  # type: ignore[attr-defined]
        if self.manager is not None:
            await self.manager.drain(grace)
        # Listen on while clients still send new work (refused): each hears it
        # drains before the listener goes (`tooljaild.edge.drain`).
        await self._refusals.quiet(min(LINGER_MAX_S, grace - (time.monotonic() - began)))
        if self.sessions is not None:
            await self.sessions.stop()
        if self._relay is not None:
            self._relay.stop_accepting()  # as gRPC's own listener goes (below)
        if self._server is not None:
            # Calls are answered; give the streams a moment to deliver their results.
            await self._server.stop(2.0)
        if self._relay is not None:
            await self._relay.close()
        if self._health_server is not None:
            await self._health_server.stop(None)
        await self._close_sandboxes()
        if self.egress is not None:  # after the sandboxes: their gates close with it
            await asyncio.to_thread(self.egress.stop)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
        if self._socket is not None:
            self._socket.discard()  # gRPC's private socket and its directory
        for pruning in (self._journal_pruning, self._pruning):
            if pruning is not None:
                pruning.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pruning
        if self.journal is not None:
            self.journal.close()
        if self.artifacts is not None:
            self.artifacts.close()
        if self.metrics is not None:
            self.metrics.close()

        if self._watchdog is not None:
            # Last: a drain slower than WatchdogSec is not taken for a hang.
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        log.info("stopped")

    async def _serve_health(self, health: grpc_health.aio.HealthServicer) -> None:
        """Serve `health` alone on `health_listen`, if set (see `create_health_server`).

        Raises:
            DaemonError: The address cannot be bound (what was started is stopped).
        """
        listen = self.settings.health_listen
        if listen is None:
            return
        try:
            server, self.health_port = create_health_server(health, listen)
        except RuntimeError as exc:
            if self._server is not None:
                await self._server.stop(None)
            await self._close_sandboxes()
            raise DaemonError(f"cannot serve health checks on {listen}: {exc}") from exc
        await server.start()
        self._health_server = server

    def _serve_metrics(self) -> None:
        """Serve `/metrics` on `metrics_listen`, if set, fed by the manager and the rest.

        Raises:
            DaemonError: The address is not HOST:PORT or cannot be bound.
        """
        listen = self.settings.metrics_listen
        if listen is None or self.manager is None:
            return
        # Imported here: prometheus_client is needed only by a daemon that serves metrics.
        from tooljaild.app.metrics import Metrics

        metrics = Metrics()
        metrics.sources.pools, metrics.sources.sessions = self.pools, self.sessions
        metrics.sources.artifacts = self.artifacts
        if self.egress is not None:  # its denials by reason, its open connections
            self.egress.on_denial, metrics.sources.egress = (
                metrics.egress_denied,
                self.egress.service,
            )
        metrics.attach(self.manager, self.journal)
        try:
            metrics.serve(listen)
        except (ValueError, OSError) as exc:
            raise DaemonError(f"cannot serve metrics on {listen}: {exc}") from exc
        self.metrics = metrics

    def _open_artifacts(self) -> None:
        """Open the artifact store (`<state_dir>/artifacts`), made consistent after a crash.

        Raises:
            DaemonError: It cannot be opened.
        """
        root = self.settings.state_dir / "artifacts"
        try:
            self.artifacts = ArtifactStore.open(root, self.settings.artifacts)
        except (OSError, sqlite3.Error) as exc:
            raise DaemonError(f"cannot open the artifact store {root}: {exc}") from exc

    async def serve_until_signalled(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then drain and stop; reload on SIGHUP.

        This is the process's life (`tooljail serve`): it also sets the
        process's umask to `DAEMON_UMASK`, before anything is written, so
        every file the daemon writes is its own unless made otherwise on
        purpose (tooljaild.sandbox.file_modes). A daemon embedded with `start` and
        `stop` keeps its process's umask.
        """
        os.umask(DAEMON_UMASK)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_soon)
        await self.start()
        await stop.wait()
        log.info("signal received: draining")
        await self.stop()
