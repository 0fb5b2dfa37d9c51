"""A host that dies mid-conversation and replays it: no tool runs twice.

An OpenAI-style conversation is run by an agent host in a subprocess
(replay_host.py) against a `tooljail serve` subprocess; its assistant message
asks for a non-idempotent user tool that appends a line to a file. The test
SIGKILLs the host after the call ran and before its answer came back, or after
the answer came back (before the host kept it), then starts a host that
replays the same conversation (the same `tool_call.id`s): the file has the line
once, and the host gets the journaled answer (the same run's token). The same
through the daemon killed (SIGKILL) and started again on its state directory:
the call is answered from the journal; killed while the call ran, the replay is
told the call was lost, and it does not run again. And a model's `call_status`
after a timeout: running, then succeeded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tooljail import Client
from tooljail.integrations import openai as tj
from tooljail.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
HOST = Path(__file__).with_name("replay_host.py")
CLIENT_NAME = "replay-host"
"""The host's name, the same across its restarts: the namespace of its call ids."""
TOOLS = '''
import time
import uuid
from tooljail import tool


@tool(timeout_s=60)
def append_line(path: str, line: str, hold_s: float = 0.0) -> str:
    """Appends a line to a file (run twice, it writes it twice), then waits hold_s seconds."""
    with open(path, "a") as f:
        f.write(line + "\\n")
    time.sleep(hold_s)
    return f"appended {line!r} (run {uuid.uuid4().hex})"


@tool(timeout_s=1, kill_after_s=30)
def slow_append(path: str, line: str, seconds: float = 3.0) -> str:
    """Sleeps past its timeout (it runs on, detached), then appends a line to a file."""
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(line + "\\n")
    return f"appended {line!r} after {seconds}s"
'''
ANSWER = re.compile(r"appended '(\w+)' \(run [0-9a-f]{32}\)")


class Daemon:
    """A `tooljail serve` subprocess on one state directory, killed and started again."""

    def __init__(self, base: Path, tools: Path) -> None:
        self.base, self.tools = base, tools
        self.target = f"unix://{base}/tooljail.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # No namespaces: the tool appends to a file of the test's host directory.
        self.process, _, _ = spawn_daemon(
            self.base,
            "--tools-dir",
            str(self.tools),
            listen=self.target,
            env={"TOOLJAIL_ISOLATION": "none"},
        )
        wait_serving(self.target, self.process, self.base / "daemon.log")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def journaled(self, call_id: str) -> bool:
        """The daemon has journaled the call's end: it logs "call finished" once it has
        (the journal itself is the daemon's alone: SQLite's exclusive locking)."""
        for line in (self.base / "daemon.log").read_text(errors="replace").splitlines():
            if '"call finished"' in line and f'"call_id": "{call_id}"' in line:
                return True
        return False


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Daemon]:
    tools = tmp_path / "tools"  # reachable by the sandbox's uid, as tmp_path is
    tools.mkdir()
    (tools / "replay_tools.py").write_text(TOOLS)
    daemon = Daemon(tmp_path_factory.mktemp("replay"), tools)
    daemon.start()
    yield daemon
    if daemon.process is not None and daemon.process.poll() is None:
        daemon.process.send_signal(signal.SIGTERM)
        daemon.process.wait(60)


class Host:
    """One run of replay_host.py over a conversation; its tool messages, as it printed them."""

    def __init__(self, daemon: Daemon, conversation: Path, *, hold: bool = False) -> None:
        self.out = conversation.with_name(f"host-{uuid.uuid4().hex[:8]}.out")
        path = os.pathsep.join([str(ROOT / "client"), os.environ.get("PYTHONPATH", "")])
        argv = [sys.executable, str(HOST), daemon.target, CLIENT_NAME, str(conversation)]
        with self.out.open("wb") as out:
            self.process = subprocess.Popen(
                [*argv, *(["hold"] if hold else [])],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": path},
            )

    def answers(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [json.loads(line) for line in lines if line.startswith("{")]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def finish(self) -> list[dict[str, Any]]:
        """Its tool messages, once it has run the whole conversation."""
        assert self.process.wait(60) == 0, self.out.read_text()
        *answers, done = self.answers()
        assert done == {"done": True}
        return answers


def conversation(tmp_path: Path, ledger: Path, *, hold_s: float = 0.0) -> tuple[Path, str]:
    """An OpenAI-style conversation whose assistant asks for one append; its file and
    the tool call's id."""
    tool_call_id = "call_" + uuid.uuid4().hex[:24]
    arguments = {"path": str(ledger), "line": "once", "hold_s": hold_s}
    messages = [
        {"role": "user", "content": "Note 'once' in the ledger."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": tool_call_id,
                    "type": "function",
                    "function": {"name": "append_line", "arguments": json.dumps(arguments)},
                }
            ],
        },
    ]
    path = tmp_path / f"conversation-{tool_call_id}.json"
    path.write_text(json.dumps(messages))
    return path, tool_call_id


def lines(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def test_a_host_killed_after_the_call_ran_and_before_its_answer_replays_without_running_it(
    daemon: Daemon, tmp_path: Path, host_dir: Path
) -> None:
    ledger = host_dir / "ledger"
    talk, tool_call_id = conversation(tmp_path, ledger, hold_s=3.0)
    first = Host(daemon, talk)
    wait_for(lambda: lines(ledger) == ["once"], timeout=30)  # the call ran...
    first.kill()  # ...and the host dies before its answer comes back
    assert first.answers() == []

    (answer,) = Host(daemon, talk).finish()  # attaches to the call, which ends

    assert lines(ledger) == ["once"]
    assert answer["tool_call_id"] == tool_call_id
    assert ANSWER.fullmatch(answer["content"]), answer
    with Client(daemon.target) as client:
        info = client.get_call(f"{CLIENT_NAME}:{tool_call_id}")
    assert info.result is not None and info.result.data == answer["content"]


def test_a_host_killed_after_its_answer_replays_and_gets_the_journaled_answer(
    daemon: Daemon, tmp_path: Path, host_dir: Path
) -> None:
    ledger = host_dir / "ledger"
    talk, _ = conversation(tmp_path, ledger)
    first = Host(daemon, talk, hold=True)
    wait_for(lambda: len(first.answers()) == 1, timeout=30)  # answered, not yet kept
    first.kill()

    replayed = Host(daemon, talk).finish()

    assert replayed == first.answers()  # the same run's token: it did not run again
    assert ANSWER.fullmatch(replayed[0]["content"])
    assert lines(ledger) == ["once"]


def test_a_replay_after_the_daemon_restarts_is_answered_from_the_journal(
    daemon: Daemon, tmp_path: Path, host_dir: Path
) -> None:
    ledger = host_dir / "ledger"
    talk, tool_call_id = conversation(tmp_path, ledger)
    answered = Host(daemon, talk).finish()
    call_id = f"{CLIENT_NAME}:{tool_call_id}"
    wait_for(lambda: daemon.journaled(call_id), timeout=10)
    daemon.kill()
    daemon.start()

    replayed = Host(daemon, talk).finish()

    assert replayed == answered
    assert lines(ledger) == ["once"]


def test_a_call_the_daemon_died_under_is_told_lost_on_replay_and_not_run_again(
    daemon: Daemon, tmp_path: Path, host_dir: Path
) -> None:
    ledger = host_dir / "ledger"
    talk, _ = conversation(tmp_path, ledger, hold_s=30.0)
    first = Host(daemon, talk)
    wait_for(lambda: lines(ledger) == ["once"], timeout=30)
    daemon.kill()  # the call ran, and the daemon (and the host's call) died under it
    first.process.wait(30)
    daemon.start()

    (answer,) = Host(daemon, talk).finish()

    assert answer["content"].startswith("The daemon stopped while the call ran.")
    assert "may or may not have taken effect" in answer["content"]
    assert lines(ledger) == ["once"]  # a non-idempotent tool is never run again


def status_call(tool_call_id: str, call_id: str) -> dict[str, Any]:
    arguments = json.dumps({"call_id": call_id})
    return {
        "id": tool_call_id,
        "type": "function",
        "function": {"name": "call_status", "arguments": arguments},
    }


def test_a_model_checks_a_timed_out_call_with_call_status(daemon: Daemon, host_dir: Path) -> None:
    ledger = host_dir / "ledger"
    arguments = json.dumps({"path": str(ledger), "line": "late", "seconds": 3})
    slow = {
        "id": "call_slow_" + uuid.uuid4().hex[:8],
        "type": "function",
        "function": {"name": "slow_append", "arguments": arguments},
    }
    with Client(daemon.target, client_name=CLIENT_NAME) as client:
        timed_out = tj.dispatch(client, slow)["content"]
        assert "timed out" in timed_out and "may still take effect" in timed_out
        named = re.search(r"call_status tool \(call_id '([^']+)'\)", timed_out)
        assert named, timed_out
        call_id = named[1]
        assert call_id == f"{CLIENT_NAME}:{slow['id']}"

        running = json.loads(tj.dispatch(client, status_call("status_1", call_id))["content"])
        assert running["running"] is True and running["state"] == "running", running
        assert "ask again with call_status" in running["next"]
        assert lines(ledger) == []

        wait_for(lambda: lines(ledger) == ["late"], timeout=15)

        def ended() -> dict[str, Any]:
            asked = tj.dispatch(client, status_call("status_" + uuid.uuid4().hex[:8], call_id))
            return dict(json.loads(asked["content"]))

        wait_for(lambda: not ended()["running"], timeout=10)
        done = ended()
        # The first question, replayed (the same tool-call id), has its journaled answer.
        again = json.loads(tj.dispatch(client, status_call("status_1", call_id))["content"])
    assert done["state"] == "succeeded" and done["status"] == "success", done
    assert done["data"] == "appended 'late' after 3s"
    assert "It succeeded" in done["next"]
    assert again == running
    assert lines(ledger) == ["late"]
