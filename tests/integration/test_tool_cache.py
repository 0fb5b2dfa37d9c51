"""A tool's cache (`@tool(cache_s=...)`): an earlier success given again, not run again.

Through a real daemon (on a state directory of the test's, so that a second
daemon finds the first one's journal) with identities from a tokens file. The
user tools append a line to a host file each time they run (the sandboxes run
without namespaces, so they see it): the file says how often each ran.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

import tooljail.testing
from tooljail import CallState, CallStatus, Client, Effect, ToolResult
from tooljail.testing import wait_for
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS
from tooljaild.tools.registry import Tool, ToolOptions

POLICIES = {
    "agent-a": "",
    "agent-b": "",
    "careful": 'approval = ["stamp"]',
    "ops": "approver = true",
}
TOKENS = {name: f"token-of-{name}" for name in POLICIES}

TOOLS = '''
from tooljail import tool

LOG = {log!r}


def _ran(what: str) -> None:
    with open(LOG, "a") as f:
        f.write(what + "\\n")


@tool(cache_s=600)
def stamp(key: str) -> str:
    """Note that it ran; answer the key in capitals."""
    _ran("stamp:" + key)
    return key.upper()


@tool(cache_s=3)
def brief(key: str) -> str:
    """As stamp, cached for three seconds only."""
    _ran("brief:" + key)
    return key.upper()


@tool(cache_s=600)
def failing(key: str) -> str:
    """Note that it ran, then fail."""
    _ran("failing:" + key)
    raise ValueError("not today")


@tool
def slow(seconds: float) -> str:
    """Sleep, holding its sandbox."""
    import time

    _ran("slow")
    time.sleep(seconds)
    return "slept"


def looked_up(key):
    _ran("looked_up:" + key)
    return key.upper()


looked_up.tool_info = {{
    "tool_name": "looked_up",
    "tool_description": "As stamp, described by a LightAgent tool_info.",
    "tool_params": [{{"name": "key", "type": "string", "required": True}}],
    "cache_s": 600,
}}
'''

BAD_TOOLS = """
from tooljail import tool


@tool(cache_s=-1)
def negative(key: str) -> str:
    return key


@tool(cache_s=True)
def flag(key: str) -> str:
    return key


@tool(cache_s=8 * 24 * 3600)
def too_long(key: str) -> str:
    return key


@tool(cache_s=60)
def counting(n: int):
    for i in range(n):
        yield i


def by_info(key):
    return key


by_info.tool_info = {
    "tool_name": "by_info",
    "tool_params": [{"name": "key", "type": "string"}],
    "cache_s": "600",
}
"""


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            f"{POLICIES[name]}\n"
            for name, token in TOKENS.items()
        )
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def log(host_dir: Path) -> Path:
    return host_dir / "ran.log"


@pytest.fixture
def tools_dir(tmp_path: Path, log: Path) -> Path:
    directory = tmp_path / "tools"
    directory.mkdir()
    (directory / "cached.py").write_text(textwrap.dedent(TOOLS.format(log=str(log))))
    (directory / "bad.py").write_text(textwrap.dedent(BAD_TOOLS))
    return directory


@contextlib.contextmanager
def daemon(tmp_path: Path, tools_dir: Path, tokens_file: Path, **settings: Any) -> Iterator[str]:
    """A daemon on the test's state directory (its journal, kept across daemons)."""
    with tooljail.testing.daemon(
        state_dir=tmp_path / "state",
        tools_dirs=[tools_dir],
        pool_size=1,
        isolation="none",
        auth={"tokens_file": str(tokens_file)},
        **settings,
    ) as target:
        yield target


@pytest.fixture
def target(tmp_path: Path, tools_dir: Path, tokens_file: Path) -> Iterator[str]:
    with daemon(tmp_path, tools_dir, tokens_file) as target:
        yield target


def as_(target: str, name: str) -> Client:
    return Client(target, token=TOKENS[name], retries=0)


def runs(log: Path) -> list[str]:
    """What ran, in order (one line per run)."""
    return log.read_text().splitlines() if log.exists() else []


def assert_cached(result: ToolResult, original: ToolResult) -> None:
    """`result` is `original`'s success given again, as a call of its own."""
    assert result.ok and result.cached, result
    assert result.cached_from == original.call_id
    assert result.call_id != original.call_id
    assert result.data == original.data
    assert result.effect is Effect.NONE
    assert result.arguments_sha256 == original.arguments_sha256
    # A model reads that it is not fresh, and from when.
    assert f"Cached result of call {original.call_id}" in result.message
    assert "did not run again" in result.message


def test_a_success_is_given_again_without_running(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a:
        first = a.call("stamp", {"key": "k"})
        assert first.ok and first.data == "K" and not first.cached
        assert first.cached_from == ""
        second = a.call("stamp", {"key": "k"})
        assert_cached(second, first)
        assert runs(log) == ["stamp:k"]  # the tool ran once

        # A call of its own: history shows it, and a retry of its id answers the same.
        info = a.get_call(second.call_id)
        assert info.state is CallState.SUCCEEDED
        assert info.result is not None and info.result.cached_from == first.call_id
        assert info.started_at is None and info.sandbox_id == ""  # it never ran
        again = a.call("stamp", {"key": "k"}, call_id=second.call_id)
        assert again.call_id == second.call_id and again.cached_from == first.call_id

        # Given again from a cached answer: it still names the run.
        third = a.call("stamp", {"key": "k"}, call_id="third")
        assert_cached(third, first)

        # Other arguments are another question: the tool runs.
        other = a.call("stamp", {"key": "other"})
        assert other.ok and not other.cached and other.data == "OTHER"
        assert runs(log) == ["stamp:k", "stamp:other"]

        # ListTools says which tools cache, and for how long.
        cache_s = {t.name: t.cache_s for t in a.list_tools()}
        assert cache_s["stamp"] == 600 and cache_s["brief"] == 3
        assert cache_s["looked_up"] == 600
    # And `tooljail tools`, for a person.
    listed = subprocess.run(
        [sys.executable, "-m", "tooljaild", "tools", "--target", target],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TOOLJAIL_TOKEN": TOKENS["agent-a"]},
        check=True,
    ).stdout
    [line] = [line for line in listed.splitlines() if line.startswith("stamp ")]
    assert "cache 600s" in line
    [line] = [line for line in listed.splitlines() if line.startswith("execute_python_code ")]
    assert "cache" not in line


def test_cache_hits_are_counted(tmp_path: Path, tools_dir: Path, tokens_file: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = int(free.getsockname()[1])
    listen = f"127.0.0.1:{port}"
    with (
        daemon(tmp_path, tools_dir, tokens_file, metrics_listen=listen) as target,
        as_(target, "agent-a") as a,
    ):
        for _ in range(3):
            assert a.call("stamp", {"key": "k"}).ok
        a.call("stamp", {"key": "other"})

        def hits() -> float:
            url = f"http://{listen}/metrics"
            with urllib.request.urlopen(url, timeout=10) as reply:
                text = reply.read().decode()
            return sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "tooljail_cache_hits_total" and sample.labels["tool"] == "stamp"
            )

        # Counted a moment after the answer, as every end.
        wait_for(lambda: hits() == 2, timeout=10, what="two cache hits counted")


def test_a_cached_answer_holds_no_slot(
    tmp_path: Path, tools_dir: Path, tokens_file: Path, log: Path
) -> None:
    with (
        daemon(tmp_path, tools_dir, tokens_file, max_concurrent=1) as target,
        as_(target, "agent-a") as a,
        as_(target, "agent-b") as b,
    ):
        first = a.call("stamp", {"key": "k"})
        slept: list[ToolResult] = []
        sleeper = threading.Thread(
            target=lambda: slept.append(b.call("slow", {"seconds": 30}, call_id="sleeper"))
        )
        sleeper.start()
        try:
            # The daemon's one slot is taken: a call that runs would wait for it.
            wait_for(lambda: "slow" in runs(log), timeout=15, what="the slow call running")
            began = time.monotonic()
            assert_cached(a.call("stamp", {"key": "k"}), first)
            assert time.monotonic() - began < 5
        finally:
            b.cancel("sleeper")
            sleeper.join(timeout=30)
    assert slept and slept[0].status is CallStatus.CANCELLED


def test_another_identity_is_never_given_a_cached_answer(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a, as_(target, "agent-b") as b:
        first = a.call("stamp", {"key": "k"})
        theirs = b.call("stamp", {"key": "k"})
        assert theirs.ok and not theirs.cached
        assert runs(log) == ["stamp:k", "stamp:k"]
        # Each identity's cache answers it alone.
        assert_cached(b.call("stamp", {"key": "k"}), theirs)
        assert_cached(a.call("stamp", {"key": "k"}), first)
        assert len(runs(log)) == 2


def test_a_failure_is_not_cached(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a:
        for _ in range(2):
            failed = a.call("failing", {"key": "k"})
            assert failed.status is CallStatus.ERROR and not failed.cached
    assert runs(log) == ["failing:k", "failing:k"]


def test_the_cache_expires_cache_s_after_the_run(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a:
        first = a.call("brief", {"key": "k"})
        ran_at = time.monotonic()
        time.sleep(1.0)
        # Cached: and this answer, ending later than the run, does not make it last.
        assert_cached(a.call("brief", {"key": "k"}), first)
        time.sleep(max(0.0, ran_at + 3.2 - time.monotonic()))
        fresh = a.call("brief", {"key": "k"})
        assert fresh.ok and not fresh.cached
        assert runs(log) == ["brief:k", "brief:k"]
        assert_cached(a.call("brief", {"key": "k"}), fresh)


def test_the_cache_outlives_a_restart_of_the_daemon(
    tmp_path: Path, tools_dir: Path, tokens_file: Path, log: Path
) -> None:
    with daemon(tmp_path, tools_dir, tokens_file) as target, as_(target, "agent-a") as a:
        first = a.call("stamp", {"key": "k"})
    # A new daemon: the run is in no one's memory, only in the journal.
    with daemon(tmp_path, tools_dir, tokens_file) as target, as_(target, "agent-a") as a:
        assert_cached(a.call("stamp", {"key": "k"}), first)
    assert runs(log) == ["stamp:k"]


def test_a_tool_info_tool_caches_too(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a:
        first = a.call("looked_up", {"key": "k"})
        assert first.ok and first.data == "K"
        assert_cached(a.call("looked_up", {"key": "k"}), first)
    assert runs(log) == ["looked_up:k"]


def test_a_bad_cache_s_is_a_diagnostic(target: str) -> None:
    with as_(target, "agent-a") as a:
        served = {t.name for t in a.list_tools()}
        diagnostics = {d.tool: d for d in a.diagnostics() if d.code == "bad_options"}
    for name in ("negative", "flag", "too_long", "by_info"):
        assert name not in served
        assert diagnostics[name].severity == "error"
        assert "cache_s" in diagnostics[name].message, diagnostics[name]
    assert "between 0 (no cache) and 604800" in diagnostics["negative"].message
    assert "between 0 (no cache) and 604800" in diagnostics["too_long"].message
    # What a streaming tool streams is not kept: a cached answer would be empty.
    assert "counting" not in served
    assert "streaming tool" in diagnostics["counting"].message


def test_builtins_never_cache(target: str) -> None:
    with as_(target, "agent-a") as a:
        infos = {t.name: t for t in a.list_tools()}
        assert all(infos[t.name].cache_s == 0 for t in BUILTIN_TOOLS if t.name in infos)
        code = {"code": "import time; print(time.time_ns())"}
        first, second = (a.call("execute_python_code", code) for _ in range(2))
        assert not (first.cached or second.cached)
        assert first.data["stdout"] != second.data["stdout"]
    # No built-in can be given a cache, by whatever builds it.
    builtin = BUILTIN_TOOLS[0]
    with pytest.raises(ValidationError, match="cannot cache"):
        Tool(
            name=builtin.name,
            input_schema=builtin.input_schema,
            options=ToolOptions(cache_s=60),
            source="builtin",
            builtin=builtin.builtin,
        )


def test_a_call_in_a_session_is_never_cached(target: str, log: Path) -> None:
    with as_(target, "agent-a") as a:
        first = a.call("stamp", {"key": "k"})
        with a.session() as session:
            for _ in range(2):
                ran = a.call("stamp", {"key": "k"}, session_id=session.id)
                assert ran.ok and not ran.cached
        # Nor does a session's run answer a call outside it.
        assert_cached(a.call("stamp", {"key": "k"}), first)
    assert runs(log) == ["stamp:k"] * 3


def test_a_call_held_for_approval_is_not_answered_from_the_cache(target: str, log: Path) -> None:
    results: dict[str, ToolResult] = {}

    def call(call_id: str) -> None:
        with as_(target, "careful") as careful:
            results[call_id] = careful.call("stamp", {"key": "k"}, call_id=call_id)

    with as_(target, "ops") as ops:
        for call_id in ("approved-1", "approved-2"):
            caller = threading.Thread(target=call, args=(call_id,))
            caller.start()
            # It waits for the approver, the second time too.
            wait_for(lambda i=call_id: _awaiting(ops, i), timeout=15)
            ops.approve(call_id)
            caller.join(timeout=30)
    assert not results["approved-2"].cached
    assert runs(log) == ["stamp:k", "stamp:k"]


def _awaiting(client: Client, call_id: str) -> bool:
    with contextlib.suppress(Exception):
        return client.get_call(call_id).state is CallState.AWAITING_APPROVAL
    return False
