"""The approval queue for an approver (issue 25, item 2): `ListApprovals` and
`WatchApprovals` through a real daemon and a real channel, with the SDK's
`list_approvals()` / `watch_approvals()` and the CLI's `tooljail approvals ls|watch`.

Who calls is an identity of this module's tokens file: `agent` needs approval
for two tools, `ops` approves any tool, `narrow` approves only `list_artifacts`
(its own policy lets it call nothing else), `other` is no approver.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

import tooljail.testing
from tests.conftest import RunningDaemon, ServedDaemon
from tests.holds import MiB, daemon_holds
from tooljail import (
    ApprovalEvent,
    ApprovalEventKind,
    AsyncClient,
    CallState,
    Client,
    ToolResult,
)
from tooljail.errors import (
    CallNotFoundError,
    OverloadedError,
    PermissionDeniedError,
)
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

TOOL = "execute_python_code"
CHEAP = "list_artifacts"  # runs in the daemon: no sandbox, so a churn is fast
POLICIES = {
    "agent": f'approval = ["{TOOL}", "{CHEAP}"]',
    "ops": "approver = true",
    "narrow": f'approver = true\ntools = ["{CHEAP}"]',
    "lead": "approver = true",
    "other": "",
}
TOKENS = {name: f"queue-token-of-{name}" for name in POLICIES}


def _tokens_text(policies: dict[str, str]) -> str:
    return "".join(
        f'[identities.{name}]\ntoken_sha256 = "{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"'
        f"\n{policy}\n"
        for name, policy in policies.items()
    )


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens.toml"
    path.write_text(_tokens_text(POLICIES))
    path.chmod(0o600)
    return path


@pytest.fixture
def serve(serve: Callable[..., ServedDaemon], tokens_file: Path) -> Callable[..., ServedDaemon]:
    """conftest's `serve`, with this module's tokens file."""

    def start(**settings: Any) -> ServedDaemon:
        auth = {"tokens_file": str(tokens_file), **settings.pop("auth", {})}
        return serve(auth=auth, **settings)

    return start


@pytest.fixture
def clients(served: ServedDaemon) -> Iterator[Callable[[str], Client]]:
    made: list[Client] = []

    def client(name: str) -> Client:
        made.append(Client(served.target, token=TOKENS[name]))
        return made[-1]

    yield client
    for c in made:
        c.close()


class Asked:
    """Calls made by `agent` on threads (each blocks while it waits for approval)."""

    def __init__(self, target: str) -> None:
        self._client = Client(target, token=TOKENS["agent"])
        self._pool = ThreadPoolExecutor(8)
        self.results: dict[str, Any] = {}

    def ask(self, call_id: str, tool: str = TOOL, args: dict[str, Any] | None = None) -> None:
        args = {"code": f"print({call_id!r})"} if args is None and tool == TOOL else args
        self.results[call_id] = self._pool.submit(self._client.call, tool, args, call_id=call_id)

    def result(self, call_id: str) -> ToolResult:
        result: ToolResult = self.results[call_id].result(timeout=30)
        return result

    def cancel(self, call_id: str) -> None:
        self._client.cancel(call_id)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()


@pytest.fixture
def asked(served: ServedDaemon) -> Iterator[Asked]:
    made = Asked(served.target)
    yield made
    made.close()


def _waiting(client: Client, *call_ids: str) -> None:
    def all_waiting() -> bool:
        for call_id in call_ids:
            try:
                if client.get_call(call_id).state is not CallState.AWAITING_APPROVAL:
                    return False
            except CallNotFoundError:
                return False
        return True

    wait_for(all_waiting, timeout=15)


def _next(events: Iterator[ApprovalEvent]) -> tuple[ApprovalEventKind, str, CallState]:
    event = next(events)
    return event.kind, event.call.call_id, event.call.state


def test_the_approvers_list_shows_waiting_calls_with_arguments_and_who_asked(
    served: ServedDaemon, clients: Callable[[str], Client], asked: Asked
) -> None:
    ops = clients("ops")
    asked.ask("first", args={"code": "print('rm -rf /tmp/x')"})
    _waiting(ops, "first")
    asked.ask("second", CHEAP, {"call_id": "c"})
    _waiting(ops, "second")
    calls = ops.list_approvals()
    assert [c.call_id for c in calls] == ["first", "second"]  # oldest first
    first = calls[0]
    assert first.state is CallState.AWAITING_APPROVAL
    assert first.tool == TOOL and first.client_name == "agent"
    assert first.arguments == {"code": "print('rm -rf /tmp/x')"}
    assert first.arguments_sha256 and first.daemon_id
    assert first.received_at is not None and first.received_at <= calls[1].received_at  # type: ignore[operator]
    assert calls[1].arguments == {"call_id": "c"}
    # Decided, a call leaves the list.
    ops.approve("first")
    assert asked.result("first").ok
    assert [c.call_id for c in ops.list_approvals()] == ["second"]
    ops.deny("second", "no")


def test_a_non_approver_is_refused_and_told_who_may(
    served: ServedDaemon, clients: Callable[[str], Client], asked: Asked
) -> None:
    asked.ask("hidden")
    _waiting(clients("ops"), "hidden")
    for name in ("agent", "other"):
        who = clients(name)
        with pytest.raises(PermissionDeniedError, match="approver = true"):
            who.list_approvals()
        with pytest.raises(PermissionDeniedError, match="approver = true"):
            who.watch_approvals()
    clients("ops").deny("hidden")


def test_without_tokens_nobody_lists_approvals_as_nobody_approves() -> None:
    # Approve there says PERMISSION_DENIED (no identity is an approver): so do these.
    with tooljail.testing.daemon(pool_size=0) as target, Client(target) as anonymous:
        with pytest.raises(PermissionDeniedError, match="tokens_file"):
            anonymous.list_approvals()
        with pytest.raises(PermissionDeniedError, match="tokens_file"):
            anonymous.watch_approvals()


def test_an_approver_sees_only_the_tools_it_may_call(
    served: ServedDaemon, clients: Callable[[str], Client], asked: Asked
) -> None:
    ops, narrow = clients("ops"), clients("narrow")
    with narrow.watch_approvals() as narrow_events:
        asked.ask("code-call")
        asked.ask("cheap-call", CHEAP, {})
        _waiting(ops, "code-call", "cheap-call")
        assert {c.call_id for c in ops.list_approvals()} == {"code-call", "cheap-call"}
        assert [c.call_id for c in narrow.list_approvals()] == ["cheap-call"]
        narrow.approve("cheap-call")
        ops.deny("code-call", "not today")
        # The narrow approver's watch told it of its tool's call only.
        assert _next(narrow_events) == (
            ApprovalEventKind.REQUESTED,
            "cheap-call",
            CallState.AWAITING_APPROVAL,
        )
        kind, call_id, _ = _next(narrow_events)
        assert (kind, call_id) == (ApprovalEventKind.DECIDED, "cheap-call")
    assert asked.result("cheap-call").ok


def test_watch_sees_the_waiting_then_new_requests_and_decisions_in_order(
    served: ServedDaemon, clients: Callable[[str], Client], asked: Asked
) -> None:
    ops = clients("ops")
    asked.ask("before")
    _waiting(ops, "before")
    with ops.watch_approvals() as watch:
        events = iter(watch)
        first = next(events)
        assert (first.kind, first.call.call_id) == (ApprovalEventKind.REQUESTED, "before")
        assert first.call.arguments == {"code": "print('before')"}
        assert first.call.client_name == "agent" and first.call.received_at is not None
        asked.ask("new")
        assert _next(events) == (ApprovalEventKind.REQUESTED, "new", CallState.AWAITING_APPROVAL)
        ops.approve("before")
        assert _next(events) == (ApprovalEventKind.DECIDED, "before", CallState.QUEUED)
        ops.deny("new", "too risky")
        denied = next(events)
        assert (denied.kind, denied.call.call_id) == (ApprovalEventKind.DECIDED, "new")
        assert denied.call.state is CallState.FAILED
        assert denied.call.result is not None and "too risky" in denied.call.result.message
        asked.ask("cancelled")
        assert _next(events) == (
            ApprovalEventKind.REQUESTED,
            "cancelled",
            CallState.AWAITING_APPROVAL,
        )
        asked.cancel("cancelled")
        assert _next(events) == (ApprovalEventKind.DECIDED, "cancelled", CallState.CANCELLED)
    assert asked.result("before").ok
    assert asked.result("cancelled").status.value == "cancelled"


def test_the_async_client_lists_and_watches(
    served: ServedDaemon, clients: Callable[[str], Client], asked: Asked
) -> None:
    asked.ask("async-one")
    _waiting(clients("ops"), "async-one")

    async def main() -> list[tuple[ApprovalEventKind, str]]:
        async with AsyncClient(served.target, token=TOKENS["ops"]) as ops:
            assert [c.call_id for c in await ops.list_approvals()] == ["async-one"]
            seen = []
            async with await ops.watch_approvals() as watch:
                async for event in watch:
                    seen.append((event.kind, event.call.call_id))
                    if event.kind is ApprovalEventKind.REQUESTED:
                        await ops.deny("async-one", "no")
                    else:
                        break
            return seen

    assert asyncio.run(main()) == [
        (ApprovalEventKind.REQUESTED, "async-one"),
        (ApprovalEventKind.DECIDED, "async-one"),
    ]


def test_watches_are_bounded_in_all_and_per_approver(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(auth={"max_approval_watchers": 2, "max_approval_watchers_per_identity": 1})
    with (
        Client(served.target, token=TOKENS["ops"]) as ops,
        Client(served.target, token=TOKENS["lead"]) as lead,
        Client(served.target, token=TOKENS["narrow"]) as narrow,
        ops.watch_approvals(),
    ):
        with pytest.raises(OverloadedError, match="max_approval_watchers_per_identity") as e:
            ops.watch_approvals()
        assert e.value.retry_after_s
        with (
            lead.watch_approvals(),
            pytest.raises(OverloadedError, match=r"max_approval_watchers\)"),
        ):
            narrow.watch_approvals()
        # One closed, its place is free again.
        wait_for(lambda: _opens(narrow), timeout=10)


def _opens(client: Client) -> bool:
    try:
        client.watch_approvals().close()
    except OverloadedError:
        return False
    return True


def test_a_watcher_that_stops_reading_is_ended_and_the_daemon_holds(
    serve: Callable[..., ServedDaemon],
) -> None:
    # 2,000 calls of 16 KiB arguments requested and ended (each times out of its
    # approval at once): 4,000 events, ~64 MB of them, while one watcher reads none.
    # Held for it, they would grow the daemon by ~70 MiB (measured: 93 MiB with the
    # backlog bound set to 1 GiB); bounded, by its 1 MiB.
    served = serve(pool_size=0, auth={"approval_timeout_s": 0.01})
    # A reader that reads nothing, and (no BDP probing) keeps gRPC's window at its
    # 64 KiB start: the daemon's writes to it stop, and its events wait in the daemon.
    channel = grpc.insecure_channel(served.target, options=[("grpc.http2.bdp_probe", 0)])
    stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
    metadata = (("authorization", f"Bearer {TOKENS['ops']}"),)
    stalled = stub.WatchApprovals(pb.WatchApprovalsRequest(), metadata=metadata)
    stalled.initial_metadata()  # in place, and never read until the churn is over
    code = "#" + "x" * 16 * 1024
    with (
        daemon_holds(served.target, rss_bytes=48 * MiB, token=TOKENS["ops"]),
        Client(served.target, token=TOKENS["agent"]) as agent,
        ThreadPoolExecutor(8) as pool,
    ):
        ends = list(
            pool.map(
                lambda i: agent.call(TOOL, {"code": f"{code}{i}"}, call_id=f"churn-{i}"),
                range(2000),
            )
        )
    assert all(r.error is not None and r.error.type == "ApprovalTimeout" for r in ends)
    # The stalled watcher: what it had in flight, then the end, telling it to watch again.
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stalled:
            pass
    assert ended.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "watch again" in (ended.value.details() or "")
    channel.close()
    # Watching again works: a resync, with nothing waiting now.
    with Client(served.target, token=TOKENS["ops"]) as ops:
        assert ops.list_approvals() == []
        ops.watch_approvals().close()


def test_a_stopping_daemon_ends_watches_cleanly(tokens_file: Path) -> None:
    auth = {"tokens_file": str(tokens_file)}
    events: list[ApprovalEvent] = []
    with tooljail.testing.daemon(pool_size=0, stop_grace_s=60, auth=auth) as target:
        asked = Asked(target)
        ops = Client(target, token=TOKENS["ops"])
        asked.ask("at-stop")
        _waiting(ops, "at-stop")
        watch = ops.watch_approvals()
        reader = threading.Thread(target=lambda: events.extend(watch), daemon=True)
        reader.start()
        wait_for(lambda: len(events) == 1, timeout=10)
        started = time.monotonic()
    # The drain ended the waiting call, told the watcher, and ended its stream (no error).
    reader.join(20)
    assert not reader.is_alive()
    assert time.monotonic() - started < 20
    assert [(e.kind, e.call.call_id, e.call.state) for e in events] == [
        (ApprovalEventKind.REQUESTED, "at-stop", CallState.AWAITING_APPROVAL),
        (ApprovalEventKind.DECIDED, "at-stop", CallState.CANCELLED),
    ]
    watch.close()
    ops.close()
    asked.close()


# --- through `tooljail serve`: a reload, and the CLI -------------------------


@pytest.fixture
def tokens_daemon(
    start_daemon: Callable[..., RunningDaemon], tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunningDaemon, Path]:
    base = tmp_path_factory.mktemp("config")
    tokens = base / "tokens.toml"
    tokens.write_text(_tokens_text(POLICIES))
    tokens.chmod(0o600)
    config = base / "tooljail.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    return start_daemon("--config", str(config), pool_size=0), tokens


def test_a_reload_that_revokes_the_approver_ends_its_watch(
    tokens_daemon: tuple[RunningDaemon, Path],
) -> None:
    daemon, tokens = tokens_daemon
    with (
        Client(daemon.target, token=TOKENS["ops"]) as ops,
        Client(daemon.target, token=TOKENS["lead"]) as lead,
        ops.watch_approvals() as ops_watch,
        lead.watch_approvals() as lead_watch,
    ):
        revoked = {**POLICIES, "ops": ""}  # ops stays, no longer an approver
        draft = tokens.with_suffix(".new")
        draft.write_text(_tokens_text(revoked))
        draft.chmod(0o600)
        draft.replace(tokens)
        daemon.process.send_signal(signal.SIGHUP)
        with pytest.raises(PermissionDeniedError, match="reloaded"):
            next(iter(ops_watch))
        # lead is an approver still: its watch goes on.
        with Client(daemon.target, token=TOKENS["agent"]) as agent:
            threading.Thread(
                target=lambda: agent.call(CHEAP, {}, call_id="after-reload"), daemon=True
            ).start()
            event = next(iter(lead_watch))
            assert (event.kind, event.call.call_id) == (ApprovalEventKind.REQUESTED, "after-reload")
            lead.deny("after-reload")


def _cli(daemon: RunningDaemon, *args: str, token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", "approvals", *args, "--target", daemon.target],
        env={**os.environ, "TOOLJAIL_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_approvals_ls_and_watch(tokens_daemon: tuple[RunningDaemon, Path]) -> None:
    daemon, _ = tokens_daemon
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tooljaild",
            "approvals",
            "watch",
            "--json",
            "--target",
            daemon.target,
        ],
        env={**os.environ, "TOOLJAIL_TOKEN": TOKENS["ops"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with (
            Client(daemon.target, token=TOKENS["agent"]) as agent,
            Client(daemon.target, token=TOKENS["ops"]) as ops,
            ThreadPoolExecutor(1) as pool,
        ):
            done = pool.submit(
                agent.call, TOOL, {"code": "print('from the cli test')"}, call_id="cli-one"
            )
            _waiting(ops, "cli-one")
            table = _cli(daemon, "ls", token=TOKENS["ops"])
            assert table.returncode == 0, table.stderr
            header, row = table.stdout.splitlines()
            assert header.split()[:4] == ["CALL", "ID", "TOOL", "CLIENT"]
            assert row.split()[:3] == ["cli-one", TOOL, "agent"]
            assert "from the cli test" in row
            as_json = _cli(daemon, "ls", "--json", token=TOKENS["ops"])
            [listed] = json.loads(as_json.stdout)
            assert listed["call_id"] == "cli-one" and listed["client_name"] == "agent"
            refused = _cli(daemon, "ls", token=TOKENS["other"])
            assert refused.returncode == 2 and "approver = true" in refused.stderr
            assert watch.stdout is not None
            lines = [json.loads(watch.stdout.readline())]  # the watch is in place
            ops.deny("cli-one", "from the test")
            assert done.result(timeout=30).error is not None
            lines.append(json.loads(watch.stdout.readline()))
        assert [(e["kind"], e["call"]["call_id"]) for e in lines] == [
            ("requested", "cli-one"),
            ("decided", "cli-one"),
        ]
        assert lines[1]["call"]["state"] == "failed"
        watch.send_signal(signal.SIGINT)  # Ctrl-C ends it cleanly
        assert watch.wait(30) == 0, watch.stderr.read() if watch.stderr else ""
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
        for pipe in (watch.stdout, watch.stderr):
            if pipe is not None:
                pipe.close()


def test_over_many_daemons_the_list_and_the_watch_merge_them(
    serve: Callable[..., ServedDaemon],
) -> None:
    one, two = serve(pool_size=0), serve(pool_size=0)
    both = [one.target, two.target]
    with (
        Client(one.target, token=TOKENS["agent"]) as agent_one,
        Client(two.target, token=TOKENS["agent"]) as agent_two,
        Client(both, token=TOKENS["ops"]) as ops,
        ThreadPoolExecutor(2) as pool,
    ):
        pool.submit(agent_one.call, CHEAP, {}, call_id="on-one")
        with ops.watch_approvals() as watch:
            events = iter(watch)
            first = next(events)
            pool.submit(agent_two.call, CHEAP, {}, call_id="on-two")
            second = next(events)
            assert {first.call.call_id, second.call.call_id} == {"on-one", "on-two"}
            assert first.call.daemon_id != second.call.daemon_id
            assert [c.call_id for c in ops.list_approvals()] == ["on-one", "on-two"]
            ops.deny("on-one")
            ops.deny("on-two")
            decided = {next(events).call.call_id, next(events).call.call_id}
            assert decided == {"on-one", "on-two"}


def test_a_snapshot_larger_than_the_backlog_bound_still_opens(
    serve: Callable[..., ServedDaemon],
) -> None:
    # The calls waiting when a watch opens are told first, whatever their size: they
    # are held anyway, and a new watch must not end before its reader read a byte.
    served = serve(pool_size=0, auth={"approval_watch_buffer_bytes": 64 * 1024})
    asked = Asked(served.target)
    big = "#" + "x" * 16 * 1024
    try:
        with Client(served.target, token=TOKENS["ops"]) as ops:
            ids = [f"big-{i}" for i in range(8)]  # ~130 KiB of arguments
            for call_id in ids:
                asked.ask(call_id, args={"code": big})
            _waiting(ops, *ids)
            with ops.watch_approvals() as watch:
                events = iter(watch)
                told = [next(events) for _ in ids]
                assert {e.call.call_id for e in told} == set(ids)
                assert all(e.call.arguments == {"code": big} for e in told)
            for call_id in ids:
                ops.deny(call_id)
    finally:
        asked.close()
