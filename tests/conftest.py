"""Shared fixtures: a real daemon, in this process or as `tooljail serve` in a subprocess.

`served` / `serve` run the daemon in this process (`tooljail.testing.daemon`):
a real servicer, call manager and sandboxes over a real gRPC channel, started in
a fraction of a second. `daemon` / `start_daemon` run `tooljail serve` as a
child, for tests where the process boundary is the point: signals, crashes,
the command line, what a sandbox can see of the daemon.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tooljail.testing
from tooljail import CallInfo, Client
from tooljail.testing import wait_for

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class RunningDaemon:
    """A `tooljail serve` process and how to reach it."""

    process: subprocess.Popen[bytes]
    target: str
    state_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"daemon did not stop within {timeout}s:\n{self.log()}") from None

    def assert_serving(self) -> None:
        """The daemon still answers a real call."""
        assert_serving(self.target)


@dataclass
class ServedDaemon:
    """A daemon served in this process by `tooljail.testing.daemon`."""

    target: str

    def assert_serving(self) -> None:
        """The daemon still answers a real call."""
        assert_serving(self.target)


def assert_serving(target: str) -> None:
    """The daemon at `target` still answers a real call."""
    with Client(target) as client:
        result = client.call("execute_python_code", {"code": "print('alive')"})
    assert result.ok, result
    assert result.data["stdout"] == "alive\n"


def wait_finished(client: Client, call_id: str, timeout: float = 15.0) -> CallInfo:
    """Poll GetCall until the call has ended (or `timeout` passed); its last info."""
    last: list[CallInfo] = []

    def finished() -> bool:
        last[:] = [client.get_call(call_id)]
        return last[0].state.finished

    with contextlib.suppress(TimeoutError):
        wait_for(finished, timeout, interval=0.02)
    return last[0]


def wait_serving(
    target: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float = 60.0
) -> None:
    """Wait until the daemon's health service says SERVING (or fail with its log)."""

    def serving() -> bool:
        if process.poll() is not None:
            raise AssertionError(
                f"daemon exited with {process.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
            except grpc.RpcError:
                return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    try:
        wait_for(serving, timeout, interval=0.02)
    except TimeoutError:
        raise AssertionError(
            f"daemon not serving after {timeout}s:\n{log_path.read_text()}"
        ) from None


def _reachable(path: Path) -> Path:
    """Let the sandbox's unprivileged uid walk down to `path` (not list it).

    Under bubblewrap the sandbox uid must reach what it binds: tool and file
    directories, the state directory. pytest makes its temp dirs 0700.
    """
    for directory in (path, *path.parents):
        if directory == Path(tempfile.gettempdir()) or directory == Path("/"):
            break
        if directory.stat().st_uid == os.geteuid():
            directory.chmod(directory.stat().st_mode | 0o011)
    return path


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's tmp_path, reachable by the sandbox uid (see _reachable)."""
    return _reachable(tmp_path)


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A host directory sandboxed code may write (tests watching a tool's effects).

    Tools run as an unprivileged uid, so this one is world-writable (sticky).
    Only sandboxes without namespaces see the host's files at all.
    """
    shared = tmp_path / "host"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def spawn_daemon(
    base: Path,
    *args: str,
    env: dict[str, str] | None = None,
    listen: str | None = None,
    pool_size: int = 2,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start `tooljail serve` in `base` (state dir, socket, log); do not wait for it.

    Returns:
        The process, its target address and `base` (made reachable by sandboxes).
    """
    base = _reachable(base)
    target = listen or f"unix://{base}/tooljail.sock"
    argv = [
        sys.executable, "-m", "tooljaild", "serve", "--listen", target,
        "--state-dir", str(base / "state"), "--pool-size", str(pool_size), *args,
    ]  # fmt: skip
    with open(base / "daemon.log", "wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return process, target, base


@pytest.fixture
def start_daemon(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., RunningDaemon]]:
    """Start `tooljail serve` with extra flags; every daemon is stopped at teardown.

    Usage: `daemon = start_daemon("--tools-dir", str(d), env={"TOOLJAIL_X": "1"})`.
    By default it listens on a Unix socket in a temp dir with a pool of 2.
    """
    started: list[RunningDaemon] = []

    def start(
        *args: str, env: dict[str, str] | None = None, listen: str | None = None, pool_size: int = 2
    ) -> RunningDaemon:
        process, target, base = spawn_daemon(
            tmp_path_factory.mktemp("daemon"), *args, env=env, listen=listen, pool_size=pool_size
        )
        daemon = RunningDaemon(process, target, base / "state", base / "daemon.log", list(args))
        started.append(daemon)
        wait_serving(target, process, daemon.log_path)
        return daemon

    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGTERM, timeout=60)


@pytest.fixture
def daemon(start_daemon: Callable[..., RunningDaemon]) -> RunningDaemon:
    """A `tooljail serve` subprocess with the default settings."""
    return start_daemon()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServedDaemon]]:
    """Serve a daemon in this process with these settings; each stops at teardown.

    Usage: `served = serve(isolation="none", tools_dirs=[d])`; settings are the
    config's keys (see `tooljail.testing.daemon`). The pool holds 2 by default.
    """
    with contextlib.ExitStack() as stack:

        def start(**settings: object) -> ServedDaemon:
            settings.setdefault("pool_size", 2)
            return ServedDaemon(stack.enter_context(tooljail.testing.daemon(**settings)))

        yield start


@pytest.fixture
def served(serve: Callable[..., ServedDaemon]) -> ServedDaemon:
    """A daemon in this process with the default settings."""
    return serve()


@pytest.fixture(scope="session")
def plotting_python() -> str:
    """A virtualenv's bin/python with matplotlib, readable by the sandbox uid.

    For `sandbox={"python": plotting_python}`. Built from PyPI on the system's
    python3 once per machine (about a minute), then cached: see tests/plotting.py.
    """
    from tests.plotting import plotting_venv

    return str(plotting_venv())


@pytest.fixture(scope="session")
def omnicore_python() -> str:
    """A Python >= 3.12 virtualenv's bin/python with omnicoreagent 0.6 (and pyagenity).

    omnicoreagent needs Python >= 3.12; its tests run a driver script there with
    the tree's client on PYTHONPATH. Built once per machine, then cached: see
    tests/py312.py.
    """
    from tests.py312 import frameworks_venv

    return str(frameworks_venv())


@pytest.fixture(scope="session")
def pyagenity_python(omnicore_python: str) -> str:
    """The same venv: pyagenity 0.3.9 needs Python >= 3.12 and installs beside omnicoreagent."""
    return omnicore_python


SANDBOX_IMAGE = "tooljail/python:latest"
"""The docker backend's default image, which its tests run in."""


def docker_problem() -> str | None:
    """Why the docker backend cannot run here (no engine, no image), or None.

    Here, not in a conftest of its own: the hook below calls it, and this file
    is also run alone (tests/unit/test_ci_policy.py copies it into a temp dir).
    """
    from tooljaild.sandbox.docker_engine import EngineUnavailableError, connect_client

    try:
        client = connect_client(timeout=3.0)
    except EngineUnavailableError as exc:
        return str(exc)  # "no Docker engine answers at ...: start it ..."
    from docker.errors import ImageNotFound

    try:
        client.images.get(SANDBOX_IMAGE)
    except ImageNotFound:
        return f"no image {SANDBOX_IMAGE}: build it with `tooljail images build python`"
    finally:
        client.close()
    return None


_DOCKER_PROBLEM: list[str | None] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `docker` skips, saying why, where no engine (or image) is there.

    Checked once per run, before the test's own fixtures start a daemon on the
    docker backend, so no docker test can fail for the engine's absence alone
    (in CI, the skip is then failed by `pytest_runtest_makereport` below).
    """
    marker = item.get_closest_marker("docker")
    if marker is None:
        return
    if not _DOCKER_PROBLEM:
        from tooljaild.sandbox.docker_engine import EngineUnavailableError, connect_client

        try:
            connect_client(timeout=3.0).close()
        except EngineUnavailableError as exc:
            _DOCKER_PROBLEM.extend([str(exc), str(exc)])
        else:
            _DOCKER_PROBLEM.extend([None, docker_problem()])
    # `docker(needs_image=False)`: the test builds the sandbox image itself.
    problem = _DOCKER_PROBLEM[1 if marker.kwargs.get("needs_image", True) else 0]
    if problem is not None:
        pytest.skip(problem)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In CI a skipped test is a failure: CI must provide what every test needs.

    Not only the tests marked `docker` or `isolation`: a cgroup or bubblewrap
    parameter, a seccomp test or a root-only journal test that skips passes
    silently otherwise. A test whose skip CI cannot prevent (another
    architecture's check) says so with `@pytest.mark.ci_may_skip("why")`.
    """
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if (
        IN_CI
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("ci_may_skip") is None
    ):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped in CI, which must provide what this test needs: {reason}"


# The egress tests' local world, a session fixture. Not where this file is copied
# alone into a scratch project (tests/unit/test_ci_policy.py), which has no `tests`.
if __name__ == "tests.conftest":
    from tests.egress_world import egress_world  # noqa: F401
