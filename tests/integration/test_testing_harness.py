"""`tooljail.testing.daemon`: the README's user story, in both modes, and what it leaves.

A user writes a tool in a directory and tests it against a real daemon with no
setup script; bad settings and start failures surface as exceptions that say
why; after the `with` block the socket is gone and no sandbox process is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import tooljail.testing
from tooljail import AsyncClient, BadTimeoutError, Client
from tooljaild.app.errors import DaemonError
from tooljaild.settings.config import ConfigError

TOOL = '''
from tooljail import tool


@tool
def double(n: int) -> dict:
    """Double a number."""
    return {"doubled": n * 2}
'''

BOTH_MODES = pytest.mark.parametrize("in_process", [True, False], ids=["in_process", "child"])


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    tools = tmp_path / "my_tools"
    tools.mkdir()
    (tools / "double.py").write_text(TOOL)
    return tools


def _descendants(pid: int) -> set[psutil.Process]:
    return set(psutil.Process(pid).children(recursive=True))


@BOTH_MODES
def test_a_user_tool_runs_and_nothing_is_left_after_the_block(
    tools_dir: Path, in_process: bool
) -> None:
    before = _descendants(os.getpid())
    with tooljail.testing.daemon(tools_dirs=[tools_dir], in_process=in_process) as target:
        with Client(target) as client:
            result = client.call("double", {"n": 21})
        sandboxes = _descendants(os.getpid()) - before
        socket_path = Path(target.removeprefix("unix://"))
        assert socket_path.is_socket()
    assert result.ok, result
    assert result.data == {"doubled": 42}
    assert sandboxes, "a warm pool has sandbox processes while it serves"
    assert not socket_path.exists()
    alive = [p for p in sandboxes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive


@BOTH_MODES
def test_a_relative_tools_dir_is_the_one_beside_the_test(
    tools_dir: Path, in_process: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the README writes it: tools_dirs=["my_tools"], from the test's directory.
    monkeypatch.chdir(tools_dir.parent)
    with (
        tooljail.testing.daemon(tools_dirs=["my_tools"], in_process=in_process) as target,
        Client(target) as client,
    ):
        assert client.call("double", {"n": 4}).data == {"doubled": 8}


async def test_an_async_client_on_the_tests_own_loop() -> None:
    with tooljail.testing.daemon() as target:
        async with AsyncClient(target) as client:
            result = await client.call("execute_python_code", {"code": "print(6 * 7)"})
    assert result.ok, result
    assert result.data["stdout"] == "42\n"


@BOTH_MODES
def test_settings_reach_the_daemon_nested_tables_too(in_process: bool) -> None:
    settings = {"max_timeout_s": 7, "default_timeout_s": 5, "limits": {"output_bytes": 2048}}
    with (
        tooljail.testing.daemon(in_process=in_process, **settings) as target,
        Client(target) as client,
    ):
        with pytest.raises(BadTimeoutError):
            client.call("execute_python_code", {"code": "print(1)"}, tool_timeout_s=8)
        result = client.call("execute_python_code", {"code": "print('x' * 10_000)"})
    assert result.ok, result
    assert len(result.data["stdout"]) < 10_000, "limits.output_bytes was not applied"


@BOTH_MODES
def test_an_unknown_setting_is_refused_by_name(in_process: bool) -> None:
    with (
        pytest.raises(ConfigError, match="pool_sise"),
        tooljail.testing.daemon(pool_sise=2, in_process=in_process),
    ):
        pass


@BOTH_MODES
def test_a_start_failure_surfaces_with_the_daemons_reason(in_process: bool) -> None:
    with (
        pytest.raises(DaemonError, match="refusing to serve plaintext TCP"),
        tooljail.testing.daemon(listen="0.0.0.0:45871", in_process=in_process),
    ):
        pass


def test_importing_it_does_not_import_the_daemon() -> None:
    code = (
        "import sys, tooljail.testing\n"
        "assert 'tooljaild' not in sys.modules, sorted(sys.modules)\n"
        # Where the daemon is not installed, daemon() says what to install.
        "sys.modules['tooljaild'] = None\n"
        "try:\n"
        "    tooljail.testing.daemon().__enter__()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'tooljail[daemon]'" in proc.stdout
