"""One suite, every backend: each test runs against a real daemon over real gRPC,
once with `--backend process` and once with `--backend docker`.

The daemon of each backend is shared by the whole package (started once per
backend), with the security suite's canary in its environment and the tools of
`TOOLS` in its tools directory. The docker run needs a Docker engine and the
python image (`tooljail images build python`): without them it skips, saying
which is missing, and in CI a skip is a failure (tests/conftest.py).

Tests ask `Backend` for what differs by backend only where the host side of a
check differs (a container to look for); what the caller sees never does.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import docker_problem
from tests.security.conftest import (
    SecurityDaemon,
    launch_daemon,
    live_processes_mentioning,
    stop_daemon,
    wait_until,
)
from tooljail import Client, Output, ToolResult

LABEL_STATE_DIR = "org.tooljail.state-dir"

TOOLS = '''
"""User tools of the conformance suite: one file, run by every backend."""

import os
import sys
import time

from tooljail import tool


@tool
def double(x: int) -> dict:
    """Twice x."""
    return {"doubled": 2 * x}


@tool
def countdown(n: int, pause: float = 0.4):
    """Yields n down to 1, each with the time it was yielded, pausing between."""
    for i in range(n, 0, -1):
        yield {"i": i, "t": time.time()}
        time.sleep(pause)


@tool
def fail(message: str) -> None:
    """Raises ValueError(message) two frames down."""

    def inner() -> None:
        raise ValueError(message)

    inner()


@tool
def where() -> dict:
    """Where the tool runs."""
    return {"docker": os.path.exists("/.dockerenv"), "uid": os.getuid(), "cwd": os.getcwd()}


@tool(limits={"sandbox_memory_bytes": 160 * 2**20})
def hog(mib: int) -> str:
    """Holds `mib` MiB, touched, in a sandbox of 160 MiB (a profile of its own)."""
    chunks = []
    for _ in range(mib // 16):
        chunks.append(b"\\x01" * (16 * 2**20))
    return "fit"


@tool(limits={"cpu_s": 1})
def spin(seconds: float) -> str:
    """Burns CPU for `seconds` of wall time, with 1 CPU second allowed."""
    end = time.time() + seconds
    while time.time() < end:
        pass
    return "done"


@tool(limits={"output_limit_bytes": 4 * 2**20})
def shout() -> None:
    """Writes forever, with 4 MiB of output allowed."""
    while True:
        sys.stdout.write("y" * 65536 + "\\n")
'''

BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@dataclass
class Backend:
    """The backend under test, and its host-side views."""

    name: str
    state_dir: Path
    docker: Any = None
    """A docker SDK client (docker backend only)."""

    def containers(self) -> list[dict[str, Any]]:
        """Every container this daemon's state directory labels (none for process)."""
        if self.docker is None:
            return []
        found: list[dict[str, Any]] = self.docker.api.containers(
            all=True, filters={"label": f"{LABEL_STATE_DIR}={self.state_dir}"}
        )
        return found

    def container_of(self, pid: int) -> str | None:
        """The id of the container a host process runs in, or None."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        found = re.search(r"\b([0-9a-f]{64})\b", text)
        return found.group(1) if found else None

    def container_exists(self, container_id: str) -> bool:
        from docker.errors import NotFound

        try:
            self.docker.api.inspect_container(container_id)
        except NotFound:
            return False
        return True


@pytest.fixture(scope="package", params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="package")
def daemon(backend_name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecurityDaemon]:
    """The backend's daemon, shared by the package: `serve --backend NAME --tools-dir`."""
    if backend_name == "docker":
        problem = docker_problem()
        if problem is not None:
            pytest.skip(problem)
    base = tmp_path_factory.mktemp(f"conformance-{backend_name}")
    tools = base / "tools"
    tools.mkdir(mode=0o755)
    (tools / "conf_tools.py").write_text(TOOLS)
    running = launch_daemon(base, None, 2, "--backend", backend_name, "--tools-dir", str(tools))
    yield running
    stop_daemon(running)


@pytest.fixture(scope="package")
def backend(backend_name: str, daemon: SecurityDaemon) -> Iterator[Backend]:
    """Host-side views of the backend; for docker, checks at the end that the
    daemon's shutdown left no container behind."""
    if backend_name != "docker":
        yield Backend(backend_name, daemon.state_dir)
        return
    import docker

    client = docker.from_env()
    view = Backend(backend_name, daemon.state_dir.resolve(), client)
    try:
        yield view
        # Runs before the daemon's teardown (this fixture depends on it): stop it
        # here to see what its shutdown leaves.
        stop_daemon(daemon)
        left = [c["Names"] for c in view.containers()]
        assert left == [], f"containers left after the daemon stopped: {left}"
    finally:
        client.close()


@pytest.fixture
def token() -> str:
    """A unique word to find the call's processes by."""
    return "tjconf" + uuid.uuid4().hex[:16]


def stream_with_times(
    daemon: SecurityDaemon, tool: str, args: dict[str, Any], timeout: float = 30
) -> tuple[list[tuple[float, Output]], ToolResult]:
    """Stream a call; each chunk with the wall-clock time it arrived, and the result."""
    chunks: list[tuple[float, Output]] = []
    result: ToolResult | None = None
    with Client(daemon.target) as client:
        for item in client.stream(tool, args, tool_timeout_s=timeout):
            if isinstance(item, Output):
                chunks.append((time.time(), item))
            else:
                result = item
    assert result is not None
    return chunks, result


def assert_gone(backend: Backend, token: str, containers: set[str], timeout: float = 10) -> None:
    """No host process mentions `token`, and (docker) none of `containers` exists."""
    left = wait_until(lambda: not live_processes_mentioning(token), timeout, 0.1)
    assert left, f"processes outlived their call: {live_processes_mentioning(token)}"
    for cid in containers:
        gone = wait_until(lambda c=cid: not backend.container_exists(c), timeout, 0.2)
        assert gone, f"container {cid[:12]} outlived its call"


def containers_of_token(backend: Backend, token: str) -> set[str]:
    """The containers the processes mentioning `token` run in (docker only)."""
    found = set()
    for proc in live_processes_mentioning(token):
        with contextlib.suppress(psutil.Error):
            cid = backend.container_of(proc.pid)
            if cid:
                found.add(cid)
    return found
