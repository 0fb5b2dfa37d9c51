"""Calls that need an approver: they wait (visible to get_call, a notice on their
stream) until an approver approves (they run) or denies (they end, effect none,
with a message a model can act on), or the approval times out; cancel works while
they wait; only an approver may decide.

Who is calling is an identity of the daemon's tokens file, authenticated by the
bearer token each client sends, over a real daemon and a real channel.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tooljail.testing
from tests.conftest import ServedDaemon, wait_finished
from tooljail import CallState, Client, Output, StreamKind, ToolResult
from tooljail.errors import (
    CallNotFoundError,
    NotAwaitingApprovalError,
    PermissionDeniedError,
)
from tooljail.testing import wait_for
from tooljaild import cli
from tooljaild.app.daemon import JOURNAL_FILE

TOOL = "execute_python_code"
POLICIES = {
    "agent": f'approval = ["{TOOL}"]',
    "ops": "approver = true",
    "other": "",
    "careful": f'approval = ["{TOOL}", "list_artifacts"]',
    "lead": f'approver = true\napproval = ["{TOOL}"]',
}
TOKENS = {name: f"token-of-{name}" for name in POLICIES}


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.toml"
    path.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{_sha256(TOKENS[name])}"\n{policy}\n'
            for name, policy in POLICIES.items()
        )
    )
    path.chmod(0o600)  # the daemon reads no tokens file others could read
    return path


@pytest.fixture
def serve(serve: Callable[..., ServedDaemon], tokens_file: Path) -> Callable[..., ServedDaemon]:
    """conftest's `serve`, with this module's tokens file."""

    def start(**settings: Any) -> ServedDaemon:
        auth = {"tokens_file": str(tokens_file), **settings.pop("auth", {})}
        return serve(auth=auth, **settings)

    return start


class Streamed:
    """A call streamed on a thread: its items as they come, its result at the end."""

    def __init__(self, target: str, code: str, call_id: str) -> None:
        self.items: list[Output | ToolResult] = []
        self._client = Client(target, token=TOKENS["agent"])

        def run() -> None:
            for item in self._client.stream(TOOL, {"code": code}, call_id=call_id):
                self.items.append(item)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float = 30.0) -> ToolResult:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), self.items
        self._client.close()
        result = self.items[-1]
        assert isinstance(result, ToolResult), self.items
        return result


@pytest.fixture
def clients(served: ServedDaemon) -> Iterator[Callable[[str], Client]]:
    made: list[Client] = []

    def client(name: str) -> Client:
        made.append(Client(served.target, token=TOKENS[name]))
        return made[-1]

    yield client
    for c in made:
        c.close()


def _waiting(client: Client, call_id: str) -> None:
    wait_for(lambda: _state(client, call_id) is CallState.AWAITING_APPROVAL, timeout=15)


def _state(client: Client, call_id: str) -> CallState | None:
    try:
        return client.get_call(call_id).state
    except CallNotFoundError:
        return None


def test_an_approved_call_waits_with_a_notice_then_runs(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    streamed = Streamed(served.target, "print('ran')", "approve-me")
    ops = clients("ops")
    _waiting(ops, "approve-me")
    # The caller hears at once why nothing happens, and how to decide.
    wait_for(lambda: bool(streamed.items), timeout=10)
    notice = streamed.items[0]
    assert isinstance(notice, Output) and notice.stream is StreamKind.NOTICE
    assert "tooljail approve approve-me" in notice.data
    info = ops.approve("approve-me")
    assert info.state in (CallState.QUEUED, CallState.RUNNING, CallState.SUCCEEDED)
    result = streamed.result()
    assert result.ok, result
    assert result.data["stdout"] == "ran\n"


def test_a_denied_call_ends_without_running_and_says_why(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    streamed = Streamed(served.target, "print('never')", "deny-me")
    ops = clients("ops")
    _waiting(ops, "deny-me")
    info = ops.deny("deny-me", "no network scans on prod")
    assert info.state is CallState.FAILED
    result = streamed.result()
    assert result.status.value == "error" and result.effect.value == "none"
    assert result.error is not None and result.error.type == "ApprovalDenied"
    assert "no network scans on prod" in result.message and "'ops'" in result.message
    assert not any(isinstance(i, Output) and i.stream is StreamKind.STDOUT for i in streamed.items)
    assert wait_finished(ops, "deny-me").state is CallState.FAILED


def test_an_undecided_call_times_out_without_running(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(auth={"approval_timeout_s": 0.5})
    with Client(served.target, token=TOKENS["agent"]) as agent:
        result = agent.call(TOOL, {"code": "print('never')"}, call_id="too-late")
    assert result.status.value == "error" and result.effect.value == "none"
    assert result.error is not None and result.error.type == "ApprovalTimeout"
    assert "0.5s" in result.message
    with Client(served.target, token=TOKENS["ops"]) as ops, pytest.raises(NotAwaitingApprovalError):
        ops.approve("too-late")


def test_a_waiting_call_can_be_cancelled(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    streamed = Streamed(served.target, "print('never')", "cancel-me")
    agent = clients("agent")
    _waiting(agent, "cancel-me")
    assert agent.cancel("cancel-me") is CallState.CANCELLED
    result = streamed.result()
    assert result.status.value == "cancelled" and result.effect.value == "none"
    assert "waited for approval" in result.message


def test_only_an_approver_decides_and_only_on_a_waiting_call(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    streamed = Streamed(served.target, "print('ran')", "mine")
    agent, other, ops = clients("agent"), clients("other"), clients("ops")
    _waiting(ops, "mine")
    for who in (agent, other):
        with pytest.raises(PermissionDeniedError):
            who.approve("mine")
    # A non-approver learns nothing of calls: not even whether the id exists.
    with pytest.raises(PermissionDeniedError):
        other.deny("no-such-call", "x")
    with pytest.raises(CallNotFoundError):
        ops.approve("no-such-call")
    assert _state(ops, "mine") is CallState.AWAITING_APPROVAL
    ops.approve("mine")
    assert streamed.result().ok
    with pytest.raises(NotAwaitingApprovalError):
        ops.approve("mine")
    # Another identity, whose policy needs no approval, runs the tool at once.
    assert other.call(TOOL, {"code": "print(1)"}).ok


def test_an_approver_cannot_approve_its_own_call(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    lead, ops = clients("lead"), clients("ops")
    done: list[ToolResult] = []
    caller = threading.Thread(
        target=lambda: done.append(lead.call(TOOL, {"code": "print('ran')"}, call_id="own"))
    )
    caller.start()
    try:
        _waiting(ops, "own")
        with pytest.raises(PermissionDeniedError, match="another approver must approve it"):
            lead.approve("own")
        assert _state(ops, "own") is CallState.AWAITING_APPROVAL
        ops.approve("own")
    finally:
        caller.join(30)
    assert done and done[0].ok, done


def test_cli_approve_and_deny(
    served: ServedDaemon,
    clients: Callable[[str], Client],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TOOLJAIL_TOKEN", TOKENS["ops"])
    ops = clients("ops")
    approved = Streamed(served.target, "print('ran')", "cli-approve")
    denied = Streamed(served.target, "print('never')", "cli-deny")
    _waiting(ops, "cli-approve")
    _waiting(ops, "cli-deny")
    assert cli.main(["approve", "--target", served.target, "cli-approve"]) == 0
    assert approved.result().ok
    assert cli.main(["deny", "--target", served.target, "cli-deny", "--reason", "not now"]) == 0
    assert capsys.readouterr().out.split()[-1] == "failed"
    result = denied.result()
    assert result.error is not None and "not now" in result.error.message
    # Refused: exit 2 and the reason on stderr.
    monkeypatch.setenv("TOOLJAIL_TOKEN", TOKENS["other"])
    assert cli.main(["approve", "--target", served.target, "cli-approve"]) == 2


def test_a_call_waiting_when_the_daemon_dies_is_lost_with_effect_none(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    first = serve(state_dir=tmp_path / "first")
    streamed = Streamed(first.target, "print('never')", "orphan")
    with Client(first.target, token=TOKENS["ops"]) as ops:
        _waiting(ops, "orphan")
        # The journal's files as a crash would leave them now (the daemon holds
        # them locked, so a copy is how a second daemon can read them).
        (tmp_path / "second").mkdir()
        for f in (tmp_path / "first").glob(JOURNAL_FILE + "*"):
            shutil.copy(f, tmp_path / "second" / f.name)
    with Client(first.target, token=TOKENS["agent"]) as agent:
        agent.cancel("orphan")  # its owner's to cancel
    streamed.result()
    second = serve(state_dir=tmp_path / "second")
    with Client(second.target, token=TOKENS["ops"]) as ops:
        info = ops.get_call("orphan")
        assert info.state is CallState.LOST
        assert info.result is not None and info.result.effect.value == "none"
        assert "waited for approval" in info.result.message
        with pytest.raises(NotAwaitingApprovalError):
            ops.approve("orphan")


def test_calls_in_a_session_and_in_the_daemon_wait_too(
    served: ServedDaemon, clients: Callable[[str], Client]
) -> None:
    careful, ops = clients("careful"), clients("ops")
    outcomes: dict[str, ToolResult] = {}
    with careful.session() as session:

        def run(call_id: str, tool: str, args: dict[str, object], sid: str | None) -> None:
            outcomes[call_id] = careful.call(tool, args, call_id=call_id, session_id=sid)

        threads = [
            threading.Thread(target=run, args=("in-session", TOOL, {"code": "x = 41"}, session.id)),
            threading.Thread(target=run, args=("in-daemon", "list_artifacts", {}, None)),
        ]
        for t in threads:
            t.start()
        _waiting(ops, "in-session")
        _waiting(ops, "in-daemon")
        ops.approve("in-session")
        ops.deny("in-daemon", "not needed")
        for t in threads:
            t.join(30)
        assert outcomes["in-session"].ok, outcomes
        denied = outcomes["in-daemon"]
        assert denied.error is not None and denied.error.type == "ApprovalDenied"
        # The approved call ran in the session: its variable is there.
        after = threading.Thread(
            target=run, args=("after", TOOL, {"code": "print(x + 1)"}, session.id)
        )
        after.start()
        _waiting(ops, "after")
        ops.approve("after")
        after.join(30)
        assert outcomes["after"].data["stdout"] == "42\n"


def test_a_stopping_daemon_ends_waiting_calls_at_once(tokens_file: Path) -> None:
    started = 0.0
    auth = {"tokens_file": str(tokens_file)}
    with tooljail.testing.daemon(pool_size=1, stop_grace_s=60, auth=auth) as target:
        streamed = Streamed(target, "print('never')", "at-stop")
        with Client(target, token=TOKENS["agent"]) as agent:
            _waiting(agent, "at-stop")
        started = time.monotonic()
    # The drain did not wait its 60 s grace for an approver.
    assert time.monotonic() - started < 20
    result = streamed.result()
    assert result.status.value == "cancelled" and result.effect.value == "none"
    assert "shut down while the call waited for approval" in result.message


def test_without_identities_nobody_approves() -> None:
    # No tokens file: no identity, so no approver.
    with tooljail.testing.daemon(pool_size=1) as target, Client(target) as anonymous:
        assert anonymous.call(TOOL, {"code": "print(1)"}, call_id="plain").ok
        with pytest.raises(PermissionDeniedError, match="tokens_file"):
            anonymous.approve("plain")
