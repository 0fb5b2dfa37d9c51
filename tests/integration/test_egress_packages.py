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

from tests.conftest import ServedDaemon
from tests.egress_world import World
from tooljail import Client
from tooljail.errors import InvalidArgumentsError, InvalidRequestError

INDEX = "pypi.internal"


@pytest.fixture
def daemon(serve: Callable[..., ServedDaemon], egress_world: World) -> ServedDaemon:
    return serve(**egress_world.settings(allow=[INDEX, "data.example.org"]), pool_size=1)


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
    with pytest.raises(InvalidRequestError, match="works on a session"):
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
