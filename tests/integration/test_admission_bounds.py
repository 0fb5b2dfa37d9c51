"""Admission holds whatever runs a call, and no request buys the daemon's time.

Issue 21's attacks, played through a real daemon over a real channel:

- in-daemon tools (the artifact tools, `upload_file`) count against their
  identity's bound and the client's share, and run in a pool of their own;
- calls waiting for an approver hold no running or queued slot: two
  identities filling their own bound of waiting calls leave everyone else
  served, and past that bound they hear RESOURCE_EXHAUSTED with a retry hint;
- an approver approves only tools its own policy allows; a deny reason is bounded;
- arguments of 400,000 unknown keys are refused before they are decoded,
  while another client's cheap RPC answers at once;
- the journal keeps a bounded number of ended sessions.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

import tooljail.testing
from tests.conftest import RunningDaemon, ServedDaemon
from tests.holds import daemon_holds
from tooljail import CallState, Client, ToolResult
from tooljail.errors import (
    CallNotFoundError,
    InvalidRequestError,
    OverloadedError,
    PermissionDeniedError,
)
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.app.daemon import JOURNAL_FILE

TOOL = "execute_python_code"
POLICIES = {
    "limited": "max_concurrent_calls = 2",
    "gated-a": f'approval = ["{TOOL}"]',
    "gated-b": f'approval = ["{TOOL}"]',
    "plain": "",
    "ops": "approver = true",
    "narrow": 'approver = true\ntools = ["ls"]',
}
TOKENS = {name: f"token-of-{name}" for name in POLICIES}
SLEEP = {"code": "import time; time.sleep(4)"}


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
    path.chmod(0o600)
    return path


@pytest.fixture
def authed(serve: Callable[..., ServedDaemon], tokens_file: Path) -> Callable[..., ServedDaemon]:
    """conftest's `serve`, with this module's tokens file."""

    def start(**settings: Any) -> ServedDaemon:
        auth = {"tokens_file": str(tokens_file), **settings.pop("auth", {})}
        return serve(auth=auth, **settings)

    return start


@pytest.fixture
def clients() -> Iterator[Callable[[str, str], Client]]:
    made: list[Client] = []

    def client(target: str, name: str) -> Client:
        made.append(Client(target, token=TOKENS[name], retries=0))
        return made[-1]

    yield client
    for c in made:
        c.close()


def _state(client: Client, call_id: str) -> CallState | None:
    try:
        return client.get_call(call_id).state
    except CallNotFoundError:
        return None


def _in_state(client: Client, call_id: str, state: CallState, timeout: float = 20) -> None:
    wait_for(lambda: _state(client, call_id) is state, timeout=timeout)


# ------------------------------------------------------------------ finding 9


def test_in_daemon_calls_count_against_the_identitys_bound_and_run_in_their_own_pool(
    authed: Callable[..., ServedDaemon], clients: Callable[[str, str], Client]
) -> None:
    # upload_file of a session's file waits for the session's turn, so while a
    # session call sleeps each upload stays in flight: the attack's 30 searches.
    served = authed(storage={"bucket": "b", "endpoint_url": "http://127.0.0.1:9"})
    limited = clients(served.target, "limited")
    with limited.session() as session, ThreadPoolExecutor(12) as pool:
        sleeping = pool.submit(limited.call, TOOL, SLEEP, call_id="turn", session_id=session.id)
        _in_state(limited, "turn", CallState.RUNNING)

        def upload(i: int) -> ToolResult:
            return limited.call(
                "upload_file", {"path": "x.txt"}, call_id=f"up-{i}", session_id=session.id
            )

        uploads = [pool.submit(upload, i) for i in range(10)]
        refused = [f for f in uploads if isinstance(_error(f), OverloadedError)]
        # Its bound of 2 holds: the session call, and one upload.
        assert len(refused) == 9, [_error(f) for f in uploads]
        assert "share" in str(_error(refused[0]))
        assert sleeping.result(30).ok
        admitted = [f for f in uploads if f not in refused]
        assert admitted[0].result(30).status.value == "error"  # no such file: it ran


def test_in_daemon_tools_wait_for_their_pool(
    authed: Callable[..., ServedDaemon], clients: Callable[[str, str], Client]
) -> None:
    served = authed(
        max_in_daemon_calls=1, storage={"bucket": "b", "endpoint_url": "http://127.0.0.1:9"}
    )
    plain = clients(served.target, "plain")
    with plain.session() as session, ThreadPoolExecutor(3) as pool:
        sleeping = pool.submit(plain.call, TOOL, SLEEP, call_id="turn", session_id=session.id)
        _in_state(plain, "turn", CallState.RUNNING)
        upload = pool.submit(
            plain.call, "upload_file", {"path": "x.txt"}, call_id="up", session_id=session.id
        )
        _in_state(plain, "up", CallState.RUNNING)  # holds the pool's one slot
        listing = pool.submit(plain.call, "list_artifacts", {}, call_id="ls")
        _in_state(plain, "ls", CallState.QUEUED)
        time.sleep(0.5)
        assert _state(plain, "ls") is CallState.QUEUED  # it waits for the slot
        assert sleeping.result(30).ok
        assert upload.result(30).status.value == "error"
        assert listing.result(30).ok


def _error(future: Future[Any]) -> BaseException | None:
    try:
        future.result(30)
    except Exception as exc:
        return exc
    return None


# ------------------------------------------------------------------ finding 13


def test_calls_waiting_for_approval_have_their_own_bound_and_starve_nobody(
    authed: Callable[..., ServedDaemon], clients: Callable[[str, str], Client]
) -> None:
    # Room for 4 running and queued calls in all; 3 waiting calls per identity.
    served = authed(
        max_concurrent=2, max_queue=2, auth={"max_calls_awaiting_approval": 3}, pool_size=1
    )
    a, b, plain, ops = (clients(served.target, n) for n in ("gated-a", "gated-b", "plain", "ops"))
    waiting: list[tuple[Client, str]] = []
    # The daemon holds throughout: its loop answers, its memory stays put.
    with daemon_holds(served.target, token=TOKENS["plain"]), ThreadPoolExecutor(8) as pool:
        futures = []
        for who, name in ((a, "a"), (b, "b")):
            for i in range(3):
                call_id = f"{name}-{i}"
                futures.append(pool.submit(who.call, TOOL, {"code": "print(7)"}, call_id=call_id))
                waiting.append((who, call_id))
        for who, call_id in waiting:
            _in_state(who, call_id, CallState.AWAITING_APPROVAL)
        # Past its own bound an identity hears why, and when to try again.
        with pytest.raises(OverloadedError, match="waiting for approval") as refused:
            a.call(TOOL, {"code": "print(7)"}, call_id="a-3")
        assert refused.value.retry_after_s > 0
        # The flood: past their bounds, both identities keep asking; each
        # ask is refused at once, and holds nothing.
        for i in range(60):
            who = a if i % 2 else b
            with pytest.raises(OverloadedError, match="waiting for approval"):
                who.call(TOOL, {"code": "print(7)"}, call_id=f"flood-{i}")
        # Everyone else is served as if nobody waited: 4 at once, the whole bound.
        started = time.monotonic()
        ran = list(pool.map(lambda i: plain.call(TOOL, {"code": f"print({i})"}), range(4)))
        assert all(r.ok for r in ran), ran
        assert time.monotonic() - started < 30
        # Approved, a waiting call counts in and runs; denied ones end, effect none.
        ops.approve("a-0")
        for _who, call_id in waiting[1:]:
            ops.deny(call_id, "not now")
        results = [f.result(30) for f in futures]
    assert results[0].ok and results[0].data["stdout"] == "7\n"
    assert all(r.error is not None and r.error.type == "ApprovalDenied" for r in results[1:])
    # Its bound is free again.
    with ThreadPoolExecutor(1) as pool:
        again = pool.submit(a.call, TOOL, {"code": "print(8)"}, call_id="a-again")
        _in_state(a, "a-again", CallState.AWAITING_APPROVAL)
        ops.approve("a-again")
        assert again.result(30).data["stdout"] == "8\n"


def test_an_approved_call_waits_for_room_in_its_identitys_share(
    authed: Callable[..., ServedDaemon], clients: Callable[[str, str], Client]
) -> None:
    served = authed(max_calls_per_client=1, pool_size=1)
    a, ops = clients(served.target, "gated-a"), clients(served.target, "ops")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(a.call, TOOL, {"code": "print(1)"}, call_id="w-1")
        second = pool.submit(a.call, TOOL, {"code": "print(2)"}, call_id="w-2")
        _in_state(a, "w-1", CallState.AWAITING_APPROVAL)
        _in_state(a, "w-2", CallState.AWAITING_APPROVAL)
        # Both waited at once, though its share is one call: waiting holds no room.
        ops.approve("w-1")
        ops.approve("w-2")
        assert first.result(30).ok and second.result(30).ok


# ------------------------------------------------------------------ finding 17


def test_an_approver_approves_only_tools_it_may_call_and_reasons_are_bounded(
    authed: Callable[..., ServedDaemon], clients: Callable[[str, str], Client]
) -> None:
    served = authed()
    a, narrow, ops = (clients(served.target, n) for n in ("gated-a", "narrow", "ops"))
    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(a.call, TOOL, {"code": "print(1)"}, call_id="n-1")
        two = pool.submit(a.call, TOOL, {"code": "print(2)"}, call_id="n-2")
        _in_state(a, "n-1", CallState.AWAITING_APPROVAL)
        _in_state(a, "n-2", CallState.AWAITING_APPROVAL)
        with pytest.raises(PermissionDeniedError, match="may not approve calls of"):
            narrow.approve("n-1")
        with pytest.raises(InvalidRequestError, match="at most 1000"):
            ops.deny("n-1", "x" * 5000)
        assert _state(ops, "n-1") is CallState.AWAITING_APPROVAL
        ops.approve("n-1")
        narrow.deny("n-2", "a refusal runs nothing: any approver may give it")
        assert one.result(30).ok
        denied = two.result(30)
    assert denied.error is not None and denied.error.type == "ApprovalDenied"


# ------------------------------------------------------------------ finding 11


def _raw_call(target: str, arguments_json: str) -> tuple[grpc.StatusCode, str, float]:
    """A Run request with these arguments through the raw stub: its status and time."""
    with grpc.insecure_channel(
        target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    ) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        request = pb.CallRequest(tool=TOOL, arguments_json=arguments_json)
        started = time.monotonic()
        try:
            stub.Run(request, timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or "", time.monotonic() - started
        return grpc.StatusCode.OK, "", time.monotonic() - started


def test_a_request_of_400k_unknown_keys_is_refused_without_stalling_the_daemon(
    daemon: RunningDaemon,
) -> None:
    attack = json.dumps({"code": "print(1)", **{f"k{i}": 1 for i in range(400_000)}})
    assert len(attack) > 4 * 1024 * 1024
    process = psutil.Process(daemon.pid)
    rss_before = process.memory_info().rss
    lags: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        # Another client's cheap RPC, again and again, while the attack runs.
        with grpc.insecure_channel(daemon.target) as channel:
            stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
            stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
            while not stop.is_set():
                started = time.monotonic()
                stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
                lags.append(time.monotonic() - started)
                time.sleep(0.005)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        time.sleep(0.2)
        outcomes = [_raw_call(daemon.target, attack) for _ in range(3)]
    finally:
        stop.set()
        prober.join(30)
    # The loop answered throughout (the old daemon stalled 1.3 s per request).
    assert lags and max(lags) < 0.3, f"slowest GetDaemonInfo {max(lags):.3f}s"
    for code, details, _seconds in outcomes:
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
        assert "more than 20000 values" in details and "max_argument_values" in details
    assert process.memory_info().rss - rss_before < 200 * 1024 * 1024
    daemon.assert_serving()


def test_large_arguments_within_the_bounds_still_run_and_deep_ones_are_refused(
    daemon: RunningDaemon,
) -> None:
    # Commas and brackets inside a string are no values: a long list in code runs.
    code = "x = [" + "1," * 200_000 + "]\nprint(len(x))"
    with Client(daemon.target, retries=0) as client:
        assert client.call(TOOL, {"code": code}).data["stdout"] == "200000\n"
        deep: Any = 1
        for _ in range(100):
            deep = [deep]
        with pytest.raises(InvalidRequestError, match="nested deeper than 64"):
            client.call(TOOL, {"code": "print(1)", "deep": deep})
    # Nesting past the bound is refused before the decoder recurses into it.
    status, details, _ = _raw_call(daemon.target, "[" * 100_000)
    assert status is grpc.StatusCode.INVALID_ARGUMENT and "nested deeper" in details, details


# ------------------------------------------------------------------ finding 12


def test_the_journal_keeps_a_bounded_number_of_ended_sessions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    settings: dict[str, Any] = {"journal_max_session_rows": 10, "pool_size": 1}
    with tooljail.testing.daemon(state_dir=str(state), **settings) as target:  # noqa: SIM117
        with Client(target, retries=0) as client:
            for _ in range(25):  # sessions opened and closed: no call ever finishes
                with client.session():
                    pass
    # Read once the daemon is gone: it holds the journal exclusively.
    with sqlite3.connect(f"file:{state / JOURNAL_FILE}?mode=ro", uri=True) as db:
        (ended,) = db.execute("SELECT count(*) FROM sessions WHERE ended IS NOT NULL").fetchone()
    assert ended <= 11, ended
