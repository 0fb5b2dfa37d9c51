"""The docker backend: each sandbox is a container with the runner already waiting inside.

A sandbox is one container from a sandbox image (`tooljail images build
python`), started by the pool's refill. Its command is the daemon's own
stdlib-only runner, bind-mounted read-only at /opt/tooljail/runner, started as
``python3 -I -B _runner.py --connect /run/tooljail-channel/sandbox.sock``. The call
path then goes through no `docker exec` and no container start: `run` writes
one JSON line into a pipe the runner is already blocked on, and reads.

The channel. A container cannot inherit the daemon's pipes: `docker_handover`
passes them to the runner over a socket before its first call. From there on
the sandbox speaks the runner channel (`runner_channel`) exactly as a process
sandbox does; `RunnerSandbox` runs its calls.

Hardened by default (docs/decisions.md has the why):
- no network (``network_mode=none``) unless the config allows it;
- read-only root; size-capped tmpfs /tmp and /workspace (nosuid, nodev) and
  /dev/shm; the runner and the tool and files directories bound read-only;
- uid 65534 (never root), every capability dropped, no-new-privileges, the
  process backend's seccomp filter (`docker_seccomp`);
- memory (swap included), pids and CPU limits of the whole container from
  `Limits`; rlimits applied by the runner per call, as in the process backend;
- a scrubbed environment (the runner replaces it with the request's);
- no Docker socket inside; labels ``org.tooljail.sandbox=1``,
  ``org.tooljail.daemon=<daemon id>``, ``org.tooljail.sandbox-id=<id>`` and
  ``org.tooljail.state-dir=<dir>`` on every container, so leftovers are found.

The runner's keeper is the container's pid 1: a subreaper already, and when it
dies the kernel kills everything in the container's pid namespace. So no init
is added, and the worker may "seal" its result (kill every other process of
the sandbox before it reports), as under the zygote.

The docker SDK blocks: every engine request runs on the engine's own thread
pool (`DockerEngine.call`, in `docker_engine` with the leftover sweeps), so a
slow engine never stalls the event loop or the daemon's other threads. The
engine must share this host's file system (the channel and runner directories
are bind mounts); a remote DOCKER_HOST is not supported by this backend.

This module is one container's life (create, connect, wait for ready, end,
remove); what stands on its own is beside it: the backend's settings
(`settings.sandbox`), the engine and its sweeps (`docker_engine`), the pipes'
handover (`docker_handover`), the seccomp profile (`docker_seccomp`), its
memory cgroup's OOM count (`docker_oom`) and a call over the runner channel
(`runner_channel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tooljaild.egress.dirs import EgressDirs
from tooljaild.sandbox.base import RunOutcome, SandboxError
from tooljaild.sandbox.docker_engine import (
    CHANNEL_SUBDIR,
    LABEL_DAEMON,
    LABEL_SANDBOX,
    LABEL_SANDBOX_ID,
    LABEL_STATE_DIR,
    DockerEngine,
    EngineUnavailableError,
    ImageMissingError,
    container_status,
    explain,
    image_missing_message,
    is_connection_error,
    kill_container,
    new_daemon_id,
    no_engine_message,
    oom_killed_state,
    remove_container,
    remove_own_containers,
    remove_stale_containers,
)
from tooljaild.sandbox.docker_handover import INSIDE_CHANNEL_DIR, INSIDE_SOCKET, Handover
from tooljaild.sandbox.docker_oom import memory_cgroup, oom_count
from tooljaild.sandbox.frames import CallFrames
from tooljaild.sandbox.outcome import outcome_of
from tooljaild.sandbox.runner_channel import RunnerPipes, RunnerSandbox, RunnerSpec
from tooljaild.settings.sandbox import DockerSandboxConfig, Limits

if TYPE_CHECKING:
    from docker import DockerClient

__all__ = [
    "LABEL_DAEMON",
    "LABEL_SANDBOX",
    "LABEL_SANDBOX_ID",
    "LABEL_STATE_DIR",
    "DockerContext",
    "DockerEngine",
    "DockerSandbox",
    "EngineUnavailableError",
    "ImageMissingError",
    "new_daemon_id",
    "remove_own_containers",
    "remove_stale_containers",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

INSIDE_RUNNER_DIR = "/opt/tooljail/runner"
INSIDE_WORKSPACE = "/workspace"
INSIDE_EGRESS = "/run/tooljail"
"""Where a sandbox sees its egress directory (egress/env.py's INSIDE_DIR)."""

_STATUS_POLL_S = 0.5
"""While waiting for the runner to connect: how often to ask whether the container died."""
_DRAIN_S = 2.0
"""How long output may keep flowing after the result before the container is killed."""
_RUNNER_SPEC = RunnerSpec(
    workdir=INSIDE_WORKSPACE,
    tmpdir="/tmp",
    tooldef=f"{INSIDE_RUNNER_DIR}/_tooldef.py",
    # The keeper is pid 1 of the container's own pid namespace: the worker may
    # end every other process itself and report last.
    seal=True,
    keeper=True,
)


# ---------------------------------------------------------------------- config


@dataclass(frozen=True)
class DockerContext:
    """What the daemon decided once, that every docker sandbox it builds shares."""

    engine: DockerEngine
    runner_dir: Path
    """Host directory holding the runner (`_runner.py` and the modules beside it) and
    `_tooldef.py` (see `isolation.install_runner`)."""
    state_dir: Path
    """Channel directories live in `<state_dir>/docker/<sandbox id>/`."""
    daemon_id: str
    """Labels every container, so the daemon can tell its own from leftovers."""
    shared_dirs: tuple[Path, ...] = ()
    """Tool and files directories: visible read-only, at the same paths, inside."""
    egress_root: Path | None = None
    """Where each sandbox's egress directory is made (egress/dirs.py), bound
    read-only at /run/tooljail; None: no egress on this daemon."""

    @property
    def channel_root(self) -> Path:
        return self.state_dir / CHANNEL_SUBDIR


def build_docker_sandbox(
    config: DockerSandboxConfig, context: DockerContext, limits: Limits | None = None
) -> DockerSandbox:
    """A docker sandbox, not yet started, from the backend's settings.

    Here and not on the settings: settings are plain data (`tooljaild.settings`).
    """
    return DockerSandbox(config, context, limits or Limits())


# ---------------------------------------------------------------------- sandbox


class DockerSandbox(RunnerSandbox):
    """A container whose runner (keeper + worker) waits for one request."""

    def __init__(self, config: DockerSandboxConfig, context: DockerContext, limits: Limits) -> None:
        super().__init__()
        self.id = "sbx-" + uuid.uuid4().hex[:12]
        self.workspace = Path(INSIDE_WORKSPACE)
        """The workspace as the tool sees it (a tmpfs inside the container)."""
        self.container_name = f"tooljail-{self.id}"
        self.container_id: str | None = None
        self._config = config
        self._context = context
        self._engine = context.engine
        self._limits = limits
        self._channel = context.channel_root / self.id
        self._handover: Handover | None = None
        self._init_pid: int | None = None
        self._pidfd: int | None = None
        self._memory_cgroup: tuple[int, Path] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._start_called = False
        self._create_sent = False
        self._ready = False

    @property
    def alive(self) -> bool:
        return (
            self._ready
            and not self._used
            and not self._closed
            and not (self._pipes is not None and self._pipes.ended)
        )

    @property
    def init_pid(self) -> int | None:
        """The host pid of the container's first process (the runner's keeper)."""
        return self._init_pid

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        if self._start_called:
            raise SandboxError(f"sandbox {self.id} was already started")
        self._start_called = True
        try:
            await self._start()
        except SandboxError:
            await self.close()
            raise
        except Exception as exc:
            # Never leave a container (or its directory) behind, whatever failed;
            # and say it as a SandboxError, as the interface promises.
            await self.close()
            if is_connection_error(exc):
                raise EngineUnavailableError(no_engine_message(self._engine.where, exc)) from exc
            raise SandboxError(f"sandbox {self.id} could not start: {explain(exc)}") from exc
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.start_timeout_s
        client = await self._engine.client()
        # A few quick local file-system calls, made here rather than on a thread
        # so that a cancelled start cannot leave a listening socket behind.
        if self._context.egress_root is not None:
            self.egress_dir = EgressDirs(self._context.egress_root).new()
        self._handover = Handover(self._channel, self._config.uid, self._config.gid)
        self._create_sent = True
        self.container_id = await self._tracked(self._create_and_start, client)
        conn = await self._accept(client, deadline)
        with conn:
            ours = self._handover.hand_over(conn)
        self._handover.close()
        self._handover = None
        self._pipes = RunnerPipes(*ours)
        ready = await self._pipes.ready(max(0.1, deadline - loop.time()))
        if ready is None:
            raise SandboxError(
                f"sandbox {self.id}: the runner in container {self.container_name} did not "
                f"say it was ready: {await self._logs(client) or 'no output'}"
            )
        self._ready = True

    def _container_spec(self) -> dict[str, Any]:
        """The arguments of the engine's create request (and its host config)."""
        cfg, lim = self._config, self._limits
        tmpfs_opts = "rw,exec,nosuid,nodev"
        mounts = [
            _bind(self._context.runner_dir, INSIDE_RUNNER_DIR),
            _bind(self._channel, INSIDE_CHANNEL_DIR),
            *(_bind(d, str(d)) for d in self._context.shared_dirs if d.is_dir()),
        ]
        if self.egress_dir is not None:
            # The gate's socket and the CA bundle; the network stays "none":
            # the relay reaches the host through this socket only.
            mounts.append(_bind(self.egress_dir, INSIDE_EGRESS))
        host_config: dict[str, Any] = {
            "network_mode": "bridge" if cfg.network else "none",
            "read_only": True,
            "tmpfs": {
                "/tmp": f"{tmpfs_opts},size={lim.tmp_bytes},mode=1777",
                INSIDE_WORKSPACE: f"{tmpfs_opts},size={lim.workspace_bytes},"
                f"uid={cfg.uid},gid={cfg.gid},mode=0700",
            },
            "shm_size": lim.tmp_bytes,
            "mounts": mounts,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges", f"seccomp={_seccomp_profile()}"],
            "ipc_mode": "private",
            "init": False,
            "log_config": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
        }
        if lim.sandbox_memory_bytes:
            host_config["mem_limit"] = lim.sandbox_memory_bytes
            # The same value: no swap beyond the memory limit.
            host_config["memswap_limit"] = lim.sandbox_memory_bytes
        if lim.sandbox_pids:
            host_config["pids_limit"] = lim.sandbox_pids
        if lim.cpus:
            host_config["nano_cpus"] = round(lim.cpus * 1e9)
        if cfg.runtime:
            host_config["runtime"] = cfg.runtime
        return {
            "image": cfg.image,
            "name": self.container_name,
            "entrypoint": [
                cfg.python,
                "-I",
                "-B",
                f"{INSIDE_RUNNER_DIR}/_runner.py",
                "--connect",
                INSIDE_SOCKET,
            ],
            "command": [],
            "user": cfg.user,
            "working_dir": INSIDE_WORKSPACE,
            "environment": {},
            "hostname": "tooljail",
            "network_disabled": not cfg.network,
            "stdin_open": False,
            "tty": False,
            "labels": {
                LABEL_SANDBOX: "1",
                LABEL_DAEMON: self._context.daemon_id,
                LABEL_SANDBOX_ID: self.id,
                LABEL_STATE_DIR: str(self._context.state_dir),
            },
            "host_config": host_config,
        }

    def _create_and_start(self, client: DockerClient) -> str:
        """Create and start the container; its id. Blocks (two engine requests)."""
        from docker.errors import APIError, ImageNotFound, NotFound

        spec = self._container_spec()
        host_config = client.api.create_host_config(**spec.pop("host_config"))
        try:
            created = client.api.create_container(**spec, host_config=host_config)
        except (ImageNotFound, NotFound) as exc:
            raise ImageMissingError(image_missing_message(self._config.image, exc)) from None
        except APIError as exc:
            raise SandboxError(
                f"the Docker engine refused to create a sandbox container: {explain(exc)}"
            ) from None
        except OSError as exc:  # requests' connection errors and timeouts
            raise EngineUnavailableError(no_engine_message(self._engine.where, exc)) from None
        container_id: str = created["Id"]
        try:
            client.api.start(container_id)
        except APIError as exc:
            raise SandboxError(
                f"the Docker engine could not start sandbox container {self.container_name}: "
                f"{explain(exc)}"
            ) from None
        except OSError as exc:
            raise EngineUnavailableError(no_engine_message(self._engine.where, exc)) from None
        return container_id

    async def _accept(self, client: DockerClient, deadline: float) -> socket.socket:
        """The runner's connection, once it has proved it is this container's."""
        loop = asyncio.get_running_loop()
        assert self._handover is not None and self.container_id is not None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SandboxError(
                    f"sandbox {self.id}: the runner in container {self.container_name} did not "
                    f"connect within {self._config.start_timeout_s:g} s: "
                    f"{await self._logs(client) or 'no output'}"
                )
            accepted = await self._handover.accept(
                self.container_id, min(remaining, _STATUS_POLL_S)
            )
            if accepted is None:
                status = await self._engine.call(container_status, client, self.container_id)
                if status not in ("created", "running", "restarting"):
                    raise SandboxError(
                        f"sandbox {self.id}: container {self.container_name} ended ({status}) "
                        f"before its runner connected: {await self._logs(client) or 'no output'}"
                    )
                continue
            conn, pid = accepted
            self._init_pid = pid
            self._memory_cgroup = memory_cgroup(pid)
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)
            return conn

    async def _tracked(self, fn: Callable[..., T], *args: Any) -> T:
        """Run an engine request that makes something; `close` waits for it.

        A task cancelled while a container is being created must not leak it:
        the request finishes on its thread anyway, and `close` waits for it
        before it removes the container.
        """
        future = asyncio.ensure_future(self._engine.call(fn, *args))
        self._pending.add(future)
        future.add_done_callback(_settled)
        future.add_done_callback(self._pending.discard)
        return await asyncio.shield(future)

    async def _logs(self, client: DockerClient) -> str:
        """The container's own output (the runner's, before it got its pipes), for errors."""
        if self.container_id is None:
            return ""
        try:
            data: bytes = await asyncio.wait_for(
                self._engine.call(client.api.logs, self.container_id, tail=20), 5.0
            )
        except Exception:  # only for an error message
            return ""
        return data.decode(errors="replace").strip()

    # ------------------------------------------------------------------ run

    _drain_s = _DRAIN_S

    def _runner_spec(self) -> RunnerSpec:
        return _RUNNER_SPEC

    async def _outcome(self, end: CallFrames) -> RunOutcome:
        sig = end.exit_frame.get("signal") if end.exit_frame else None
        oom = False
        if end.result is None and not self._killed and sig == signal.SIGKILL:
            oom = await self._oom_killed()
        return outcome_of(
            end.result,
            end.exit_frame,
            end.yields,
            killed=self._killed,
            out_of_memory=oom,
            memory_bytes=self._limits.sandbox_memory_bytes,
            lost_hint="the tool may have killed it, or the container was stopped",
            protocol_error=end.broken,
        )

    async def _oom_killed(self) -> bool:
        """Whether the kernel killed a process of this container for lack of memory.

        The container's memory cgroup says so while it exists (v1:
        `memory.oom_control`, v2: `memory.events`, `oom_kill`); the keeper exits
        right after its last frame and the runtime then removes the cgroup, so
        when it is gone the engine's record (`State.OOMKilled`, set when the
        container ends) decides.
        """
        if self._memory_cgroup is not None:
            count = await asyncio.to_thread(oom_count, *self._memory_cgroup)
            if count is not None:
                return count > 0
        if self.container_id is None:
            return False
        try:
            client = await self._engine.client()
            return await self._engine.call(oom_killed_state, client, self.container_id)
        except Exception as exc:  # the outcome is then a plain SIGKILL
            log.warning("sandbox %s: cannot tell whether it ran out of memory: %s", self.id, exc)
            return False

    # ------------------------------------------------------------------ end

    def _kill_now(self) -> None:
        self._signal_pid1()

    def _signal_pid1(self) -> bool:
        """SIGKILL the container's pid 1 through its pidfd, without waiting.

        Returns:
            True when it is dead or dying (the kernel then kills all of its pid
            namespace); False when the engine must be asked.
        """
        if self._pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone, and with it everything in the container
        except OSError:
            return False  # not ours to signal (a daemon that is not root)
        return True

    async def _kill_all(self) -> None:
        """SIGKILL the container's pid 1: the kernel then kills all of its pid namespace."""
        if self._signal_pid1() or self.container_id is None:
            return
        try:
            client = await self._engine.client()
            await self._engine.call(kill_container, client, self.container_id)
        except Exception as exc:  # kill must not raise; close removes it anyway
            log.warning("sandbox %s: cannot kill its container: %s", self.id, exc)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pipes is not None:
            self._pipes.close_request()  # an unused runner exits on EOF
            self._pipes.close()
        if self._handover is not None:
            self._handover.close()
            self._handover = None
        if self._pending:
            # A create request still on its thread: its container must be removed too.
            await asyncio.wait(set(self._pending), timeout=self._engine.request_timeout_s)
        if self._create_sent:
            try:
                client = await self._engine.client()
                await self._engine.call(
                    remove_container, client, self.container_id or self.container_name
                )
            except Exception as exc:  # close must finish; the sweep catches it
                log.warning("sandbox %s: cannot remove its container: %s", self.id, exc)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        await asyncio.to_thread(self._remove_dirs)

    def _remove_dirs(self) -> None:
        """The channel and egress directories (blocking: on a thread)."""
        shutil.rmtree(self._channel, True)
        if self.egress_dir is not None and self._context.egress_root is not None:
            EgressDirs(self._context.egress_root).remove(self.egress_dir)


# ---------------------------------------------------------------------- helpers


def _settled(future: asyncio.Future[Any]) -> None:
    """Mark the future's exception as seen: whoever awaited it may have been cancelled."""
    if not future.cancelled():
        future.exception()


def _bind(source: Path, target: str) -> Any:
    from docker.types import Mount

    return Mount(target=target, source=str(source), type="bind", read_only=True)


@functools.cache
def _seccomp_profile() -> str:
    from tooljaild.sandbox.docker_seccomp import profile_json

    return profile_json()
