"""`systemctl reload` re-reads the tokens file, through a real `tooljail serve`.

The operator's story: identity x is revoked and y added while x has a call
running; after SIGHUP x is refused and y served under its policy (its tools,
its limit), and x's call runs to its end.
Then a broken tokens file and another SIGHUP: y still works, the STATUS line
and the log say the file was kept, and nothing secret reaches the log.
"""

from __future__ import annotations

import hashlib
import signal
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tests.integration.test_systemd_daemon import Systemd, systemd  # noqa: F401 (a fixture)
from tooljail import CallState, Client
from tooljail.errors import (
    CallNotFoundError,
    NotAwaitingApprovalError,
    OverloadedError,
    UnauthenticatedError,
)
from tooljail.testing import wait_for
from tooljaild.app.daemon import JOURNAL_FILE

TOKEN_X, TOKEN_Y = "token-of-x-reloaded", "token-of-y-reloaded"
PRINT_1 = {"code": "print(1)"}
SLOW = {"code": "import time; time.sleep(4); print('finished')"}
BRIEF = {"code": "import time; time.sleep(2)"}


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _running(client: Client, call_id: str) -> bool:
    try:
        return client.get_call(call_id).state is CallState.RUNNING
    except CallNotFoundError:  # not submitted yet
        return False


def _write_tokens(path: Path, text: str) -> None:
    """Replace the file as an operator's editor or config tool would: whole, at once."""
    draft = path.with_suffix(".new")
    draft.write_text(text)
    draft.chmod(0o600)
    draft.replace(path)


def test_a_reload_revokes_and_adds_identities_and_keeps_them_on_a_broken_file(
    tmp_path_factory: pytest.TempPathFactory,
    systemd: Systemd,  # noqa: F811 (the fixture imported above)
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tokens = base / "tokens.toml"
    _write_tokens(tokens, f'[identities.x]\ntoken_sha256 = "{_sha(TOKEN_X)}"\n')
    config = base / "tooljail.toml"
    config.write_text(f'log_level = "INFO"\n\n[auth]\ntokens_file = "{tokens}"\n')
    process, target, base = spawn_daemon(
        base, "--config", str(config), env={"NOTIFY_SOCKET": str(systemd.path)}, pool_size=1
    )
    log = base / "daemon.log"
    try:
        systemd.next("READY")
        with Client(target, token=TOKEN_X, retries=0) as x, ThreadPoolExecutor(1) as pool:
            assert x.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
            running = pool.submit(x.call, "execute_python_code", SLOW, call_id="x-long")
            wait_for(lambda: _running(x, "x-long"), 30)

            # x revoked, y added with a policy of its own; then the reload.
            _write_tokens(
                tokens,
                f'[identities.y]\ntoken_sha256 = "{_sha(TOKEN_Y)}"\n'
                'tools = ["execute_python_code"]\nmax_concurrent_calls = 1\n',
            )
            process.send_signal(signal.SIGHUP)
            systemd.next("RELOADING")
            assert "kept" not in systemd.next("READY")["STATUS"]
            assert not running.done(), "x's call was still running across the reload"

            for refused in (x.list_tools, lambda: x.call("execute_python_code", PRINT_1)):
                with pytest.raises(UnauthenticatedError):
                    refused()
            with Client(target, token=TOKEN_Y, retries=0) as y, ThreadPoolExecutor(1) as more:
                assert [t.name for t in y.list_tools()] == ["execute_python_code", "call_status"]
                assert y.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
                # Its limit of one call at a time holds from its next admission.
                first = more.submit(y.call, "execute_python_code", BRIEF, call_id="y-first")
                wait_for(lambda: _running(y, "y-first"), 30)
                with pytest.raises(OverloadedError):
                    y.call("execute_python_code", PRINT_1)
                assert first.result(timeout=30).ok

            # Admitted under x, x's call runs to its end.
            result = running.result(timeout=30)
            assert result.ok, result
            assert result.data["stdout"] == "finished\n"
        text = log.read_text()
        assert '"identities_added": ["y"]' in text and '"identities_removed": ["x"]' in text

        # A broken file: the identities in force (y) are kept, and everyone hears why.
        _write_tokens(tokens, f'[identities.z]\ntoken_sha256 = "{TOKEN_Y}"\n')
        process.send_signal(signal.SIGHUP)
        systemd.next("RELOADING")
        status = systemd.next("READY")["STATUS"]
        assert status.startswith("serving ") and "kept the tokens file" in status
        with Client(target, token=TOKEN_Y, retries=0) as y:
            assert y.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
        text = log.read_text()
        assert "identities kept, the tokens file cannot be used" in text
        assert str(tokens) in text and "identities.z.token_sha256" in text
        for secret in (TOKEN_X, TOKEN_Y, _sha(TOKEN_X), _sha(TOKEN_Y)):
            assert secret not in text

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_a_reload_ends_the_revoked_identitys_calls_that_have_not_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Issue 21, finding 15: a waiting call of a revoked identity was approved and ran.
    base = tmp_path_factory.mktemp("daemon")
    tokens = base / "tokens.toml"
    ops = f'[identities.ops]\ntoken_sha256 = "{_sha(TOKEN_Y)}"\napprover = true\n'
    _write_tokens(
        tokens, f'[identities.x]\ntoken_sha256 = "{_sha(TOKEN_X)}"\napproval = ["ls"]\n' + ops
    )
    config = base / "tooljail.toml"
    # One running slot: x's second call queues behind its first.
    config.write_text(f'max_concurrent = 1\n\n[auth]\ntokens_file = "{tokens}"\n')
    process, target, base = spawn_daemon(base, "--config", str(config), pool_size=1)
    log = base / "daemon.log"
    try:
        wait_serving(target, process, log)
        with (
            Client(target, token=TOKEN_X, retries=0) as x,
            Client(target, token=TOKEN_Y, retries=0) as approver,
            ThreadPoolExecutor(3) as pool,
        ):
            running = pool.submit(x.call, "execute_python_code", SLOW, call_id="x-running")
            wait_for(lambda: _running(x, "x-running"), 30)
            queued = pool.submit(x.call, "execute_python_code", PRINT_1, call_id="x-queued")
            waiting = pool.submit(x.call, "ls", {}, call_id="x-waiting")
            wait_for(lambda: _state(approver, "x-waiting") is CallState.AWAITING_APPROVAL, 30)
            assert _state(approver, "x-queued") is CallState.QUEUED

            _write_tokens(tokens, ops)  # x revoked
            process.send_signal(signal.SIGHUP)
            wait_for(lambda: '"identities_removed": ["x"]' in log.read_text(), 30)

            # Neither call that had not run will: each ends, effect none, saying why.
            for future, call_id in ((waiting, "x-waiting"), (queued, "x-queued")):
                result = future.result(timeout=30)
                assert result.status.value == "cancelled" and result.effect.value == "none"
                assert result.error is not None and result.error.type == "IdentityRevoked"
                assert "revoked" in result.message
                assert approver.get_call(call_id).state is CallState.CANCELLED
            with pytest.raises(NotAwaitingApprovalError):
                approver.approve("x-waiting")
            # The call that ran when x was revoked runs to its end.
            assert running.result(timeout=30).data["stdout"] == "finished\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        # The journal says the same after the daemon is gone.
        with sqlite3.connect(f"file:{base / 'state' / JOURNAL_FILE}?mode=ro", uri=True) as db:
            rows = dict(db.execute("SELECT call_id, state FROM calls WHERE client = 'x'"))
        assert rows == {"x-running": "succeeded", "x-queued": "cancelled", "x-waiting": "cancelled"}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _state(client: Client, call_id: str) -> CallState | None:
    try:
        return client.get_call(call_id).state
    except CallNotFoundError:
        return None
