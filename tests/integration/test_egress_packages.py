"""Packages at run time, through a real daemon: pip in a session, install_packages, the cache.

A daemon served in this process for the local world (tests/egress_world.py):
its package index ("pypi.internal", plain HTTP, `[packages] index_url`) holds
`tjdemo-1.0` (requires `tjdep>=1`) and `tjdep-1.0`; every request it gets is
recorded, so a test sees whether an install reached the index at all.

- pip as a model writes it (`subprocess.run([sys.executable, "-m", "pip",
  "install", ...])`) in a session installs into the workspace's site dir,
  importable in the next call and after the interpreter restarts; the
  interpreter the sandboxes share stays read-only.
- install_packages: a second session installing the same wheels is served from
  the daemon's cache (the index sees no request) in a fraction of the first's
  time; a tampered cached file is refused and fetched again; no session, bad
  requirements and an index the session may not reach are refused clearly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServedDaemon, docker_problem
from tests.egress_world import World
from tooljail import Client
from tooljail.errors import InvalidArgumentsError, SessionRequiredError

INDEX = "pypi.internal"
BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=["process"])
def daemon(
    request: pytest.FixtureRequest, serve: Callable[..., ServedDaemon], egress_world: World
) -> ServedDaemon:
    """A daemon for the world on the backend the test names (process unless parametrized)."""
    backend = str(request.param)
    if backend == "docker" and (problem := docker_problem()) is not None:
        pytest.skip(problem)
    settings = egress_world.settings(allow=[INDEX, "data.example.org"])
    return serve(**settings, backend=backend, pool_size=1)


@pytest.fixture
def client(daemon: ServedDaemon) -> Iterator[Client]:
    with Client(daemon.target) as c:
        yield c


def _state_dir(daemon: ServedDaemon) -> Path:
    """The served daemon's state directory (tooljail.testing puts it beside its socket)."""
    return Path(daemon.target.removeprefix("unix://")).parent / "state"


def _index_requests(world: World, mark: Any) -> list[str]:
    return [r.path for r in world.since(mark).requests if r.server == "index"]


def _out(result: Any) -> str:
    assert result.status.value == "success", (result.message, result.data, result.error)
    return str(result.data["stdout"])


@pytest.mark.parametrize("daemon", BACKENDS, indirect=True)
def test_pip_in_a_session_installs_for_the_next_call(client: Client, egress_world: World) -> None:
    with client.session(egress=[INDEX]) as session:
        result = session.call(
            "execute_python_code",
            {
                "code": (
                    "import subprocess, sys\n"
                    "p = subprocess.run([sys.executable, '-m', 'pip', 'install', 'tjdemo'],\n"
                    "    capture_output=True, text=True)\n"
                    "print(p.returncode); print(p.stderr[-2000:], file=sys.stderr)\n"
                )
            },
        )
        assert _out(result).strip() == "0", result.data["stderr"]
        code = (
            "import os, sys, sysconfig, tjdemo\n"
            "print(tjdemo.__file__.startswith(os.path.join(os.getcwd(), '.packages')))\n"
            "print(tjdemo.hello())\n"
            "import subprocess\n"
            "print(subprocess.run([sys.executable, '-c', 'import tjdep; print(tjdep.VALUE)'],\n"
            "    capture_output=True, text=True).stdout.strip())\n"
            "try:\n"
            "    open(os.path.join(sysconfig.get_paths()['purelib'], 'tj-probe'), 'w')\n"
            "    print('shared interpreter WRITABLE')\n"
            "except OSError as e:\n"
            "    print('shared interpreter read-only', type(e).__name__)\n"
        )
        lines = _out(session.call("execute_python_code", {"code": code})).splitlines()
        assert lines[:3] == ["True", "tjdemo says 42", "42"], lines
        assert lines[3].startswith("shared interpreter read-only"), lines
        # The interpreter dies (and is restarted, the workspace kept): still importable.
        session.call("execute_python_code", {"code": "import os; os._exit(3)"})
        again = session.call(
            "execute_python_code", {"code": "import tjdemo; print(tjdemo.hello())"}
        )
        assert _out(again).strip() == "tjdemo says 42"


@pytest.mark.parametrize("daemon", BACKENDS, indirect=True)
def test_install_packages_second_session_is_served_from_the_cache(
    client: Client, daemon: ServedDaemon, egress_world: World
) -> None:
    def install(session: Any) -> tuple[dict[str, Any], float]:
        start = time.perf_counter()
        result = session.call("install_packages", {"packages": ["tjdemo==1.0"]})
        elapsed = time.perf_counter() - start
        assert result.status.value == "success", (result.message, result.error)
        check = session.call(
            "execute_python_code", {"code": "import tjdemo; print(tjdemo.hello())"}
        )
        assert _out(check).strip() == "tjdemo says 42"
        return result.data, elapsed

    with client.session(egress=[INDEX]) as first:
        mark = egress_world.mark()
        data, cold = install(first)
        assert data["from_cache"] is False
        assert sorted(data["installed"], key=json.dumps) == [
            {"name": "tjdemo", "version": "1.0"},
            {"name": "tjdep", "version": "1.0"},
        ]
        assert any(p.endswith(".whl") for p in _index_requests(egress_world, mark))
    with client.session(egress=[INDEX]) as second:
        mark = egress_world.mark()
        data, warm = install(second)
        assert data["from_cache"] is True
        assert _index_requests(egress_world, mark) == []  # nothing reached the index
    print(f"\ninstall_packages: first session {cold * 1000:.0f} ms, second {warm * 1000:.0f} ms "
          f"({warm / cold:.0%})")  # fmt: skip
    assert warm <= 0.6 * cold, (cold, warm)

    # A cached file changed on disk is refused (by hash) and fetched again.
    files = _state_dir(daemon) / "egress" / "packages" / "files"
    victims = sorted(files.iterdir())
    assert victims, "nothing was cached"
    for victim in victims:
        victim.write_bytes(b"PK not the wheel that was cached")
    with client.session(egress=[INDEX]) as third:
        mark = egress_world.mark()
        data, _ = install(third)
        assert data["from_cache"] is False  # the remembered wheels failed their hash
        assert any(p.endswith(".whl") for p in _index_requests(egress_world, mark))
    import hashlib

    for path in files.iterdir():  # fetched again, kept by their true hash
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name


def test_install_packages_needs_a_session(client: Client) -> None:
    with pytest.raises(SessionRequiredError, match="works on a session"):
        client.call("install_packages", {"packages": ["tjdemo"]})


@pytest.mark.parametrize(
    "packages",
    [[], ["--index-url=http://evil.example.net/simple"], ["tjdemo @ http://evil/x.whl"], ["./x"]],
)
def test_install_packages_refuses_what_is_not_a_requirement(
    client: Client, packages: list[str]
) -> None:
    with client.session(egress=[INDEX]) as session, pytest.raises(InvalidArgumentsError):
        session.call("install_packages", {"packages": packages})


def test_install_packages_without_egress_to_the_index_says_so(
    client: Client, egress_world: World
) -> None:
    with client.session(egress=["data.example.org"]) as session:
        mark = egress_world.mark()
        result = session.call("install_packages", {"packages": ["tjdemo"]})
        assert result.status.value == "error"
        assert result.error is not None and result.error.type == "EgressDenied"
        assert f"{INDEX}:80" in result.error.message and "not_allowed" in result.error.message
        assert _index_requests(egress_world, mark) == []
    with client.session() as offline:
        result = offline.call("install_packages", {"packages": ["tjdemo"]})
        assert result.error is not None and result.error.type == "NoEgress", result.error


def test_installs_count_in_the_workspace_quota(client: Client) -> None:
    quota = 1024 * 1024
    with client.session(egress=[INDEX], workspace_bytes=quota) as session:
        # Fill the workspace but for a few KiB: the wheels no longer fit.
        fill = "open('filler', 'wb').write(b'x' * (1024 * 1024 - 8 * 1024))"
        _out(session.call("execute_python_code", {"code": fill}))
        result = session.call("install_packages", {"packages": ["tjdemo"]})
        assert result.status.value == "error", result.data
        assert result.error is not None
        assert "No space left" in result.error.message or "Errno 28" in result.error.message
        # Room made, the same install fits.
        _out(session.call("execute_python_code", {"code": "import os; os.remove('filler')"}))
        again = session.call("install_packages", {"packages": ["tjdemo"]})
        assert again.status.value == "success", again.error


def test_an_install_past_its_timeout_is_stopped_and_the_session_goes_on(
    serve: Callable[..., ServedDaemon], egress_world: World
) -> None:
    import socket
    import threading

    # An index that takes connections and never answers.
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = silent.getsockname()[1]
        daemon = serve(
            **egress_world.settings(
                allow=["slow.internal"],
                index_url="http://slow.internal/simple",
                extra_hosts={"slow.internal:80": f"127.0.0.1:{port}"},
            ),
            pool_size=1,
        )
        with Client(daemon.target) as client, client.session(egress=["slow.internal"]) as session:
            start = time.perf_counter()
            result = session.call("install_packages", {"packages": ["tjdemo"]}, tool_timeout_s=2)
            assert result.status.value == "timeout", (result.message, result.error)
            assert time.perf_counter() - start < 20
            after = session.call("execute_python_code", {"code": "print('still here')"})
            assert _out(after).strip() == "still here"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        silent.close()
