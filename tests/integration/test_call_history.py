"""ListCalls through a real daemon (issue 25, item 1): each filter, paging, who sees what.

Every call here is real (admitted, run and journaled by the daemon), none seeded:
the 1,000 of the paging test are calls of `list_artifacts`, a built-in that runs
in the daemon itself (no sandbox, ~2 ms each), so they cost seconds, not
minutes; the filters' set mixes it with sandboxed calls (a timeout, a session,
a call still running, one cancelled), and `read_artifact` of an id nobody made
(status error). The journal itself, seeded, is the benchmark's
(bench/bench_history.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import AsyncClient, CallInfo, CallState, CallStatus, Client
from tooljail.errors import CallNotFoundError, InvalidRequestError, PermissionDeniedError
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

FAST = "list_artifacts"
"""A built-in that runs in the daemon: a real call at ~2 ms."""
TOKENS = {"agent-a": "token-of-a", "agent-b": "token-of-b", "ops": "token-of-ops"}


def ids(calls: Any) -> set[str]:
    return {c.call_id for c in calls}


def every(client: Client, **filters: Any) -> list[CallInfo]:
    """Every page of `list_calls(**filters)`, checked: no call twice, newest first."""
    found = list(client.iter_calls(**filters))
    assert len(found) == len(ids(found)), "a call came twice"
    received = [c.received_at for c in found]
    assert all(r is not None for r in received)
    assert received == sorted(received, reverse=True)  # type: ignore[type-var]
    return found


def fast_calls(target: str, count: int, *, client_name: str = "bulk", threads: int = 4) -> set[str]:
    """`count` real calls of `FAST`, from `threads` clients at once; their ids."""
    made: list[str] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        with Client(target, client_name=client_name) as client:
            mine = [client.call(FAST, {}).call_id for _ in range(n)]
        with lock:
            made.extend(mine)

    workers = [
        threading.Thread(target=work, args=(count // threads + (i < count % threads),))
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert len(made) == count
    return set(made)


@pytest.fixture
def stub(served: ServedDaemon) -> Iterator[Any]:
    with grpc.insecure_channel(served.target) as channel:
        yield tooljail_pb2_grpc.ToolRunnerStub(channel)


def test_each_filter_finds_exactly_its_calls(served: ServedDaemon) -> None:
    target = served.target
    with Client(target, client_name="alpha") as alpha, Client(target, client_name="beta") as beta:
        quick = {alpha.call(FAST, {}).call_id for _ in range(3)}
        time.sleep(0.02)
        mid = time.time()
        time.sleep(0.02)
        failed = {beta.call("read_artifact", {"artifact_id": "nobody-made-it"}).call_id}
        failed.add(beta.call("read_artifact", {"artifact_id": "nor-this"}).call_id)
        with alpha.session() as session:
            in_session = session.call(FAST, {}).call_id
        timed = alpha.call(
            "execute_python_code", {"code": "import time; time.sleep(30)"}, tool_timeout_s=1
        )
        assert timed.status is CallStatus.TIMEOUT, timed
        runner = threading.Thread(
            target=lambda: alpha.call(
                "execute_python_code", {"code": "import time; time.sleep(60)"}, call_id="long-1"
            )
        )
        runner.start()

        def long_runs() -> bool:
            try:  # the thread may not have asked yet: unknown until it has
                return beta.get_call("long-1").state is CallState.RUNNING
            except CallNotFoundError:
                return False

        wait_for(long_runs, timeout=15)
        everything = quick | failed | {in_session, timed.call_id, "long-1"}

        # No tokens, and the test is the daemon's own uid: every caller sees all.
        assert ids(every(beta)) == everything
        assert ids(every(alpha, tool="read_artifact")) == failed
        assert ids(every(alpha, client_name="beta")) == failed
        assert ids(every(beta, client_name="alpha")) == everything - failed
        assert ids(every(alpha, status=CallStatus.ERROR)) == failed
        assert ids(every(alpha, status="timeout")) == {timed.call_id}
        assert ids(every(alpha, session_id=session.id)) == {in_session}
        assert ids(every(alpha, until=mid)) == quick
        assert ids(every(alpha, since=mid)) == everything - quick
        assert ids(every(alpha, since=time.time() + 60)) == set()
        running = every(alpha, running=True)
        assert ids(running) == {"long-1"}
        assert running[0].state is CallState.RUNNING and running[0].started_at is not None
        assert ids(every(alpha, running=False)) == everything - {"long-1"}
        assert ids(every(alpha, tool=FAST, client_name="alpha", until=mid)) == quick

        # A page's call is whole: arguments, who, where, when, how it ended.
        (info,) = alpha.list_calls(status="timeout").calls
        assert info.arguments == {"code": "import time; time.sleep(30)"}
        assert info.client_name == "alpha" and info.daemon_id
        assert info.result is not None and info.result.status is CallStatus.TIMEOUT
        assert info.ended_at is not None and info.received_at is not None

        alpha.cancel("long-1")
        runner.join(30)
        assert ids(every(alpha, running=True)) == set()
        cancelled = every(beta, status=CallStatus.CANCELLED)
        assert ids(cancelled) == {"long-1"}
        assert cancelled[0].state is CallState.CANCELLED


def test_paging_across_1000_calls_loses_and_repeats_none(served: ServedDaemon) -> None:
    made = fast_calls(served.target, 600, client_name="p") | fast_calls(
        served.target, 400, client_name="q"
    )
    with Client(served.target) as client:
        assert ids(every(client, limit=1000)) == made
        pages = 0
        seen: list[str] = []
        cursor = None
        while True:
            page = client.list_calls(limit=97, cursor=cursor)
            pages += 1
            seen += [c.call_id for c in page.calls]
            # Calls made while paging are newer than the first page: never in a later one.
            client.call(FAST, {})
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        assert pages == 11 and len(seen) == 1000 and set(seen) == made
        # A filter pages over its own index the same way.
        p_calls = every(client, client_name="p", tool=FAST, limit=77)
        assert len(p_calls) == 600 and {c.client_name for c in p_calls} == {"p"}
        one = client.list_calls(limit=1000, client_name="q")
        assert len(one.calls) == 400 and one.next_cursor == ""


def test_another_identitys_calls_are_invisible_and_an_approver_sees_all(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{hashlib.sha256(t.encode()).hexdigest()}"\n'
            + ("approver = true\n" if name == "ops" else "")
            for name, t in TOKENS.items()
        )
    )
    tokens.chmod(0o600)
    served = serve(auth={"tokens_file": str(tokens)})

    def as_(name: str) -> Client:
        return Client(served.target, token=TOKENS[name], retries=0)

    with as_("agent-a") as a, as_("agent-b") as b, as_("ops") as ops:
        mine = {a.call(FAST, {}).call_id for _ in range(3)}
        theirs = {b.call(FAST, {}).call_id for _ in range(2)}
        # A claimed client name changes nothing: the identity is the owner.
        with Client(served.target, token=TOKENS["agent-b"], client_name="agent-a") as claim:
            theirs.add(claim.call(FAST, {}).call_id)

        assert ids(every(a)) == mine
        assert ids(every(b)) == theirs
        assert ids(every(a, client_name="agent-a")) == mine
        for client, other in ((a, "agent-b"), (b, "agent-a"), (a, "ops")):
            with pytest.raises(PermissionDeniedError) as denied:
                client.list_calls(client_name=other)
            assert "only an approver or the operator" in str(denied.value)
            assert other in str(denied.value)

        assert ids(every(ops)) == mine | theirs
        assert ids(every(ops, client_name="agent-b")) == theirs
        assert {c.client_name for c in every(ops, client_name="agent-a")} == {"agent-a"}


def test_bad_bounds_and_cursors_are_invalid_argument_saying_why(
    served: ServedDaemon, stub: Any
) -> None:
    with Client(served.target) as client:
        for _ in range(3):
            client.call(FAST, {})
        cursor = client.list_calls(limit=1).next_cursor
        assert cursor
        assert len(client.list_calls(limit=1, cursor=cursor).calls) == 1

        refused = {
            "limit must be 1..1000": pb.ListCallsRequest(limit=1001),
            "the cursor is not one a page of calls gave": pb.ListCallsRequest(cursor="x!y"),
            "is after until": pb.ListCallsRequest(since_unix=2e9, until_unix=1e9),
            "seconds since the epoch": pb.ListCallsRequest(since_unix=-5),
            "not a Status": pb.ListCallsRequest(status=99),  # type: ignore[arg-type]
            "not a RunningFilter": pb.ListCallsRequest(running=7),  # type: ignore[arg-type]
        }
        for said, request in refused.items():
            with pytest.raises(grpc.RpcError) as error:
                stub.ListCalls(request)
            assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, said
            assert said in (error.value.details() or ""), (said, error.value.details())
        # 0 asks for the default page.
        assert len(stub.ListCalls(pb.ListCallsRequest()).calls) == 3

        # The SDK says the same in its own error tree: from the daemon, or at once.
        with pytest.raises(InvalidRequestError, match="not one a page of calls gave"):
            client.list_calls(cursor="bm90LWEtY3Vyc29y")
        for bad in (
            {"limit": 0},
            {"limit": 1001},
            {"status": "finished"},
            {"since": 200.0, "until": 100.0},
            {"since": float("nan")},
        ):
            with pytest.raises(InvalidRequestError):
                client.list_calls(**bad)
        for wrong in ({"limit": "5"}, {"running": "yes"}, {"since": "yesterday"}):
            with pytest.raises(TypeError):
                client.list_calls(**wrong)


def test_many_daemons_merge_newest_first_under_one_cursor(
    serve: Callable[..., ServedDaemon],
) -> None:
    first, second = serve(pool_size=0), serve(pool_size=0)
    with Client([first.target, second.target]) as routed:
        made = {routed.call(FAST, {}).call_id for _ in range(40)}
        # Rendezvous hashing spread them: each daemon holds some.
        with Client(first.target) as one:
            held = ids(every(one))
        assert 0 < len(held) < 40
        seen: list[CallInfo] = []
        cursor = None
        while True:
            page = routed.list_calls(limit=7, cursor=cursor)
            seen += page.calls
            routed.call(FAST, {})  # newer: in no later page
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        assert [c.call_id for c in seen if c.call_id in made] == [c.call_id for c in seen]
        assert len(seen) == 40 and ids(seen) == made
        assert {c.daemon_id for c in seen} == {c.daemon_id for c in routed.list_calls().calls}
        with pytest.raises(InvalidRequestError, match="over these daemons"):
            routed.list_calls(cursor="WzEsMl0")  # one daemon's cursor is not many's


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_calls_ls_and_show(daemon: RunningDaemon) -> None:
    with Client(daemon.target, client_name="cli-test") as client:
        quick = [client.call(FAST, {}).call_id for _ in range(3)]
        code = client.call("execute_python_code", {"code": "print('from the sandbox')"})

    ls = _cli("calls", "ls", "--target", daemon.target)
    assert ls.returncode == 0, ls
    lines = ls.stdout.splitlines()
    assert lines[0].split()[:2] == ["CALL", "TOOL"]
    assert [line.split()[0] for line in lines[1:]] == [code.call_id, *reversed(quick)]
    assert "execute_python_code" in lines[1] and "success" in lines[1] and "cli-test" in lines[1]

    paged = _cli("calls", "ls", "--target", daemon.target, "--limit", "2")
    assert len(paged.stdout.splitlines()) == 3
    assert "--cursor" in paged.stderr
    rest = paged.stderr.split("--cursor ")[1].split()[0]
    after = _cli("calls", "ls", "--target", daemon.target, "--cursor", rest, "--json")
    assert [c["call_id"] for c in json.loads(after.stdout)["calls"]] == quick[1::-1]
    every_page = _cli("calls", "ls", "--target", daemon.target, "--limit", "1", "--all", "--json")
    assert len(json.loads(every_page.stdout)["calls"]) == 4

    filtered = _cli(
        "calls", "ls", "--target", daemon.target, "--tool", "execute_python_code",
        "--status", "success", "--since", "1h", "--ended", "--client", "cli-test", "--json",
    )  # fmt: skip
    assert filtered.returncode == 0, filtered
    assert [c["call_id"] for c in json.loads(filtered.stdout)["calls"]] == [code.call_id]
    none = _cli("calls", "ls", "--target", daemon.target, "--until", "2000-01-01T00:00:00")
    assert none.returncode == 0 and none.stdout == "" and "no calls" in none.stderr

    show = _cli("calls", "show", code.call_id, "--target", daemon.target)
    assert show.returncode == 0, show
    for expected in (
        f"call       {code.call_id}",
        "tool       execute_python_code",
        "client     cli-test",
        "result     success, effect applied",
        "print('from the sandbox')",
        "from the sandbox",
        "usage      wall",
    ):
        assert expected in show.stdout, (expected, show.stdout)
    as_json = json.loads(_cli("calls", "show", code.call_id, "--target", daemon.target,
                              "--json").stdout)  # fmt: skip
    assert as_json["arguments_sha256"] == code.arguments_sha256

    bad = _cli("calls", "ls", "--target", daemon.target, "--since", "last tuesday")
    assert bad.returncode == 2 and "neither an ISO 8601 time" in bad.stderr
    unknown = _cli("calls", "show", "no-such-call", "--target", daemon.target)
    assert unknown.returncode == 2 and "no-such-call" in unknown.stderr


def test_the_async_client_lists_and_pages_the_same(served: ServedDaemon) -> None:
    async def main() -> tuple[set[str], list[str], set[str]]:
        async with AsyncClient(served.target, client_name="async") as client:
            made = {(await client.call(FAST, {})).call_id for _ in range(5)}
            first = await client.list_calls(limit=2, status=CallStatus.SUCCESS)
            paged = [c.call_id async for c in client.iter_calls(limit=2)]
            with pytest.raises(InvalidRequestError):
                await client.list_calls(limit=0)
            return made, [c.call_id for c in first.calls], set(paged) if len(paged) == 5 else set()

    made, first, paged = asyncio.run(main())
    assert paged == made and len(first) == 2 and set(first) <= made


def test_a_page_of_large_calls_ends_at_its_byte_bound_and_the_daemon_holds(
    serve: Callable[..., ServedDaemon],
) -> None:
    """Calls with large outputs: a page of 1,000 asked carries at most
    `list_calls_max_bytes` of them (RSS bounded), the next cursor goes on where it
    stopped (nothing lost), and the event loop answers a cheap RPC meanwhile."""
    bound = 256 * 1024
    served = serve(list_calls_max_bytes=bound)
    code = "print('x' * 100_000)"
    with Client(served.target) as client:
        made = {client.call("execute_python_code", {"code": code}).call_id for _ in range(12)}
        made |= {client.call(FAST, {}).call_id for _ in range(5)}
        first = client.list_calls(limit=1000)
        # The 5 small calls (the newest) and about 2 big ones (~100 KB of output
        # each) fit, not all 17.
        big = [c for c in first.calls if c.tool == "execute_python_code"]
        assert 1 <= len(big) <= 3 and len(first.calls) == 5 + len(big) and first.next_cursor
        assert sum(len(c.model_dump_json()) for c in first.calls) < 2 * bound
        assert ids(every(client, limit=1000)) == made

        with grpc.insecure_channel(served.target) as channel:
            stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
            pages = [stub.ListCalls.future(pb.ListCallsRequest(limit=1000)) for _ in range(20)]
            start = time.perf_counter()
            stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=5)
            answered_s = time.perf_counter() - start
            sizes = [p.result(timeout=30).ByteSize() for p in pages]
        assert max(sizes) < 2 * bound, sizes
        assert answered_s < 1.0, answered_s
