"""A Python >= 3.12 virtualenv with the frameworks that need it, built once per machine.

omnicoreagent 0.6 requires Python >= 3.12 and pins versions that conflict with
lightagent; pyagenity (0.3.9, the release users run) needs Python >= 3.12, so
neither imports in the test interpreter (3.11). The two install together, so one
venv holds both (a pin that conflicted would get a venv of its own, keyed the
same way, rather than a downgrade). Their tests serve a daemon in the pytest
process and run a driver script in this venv against it. The venv holds the frameworks and the
SDK's own dependencies, not the SDK: a driver runs with `PYTHONPATH` set to the
tree's `client/` (`driver_env`), so it tests the code in the tree, and the
cache does not go stale when that code changes.

Cache: as tests/plotting.py's ($TOOLJAIL_TEST_VENVS, default
/var/tmp/tooljail-test-venvs), one venv per requirement set, e.g.
frameworks-omnicoreagent-0.6.0-pyagenity-0.3.9-py3.12-<hash of the SDK's
requirements>. Built from PyPI the first time (a minute or two); concurrent
runs wait on the same lock file instead of building twice.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from tests.plotting import CACHE_ENV, DEFAULT_CACHE, READY, _make_readable_dir, _run

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("omnicoreagent==0.6.0", "pyagenity==0.3.9")
"""Pinned: the cache is keyed by them, so a new release does not rebuild it unasked."""


def python312() -> str:
    """An interpreter >= 3.12 with the venv module.

    Looked for as python3.12 / python3.13 under ~/.pyenv/versions (not the
    slow pyenv shims), then on PATH, then in /usr/bin and /usr/local/bin.

    Raises:
        RuntimeError: There is none.
    """
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [
        *sorted(glob.glob(str(pyenv / "3.12*/bin/python3.12"))),
        *sorted(glob.glob(str(pyenv / "3.13*/bin/python3.13"))),
        *(shutil.which(name) or "" for name in ("python3.12", "python3.13")),
        "/usr/bin/python3.12", "/usr/local/bin/python3.12",
        "/usr/bin/python3.13", "/usr/local/bin/python3.13",
    ]  # fmt: skip
    for candidate in filter(None, candidates):
        if os.access(candidate, os.X_OK):
            ok = subprocess.run(
                [candidate, "-c", "import sys, venv; sys.exit(sys.version_info < (3, 12))"],
                capture_output=True,
                check=False,
            )
            if ok.returncode == 0:
                return candidate
    raise RuntimeError(
        "no Python >= 3.12 found (omnicoreagent and pyagenity need it): "
        "install python3.12, or `pyenv install 3.12`"
    )


def _sdk_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def frameworks_venv(cache: Path | None = None) -> Path:
    """The cached venv with omnicoreagent and pyagenity, built if missing; its bin/python.

    Raises:
        RuntimeError: No Python >= 3.12, or the build failed (pip's output says why).
    """
    base = python312()
    tag = subprocess.run(
        [base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    requirements = [*FRAMEWORKS, *_sdk_requirements()]
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:10]
    root = cache or Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    _make_readable_dir(root)
    name = "-".join(r.replace("==", "-") for r in FRAMEWORKS)
    venv = root / f"frameworks-{name}-py{tag}-{digest}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it: wait for it
        if not (venv / READY).exists():
            _build(base, venv, requirements)
    return venv / "bin" / "python"


def _build(base: str, venv: Path, requirements: list[str]) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    # No pip inside: this test interpreter's pip installs into it (see tests/plotting.py).
    _run([base, "-m", "venv", "--without-pip", str(venv)])
    _run(
        [
            sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
            "install", "--quiet", "--disable-pip-version-check", "--no-input", *requirements,
        ]
    )  # fmt: skip
    (venv / READY).write_text("\n".join(requirements) + "\n")


def driver_env() -> dict[str, str]:
    """The environment a driver runs in: the tree's SDK first on the path, nothing of ours else."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT / "client")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # litellm (omnicoreagent's dependency; pyagenity imports it when present)
    # fetches a model price list from GitHub at import: nothing may leave the machine.
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


DRIVER_TIMEOUT_S = 240


def run_driver(python: str, driver: Path, *args: str) -> dict[str, Any]:
    """Runs a driver script in the venv and returns the JSON object it prints last.

    Raises:
        AssertionError: The driver failed or printed no JSON (its stderr says why).
    """
    proc = subprocess.run(
        [python, str(driver), *args],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        env=driver_env(),
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"{driver.name} exited with {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


LOOKUP_TOOL = '''
from typing import Literal

from tooljail import tool


@tool(idempotent=True)
def lookup(
    key: str,
    mode: Literal["exact", "prefix"] = "exact",
    tags: list[str] | None = None,
    limit: int = 3,
    ratio: float = 0.5,
    strict: bool = False,
) -> dict:
    """Look a key up (a test tool: it echoes what it was given).

    key: what to look up
    limit: how many answers at most
    """
    return {
        "key": key, "mode": mode, "tags": tags, "limit": limit, "ratio": ratio, "strict": strict
    }
'''
"""A user tool with an `idempotent` flag and one parameter of each kind a schema maps."""


def lookup_tools_dir(base: Path) -> Path:
    """A tools directory in `base` serving `lookup`, readable by the sandbox uid."""
    from tests.conftest import _reachable

    directory = _reachable(base) / "tools"
    directory.mkdir()
    (directory / "lookup.py").write_text(LOOKUP_TOOL)
    directory.chmod(0o755)
    (directory / "lookup.py").chmod(0o644)
    return directory
