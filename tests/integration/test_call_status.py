"""The built-in `call_status`: a model checks on a call that timed out.

Through a real daemon over a real channel: a tool that sleeps past its timeout
(kill_after_s lets it run on) times out with a message naming call_status and
the call id; call_status then says it is still running (and when to ask again),
and later that it succeeded, with its data. An unknown id, or another
identity's call, is a result the model reads (status error, effect none), never
a refusal; an approver sees any call. A policy that does not list call_status,
or lists it for approval, neither hides nor gates it. It answers while the
client's share of calls is full of the calls it asks about.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client, Effect, ToolResult
from tooljail.testing import wait_for

SLOW_TOOL = '''
import time
from tooljail import tool


@tool(timeout_s=1, kill_after_s=20)
def slow_append(path: str, seconds: float = 2.5) -> str:
    """Sleeps, then appends a line to a file."""
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write("done\\n")
    return "appended to " + path
'''
TOKENS = {"agent-a": "token-of-a", "agent-b": "token-of-b", "ops": "token-of-ops"}
POLICIES = {
    "agent-a": 'tools = ["slow_append"]\napproval = ["call_status"]',
    "agent-b": 'tools = ["slow_append"]',
    "ops": "approver = true",
}


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "slow.py").write_text(SLOW_TOOL)
    return tools


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "".join(
            f"[identities.{name}]\n"
            f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            f"{POLICIES[name]}\n"
            for name, token in TOKENS.items()
        )
    )
    path.chmod(0o600)
    return path


def status_of(client: Client, call_id: str) -> tuple[ToolResult, dict[str, Any]]:
    result = client.call("call_status", {"call_id": call_id})
    return result, result.data if isinstance(result.data, dict) else {}


def test_a_model_checks_a_timed_out_call_until_it_succeeded(
    serve: Callable[..., ServedDaemon], tools_dir: Path, host_dir: Path
) -> None:
    daemon = serve(tools_dirs=[tools_dir], isolation="none")
    target = host_dir / "out.txt"
    call_id = "status-" + uuid.uuid4().hex
    with Client(daemon.target) as client:
        assert "call_status" in {t.name for t in client.list_tools()}
        timed_out = client.call("slow_append", {"path": str(target)}, call_id=call_id)
        assert timed_out.status is CallStatus.TIMEOUT and timed_out.still_running
        assert "may still take effect" in timed_out.message
        assert f"call_status tool (call_id '{call_id}')" in timed_out.message

        started = time.monotonic()
        running, data = status_of(client, call_id)
        assert time.monotonic() - started < 1.0  # no wait behind the call it reports on
        assert running.status is CallStatus.SUCCESS, running
        assert data["running"] is True and data["state"] == "running", data
        assert data["tool"] == "slow_append" and "status" not in data
        assert "Still running" in data["next"] and "ask again with call_status in" in data["next"]
        assert not target.exists()

        def ended() -> bool:
            return status_of(client, call_id)[1]["running"] is False

        wait_for(ended, timeout=15)
        done, data = status_of(client, call_id)
        assert done.ok, done
    assert data["state"] == "succeeded", data
    assert data["status"] == "success" and data["effect"] == "applied"
    assert data["data"] == f"appended to {target}"
    assert "It succeeded" in data["next"] and "Do not call slow_append again" in data["next"]
    assert data["ended_at"] >= data["started_at"] >= data["received_at"]
    assert target.read_text() == "done\n"


def test_an_unknown_id_is_a_result_the_model_reads(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        for asked in ("never-made-" + uuid.uuid4().hex, "not an id/..", "x" * 200):
            result, _ = status_of(client, asked)
            assert result.status is CallStatus.ERROR, result
            assert result.effect is Effect.NONE
            assert result.error is not None and result.error.type == "CallNotFound"
            assert "No call with the id" in result.message
            assert "is known to this daemon" in result.message


def test_call_status_follows_the_owner_rule_and_no_policy_hides_it(
    serve: Callable[..., ServedDaemon], tools_dir: Path, tokens_file: Path, host_dir: Path
) -> None:
    daemon = serve(tools_dirs=[tools_dir], isolation="none", auth={"tokens_file": str(tokens_file)})
    call_id = "owned-" + uuid.uuid4().hex
    args = {"path": str(host_dir / "a.txt"), "seconds": 0.1}
    clients = {name: Client(daemon.target, token=token) for name, token in TOKENS.items()}
    try:
        a, b, ops = clients["agent-a"], clients["agent-b"], clients["ops"]
        # Listed though the policy lists only slow_append; not gated though it
        # names call_status for approval (the call below would wait, and time out).
        assert {t.name for t in a.list_tools()} == {"slow_append", "call_status"}
        assert a.call("slow_append", args, call_id=call_id).ok
        mine, data = status_of(a, call_id)
        assert mine.ok and data["state"] == "succeeded", mine

        theirs, _ = status_of(b, call_id)
        never, _ = status_of(b, "never-" + uuid.uuid4().hex)
        assert theirs.status is CallStatus.ERROR and theirs.effect is Effect.NONE
        assert theirs.message == never.message.replace(never.message.split("'")[1], call_id)

        seen, data = status_of(ops, call_id)
        assert seen.ok and data["state"] == "succeeded"
    finally:
        for client in clients.values():
            client.close()


def test_call_status_answers_when_the_clients_share_is_full(
    serve: Callable[..., ServedDaemon], tools_dir: Path, host_dir: Path
) -> None:
    daemon = serve(
        tools_dirs=[tools_dir],
        isolation="none",
        max_concurrent=1,
        max_queue=0,
        max_calls_per_client=1,
        max_in_daemon_calls=1,
    )
    call_id = "full-" + uuid.uuid4().hex
    with Client(daemon.target) as client:
        timed_out = client.call(
            "slow_append", {"path": str(host_dir / "b.txt"), "seconds": 3}, call_id=call_id
        )
        assert timed_out.still_running  # it holds the client's share and the only slot
        started = time.monotonic()
        result, data = status_of(client, call_id)
        assert time.monotonic() - started < 1.0
    assert result.ok, result
    assert data["running"] is True


def test_call_status_in_a_session_that_ended_still_answers(
    serve: Callable[..., ServedDaemon], tools_dir: Path, host_dir: Path
) -> None:
    daemon = serve(tools_dirs=[tools_dir], isolation="none")
    with Client(daemon.target) as client:
        with client.session() as session:
            done = session.call("execute_python_code", {"code": "print(1)"})
            session_id = session.id
        # The adapters send every call of a session target with its id: call_status too.
        result = client.call("call_status", {"call_id": done.call_id}, session_id=session_id)
    assert result.ok, result
    assert result.data["state"] == "succeeded"
    assert result.data["data"]["stdout"] == "1\n"
