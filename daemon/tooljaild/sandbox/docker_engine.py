"""The docker backend's engine side: connecting, errors, and sweeping up leftovers.

`DockerEngine` is one engine connection, shared by every sandbox of a daemon:
it connects on first use (so a daemon starts where no engine answers, and
tools that need one fail fast with `EngineUnavailableError`), and it runs every
blocking SDK request on its own thread pool.

`remove_stale_containers` and `remove_own_containers` find sandbox containers
by their labels (see `tooljaild.sandbox.docker`): at startup a daemon removes
what an earlier run of it left (a crash); at shutdown, its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from tooljaild.sandbox.base import SandboxError
from tooljaild.settings.sandbox import DockerSandboxConfig

if TYPE_CHECKING:
    from docker import DockerClient

__all__ = [
    "CHANNEL_SUBDIR",
    "DEFAULT_DOCKER_HOST",
    "LABEL_DAEMON",
    "LABEL_SANDBOX",
    "LABEL_SANDBOX_ID",
    "LABEL_STATE_DIR",
    "DockerEngine",
    "EngineUnavailableError",
    "ImageMissingError",
    "connect_client",
    "new_daemon_id",
    "remove_own_containers",
    "remove_stale_containers",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"

LABEL_SANDBOX = "org.tooljail.sandbox"
"""On every sandbox container, value "1": what leftover sweeps look for."""
LABEL_DAEMON = "org.tooljail.daemon"
"""The id of the daemon (run) that made the container."""
LABEL_SANDBOX_ID = "org.tooljail.sandbox-id"
LABEL_STATE_DIR = "org.tooljail.state-dir"
"""The daemon's state directory: daemons with different ones leave each other alone."""

CHANNEL_SUBDIR = "docker"
"""Below the state directory: one channel directory per sandbox."""

_MIN_API_VERSION = "1.24"


class EngineUnavailableError(SandboxError, ConnectionError):
    """No Docker engine answers where the backend looks; the message says how to start one."""


class ImageMissingError(SandboxError, LookupError):
    """The sandbox image is not in the engine; the message says how to build it."""


def new_daemon_id() -> str:
    """A fresh id for one daemon run, for the `org.tooljail.daemon` label."""
    return uuid.uuid4().hex[:16]


# ---------------------------------------------------------------------- engine


class DockerEngine:
    """One Docker engine, connected on first use and shared by every sandbox of a daemon.

    Connecting is lazy so that a daemon starts (and serves its process-backed
    tools) where no engine answers: each sandbox start then fails fast with
    `EngineUnavailableError`, and a later one connects once the engine is up.
    """

    def __init__(
        self,
        docker_host: str | None = None,
        *,
        connect_timeout_s: float = 3.0,
        request_timeout_s: float = 60.0,
        max_workers: int = 16,
        on_connect: Callable[[DockerClient], object] | None = None,
    ) -> None:
        """
        Args:
            docker_host: The engine's address ("unix:///path", "tcp://host:port");
                None: DOCKER_HOST from the environment, else the local socket.
            connect_timeout_s: How long the engine may take to answer the first request.
            request_timeout_s: The bound on each later request.
            max_workers: Engine requests in flight at once (threads of its pool).
            on_connect: Called once (on an engine thread) with the client when the
                engine first answers, before any other request gets the client:
                the daemon sweeps up leftovers there. What it raises is logged.
        """
        self.docker_host = docker_host
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._on_connect = on_connect
        self._client: DockerClient | None = None
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="tooljail-docker"
        )
        self._closed = False

    @property
    def where(self) -> str:
        """The address requests go to, for messages."""
        return self.docker_host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST

    def connect(self) -> DockerClient:
        """The client, connecting first if needed. Blocks: call it through `call`.

        Raises:
            EngineUnavailableError: No engine answered within `connect_timeout_s`.
        """
        with self._lock:
            if self._closed:
                raise EngineUnavailableError("the Docker engine connection was closed")
            if self._client is None:
                client = _connect(
                    self.docker_host, self.where, self.connect_timeout_s, self.request_timeout_s
                )
                if self._on_connect is not None:
                    # Under the lock: no sandbox gets the client (and makes a
                    # container) before this has run.
                    try:
                        self._on_connect(client)
                    except Exception as exc:  # a failed sweep must not cost the engine
                        log.warning("after connecting to the Docker engine: %s", explain(exc))
                self._client = client
            return self._client

    @property
    def connected(self) -> bool:
        """Whether the engine has answered (and the connection is open)."""
        return self._client is not None

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking function (an SDK request) on the engine's threads.

        Raises:
            EngineUnavailableError: The engine was closed.
        """
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        except RuntimeError:  # the executor was shut down
            raise EngineUnavailableError("the Docker engine connection was closed") from None
        return await future

    async def client(self) -> DockerClient:
        """The connected client.

        Raises:
            EngineUnavailableError: No engine answers.
        """
        return await self.call(self.connect)

    def close(self) -> None:
        """Close the connection and let the engine's threads go. Idempotent."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        self._executor.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            client.close()


def connect_client(
    docker_host: str | None = None, *, timeout: float = 3.0, request_timeout: float = 60.0
) -> DockerClient:
    """A connected client of the engine at `docker_host` (None: DOCKER_HOST, else the
    local socket), without a `DockerEngine` around it (for `doctor`). Blocks.

    Raises:
        EngineUnavailableError: No engine answered within `timeout`.
    """
    where = docker_host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    return _connect(docker_host, where, timeout, request_timeout)


def _connect(
    docker_host: str | None, where: str, timeout: float, request_timeout: float
) -> DockerClient:
    import docker
    from docker.errors import DockerException

    if where.startswith("unix://"):
        # A dead Unix socket: say so at once (the SDK also leaks its socket then).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(where.removeprefix("unix://"))
            except OSError as exc:
                raise EngineUnavailableError(no_engine_message(where, exc)) from None

    def make(version: str, request_timeout: float) -> DockerClient:
        if docker_host is None:
            return docker.from_env(version=version, timeout=request_timeout)
        return docker.DockerClient(base_url=docker_host, version=version, timeout=request_timeout)

    try:
        probe = make(_MIN_API_VERSION, timeout)
    except DockerException as exc:  # a malformed address
        raise EngineUnavailableError(no_engine_message(where, exc)) from None
    try:
        api_version = probe.version(api_version=False)["ApiVersion"]
    except (DockerException, OSError, KeyError) as exc:  # OSError: requests' errors
        raise EngineUnavailableError(no_engine_message(where, exc)) from None
    finally:
        probe.close()
    return make(api_version, request_timeout)


def no_engine_message(where: str, exc: BaseException) -> str:
    """What to tell when no engine answers at `where`: why, and how to start one."""
    text = str(exc).strip()
    why = text.splitlines()[0] if text else type(exc).__name__
    return (
        f"no Docker engine answers at {where} ({why}): start it (`systemctl start docker`, "
        "or `dockerd &` as root), or point DOCKER_HOST (docker.docker_host) at one"
    )


# ---------------------------------------------------------------------- requests


def image_missing_message(image: str, exc: BaseException) -> str:
    """What to tell when the engine lacks `image`: how to build (or pull) it."""
    name = image.split(":", 1)[0]
    how = (
        f"`tooljail images build {name.removeprefix('tooljail/')}`"
        if name.startswith("tooljail/")
        else f"`docker pull {image}` or `docker build`"
    )
    return (
        f"the sandbox image {image} is not in the Docker engine ({explain(exc)}): "
        f"build it with {how}"
    )


def is_connection_error(exc: BaseException) -> bool:
    """Whether the engine went away mid-request (requests' connection errors, timeouts)."""
    try:
        from requests import exceptions
    except ImportError:  # pragma: no cover - the docker SDK depends on requests
        return False
    return isinstance(exc, (exceptions.ConnectionError, exceptions.Timeout))


def explain(exc: BaseException) -> str:
    """The first line of what the engine said (an APIError's explanation), for messages."""
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def container_status(client: DockerClient, container_id: str) -> str:
    """The container's status ("running", "exited", ...), or "removed". Blocks."""
    from docker.errors import NotFound

    try:
        state = client.api.inspect_container(container_id)["State"]
    except NotFound:
        return "removed"
    status: str = state.get("Status", "unknown")
    return status


def oom_killed_state(client: DockerClient, container_id: str, wait_s: float = 5.0) -> bool:
    """Whether the engine says the container was OOM-killed (once it has ended)."""
    from docker.errors import NotFound

    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = client.api.inspect_container(container_id)["State"]
        except NotFound:
            return False
        if state.get("OOMKilled"):
            return True
        if not state.get("Running") or time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def kill_container(client: DockerClient, container_id: str) -> None:
    """SIGKILL the container's first process (so all of it); quiet if it is gone. Blocks."""
    from docker.errors import APIError

    # 404: gone already; 409: not running any more. Either way nothing runs.
    with contextlib.suppress(APIError):
        client.api.kill(container_id)


def remove_container(client: DockerClient, container: str) -> None:
    """Remove the container (id or name), killing it first; quiet if it is gone. Blocks."""
    from docker.errors import APIError, NotFound

    try:
        client.api.remove_container(container, force=True)
    except NotFound:
        pass
    except APIError as exc:
        if exc.status_code == 409 and "already in progress" in str(exc):
            return  # another remove (a sweep) is at it
        raise


# ---------------------------------------------------------------------- leftovers


def _sandbox_containers(client: DockerClient, *labels: str) -> list[dict[str, Any]]:
    filters = {"label": [f"{LABEL_SANDBOX}=1", *labels]}
    found: list[dict[str, Any]] = client.api.containers(all=True, filters=filters)
    return found


def remove_stale_containers(
    client: DockerClient, keep_daemon_id: str, *, state_dir: Path | None = None
) -> int:
    """Remove sandbox containers left by other daemon runs (a crash); keep `keep_daemon_id`'s.

    Blocks (engine requests): call it through `DockerEngine.call` or a thread.

    Args:
        client: A connected client (`DockerEngine.connect`).
        keep_daemon_id: This daemon run's id: its containers stay.
        state_dir: When given, only containers of daemons with this state
            directory are touched (several daemons may share one engine), and
            the channel directories below it that belong to no kept container
            and are older than a minute (not a start in progress) go too.

    Returns:
        How many containers were removed.
    """
    labels = [f"{LABEL_STATE_DIR}={state_dir}"] if state_dir is not None else []
    removed = 0
    kept: set[str] = set()
    for entry in _sandbox_containers(client, *labels):
        entry_labels = entry.get("Labels") or {}
        if entry_labels.get(LABEL_DAEMON) == keep_daemon_id:
            kept.add(entry_labels.get(LABEL_SANDBOX_ID, ""))
            continue
        if _remove_entry(client, entry, state_dir):
            removed += 1
    if state_dir is not None:
        _remove_stale_channels(state_dir / CHANNEL_SUBDIR, kept)
    return removed


def _remove_stale_channels(root: Path, kept: set[str], min_age_s: float = 60.0) -> None:
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    now = time.time()
    for path in entries:
        try:
            old = now - path.lstat().st_mtime > min_age_s
        except OSError:
            continue
        if old and path.name.startswith("sbx-") and path.name not in kept:
            shutil.rmtree(path, ignore_errors=True)


def remove_own_containers(
    client: DockerClient, daemon_id: str, *, state_dir: Path | None = None
) -> int:
    """Remove every sandbox container of this daemon run (at shutdown). Blocks.

    Returns:
        How many containers were removed.
    """
    removed = 0
    for entry in _sandbox_containers(client, f"{LABEL_DAEMON}={daemon_id}"):
        if _remove_entry(client, entry, state_dir):
            removed += 1
    return removed


def _remove_entry(client: DockerClient, entry: dict[str, Any], state_dir: Path | None) -> bool:
    from docker.errors import APIError, NotFound

    try:
        client.api.remove_container(entry["Id"], force=True)
    except NotFound:
        return False
    except APIError as exc:
        log.warning("cannot remove sandbox container %s: %s", entry["Id"][:12], explain(exc))
        return False
    sandbox_id = (entry.get("Labels") or {}).get(LABEL_SANDBOX_ID, "")
    if state_dir is not None and sandbox_id.startswith("sbx-") and "/" not in sandbox_id:
        shutil.rmtree(state_dir / CHANNEL_SUBDIR / sandbox_id, ignore_errors=True)
    return True


def engine_for(
    config: DockerSandboxConfig, on_connect: Callable[[DockerClient], object] | None = None
) -> DockerEngine:
    """A (not yet connected) engine for the docker backend's docker_host and timeouts.

    Args:
        config: The docker backend's settings.
        on_connect: Run once when the engine first answers (see `DockerEngine`).
    """
    return DockerEngine(
        config.docker_host,
        connect_timeout_s=config.connect_timeout_s,
        request_timeout_s=config.request_timeout_s,
        on_connect=on_connect,
    )
