"""Where the daemon listens: its own socket directory, and no moment open to others.

The tests run as root, so a non-root daemon is played by pretending to another
uid (`os.geteuid` of the module) and giving directories to it or to nobody.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import stat
from pathlib import Path

import pytest

from tooljaild.app import listen
from tooljaild.app.errors import DaemonError
from tooljaild.app.listen import prepare_socket, private_dir_problem
from tooljaild.settings import addresses

NOBODY = pwd.getpwnam("nobody").pw_uid
ME = 4242
"""The uid the pretend non-root daemon runs as."""


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def as_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A non-root daemon (uid ME) whose default socket is `<tmp>/run/tooljail/tooljail.sock`."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(listen.os, "geteuid", lambda: ME)
    return runtime / "tooljail"


def test_a_private_directory_of_ours_is_fine(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    os.chown(d, ME, -1)
    assert private_dir_problem(d, ME) is None


@pytest.mark.parametrize(
    ("owner", "mode", "says"),
    [
        (NOBODY, 0o700, f"belongs to uid {NOBODY}, not to this daemon's uid {ME}"),
        (0, 0o755, f"belongs to uid 0, not to this daemon's uid {ME}"),
        (ME, 0o777, "may be written by others (mode 0777)"),
        (ME, 0o720, "may be written by others (mode 0720)"),
    ],
)
def test_a_directory_of_someone_else_or_writable_by_others_is_refused(
    tmp_path: Path, owner: int, mode: int, says: str
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(mode)
    os.chown(d, owner, -1)
    problem = private_dir_problem(d, ME)
    assert problem is not None and says in problem


def test_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.chown(real, ME, -1)
    (tmp_path / "link").symlink_to(real)
    os.lchown(tmp_path / "link", ME, -1)
    assert "is a symbolic link" in str(private_dir_problem(tmp_path / "link", ME))
    (tmp_path / "file").touch()
    assert "is not a directory" in str(private_dir_problem(tmp_path / "file", ME))


def test_a_missing_default_directory_is_made_0700(
    as_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_mkdir = os.mkdir

    def mkdir_as_me(path: str | Path, mode: int = 0o777) -> None:
        real_mkdir(path, mode)
        os.chown(path, ME, -1)  # what a daemon running as ME would get

    monkeypatch.setattr(listen.os, "mkdir", mkdir_as_me)
    plan = prepare_socket(f"unix://{as_user}/tooljail.sock")
    try:
        assert _mode(as_user) == 0o700
        assert plan.private_dir.parent == as_user and _mode(plan.private_dir) == 0o700
    finally:
        plan.discard()


def test_the_default_directory_of_someone_else_is_refused_naming_the_fix(as_user: Path) -> None:
    as_user.mkdir(mode=0o700)
    os.chown(as_user, NOBODY, -1)
    with pytest.raises(DaemonError) as caught:
        prepare_socket(f"unix://{as_user}/tooljail.sock")
    message = str(caught.value)
    assert f"refusing to put the socket in {as_user}" in message
    assert f"belongs to uid {NOBODY}" in message and "--listen" in message
    assert list(as_user.iterdir()) == []


def test_a_default_directory_planted_as_a_link_is_refused(as_user: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, ME, -1)
    as_user.symlink_to(theirs)
    with pytest.raises(DaemonError, match="is a symbolic link"):
        prepare_socket(f"unix://{as_user}/tooljail.sock")


def test_our_default_directory_made_readable_by_an_older_daemon_is_narrowed(
    as_user: Path,
) -> None:
    as_user.mkdir(mode=0o755)
    as_user.chmod(0o755)
    os.chown(as_user, ME, -1)
    prepare_socket(f"unix://{as_user}/tooljail.sock").discard()
    assert _mode(as_user) == 0o700


def test_an_explicit_socket_directory_is_the_operators_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listen.os, "geteuid", lambda: ME)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    prepare_socket(f"unix://{shared}/tooljail.sock").discard()
    assert _mode(shared) == 0o755


def test_the_socket_appears_only_when_its_mode_is_set(tmp_path: Path) -> None:
    # Under a permissive umask a socket is born 0777: it must be 0660 before it has its name.
    plan = prepare_socket(f"unix://{tmp_path}/tooljail.sock")
    old = os.umask(0)
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(plan.bind_address.removeprefix("unix://"))
    finally:
        os.umask(old)
    try:
        assert _mode(plan.private_dir) == 0o700  # nobody else reaches it meanwhile
        assert not (tmp_path / "tooljail.sock").exists()
        with contextlib.closing(plan.publish()):
            assert _mode(tmp_path / "tooljail.sock") == 0o660
            # gRPC's socket stays where only the daemon reaches it; the relay's
            # staged name is gone.
            assert _mode(plan.private_dir) == 0o700
            assert [p.name for p in plan.private_dir.iterdir()] == ["s"]
        plan.discard()
        assert not plan.private_dir.exists()
    finally:
        server.close()


def test_publishing_never_replaces_a_socket_someone_put_there(tmp_path: Path) -> None:
    plan = prepare_socket(f"unix://{tmp_path}/tooljail.sock")
    ours = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.bind(plan.bind_address.removeprefix("unix://"))
    theirs = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.bind(str(tmp_path / "tooljail.sock"))
    try:
        with pytest.raises(DaemonError, match="another process is already listening"):
            plan.publish()
        assert [p.name for p in plan.private_dir.iterdir()] == ["s"]
        plan.discard()
    finally:
        ours.close()
        theirs.close()


def test_the_default_daemon_id_is_the_hostname_and_the_port_or_socket_path() -> None:
    host = socket.gethostname()
    assert addresses.default_daemon_id("127.0.0.1:0", 43210) == f"{host}:43210"
    assert addresses.default_daemon_id("[::1]:7070", 7070) == f"{host}:7070"
    assert addresses.default_daemon_id("unix:///run/tj/a.sock", 0) == f"{host}:/run/tj/a.sock"
    assert addresses.default_daemon_id("unix:/run/tj/b.sock", 0) == f"{host}:/run/tj/b.sock"
