"""The sandbox backends, by kind: the one table the daemon and `tools --check` assemble.

`BACKENDS` maps a backend's kind (the config's `backend`, a tool's
`sandbox={"backend": ...}`) to its entry, a `backend.Backend` subclass (the
contract is drawn there). Nothing else in the daemon names a backend: pools,
the daemon's start and stop, the built-ins' descriptions and `tools --check`
ask the entry of a profile's kind. `Sandboxes` is a table assembled for one
daemon.

Adding a backend: a module with its config (a pydantic model with
`kind: Literal[...]`, `build()`, unknown keys forbidden), its `Sandbox` and its
entry; then, here, the entry in `BACKENDS` and its config table as a field of
`BackendSettings`, and its kind in `kinds.BackendKind` (kept apart so the CLI
need not import every backend). `FakeBackend` is an entry for tests (not in
the table: a test hands `Sandboxes` or the daemon a table with it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tooljaild.egress.dirs import EgressDirs
from tooljaild.sandbox.backend import (
    Backend,
    Host,
    Profile,
    Promises,
    Unusable,
    memory_in_words,
)
from tooljaild.sandbox.base import Sandbox, SandboxError
from tooljaild.sandbox.cgroups import cgroup_name_for
from tooljaild.sandbox.docker import (
    DockerContext,
    EngineUnavailableError,
    build_docker_sandbox,
    remove_own_containers,
    remove_stale_containers,
)
from tooljaild.sandbox.docker_engine import engine_for, explain, image_missing_message
from tooljaild.sandbox.fake import FakeSandbox
from tooljaild.sandbox.isolation import Isolation, IsolationError, reachable, sandbox_python
from tooljaild.sandbox.isolation import resolve as resolve_isolation
from tooljaild.sandbox.process import SandboxContext, build_process_sandbox, zygote_for
from tooljaild.settings.sandbox import (
    DockerSandboxConfig,
    ProcessSandboxConfig,
    image_reference,
)

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings
    from tooljaild.settings.sandbox import SandboxProfile

__all__ = [
    "BACKENDS",
    "Backend",
    "DockerBackend",
    "FakeBackend",
    "Host",
    "ProcessBackend",
    "Profile",
    "Promises",
    "Sandboxes",
    "Unusable",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- process


class ProcessBackend(Backend):
    """Runner process trees on this host, in namespaces where the host allows."""

    kind = "process"

    def __init__(self, settings: Settings, host: Host) -> None:
        super().__init__(settings, host)
        self.python_config: ProcessSandboxConfig = settings.sandbox
        """The table, with the interpreter the sandbox uid can reach (see `prepare`)."""
        self.isolation: Isolation | None = None
        self.context: SandboxContext | None = None

    @classmethod
    def config(cls, settings: Settings) -> ProcessSandboxConfig:
        return settings.sandbox

    async def prepare(self) -> None:
        self.isolation = await asyncio.to_thread(self._resolve_isolation)
        if self.isolation.tracker is not None:
            # What a killed daemon on this state directory left: kill and remove.
            swept = await asyncio.to_thread(self.isolation.tracker.sweep_stale)
            if swept:
                log.warning("removed %d sandbox cgroups a previous daemon left behind", swept)
        python = sandbox_python(self.python_config.python, self.isolation)
        if python != self.python_config.python:
            self.python_config = self.python_config.model_copy(update={"python": python})
        _check_reachable(self.isolation, (self.host.state_dir, *self.host.shared_dirs))
        egress = self.host.egress_root(self.settings)
        if egress is not None:
            await asyncio.to_thread(_prepare_egress_root, egress)
        self.context = SandboxContext(
            workspace_root=self.host.workspace_root,
            runner_dir=self.host.runner_dir,
            isolation=self.isolation,
            shared_dirs=self.host.shared_dirs,
            egress_root=egress,
        )

    def _resolve_isolation(self) -> Isolation:
        s, config = self.settings, self.settings.sandbox
        return resolve_isolation(
            s.isolation,
            bwrap=config.bwrap,
            sandbox_user=config.user,
            use_cgroups=config.use_cgroups,
            cgroup_name=cgroup_name_for(s.state_dir),
        )

    def factory(self, profile: Profile) -> Callable[[], Sandbox]:
        limits = profile.sandbox_limits(self.settings.limits)

        def process_sandbox() -> Sandbox:
            # Read at each build: `warm` may add the zygote after pools exist.
            assert self.context is not None, "prepare() first"
            return build_process_sandbox(self.python_config, self.context, limits)

        return process_sandbox

    async def warm(self) -> None:
        iso, context = self.isolation, self.context
        assert iso is not None and context is not None, "prepare() first"
        if not (iso.namespaces and self.python_config.zygote) or context.zygote:
            return
        zygote = zygote_for(self.python_config, context, self.settings.limits)
        try:
            await zygote.start()
        except SandboxError as exc:
            log.warning("no zygote, sandboxes start one by one: %s", exc)
        else:
            self.context = dataclasses.replace(context, zygote=zygote)

    def promises(self, profile: Profile) -> Promises:
        assert self.isolation is not None, "prepare() first"
        tracker = self.isolation.tracker
        memory = tracker is not None and "memory" in tracker.controllers
        return Promises(
            isolated=self.isolation.namespaces,
            # Without namespaces a process shares the host's network.
            network=not self.isolation.namespaces,
            memory=memory_in_words(
                profile.sandbox_limits(self.settings.limits), whole_sandbox=memory
            ),
        )

    def log_fields(self) -> dict[str, Any]:
        assert self.isolation is not None, "prepare() first"
        return {
            "python": self.python_config.python,
            "features": {f.name: f.status for f in self.isolation.features},
        }

    async def close(self) -> None:
        if self.context is not None and self.context.zygote is not None:
            await self.context.zygote.close()
        if self.isolation is not None and self.isolation.tracker is not None:
            await asyncio.to_thread(self.isolation.tracker.close)


def _prepare_egress_root(root: Path) -> None:
    """Make the sandboxes' egress root (0711), emptied of an earlier run's directories.

    Raises:
        IsolationError: It cannot be made.
    """
    dirs = EgressDirs(root)
    try:
        dirs.prepare()
        swept = dirs.sweep()
    except OSError as exc:
        raise IsolationError(f"cannot make the egress directory {root}: {exc}") from exc
    if swept:
        log.info("removed %d egress directories an earlier run left behind", swept)


def _check_reachable(iso: Isolation, paths: tuple[Path, ...]) -> None:
    """Under namespaces the sandbox uid must be able to walk down to what it binds."""
    if not iso.namespaces or iso.uid is None:
        return
    gid = iso.gid if iso.gid is not None else iso.uid
    for path in paths:
        if path.exists() and not reachable(path, iso.uid, gid):
            raise IsolationError(
                f"the sandbox user (uid {iso.uid}) cannot reach {path}: every directory "
                "above it needs the search bit for others (chmod o+x), or choose a "
                "directory under /var/lib, /srv or /opt"
            )


# ---------------------------------------------------------------------- docker


class DockerBackend(Backend):
    """Containers of an image, through a Docker engine connected on first use.

    When the engine first answers, the containers earlier runs with the same
    state directory left behind (a crash) are removed; `close` removes this
    daemon's own.
    """

    kind = "docker"

    def __init__(self, settings: Settings, host: Host) -> None:
        super().__init__(settings, host)
        self.engine = engine_for(settings.docker, on_connect=self._sweep)
        self.context = DockerContext(
            engine=self.engine,
            runner_dir=host.runner_dir,
            state_dir=host.state_dir,
            daemon_id=host.daemon_id,
            shared_dirs=host.shared_dirs,
            egress_root=host.egress_root(settings),
        )

    @classmethod
    def config(cls, settings: Settings) -> DockerSandboxConfig:
        return settings.docker

    @classmethod
    def profile(
        cls, settings: Settings, chosen: SandboxProfile | None, limits: tuple[tuple[str, Any], ...]
    ) -> Profile:
        image, network = settings.docker.image, settings.docker.network
        if chosen is not None:
            if chosen.image is not None:
                image = image_reference(chosen.image)
            if chosen.network is not None:
                network = chosen.network
        return Profile(cls.kind, image, network, limits)

    async def prepare(self) -> None:
        if self.context.egress_root is not None:
            await asyncio.to_thread(_prepare_egress_root, self.context.egress_root)

    def _sweep(self, client: Any) -> None:
        """Remove containers of earlier runs (a crash); on an engine thread, once."""
        removed = remove_stale_containers(
            client, self.host.daemon_id, state_dir=self.context.state_dir
        )
        if removed:
            log.info("removed %d sandbox containers left by an earlier run", removed)

    def factory(self, profile: Profile) -> Callable[[], Sandbox]:
        limits = profile.sandbox_limits(self.settings.limits)
        update = {"image": profile.image, "network": profile.network}
        config = self.settings.docker.model_copy(update=update)
        return lambda: build_docker_sandbox(config, self.context, limits)

    async def unusable(self, profiles: Iterable[Profile]) -> dict[Profile, Unusable]:
        """Connect to the engine (which sweeps leftovers) and look for the profiles' images."""
        wanted = [p for p in profiles if p.image]
        if not wanted:
            return {}
        try:
            client = await self.engine.client()
        except EngineUnavailableError as exc:
            return {p: Unusable(str(exc), unavailable=True) for p in wanted}
        from docker.errors import DockerException, ImageNotFound

        problems: dict[str, Unusable] = {}
        for image in sorted({p.image for p in wanted if p.image}):
            try:
                await self.engine.call(client.images.get, image)
            except ImageNotFound as exc:
                problems[image] = Unusable(image_missing_message(image, exc))
            except (DockerException, OSError) as exc:
                where = self.engine.where
                problems[image] = Unusable(f"the Docker engine at {where} failed: {explain(exc)}")
        return {p: problems[p.image] for p in wanted if p.image in problems}

    def promises(self, profile: Profile) -> Promises:
        limits = profile.sandbox_limits(self.settings.limits)
        return Promises(
            isolated=True,
            network=profile.network,
            memory=memory_in_words(limits, whole_sandbox=True),
        )

    async def close(self) -> None:
        engine = self.engine
        if engine.connected:
            try:
                client = await engine.client()
                removed = await asyncio.wait_for(
                    engine.call(
                        remove_own_containers,
                        client,
                        self.host.daemon_id,
                        state_dir=self.context.state_dir,
                    ),
                    engine.request_timeout_s,
                )
                if removed:
                    log.info("removed %d sandbox containers at shutdown", removed)
            except Exception as exc:  # the next start sweeps them
                log.warning("cannot remove this daemon's containers: %s", explain(exc))
        engine.close()


# ---------------------------------------------------------------------- fake


class FakeBackend(Backend):
    """Scripted sandboxes (`FakeSandbox`) for tests: no processes, no engine.

    Not in `BACKENDS`: a test puts it in place of a kind of its table, e.g.
    `{**BACKENDS, "process": FakeBackend.posing_as("process")}`, to run a real
    daemon without sandboxes.
    """

    kind = "fake"

    @classmethod
    def posing_as(cls, kind: str) -> type[Backend]:
        """This entry under another kind (a table's key is its entry's kind)."""
        return type(f"{cls.__name__}As{kind.title()}", (cls,), {"kind": kind})

    def factory(self, profile: Profile) -> Callable[[], Sandbox]:
        return FakeSandbox

    def promises(self, profile: Profile) -> Promises:
        return Promises(isolated=False, network=True, memory=None)


# ---------------------------------------------------------------------- the table

BACKENDS: Mapping[str, type[Backend]] = {
    ProcessBackend.kind: ProcessBackend,
    DockerBackend.kind: DockerBackend,
}
"""Every backend, by the kind a config or a tool names."""


class Sandboxes:
    """Every backend of a table, assembled for one daemon (or one `tools --check`).

    Args:
        settings: The daemon's settings.
        host: What every backend shares.
        table: The backends by kind; tests may swap in `FakeBackend.posing_as(kind)`.

    Raises:
        ValueError: An entry's kind is not its key (profiles name backends by kind).
    """

    def __init__(
        self, settings: Settings, host: Host, table: Mapping[str, type[Backend]] = BACKENDS
    ) -> None:
        wrong = [key for key, entry in table.items() if entry.kind != key]
        if wrong:
            raise ValueError(f"backend table entries under another kind than their own: {wrong}")
        self.settings = settings
        self.table = table
        self.backends = {kind: entry(settings, host) for kind, entry in table.items()}
        self._closed = False

    def __getitem__(self, kind: str) -> Backend:
        return self.backends[kind]

    async def prepare(self) -> None:
        """Prepare every backend (see `Backend.prepare`).

        Raises:
            IsolationError: A backend cannot be used as configured.
        """
        for backend in self.backends.values():
            await backend.prepare()

    def factory(self, profile: Profile) -> Callable[[], Sandbox]:
        """What makes one sandbox of `profile`: its backend's factory."""
        return self.backends[profile.backend].factory(profile)

    async def unusable(self, profiles: Iterable[Profile]) -> dict[Profile, Unusable]:
        """Which `profiles` cannot run now, each asked of its backend."""
        by_kind: dict[str, list[Profile]] = {}
        for profile in profiles:
            by_kind.setdefault(profile.backend, []).append(profile)
        found: dict[Profile, Unusable] = {}
        for kind, theirs in by_kind.items():
            found.update(await self.backends[kind].unusable(theirs))
        return found

    async def warm(self, profiles: Iterable[Profile]) -> None:
        """Warm the backends of `profiles`, each once."""
        for kind in dict.fromkeys(p.backend for p in profiles):
            await self.backends[kind].warm()

    def promises(self, profile: Profile) -> Promises:
        return self.backends[profile.backend].promises(profile)

    async def close(self) -> None:
        """Close every backend, even when one fails (it logs). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for backend in self.backends.values():
            try:
                await backend.close()
            except Exception:  # one backend's failure must not keep the next one open
                log.exception("closing the %s backend failed", backend.kind)
