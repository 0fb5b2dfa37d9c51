"""ListTools through a real daemon: the built-ins claim only what holds on it (fixes 6d, 6e)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon
from tooljail import Client

NO_BWRAP = {"TOOLJAIL_SANDBOX__BWRAP": "/nonexistent/bwrap"}


def _descriptions(daemon: RunningDaemon) -> dict[str, str]:
    """The Python built-ins' descriptions (the workspace tools say less: they run no code)."""
    with Client(daemon.target) as client:
        return {
            t.name: t.description
            for t in client.list_tools()
            if t.source == "builtin" and t.name.startswith("execute_python")
        }


@pytest.mark.parametrize(
    ("args", "env"),
    [(("--isolation", "none"), None), ((), NO_BWRAP)],
    ids=["isolation-none", "best-effort-without-namespaces"],
)
def test_without_namespaces_no_builtin_says_isolated_or_network_off(
    start_daemon: Callable[..., RunningDaemon], args: tuple[str, ...], env: dict[str, str] | None
) -> None:
    described = _descriptions(start_daemon(*args, env=env, pool_size=1))
    assert len(described) == 3
    for name, text in described.items():
        assert "network is off" not in text, name
        assert "isolated sandbox" not in text, name
        assert "not isolated" in text and "can reach the network" in text, name


@pytest.mark.isolation
def test_with_every_feature_the_builtins_say_isolated_and_network_off(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    described = _descriptions(start_daemon("--isolation", "strict", pool_size=1))
    for name, text in described.items():
        assert "isolated sandbox" in text and "The network is off" in text, name
        assert "memory limit (1 GiB for the whole sandbox)" in text, name


def test_execute_python_file_names_the_files_directories_it_searches(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    files = tmp_path / "scripts"
    files.mkdir()
    (files / "hello.py").write_text("print('hi')\n")
    daemon = start_daemon("--files-dir", str(files), pool_size=1)
    text = _descriptions(daemon)["execute_python_file"]
    assert f"relative to a files directory of this daemon ({files.resolve()})" in text
    assert "workspace" not in text
    # What the description says is where the call looks: a path relative to it.
    with Client(daemon.target) as client:
        result = client.call("execute_python_file", {"path": "hello.py"})
    assert result.ok and result.data["stdout"] == "hi\n", result


def test_execute_python_file_without_files_directories_says_it_is_not_enabled(
    daemon: RunningDaemon,
) -> None:
    assert "Not enabled on this daemon" in _descriptions(daemon)["execute_python_file"]
