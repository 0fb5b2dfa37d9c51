"""The docker backend through a real daemon, as a new user meets it (issue 4,
"What users will try"): a tool that picks the python image and streams; a daemon
where no engine answers; a daemon killed with SIGKILL while containers run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.conftest import LABEL_STATE_DIR
from tests.conftest import SANDBOX_IMAGE as IMAGE
from tests.conftest import RunningDaemon, docker_problem, spawn_daemon, wait_serving
from tests.security.conftest import BackgroundCall
from tooljail import CallStatus, Client, Effect, Output, StreamKind

TOOL = '''
import os
import time

from tooljail import tool


@tool(sandbox={"backend": "docker", "image": "python", "network": False})
def ticks(n: int):
    """Yields n ticks, each saying whether it runs in a container."""
    for i in range(n):
        yield {"tick": i, "container": os.path.exists("/.dockerenv")}
        time.sleep(0.2)


@tool(sandbox={"backend": "docker", "image": "nosuchimage"})
def unbuilt() -> str:
    """Runs in an image nobody built."""
    return "never"
'''


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir(mode=0o755)
    (tools / "ticks.py").write_text(TOOL)
    return tools


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    problem = docker_problem()
    if problem is not None:
        pytest.skip(problem)
    import docker

    client = docker.from_env()
    yield client
    client.close()


def containers(engine: Any, state_dir: Path) -> dict[str, str]:
    """Container id -> daemon id, of every container labelled with this state dir."""
    found = engine.api.containers(
        all=True, filters={"label": f"{LABEL_STATE_DIR}={state_dir.resolve()}"}
    )
    return {c["Id"]: c["Labels"]["org.tooljail.daemon"] for c in found}


# ---------------------------------------------------------------------- with an engine


@pytest.mark.docker
def test_a_tool_picks_the_python_image_and_streams_from_it(
    engine: Any, start_daemon: Callable[..., RunningDaemon], tools_dir: Path
) -> None:
    daemon = start_daemon("--tools-dir", str(tools_dir))  # process is the default backend
    items: list[Any] = []
    with Client(daemon.target) as client:
        for item in client.stream("ticks", {"n": 3}, tool_timeout_s=60):
            items.append(item)
        builtin = client.call(
            "execute_python_code", {"code": "import os; print(os.path.exists('/.dockerenv'))"}
        )
    *chunks, result = items
    assert result.ok and result.message == "Tool streamed 3 values", result
    assert all(isinstance(c, Output) and c.stream is StreamKind.YIELD for c in chunks)
    assert [json.loads(c.data) for c in chunks] == [
        {"tick": i, "container": True} for i in range(3)
    ]
    assert builtin.data["stdout"] == "False\n", builtin  # the built-ins stay on process
    with Client(daemon.target) as client:
        unbuilt = client.call("unbuilt", {}, tool_timeout_s=30)
    assert unbuilt.status is CallStatus.ERROR and unbuilt.effect is Effect.NONE, unbuilt
    assert unbuilt.error is not None
    assert "tooljail/nosuchimage:latest is not in the Docker engine" in unbuilt.error.message
    assert "tooljail images build nosuchimage" in unbuilt.error.message
    assert "docker-backed tools will fail until this is fixed" in daemon.log()
    assert containers(engine, daemon.state_dir), "the tool's pool has no containers"
    daemon.stop()
    assert containers(engine, daemon.state_dir) == {}, "containers left after SIGTERM"


@pytest.mark.docker
def test_after_a_sigkill_the_next_start_removes_every_container_of_the_dead_daemon(
    engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base = tmp_path_factory.mktemp("killed")

    def start() -> RunningDaemon:
        process, target, _ = spawn_daemon(base, "--backend", "docker")
        daemon = RunningDaemon(process, target, base / "state", base / "daemon.log")
        wait_serving(target, process, daemon.log_path)
        return daemon

    first = start()
    try:
        calls = [
            BackgroundCall(first, "import time\nprint('running', flush=True)\ntime.sleep(60)")
            for _ in range(2)
        ]
        for call in calls:
            call.wait_for("running")
    finally:
        first.stop(signal.SIGKILL)
    # Create requests the daemon had in flight (refills) still complete in the engine.
    time.sleep(1.0)
    before = containers(engine, first.state_dir)
    assert len(before) >= 2, before  # the two running calls, and what the pool had ready
    second = start()
    try:
        after = containers(engine, second.state_dir)
        assert not set(before) & set(after), "containers of the killed daemon are still there"
        assert len(set(after.values())) == 1, after  # only the new daemon's
        second.assert_serving()
    finally:
        second.stop()
    assert containers(engine, second.state_dir) == {}


# ---------------------------------------------------------------------- without an engine


@pytest.fixture
def no_engine(tmp_path: Path) -> dict[str, str]:
    """The environment of a daemon whose Docker engine address has nobody behind it."""
    return {"TOOLJAIL_DOCKER__DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}


def test_without_an_engine_process_tools_work_and_docker_tools_say_why(
    start_daemon: Callable[..., RunningDaemon], tools_dir: Path, no_engine: dict[str, str]
) -> None:
    daemon = start_daemon("--tools-dir", str(tools_dir), env=no_engine)
    daemon.assert_serving()
    with Client(daemon.target) as client:
        assert "ticks" in {t.name for t in client.list_tools()}
        for _ in range(3):  # every call: fast, clear, and the daemon is unharmed
            started = time.monotonic()
            result = client.call("ticks", {"n": 1}, tool_timeout_s=30)
            assert time.monotonic() - started < 5
            assert result.status is CallStatus.ERROR, result
            assert result.effect is Effect.NONE
            assert result.error is not None and result.error.type == "SandboxUnavailable"
            assert "no Docker engine answers at unix://" in result.error.message
            assert "start it" in result.error.message
            daemon.assert_serving()
    assert "docker-backed tools will fail until this is fixed" in daemon.log()


def test_serve_with_the_docker_backend_refuses_to_start_without_an_engine(
    tmp_path_factory: pytest.TempPathFactory, no_engine: dict[str, str]
) -> None:
    base = tmp_path_factory.mktemp("refused")
    process, _, _ = spawn_daemon(base, "--backend", "docker", env=no_engine)
    assert process.wait(60) == 3
    log = (base / "daemon.log").read_text()
    assert "the default backend is docker, but no Docker engine answers at" in log
    assert "--backend process" in log


def test_doctor_says_why_without_an_engine(no_engine: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tooljaild", "doctor", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **no_engine, "TOOLJAIL_BACKEND": "docker"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {f["name"]: f for f in json.loads(proc.stdout)}
    assert rows["default backend"]["detail"] == f"docker ({IMAGE})"
    assert rows["docker engine"]["status"] == "missing"
    assert "no Docker engine answers" in rows["docker engine"]["detail"]
    assert "refuses to start" in rows["docker engine"]["detail"]
