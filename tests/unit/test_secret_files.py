"""`tooljaild.auth.secret_files`: which files may hold a secret, and the messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tooljaild.auth.secret_files import ExposedSecretError, exposure, read_secret


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640, 0o440, 0o700])
def test_a_file_private_to_its_owner_and_group_may_be_read(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"secret")
    path.chmod(mode)
    assert exposure(path.stat(), path, "the key") is None
    assert read_secret(path, "the key") == b"secret"


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (0o644, "can be read by every user of this host (mode 0644)"),
        (0o604, "can be read by every user of this host (mode 0604)"),
        (0o601, "can be used by other users (mode 0601)"),
        (0o660, "can be changed by its group (mode 0660)"),
        (0o666, "can be read by every user of this host (mode 0666)"),
    ],
)
def test_a_file_others_may_read_or_change_is_refused_with_the_chmod_to_run(
    tmp_path: Path, mode: int, said: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_bytes(b"")
    path.chmod(mode)
    with pytest.raises(ExposedSecretError) as refused:
        read_secret(path, "the tokens file")
    assert str(refused.value) == (
        f"the tokens file {path} {said}; it must be private to the daemon's user: "
        f"chmod 600 {path} (or 640 to let its group read it)"
    )


def test_owned_by_the_daemon_or_root_only(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"")
    path.chmod(0o600)
    mode = path.stat().st_mode

    def owned_by(uid: int) -> os.stat_result:
        return os.stat_result((mode, 0, 0, 1, uid, uid, 0, 0, 0, 0))

    assert exposure(owned_by(1000), path, "the key", euid=1000) is None
    assert exposure(owned_by(0), path, "the key", euid=1000) is None  # root's: fine
    assert exposure(owned_by(4242), path, "the key", euid=1000) == (
        f"the key {path} belongs to uid 4242, who could change it; it must belong to the "
        f"daemon's user or root: chown 1000 {path}"
    )


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    os.mkfifo(path, 0o600)
    with pytest.raises(ExposedSecretError, match="is not a regular file"):
        read_secret(path, "the tokens file")


def test_a_symbolic_link_is_judged_by_the_file_it_names(tmp_path: Path) -> None:
    """As Kubernetes mounts a Secret: `tls.key -> ..data/tls.key`."""
    target = tmp_path / "data.key"
    target.write_bytes(b"k")
    target.chmod(0o400)
    link = tmp_path / "tls.key"
    link.symlink_to(target)
    assert read_secret(link, "the key") == b"k"
    target.chmod(0o444)
    with pytest.raises(ExposedSecretError, match="mode 0444"):
        read_secret(link, "the key")
