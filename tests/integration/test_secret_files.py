"""A TLS key or tokens file others could read or change: refused at start, kept at reload.

Issue 21, finding 16: `tooljail serve` started, and reloaded, with a
world-readable TLS private key or tokens file without a word. Now a start is
refused with a sentence naming the file, its mode and the chmod to run; a
reload (SIGHUP) keeps the identities it had and says why; a key made readable
after the start is named as stopping the next restart.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.certs import Authority
from tests.conftest import _reachable, spawn_daemon
from tests.integration.test_systemd_daemon import Systemd, systemd  # noqa: F401 (a fixture)
from tooljail import Client
from tooljail.errors import UnauthenticatedError

TOKEN_X, TOKEN_Y = "token-of-x-secret-files", "token-of-y-secret-files"
PRINT_1 = {"code": "print(1)"}
OTHER_UID = 65534


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    """Replace `path` whole, as an editor or a config tool would, with `mode`."""
    draft = path.with_suffix(".new")
    draft.write_text(text)
    draft.chmod(mode)
    draft.replace(path)
    return path


def _serve_refused(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`tooljail serve` with `args`, expected to refuse at once."""
    base = _reachable(base)
    argv = [
        sys.executable, "-m", "tooljaild", "serve", "--state-dir", str(base / "state"),
        "--pool-size", "1", *args,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _tokens(base: Path, mode: int) -> Path:
    return _write(base / "tokens.toml", f'[identities.x]\ntoken_sha256 = "{_sha(TOKEN_X)}"\n', mode)


def _config(base: Path, text: str) -> Path:
    config = base / "tooljail.toml"
    config.write_text(f'log_level = "INFO"\n\n{text}')
    return config


def _other_users_tokens(base: Path) -> Path:
    path = _tokens(base, 0o600)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


def _fifo(base: Path) -> Path:
    path = base / "tokens.toml"
    os.mkfifo(path, 0o600)
    return path


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda b: _tokens(b, 0o644), "can be read by every user of this host (mode 0644)"),
        (lambda b: _tokens(b, 0o602), "can be used by other users (mode 0602)"),
        (lambda b: _tokens(b, 0o620), "can be changed by its group (mode 0620)"),
        pytest.param(
            _other_users_tokens,
            f"belongs to uid {OTHER_UID}, who could change it",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"),
        ),
        (_fifo, "is not a regular file"),  # refused at once: never blocks the start
    ],
    ids=["world-readable", "other-writable", "group-writable", "not-owned", "fifo"],
)
def test_serve_refuses_a_tokens_file_others_could_read_or_change(
    tmp_path_factory: pytest.TempPathFactory, make: Callable[[Path], Path], said: str
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tokens = make(base)
    config = _config(base, f'[auth]\ntokens_file = "{tokens}"\n')
    proc = _serve_refused(base, "--config", str(config), "--listen", f"unix://{base}/s.sock")
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(f"tooljail: the tokens file {tokens} {said}"), error
    fix = f"chown {os.geteuid()} {tokens}" if "uid" in said else f"chmod 600 {tokens}"
    assert fix in error or "give a file's path" in error, error
    assert not (base / "s.sock").exists()


def test_serve_refuses_a_tls_key_others_could_read(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    server = Authority(base, "ops").issue("localhost", server=True)
    server.key.chmod(0o644)
    config = _config(base, f'[tls]\ncert_file = "{server.cert}"\nkey_file = "{server.key}"\n')
    proc = _serve_refused(base, "--config", str(config), "--listen", f"127.0.0.1:{_free_port()}")
    assert proc.returncode == 2, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error == (
        f"tooljail: the TLS private key ([tls] key_file) {server.key} can be read by every "
        "user of this host (mode 0644); it must be private to the daemon's user: "
        f"chmod 600 {server.key} (or 640 to let its group read it)"
    ), error


def test_a_reload_keeps_the_identities_when_the_tokens_file_becomes_readable_by_others(
    tmp_path_factory: pytest.TempPathFactory,
    systemd: Systemd,  # noqa: F811 (the fixture imported above)
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tokens = _tokens(base, 0o600)
    config = _config(base, f'[auth]\ntokens_file = "{tokens}"\n')
    process, target, base = spawn_daemon(
        base, "--config", str(config), env={"NOTIFY_SOCKET": str(systemd.path)}, pool_size=1
    )
    log = base / "daemon.log"
    try:
        systemd.next("READY")
        with Client(target, token=TOKEN_X, retries=0) as x:
            assert x.call("execute_python_code", PRINT_1).ok

        # x replaced by y, in a file every user may read: the reload keeps x.
        _write(tokens, f'[identities.y]\ntoken_sha256 = "{_sha(TOKEN_Y)}"\n', 0o644)
        process.send_signal(signal.SIGHUP)
        systemd.next("RELOADING")
        assert "kept the tokens file" in systemd.next("READY")["STATUS"]
        with Client(target, token=TOKEN_X, retries=0) as x:
            assert x.call("execute_python_code", PRINT_1).ok
        with Client(target, token=TOKEN_Y, retries=0) as y, pytest.raises(UnauthenticatedError):
            y.list_tools()
        text = log.read_text()
        assert "identities kept, the tokens file cannot be used" in text
        assert f"{tokens} can be read by every user of this host (mode 0644)" in text
        assert f"chmod 600 {tokens}" in text
        assert _sha(TOKEN_Y) not in text

        # Made private: the next reload takes it.
        tokens.chmod(0o600)
        process.send_signal(signal.SIGHUP)
        systemd.next("RELOADING")
        assert "kept" not in systemd.next("READY")["STATUS"]
        with Client(target, token=TOKEN_Y, retries=0) as y:
            assert y.call("execute_python_code", PRINT_1).ok
        with Client(target, token=TOKEN_X, retries=0) as x, pytest.raises(UnauthenticatedError):
            x.list_tools()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_a_reload_says_a_tls_key_made_readable_would_stop_the_next_start(
    tmp_path_factory: pytest.TempPathFactory,
    systemd: Systemd,  # noqa: F811 (the fixture imported above)
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    authority = Authority(base, "ops")
    server = authority.issue("localhost", server=True)
    config = _config(base, f'[tls]\ncert_file = "{server.cert}"\nkey_file = "{server.key}"\n')
    port = _free_port()
    process, _, base = spawn_daemon(
        base,
        "--config",
        str(config),
        env={"NOTIFY_SOCKET": str(systemd.path)},
        listen=f"127.0.0.1:{port}",
        pool_size=1,
    )
    target = f"localhost:{port}"
    try:
        systemd.next("READY")
        server.key.chmod(0o644)
        process.send_signal(signal.SIGHUP)
        systemd.next("RELOADING")
        systemd.next("READY")
        with Client(target, tls_ca_file=str(authority.ca_file), retries=0) as client:
            assert client.call("execute_python_code", PRINT_1).ok  # the key read at start
        text = (base / "daemon.log").read_text()
        assert "a restart would fail" in text
        assert f"{server.key} can be read by every user of this host (mode 0644)" in text
        assert f"chmod 600 {server.key}" in text
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
