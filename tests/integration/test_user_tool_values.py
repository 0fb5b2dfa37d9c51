"""What a user tool returns reaches the caller as that JSON value, and a tool
without its own timeout takes the daemon's `default_timeout_s`, as `ListTools`
shows. Through a real daemon (`tooljail serve`) and a real gRPC channel.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import RunningDaemon
from tooljail import CallStatus, Client, Effect

VALUES = '''
import time

from tooljail import tool


@tool
def forty_two() -> int:
    """An int."""
    return 42


@tool
def one_and_a_half() -> float:
    """A float."""
    return 1.5


@tool
def yes() -> bool:
    """A bool."""
    return True


@tool
def no() -> bool:
    """False, which is not "no output"."""
    return False


@tool
def zero() -> int:
    """Zero, which is not "no output" either."""
    return 0


@tool
def nothing() -> None:
    """None."""
    return None


@tool
def text() -> str:
    """A str that looks like a number stays a str."""
    return "42"


@tool
def sleepy() -> str:
    """No timeout of its own: the daemon's default applies."""
    time.sleep(5)
    return "woke"


@tool(timeout_s=30)
def patient() -> str:
    """Its own timeout."""
    return "ok"
'''


def _tools_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tools"
    directory.mkdir()
    (directory / "values.py").write_text(textwrap.dedent(VALUES))
    return directory


def test_returned_json_values_are_the_results_data(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = start_daemon("--tools-dir", str(_tools_dir(tmp_path)))
    expected = {
        "forty_two": 42,
        "one_and_a_half": 1.5,
        "yes": True,
        "no": False,
        "zero": 0,
        "text": "42",
    }
    with Client(daemon.target) as client:
        for tool, value in expected.items():
            result = client.call(tool)
            assert (result.status, result.effect) == (CallStatus.SUCCESS, Effect.APPLIED), tool
            assert result.data == value, tool
            assert type(result.data) is type(value), tool
            assert result.message == "", tool
        nothing = client.call("nothing")
    assert nothing.status is CallStatus.SUCCESS
    assert nothing.data is None
    assert nothing.message == "Tool executed successfully (no output)"


def test_default_timeout_applies_to_tools_without_their_own(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    daemon = start_daemon(
        "--tools-dir",
        str(_tools_dir(tmp_path)),
        env={"TOOLJAIL_DEFAULT_TIMEOUT_S": "1", "TOOLJAIL_MAX_TIMEOUT_S": "600"},
    )
    with Client(daemon.target) as client:
        tools = {t.name: t for t in client.list_tools()}
        # ListTools shows the timeouts in force on this daemon.
        assert tools["sleepy"].timeout_s == 1
        assert tools["execute_python_code"].timeout_s == 1
        assert tools["patient"].timeout_s == 30
        assert tools["sleepy"].max_timeout_s == 600
        assert tools["patient"].max_timeout_s == 600

        began = time.monotonic()
        result = client.call("sleepy")
        took = time.monotonic() - began
    assert result.status is CallStatus.TIMEOUT
    assert took < 4.5, took  # the default of 1 s, not the tool field's 180 s
