"""A call answered from the journal is its owner's, as a live one is.

Through a real daemon with a tokens file: a call made by one identity, then the
daemon restarted on the same state directory (the call is then known only from
its journal), is refused to every other identity exactly as an id never used
(get_call, attach, cancel), and its id cannot be taken by them (a retry, also
of a lost idempotent call that would run again). Calls journaled before the
journal recorded owners (schema 2) are nobody's: only an approver sees them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tooljail.testing
from tooljail import CallState, Client, ToolResult
from tooljail.errors import CallIdConflictError, CallNotFoundError
from tooljaild.app.daemon import JOURNAL_FILE
from tooljaild.calls.terms import fingerprint
from tooljaild.journal.store import Journal

TOOL = "execute_python_code"
PRINT_1 = {"code": "print(1)"}
TOKENS = {"agent-a": "token-of-a", "agent-b": "token-of-b", "ops": "token-of-ops"}
LOOKUP_TOOL = '''
from tooljail import tool


@tool(idempotent=True)
def lookup(key: str) -> str:
    """Look a key up (the same answer every time: safe to run again)."""
    return key.upper()
'''


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            + ("approver = true\n" if name == "ops" else "")
            for name, token in TOKENS.items()
        )
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tools"
    directory.mkdir()
    (directory / "lookup.py").write_text(textwrap.dedent(LOOKUP_TOOL))
    return directory


@contextlib.contextmanager
def daemon(state_dir: Path, tools_dir: Path, tokens_file: Path | None) -> Iterator[str]:
    """A daemon on `state_dir` (its journal), with identities unless `tokens_file` is None."""
    auth: dict[str, Any] = {} if tokens_file is None else {"tokens_file": str(tokens_file)}
    with tooljail.testing.daemon(
        state_dir=state_dir, tools_dirs=[tools_dir], pool_size=1, auth=auth
    ) as target:
        yield target


def as_(target: str, name: str) -> Client:
    return Client(target, token=TOKENS[name], retries=0)


def not_found_message(client: Client, call_id: str) -> str:
    """What the daemon says of `call_id` to `client`, which must not see it."""
    with pytest.raises(CallNotFoundError) as refused:
        client.get_call(call_id)
    return str(refused.value)


def assert_refused_as_never_used(client: Client, call_id: str) -> None:
    """`client` learns nothing of `call_id`: every method answers as for an id never used."""
    never = not_found_message(client, "never-used")
    expected = never.replace("never-used", call_id)
    assert not_found_message(client, call_id) == expected
    with pytest.raises(CallNotFoundError) as attached:
        list(client.attach(call_id))
    assert str(attached.value) == expected
    with pytest.raises(CallNotFoundError) as cancelled:
        client.cancel(call_id)
    assert str(cancelled.value) == expected


def id_taken(client: Client, tool: str, args: dict[str, Any], call_id: str) -> str:
    """What the daemon says when `client` makes a call under `call_id`, which is taken."""
    with pytest.raises(CallIdConflictError) as taken:
        client.call(tool, args, call_id=call_id)
    return str(taken.value)


def assert_taken_saying_nothing_of_it(client: Client, call_id: str) -> None:
    """Every call under `call_id` is refused in the same words, whatever its tool and
    arguments: nothing says whose the id is, or what its call ran."""
    said = {
        id_taken(client, TOOL, PRINT_1, call_id),
        id_taken(client, TOOL, {"code": "print(2)"}, call_id),
        id_taken(client, "lookup", {"key": "k"}, call_id),
    }
    assert len(said) == 1, said
    [message] = said
    assert "taken" in message
    for secret in ("agent-a", TOOL, "print", "lookup"):
        assert secret not in message.replace(call_id, "<id>"), message


def test_a_journaled_call_is_its_owners_only_after_a_restart(
    state_dir: Path, tools_dir: Path, tokens_file: Path
) -> None:
    with daemon(state_dir, tools_dir, tokens_file) as target, as_(target, "agent-a") as a:
        made = a.call(TOOL, PRINT_1, call_id="a-call")
        assert made.ok and made.data["stdout"] == "1\n"
    # A new daemon: the call is in no one's memory, only in the journal.
    with daemon(state_dir, tools_dir, tokens_file) as target:
        with as_(target, "agent-b") as b:
            assert_refused_as_never_used(b, "a-call")
            # Its id is not b's to take, with its arguments or with others.
            assert_taken_saying_nothing_of_it(b, "a-call")
        with as_(target, "agent-a") as a:
            info = a.get_call("a-call")
            assert info.state is CallState.SUCCEEDED
            assert info.result is not None and info.result.data["stdout"] == "1\n"
            [result] = [i for i in a.attach("a-call") if isinstance(i, ToolResult)]
            assert result.data["stdout"] == "1\n"
            assert a.cancel("a-call") is CallState.SUCCEEDED
            # The owner's retry is answered from the journal: not run twice.
            again = a.call(TOOL, PRINT_1, call_id="a-call")
            assert again.data == made.data
        with as_(target, "ops") as ops:  # an approver sees any call, to judge it
            assert ops.get_call("a-call").state is CallState.SUCCEEDED
            with pytest.raises(CallNotFoundError):
                ops.cancel("a-call")


def test_another_identity_cannot_rerun_a_lost_idempotent_call_under_its_id(
    state_dir: Path, tools_dir: Path, tokens_file: Path
) -> None:
    args = {"key": "k"}
    state_dir.mkdir()
    # What a daemon killed while a's idempotent call ran leaves in its journal.
    with Journal.open(state_dir / JOURNAL_FILE) as journal:
        journal.admitted(
            "a-lookup",
            tool="lookup",
            fingerprint=fingerprint("lookup", args),
            arguments_json='{"key": "k"}',
            timeout_s=30.0,
            idempotent=True,
            client="agent-a",
        )
    with daemon(state_dir, tools_dir, tokens_file) as target:
        with as_(target, "agent-b") as b:
            assert_taken_saying_nothing_of_it(b, "a-lookup")
            assert_refused_as_never_used(b, "a-lookup")
        with as_(target, "agent-a") as a:
            # Still a's, still lost: b's attempt neither ran it nor took it over.
            assert a.get_call("a-lookup").state is CallState.LOST
            rerun = a.call("lookup", args, call_id="a-lookup")
            assert rerun.ok and rerun.data == "K"


def test_calls_from_before_owners_were_journaled_are_shown_to_approvers_only(
    state_dir: Path, tools_dir: Path, tokens_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A journal of schema 2 (no owners), as the last tooljail before 3 left it.
    with daemon(state_dir, tools_dir, None) as target, Client(target) as anyone:
        assert anyone.call(TOOL, PRINT_1, call_id="old-call").ok
    journal = state_dir / JOURNAL_FILE
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        # Back through version 4 (the history's indexes and columns) to 2.
        indexes = db.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'calls' "
            "AND name != 'calls_by_end' AND sql IS NOT NULL"
        ).fetchall()
        for (name,) in indexes:
            db.execute(f"DROP INDEX {name}")
        for column in ("arguments_sha256", "status", "session_id", "client"):
            db.execute(f"ALTER TABLE calls DROP COLUMN {column}")
        db.execute("PRAGMA user_version = 2")
    caplog.set_level(logging.INFO, logger="tooljaild.calls.history")
    with daemon(state_dir, tools_dir, tokens_file) as target:
        for name in ("agent-a", "agent-b"):
            with as_(target, name) as someone:
                assert_refused_as_never_used(someone, "old-call")
                assert_taken_saying_nothing_of_it(someone, "old-call")
        with as_(target, "ops") as ops:
            info = ops.get_call("old-call")
            assert info.state is CallState.SUCCEEDED
            assert info.result is not None and info.result.data["stdout"] == "1\n"
    # Why, for the operator: in the daemon's log, never in what a caller hears.
    said = [r.getMessage() for r in caplog.records if "old-call" in r.getMessage()]
    assert any("predates the journal's record of owners" in m and "agent-b" in m for m in said)
    assert any("shown to approvers only" in m and "ops" in m for m in said)
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (4,)


def test_without_identities_any_client_reads_a_journaled_call_as_before(
    state_dir: Path, tools_dir: Path
) -> None:
    with daemon(state_dir, tools_dir, None) as target, Client(target, client_name="h1") as one:
        assert one.call(TOOL, PRINT_1, call_id="plain").ok
    with daemon(state_dir, tools_dir, None) as target, Client(target, client_name="h2") as other:
        assert other.get_call("plain").state is CallState.SUCCEEDED
        assert other.call(TOOL, PRINT_1, call_id="plain").data["stdout"] == "1\n"
        assert other.cancel("plain") is CallState.SUCCEEDED
