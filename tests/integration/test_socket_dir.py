"""A non-root daemon's default socket directory, with a daemon really running as nobody.

`setpriv` drops to nobody; the system interpreter runs the daemon from this
tree (the test venv's interpreter may sit where nobody can reach it). The
runtime directory is the test's own (XDG_RUNTIME_DIR), so the default socket is
`<tmp>/run/tooljail/tooljail.sock`, and nothing outside the test is touched.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import wait_serving
from tooljail import Client

ROOT = Path(__file__).resolve().parents[2]
NOBODY = pwd.getpwnam("nobody")
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("setpriv") is None
    or not Path(SYSTEM_PYTHON).exists()
    or subprocess.run(
        [
            SYSTEM_PYTHON,
            "-c",
            f"import sys; sys.exit(sys.version_info[:2] != {sys.version_info[:2]})",
        ],
        check=False,
    ).returncode
    != 0,
    reason="needs root, setpriv and a system python3 of the test's version",
)


def _as_nobody(runtime: Path, state: Path, *args: str) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(
        [sysconfig.get_paths()["purelib"], str(ROOT / "daemon"), str(ROOT / "client")]
    )
    argv = [
        "setpriv", "--reuid", str(NOBODY.pw_uid), "--regid", str(NOBODY.pw_gid),
        "--clear-groups", "env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent",
        f"PYTHONPATH={path}", f"XDG_RUNTIME_DIR={runtime}",
        SYSTEM_PYTHON, "-m", "tooljaild", "serve", "--state-dir", str(state),
        "--isolation", "none", "--pool-size", "1", *args,
    ]  # fmt: skip
    log = open(state.parent / "daemon.log", "wb")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A directory nobody owns, reachable through tmp_path: runtime and state go in it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "run").mkdir(mode=0o700)
    (home / "state").mkdir()
    for d in (home, home / "run", home / "state"):
        os.chown(d, NOBODY.pw_uid, NOBODY.pw_gid)
    return home


def test_a_nobody_daemon_makes_its_socket_directory_private_and_serves(home: Path) -> None:
    process = _as_nobody(home / "run", home / "state")
    socket_path = home / "run" / "tooljail" / "tooljail.sock"
    try:
        wait_serving(f"unix://{socket_path}", process, home / "daemon.log")
        st = os.lstat(socket_path.parent)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o700)
        st = os.lstat(socket_path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o660)
        # Beside the socket: gRPC's own, in a directory only the daemon reaches
        # (the public socket is the relay that names each caller's uid).
        (private,) = [p for p in socket_path.parent.iterdir() if p.name != "tooljail.sock"]
        st = os.lstat(private)
        assert stat.S_ISDIR(st.st_mode)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0o700)
        with Client(f"unix://{socket_path}") as client:
            assert "execute_python_code" in {t.name for t in client.list_tools()}
    finally:
        process.terminate()
        process.wait(30)
    assert not socket_path.exists()
    assert list(socket_path.parent.iterdir()) == []


def test_a_nobody_daemon_refuses_a_socket_directory_someone_else_made(home: Path) -> None:
    planted = home / "run" / "tooljail"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # root's, and open to all: a socket could be swapped in
    process = _as_nobody(home / "run", home / "state")
    assert process.wait(60) == 2
    log = (home / "daemon.log").read_text()
    assert f"refusing to put the socket in {planted}" in log
    assert "belongs to uid 0, not to this daemon's uid" in log
    assert list(planted.iterdir()) == []
