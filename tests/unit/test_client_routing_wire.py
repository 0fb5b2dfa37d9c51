"""Client and AsyncClient routing over three small daemons on real gRPC channels.

Each daemon here is a canned servicer that remembers the calls and sessions it
took (as a real daemon's journal does) and answers with its own daemon_id; it
can drain, die (its server stopped) and come back (a new server on the same
socket, a new start time). The sync client runs in a worker thread so that it
does not block the event loop the servers run on. Real `tooljail serve`
processes are in `tests/integration/test_multi_daemon.py`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tooljail import (
    AsyncClient,
    CallNotFoundError,
    CallState,
    CallStatus,
    Client,
    Effect,
    InvalidRequestError,
    SessionEndedError,
    SessionState,
)
from tooljail._wire import ERROR_DETAIL_KEY
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc


async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, name: str, msg: str):
    detail = pb.ErrorDetail(code=name, message=msg)
    await context.abort(
        code, msg, trailing_metadata=((ERROR_DETAIL_KEY, detail.SerializeToString()),)
    )


class MiniDaemon(tooljail_pb2_grpc.ToolRunnerServicer):
    """Runs "echo" at once; knows its calls and sessions until it restarts."""

    def __init__(self, daemon_id: str) -> None:
        self.daemon_id = daemon_id
        self.started_unix = time.time()
        self.draining = False
        self.runs: Counter[str] = Counter()
        self.calls: dict[str, pb.Result] = {}
        self.sessions: dict[str, int] = {}

    async def GetDaemonInfo(self, request, context):
        return pb.DaemonInfo(
            daemon_id=self.daemon_id,
            version="test",
            draining=self.draining,
            started_unix=self.started_unix,
        )

    async def ListTools(self, request, context):
        return pb.ListToolsResponse(tools=[pb.ToolSpec(name="echo", source="builtin")])

    async def Run(self, request, context):
        if request.call_id in self.calls:
            return self.calls[request.call_id]  # the same id joins, never runs again
        if self.draining:
            await _refuse(context, grpc.StatusCode.UNAVAILABLE, "shutting_down", "draining")
        if request.session_id:
            if request.session_id not in self.sessions:
                await _refuse(
                    context, grpc.StatusCode.NOT_FOUND, "session_not_found", "no such session"
                )
            self.sessions[request.session_id] += 1
        self.runs[request.call_id] += 1
        result = pb.Result(
            call_id=request.call_id,
            tool=request.tool,
            status=pb.STATUS_SUCCESS,
            effect=pb.EFFECT_APPLIED,
            data_json=str(self.sessions.get(request.session_id, 0)),
            session_id=request.session_id,
            daemon_id=self.daemon_id,
        )
        self.calls[request.call_id] = result
        return result

    async def Call(self, request, context):
        yield pb.CallEvent(started=pb.Started(call_id=request.call_id, daemon_id=self.daemon_id))
        yield pb.CallEvent(result=await self.Run(request, context))

    async def GetCall(self, request, context):
        if request.call_id not in self.calls:
            await _refuse(context, grpc.StatusCode.NOT_FOUND, "call_not_found", "no such call")
        result = self.calls[request.call_id]
        return pb.CallInfo(
            call_id=request.call_id,
            tool=result.tool,
            state=pb.CALL_STATE_SUCCEEDED,
            has_result=True,
            result=result,
            daemon_id=self.daemon_id,
        )

    async def CreateSession(self, request, context):
        if self.draining:
            await _refuse(context, grpc.StatusCode.UNAVAILABLE, "shutting_down", "draining")
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = 0
        return pb.SessionInfo(
            session_id=session_id, state=pb.SESSION_STATE_OPEN, daemon_id=self.daemon_id
        )

    async def ListSessions(self, request, context):
        return pb.ListSessionsResponse(
            sessions=[
                pb.SessionInfo(session_id=s, state=pb.SESSION_STATE_OPEN, daemon_id=self.daemon_id)
                for s in self.sessions
            ]
        )

    async def CloseSession(self, request, context):
        if self.sessions.pop(request.session_id, None) is None:
            await _refuse(context, grpc.StatusCode.NOT_FOUND, "session_not_found", "no session")
        return pb.SessionInfo(
            session_id=request.session_id,
            state=pb.SESSION_STATE_CLOSED,
            end_reason="closed",
            daemon_id=self.daemon_id,
        )


class Fleet:
    """Three MiniDaemons on Unix sockets, each of which can be stopped and restarted."""

    def __init__(self, tmp: Path) -> None:
        self.paths = {f"d{i}": tmp / f"d{i}.sock" for i in range(3)}
        self.daemons: dict[str, MiniDaemon] = {}
        self.servers: dict[str, grpc.aio.Server] = {}

    @property
    def targets(self) -> list[str]:
        return [f"unix://{p}" for p in self.paths.values()]

    async def start(self, daemon_id: str) -> MiniDaemon:
        daemon = MiniDaemon(daemon_id)
        server = grpc.aio.server()
        tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(daemon, server)
        server.add_insecure_port(f"unix://{self.paths[daemon_id]}")
        await server.start()
        self.daemons[daemon_id], self.servers[daemon_id] = daemon, server
        return daemon

    async def stop(self, daemon_id: str) -> None:
        await self.servers.pop(daemon_id).stop(None)

    def holder(self, call_id: str) -> str:
        (holder,) = [d for d, daemon in self.daemons.items() if call_id in daemon.calls]
        return holder


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet = Fleet(tmp_path)
    for daemon_id in fleet.paths:
        await fleet.start(daemon_id)
    try:
        yield fleet
    finally:
        for daemon_id in list(fleet.servers):
            await fleet.stop(daemon_id)


def _in_thread(fn, *args):
    return asyncio.to_thread(fn, *args)


async def test_calls_spread_over_every_daemon_and_name_the_one_that_ran(fleet: Fleet) -> None:
    def run() -> list:
        with Client(fleet.targets, retries=1) as client:
            return [client.call("echo") for _ in range(150)]

    results = await _in_thread(run)
    assert all(r.ok for r in results)
    ran = Counter(r.daemon_id for r in results)
    assert set(ran) == set(fleet.paths) and min(ran.values()) > 150 * 0.15, ran
    assert all(fleet.holder(r.call_id) == r.daemon_id for r in results)

    def look_up() -> list:
        # A new client knows no pin: it asks the daemons in rendezvous order.
        with Client(fleet.targets) as other:
            return [other.get_call(r.call_id) for r in results]

    infos = await _in_thread(look_up)
    assert [i.daemon_id for i in infos] == [r.daemon_id for r in results]
    assert all(i.state is CallState.SUCCEEDED for i in infos)


async def test_a_retry_of_one_call_id_reaches_the_same_daemon_and_runs_once(fleet: Fleet) -> None:
    def run() -> list:
        answers = []
        for _ in range(3):
            with Client(fleet.targets) as client:  # another process, as far as pins go
                answers.append(client.call("echo", call_id="the-one"))
                answers.append(next(iter(client.stream("echo", call_id="the-one")), None))
        return answers

    answers = await _in_thread(run)
    assert {a.daemon_id for a in answers} == {fleet.holder("the-one")}
    assert sum(d.runs["the-one"] for d in fleet.daemons.values()) == 1


async def test_an_id_no_daemon_knows_is_not_found(fleet: Fleet) -> None:
    def run() -> None:
        with Client(fleet.targets) as client, pytest.raises(CallNotFoundError):
            client.get_call("never-sent")

    await _in_thread(run)


async def test_a_draining_daemon_gets_no_new_calls_and_nothing_fails(fleet: Fleet) -> None:
    def run() -> list:
        with Client(fleet.targets) as client:
            client.list_tools()  # learns the table while all three serve
            fleet.daemons["d1"].draining = True  # before the health loop has seen it
            return [client.call("echo") for _ in range(60)]

    results = await _in_thread(run)
    assert all(r.ok for r in results)
    assert "d1" not in {r.daemon_id for r in results}
    assert not fleet.daemons["d1"].runs


async def test_a_killed_daemons_calls_are_lost_by_name_and_new_calls_go_elsewhere(
    fleet: Fleet,
) -> None:
    def before() -> tuple[Client, list, object]:
        client = Client(fleet.targets, retries=1)
        results = [client.call("echo") for _ in range(30)]
        session = client.session()
        return client, results, session

    client, results, session = await _in_thread(before)
    victim = session.daemon_id
    await fleet.stop(victim)

    def after() -> None:
        mine = [r for r in results if r.daemon_id == victim]
        assert mine
        for r in mine:
            info = client.get_call(r.call_id)
            assert info.state is CallState.LOST and info.result is not None
            assert info.result.status is CallStatus.LOST
            assert info.result.effect is Effect.UNKNOWN
            assert f"daemon '{victim}'" in info.result.message
            assert "unreachable" in info.result.message
        # A retry of a call pinned there is lost too, never run elsewhere.
        again = client.call("echo", call_id=mine[0].call_id)
        assert (again.status, again.daemon_id) == (CallStatus.LOST, victim)
        # Calls of the others are untouched; new ones go to the two that live.
        for r in results:
            if r.daemon_id != victim:
                assert client.get_call(r.call_id).state is CallState.SUCCEEDED
        fresh = [client.call("echo") for _ in range(30)]
        assert all(r.ok and r.daemon_id != victim for r in fresh)
        with pytest.raises(SessionEndedError, match=f"'{victim}'") as caught:
            session.call("echo")
        assert caught.value.reason == "daemon_lost"
        closed = session.close()
        assert (closed.state, closed.end_reason) == (SessionState.CLOSED, "daemon_lost")
        client.close()

    await _in_thread(after)
    assert not any(fleet.daemons[victim].runs[r.call_id] > 1 for r in results)


async def test_a_session_stays_pinned_and_is_lost_when_its_daemon_restarts(
    fleet: Fleet,
) -> None:
    client = await _in_thread(Client, fleet.targets)
    session = await _in_thread(client.session)
    counts = [
        (await _in_thread(session.call, "echo")).data for _ in range(4)
    ]  # the session's own counter: state kept on one daemon
    assert counts == [1, 2, 3, 4]
    victim = session.daemon_id
    await fleet.stop(victim)
    await fleet.start(victim)  # back, same id, nothing of the session
    with pytest.raises(SessionEndedError, match=f"'{victim}'") as caught:
        await _in_thread(session.call, "echo")
    assert caught.value.reason == "daemon_lost"
    # ... and it takes new calls again.
    new = await _in_thread(lambda: [client.call("echo") for _ in range(40)])
    assert victim in {r.daemon_id for r in new}
    await _in_thread(client.close)


async def test_a_session_opened_elsewhere_is_found_by_its_id(fleet: Fleet) -> None:
    def run() -> tuple[str, str]:
        with Client(fleet.targets) as a, Client(fleet.targets) as b:
            session = a.session()
            result = b.call("echo", session_id=session.id)
            return session.daemon_id, result.daemon_id

    opened_on, ran_on = await _in_thread(run)
    assert opened_on == ran_on


async def test_async_client_spreads_and_answers_lost_for_a_killed_daemon(fleet: Fleet) -> None:
    async with AsyncClient(fleet.targets, retries=1) as client:
        results = await asyncio.gather(*(client.call("echo") for _ in range(90)))
        assert set(Counter(r.daemon_id for r in results)) == set(fleet.paths)
        victim = results[0].daemon_id
        await fleet.stop(victim)
        info = await client.get_call(results[0].call_id)
        assert info.state is CallState.LOST
        assert f"daemon '{victim}'" in info.result.message
        items = [item async for item in client.stream("echo", call_id=results[0].call_id)]
        assert items[-1].status is CallStatus.LOST
        fresh = await asyncio.gather(*(client.call("echo") for _ in range(30)))
        assert all(r.ok and r.daemon_id != victim for r in fresh)
        assert len(await client.list_sessions()) == 0


async def test_one_target_sends_no_daemon_info(fleet: Fleet) -> None:
    # One plain target is today's client: no routing, no extra round trip.
    calls: list[str] = []
    daemon = fleet.daemons["d0"]
    original = daemon.GetDaemonInfo

    async def counted(request, context):
        calls.append("info")
        return await original(request, context)

    daemon.GetDaemonInfo = counted  # type: ignore[method-assign]
    async with AsyncClient(fleet.targets[0]) as client:
        result = await client.call("echo")
    assert result.daemon_id == "d0" and calls == []


async def test_a_dns_name_is_resolved_to_its_daemons() -> None:
    daemon = MiniDaemon("by-name")
    server = grpc.aio.server()
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(daemon, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncClient(f"dns:///localhost:{port}") as client:
            result = await client.call("echo")
            assert client.target == f"dns:///localhost:{port}"
        assert result.daemon_id == "by-name"
    finally:
        await server.stop(None)


async def test_two_daemons_with_one_id_are_refused_by_name(fleet: Fleet) -> None:
    fleet.daemons["d1"].daemon_id = "d0"
    async with AsyncClient(fleet.targets) as client:
        with pytest.raises(InvalidRequestError, match="daemon_id 'd0'"):
            await client.call("echo")


async def test_async_client_skips_a_draining_daemon_and_loses_a_session_by_name(
    fleet: Fleet,
) -> None:
    async with AsyncClient(fleet.targets, retries=1) as client:
        await client.list_tools()
        session = await client.session()
        victim = session.daemon_id
        fleet.daemons[victim].draining = True  # refused before the health task notices
        results = await asyncio.gather(*(client.call("echo") for _ in range(30)))
        assert all(r.ok and r.daemon_id != victim for r in results)
        assert not fleet.daemons[victim].runs
        await fleet.stop(victim)
        with pytest.raises(SessionEndedError, match=f"'{victim}'") as caught:
            await session.call("echo")
        assert caught.value.reason == "daemon_lost"
        assert (await session.close()).end_reason == "daemon_lost"
        assert session.daemon_id == victim


async def test_a_call_its_restarted_daemon_forgot_is_lost_by_name(fleet: Fleet) -> None:
    async with AsyncClient(fleet.targets) as client:
        result = await client.call("echo")
        holder = result.daemon_id
        await fleet.stop(holder)
        await fleet.start(holder)  # back with the same id, a new start time, no journal
        await client._router.refresh()  # what the health task does every 2 s
        info = await client.get_call(result.call_id)
        assert info.state is CallState.LOST and info.result is not None
        assert f"daemon '{holder}'" in info.result.message
        assert "restarted" in info.result.message
