"""A virtualenv with matplotlib for sandboxes, built once per machine and cached.

Process sandboxes run as an unprivileged uid (nobody, when the tests run as
root) that cannot reach the test's own interpreter (pyenv under /root): the
venv is built on the system's python3 (/usr/bin/python3.11 here), in a
directory every user can read. Its packages come from PyPI the first time
(about a minute); later runs find it ready.

Cache: $TOOLJAIL_TEST_VENVS (default /var/tmp/tooljail-test-venvs), one venv
per requirement set, e.g. /var/tmp/tooljail-test-venvs/matplotlib-3.10.3-py3.11.
Delete the directory to rebuild it. Concurrent test runs (several worktrees on
one machine) wait for each other on a lock file there instead of building twice.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

MATPLOTLIB = "3.10.3"
"""Pinned: the cache is keyed by it, so a new release does not rebuild it unasked."""
CACHE_ENV = "TOOLJAIL_TEST_VENVS"
DEFAULT_CACHE = Path("/var/tmp/tooljail-test-venvs")
READY = ".tooljail-ready"
"""Written last: a venv without it was interrupted mid-build and is built again."""
BUILD_TIMEOUT_S = 600


def base_python() -> str:
    """The system interpreter sandboxes use (>= 3.11, reachable by every uid).

    Raises:
        RuntimeError: There is none.
    """
    for candidate in ("/usr/bin/python3.11", "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            ok = subprocess.run(
                [candidate, "-c", "import sys, venv; sys.exit(sys.version_info < (3, 11))"],
                capture_output=True,
                check=False,
            )
            if ok.returncode == 0:
                return candidate
    raise RuntimeError("no system python3 >= 3.11 with the venv module: apt-get install python3")


def plotting_venv(cache: Path | None = None) -> Path:
    """The cached venv with matplotlib, built if missing; its bin/python.

    Raises:
        RuntimeError: The build failed (pip's output says why).
    """
    base = base_python()
    tag = subprocess.run(
        [base, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    root = cache or Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    _make_readable_dir(root)
    venv = root / f"matplotlib-{MATPLOTLIB}-py{tag}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it: wait for it
        if not (venv / READY).exists():
            _build(base, venv)
    return venv / "bin" / "python"


def _make_readable_dir(path: Path) -> None:
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        path.chmod(0o755)


def _build(base: str, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    old = os.umask(0o022)  # every file readable by the sandbox uid
    try:
        # No pip inside (Debian's python3 has no ensurepip without python3-venv):
        # this test interpreter's pip installs into it.
        _run([base, "-m", "venv", "--without-pip", str(venv)])
        _run(
            [
                sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                "install", "--quiet", "--disable-pip-version-check", "--no-input",
                f"matplotlib=={MATPLOTLIB}",
            ]
        )  # fmt: skip
    finally:
        os.umask(old)
    (venv / READY).write_text(f"matplotlib=={MATPLOTLIB}\n")


def _run(argv: list[str]) -> None:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        said = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{said}")
