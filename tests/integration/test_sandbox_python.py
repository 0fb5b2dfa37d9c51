"""Packages in the sandbox: a virtualenv as `sandbox.python`, under every isolation mode.

The venv (matplotlib from PyPI) is built once per machine: see tests/plotting.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import tooljail.testing
from tests.conftest import ServedDaemon
from tooljail import Client, ToolResult
from tooljaild.app.errors import DaemonError

MODES = {
    "none": {"isolation": "none"},
    "bwrap": {"isolation": "best-effort", "zygote": False},
    "zygote": {"isolation": "best-effort", "zygote": True},
}
"""Every way a process sandbox starts: on the host, under its own bubblewrap,
forked from the zygote."""

PLOT = """
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [1, 4, 9])
ax.set_title("squares")
fig.savefig("plot.png")
data = open("plot.png", "rb").read()
print(sys.prefix)
print(matplotlib.__version__)
print(data[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(data))
"""


def _serve(
    serve: Callable[..., ServedDaemon], mode: str, python: str, **settings: object
) -> ServedDaemon:
    options = dict(MODES[mode])
    return serve(
        isolation=options.pop("isolation"), sandbox={"python": python, **options}, **settings
    )


def _run(served: ServedDaemon, code: str) -> ToolResult:
    with Client(served.target) as client:
        return client.call("execute_python_code", {"code": code}, tool_timeout_s=60)


def _zygote_interpreters() -> list[str]:
    """argv[0] of each zygote this process's daemons started (under bubblewrap)."""
    found = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmdline = p.cmdline()
            if (
                any(part.endswith("_zygote.py") for part in cmdline)
                and p.parent().name() == "bwrap"
            ):
                found.append(cmdline[0])
        except psutil.NoSuchProcess:
            continue
    return found


def _bare_venv(where: Path) -> Path:
    """A venv without packages (fast): enough to see whose prefix a sandbox runs with."""
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--without-pip", str(where)], check=True, timeout=60
    )
    return where / "bin" / "python"


@pytest.mark.isolation
@pytest.mark.parametrize("mode", list(MODES))
def test_a_venv_with_matplotlib_draws_and_saves_a_png_in_the_sandbox(
    serve: Callable[..., ServedDaemon], plotting_python: str, mode: str
) -> None:
    served = _serve(serve, mode, plotting_python)
    result = _run(served, PLOT)
    assert result.ok, result
    prefix, version, png = result.data["stdout"].split("\n")[:3]
    venv = str(Path(plotting_python).parent.parent)
    assert prefix == venv, "the sandbox runs the venv, not its base interpreter"
    assert version == "3.10.3"
    is_png, size = png.split()
    assert is_png == "True" and int(size) > 1000, png
    # Fonts are found: matplotlib draws the title with no complaint on stderr.
    assert result.data["stderr"] == "", result.data["stderr"]
    zygotes = _zygote_interpreters()
    if mode == "zygote":
        assert plotting_python in zygotes, f"the zygote runs the venv's python: {zygotes}"
    else:
        assert plotting_python not in zygotes


@pytest.mark.isolation
@pytest.mark.parametrize("mode", ["bwrap", "zygote"])
def test_a_venv_under_tmp_is_bound_where_the_sandbox_mounts_a_fresh_tmp(
    serve: Callable[..., ServedDaemon], tmp_path: Path, mode: str
) -> None:
    """The sandbox's own /tmp hides the host's: the venv is bound on top of it."""
    python = _bare_venv(tmp_path / "venv")
    served = _serve(serve, mode, str(python))
    result = _run(served, "import sys\nprint(sys.prefix, sys.executable)")
    assert result.ok, result
    assert result.data["stdout"].split() == [str(tmp_path / "venv"), str(python)]


def _start_fails(mode: str, python: str) -> str:
    """Start a daemon whose sandbox.python is `python`: it must refuse; its message."""
    options = dict(MODES[mode])
    settings = {"isolation": options.pop("isolation"), "sandbox": {"python": python, **options}}
    with pytest.raises(DaemonError) as failed, tooljail.testing.daemon(**settings):
        pass
    return str(failed.value)


def _locked_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv in a directory only its owner (root) may enter: (that directory, its python)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    return locked, _bare_venv(locked / "venv")


@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_a_venv_that_does_not_exist_fails_at_start_naming_it(mode: str) -> None:
    message = _start_fails(mode, "/opt/no-such-venv/bin/python")
    assert "sandbox.python = /opt/no-such-venv/bin/python: no such file" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a sandbox uid other than the test's")
@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_a_venv_the_sandbox_uid_cannot_read_fails_at_start_naming_what_stops_it(
    tmp_path: Path, mode: str
) -> None:
    locked, python = _locked_venv(tmp_path)
    message = _start_fails(mode, str(python))
    assert f"sandbox.python = {python}" in message
    assert "the sandbox user nobody (uid 65534) cannot" in message
    assert f"{locked} (drwx------ root:root) lacks search (x) for others" in message


def _doctor(python: str) -> dict[str, dict[str, str]]:
    proc = subprocess.run(
        [sys.executable, "-m", "tooljaild", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TOOLJAIL_SANDBOX__PYTHON": python},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {f["name"]: f for f in json.loads(proc.stdout)}


def test_doctor_reports_the_venv_its_version_reach_and_packages(plotting_python: str) -> None:
    features = _doctor(plotting_python)
    python = features["sandbox python"]
    assert python["status"] == "active", python
    venv = str(Path(plotting_python).parent.parent)
    assert f"{plotting_python} (virtualenv {venv} on Python 3." in python["detail"]
    assert "reachable by" in python["detail"]
    packages = features["sandbox packages"]
    assert packages["status"] == "active"
    assert "matplotlib 3.10.3" in packages["detail"] and "numpy" in packages["detail"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a sandbox uid other than the test's")
def test_doctor_says_which_directory_keeps_the_sandbox_uid_from_a_venv(tmp_path: Path) -> None:
    locked, python = _locked_venv(tmp_path)
    python_row = _doctor(str(python))["sandbox python"]
    assert python_row["status"] == "missing"
    assert f"{locked} (drwx------ root:root) lacks search (x) for others" in python_row["detail"]
    missing = _doctor("/opt/no-such-venv/bin/python")
    assert missing["sandbox python"]["status"] == "missing"
    assert "/opt/no-such-venv/bin/python: no such file" in missing["sandbox python"]["detail"]
    assert missing["sandbox packages"]["status"] == "n/a"


def test_a_plain_daemon_has_no_plotting_packages_and_doctor_says_how_to_add_them() -> None:
    packages = _doctor("/usr/bin/python3")["sandbox packages"]
    assert "set sandbox.python to a virtualenv's bin/python" in packages["detail"]


@pytest.mark.isolation
def test_a_session_keeps_the_venv_s_packages_across_calls(
    serve: Callable[..., ServedDaemon], plotting_python: str
) -> None:
    served = _serve(serve, "zygote", plotting_python)
    with Client(served.target) as client, client.session() as session:
        first = session.call("execute_python_code", {"code": "import matplotlib\nprint(1)"})
        assert first.ok, first
        second = session.call("execute_python_code", {"code": "print(matplotlib.__version__)"})
    assert second.ok, second
    assert second.data["stdout"] == "3.10.3\n"
