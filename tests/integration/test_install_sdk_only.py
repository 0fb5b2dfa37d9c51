"""`pip install tooljail` with no extras, in a real fresh venv: the SDK and the client commands.

The venv is built once for this module (about half a minute: pip's cache and the
machine's wheel index make it an offline install) from a copy of the source tree,
so the build writes nothing into the checkout. The daemon the client commands
talk to runs in this process, from the test venv, as an operator's would run
elsewhere; the fresh venv only has grpcio, protobuf and pydantic.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon
from tooljaild.cli.extras import requirement_names

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "client", "daemon", "sandbox_images")
"""What `pip install <repo>` reads: the project file and the packages' directories."""


@pytest.fixture(scope="module")
def sdk_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with `pip install <copy of the repo>`, no extras; its bin directory."""
    base = tmp_path_factory.mktemp("sdk-only")
    source = base / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    yield venv / "bin"


def _run(bin_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout
    )


def test_no_daemon_dependency_is_installed(sdk_venv: Path) -> None:
    daemon_requirements = requirement_names("daemon")  # read from this venv's install
    assert "pydantic-settings" in daemon_requirements, daemon_requirements
    probe = _run(
        sdk_venv,
        "python",
        "-c",
        "import json; from tooljaild.cli.extras import missing_requirements; "
        "print(json.dumps(missing_requirements('daemon')))",
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == daemon_requirements
    # The daemon's server cannot even be imported there, and the SDK does not need it.
    server = _run(sdk_venv, "python", "-c", "import tooljaild.edge.servicer")
    assert server.returncode != 0
    assert "ModuleNotFoundError" in server.stderr
    sdk = _run(sdk_venv, "python", "-c", "import sys, tooljail; print('tooljaild' in sys.modules)")
    assert sdk.returncode == 0, sdk.stderr
    assert sdk.stdout.strip() == "False"


def test_client_commands_work_against_a_daemon(sdk_venv: Path, served: ServedDaemon) -> None:
    target = ("--target", served.target)
    tools = _run(sdk_venv, "tooljail", "tools", *target)
    assert tools.returncode == 0, tools.stderr
    assert "execute_python_code" in tools.stdout

    call = _run(
        sdk_venv,
        "tooljail",
        "call",
        *target,
        "--call-id",
        "sdk-only-1",
        "execute_python_code",
        '{"code": "print(6 * 7)"}',
    )
    assert call.returncode == 0, call.stderr
    assert call.stdout == "42\n"

    get = _run(sdk_venv, "tooljail", "get", *target, "sdk-only-1")
    assert get.returncode == 0, get.stderr
    assert json.loads(get.stdout)["state"] == "succeeded"

    cancel = _run(sdk_venv, "tooljail", "cancel", *target, "sdk-only-1")
    assert cancel.returncode == 0, cancel.stderr  # already ended: its state, not an error
    assert cancel.stdout.strip() == "succeeded"

    sessions = _run(sdk_venv, "tooljail", "sessions", "ls", *target)
    assert sessions.returncode == 0, sessions.stderr
    artifacts = _run(sdk_venv, "tooljail", "artifacts", "ls", *target)
    assert artifacts.returncode == 0, artifacts.stderr


@pytest.mark.parametrize(
    "command",
    [["serve"], ["doctor"], ["images", "list"], ["demo"], ["tools", "--check"]],
    ids=lambda c: " ".join(c),
)
def test_daemon_commands_say_what_to_install(sdk_venv: Path, command: list[str]) -> None:
    proc = _run(sdk_venv, "tooljail", *command)
    assert proc.returncode == 2, proc
    assert "pip install 'tooljail[daemon]'" in proc.stderr
    assert "Traceback" not in proc.stderr
