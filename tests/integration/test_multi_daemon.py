"""Three daemons on one machine, one SDK routing over them (issue 15 §3).

Three real `tooljail serve` processes, each with its own state directory, Unix
socket and `daemon_id` (and, in one test, loopback TCP ports and the default
ids), and the SDK given the list of their targets. What a user of a fleet
counts on, tested the way it breaks in production:

- calls spread over all three, and any client finds any call by its id;
- a retry with the same call id reaches the daemon that ran it, and runs nothing twice;
- a session stays on its daemon, with its state;
- a daemon killed (SIGKILL) under load: nothing hangs; its calls come back
  finished or LOST naming it, never run again elsewhere; the others' calls and
  sessions are untouched; new calls go to the two that live; its session's next
  call says the session was lost with its daemon; restarted (same state, same
  id) it takes calls again;
- a rolling restart (SIGTERM, drain, start again, one at a time) under load
  fails no call: the SDK stops sending to a draining daemon, which finishes
  what it has.

The daemons run without namespaces (`--isolation none`): routing is the point
here, and a tool must leave a mark on the host to count its runs. They are
started once for the module (start-up is most of the cost) and every test
gets them all serving again (a test that fails mid-kill leaves none down).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tooljail import (
    AsyncClient,
    AsyncSession,
    CallState,
    CallStatus,
    Client,
    Effect,
    Session,
    ToolResult,
)
from tooljail.errors import SessionEndedError

IDS = ("daemon-a", "daemon-b", "daemon-c")
QUICK = {"code": "print('hi')"}
POOL_SIZE = 3
SETTLE_S = 15.0
"""How long the SDK may take to see a daemon come back or go (its health re-check)."""


def _sleeping(seconds: float) -> dict[str, str]:
    return {"code": f"import time; time.sleep({seconds}); print('slept')"}


@dataclass
class Member:
    """One daemon of the fleet: started, killed and started again in its own place."""

    daemon_id: str
    base: Path
    listen: str | None = None
    """None: a Unix socket in `base`; else "127.0.0.1:PORT"."""
    process: subprocess.Popen[bytes] | None = None
    target: str = ""

    def spawn(self) -> None:
        """Start it (same state directory, socket and id as before); do not wait."""
        args = ["--isolation", "none"]
        if self.daemon_id:
            args += ["--daemon-id", self.daemon_id]
        self.process, self.target, _ = spawn_daemon(
            self.base, *args, listen=self.listen, pool_size=POOL_SIZE
        )

    def wait_serving(self) -> None:
        assert self.process is not None
        wait_serving(self.target, self.process, self.base / "daemon.log")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM: drain and exit; its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def log(self) -> str:
        return (self.base / "daemon.log").read_text(errors="replace")


def _start_all(members: list[Member]) -> None:
    """Start every member that is not running, side by side, and wait for each."""
    down = [m for m in members if not m.alive]
    for member in down:
        member.spawn()
    for member in down:
        member.wait_serving()


def _stop_all(members: list[Member]) -> None:
    for member in members:
        if member.alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.stop(30)
        if member.alive:
            member.kill()


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Member]]:
    members = [Member(i, tmp_path_factory.mktemp(i)) for i in IDS]
    try:
        _start_all(members)
        yield members
    finally:
        _stop_all(members)


@pytest.fixture
def fleet(trio: list[Member]) -> list[Member]:
    """The three, all serving (a test before may have left one down)."""
    _start_all(trio)
    return trio


def _targets(members: list[Member]) -> list[str]:
    return [m.target for m in members]


def _spread(daemon_ids: list[str], total: int) -> Counter[str]:
    spread = Counter(daemon_ids)
    assert set(spread) == set(IDS), spread
    for daemon_id, count in spread.items():
        assert count > 0.15 * total, f"{daemon_id} ran {count} of {total}: {spread}"
    return spread


def _failed(answers: list[ToolResult] | list[ToolResult | BaseException]) -> list[str]:
    """What went wrong with the answers that are not a success, in a line each."""
    return [
        repr(a)
        if isinstance(a, BaseException)
        else f"{a.call_id} on {a.daemon_id!r}: {a.status} {a.message!r} {a.error} {a.data}"
        for a in answers
        if isinstance(a, BaseException) or not a.ok
    ]


def _is_lost_on(result: ToolResult, member: Member) -> bool:
    """LOST, effect unknown, naming the daemon that held it."""
    return (
        result.status is CallStatus.LOST
        and result.effect is Effect.UNKNOWN
        and member.daemon_id in result.message
    )


# --------------------------------------------------------------------- spread


def test_calls_spread_over_all_three_and_any_client_finds_each(fleet: list[Member]) -> None:
    total = 300
    with Client(_targets(fleet)) as client, ThreadPoolExecutor(20) as pool:
        results = list(pool.map(lambda _: client.call("execute_python_code", QUICK), range(total)))
    assert all(r.ok and r.data["stdout"] == "hi\n" for r in results), _failed(results)
    assert len({r.call_id for r in results}) == total
    _spread([r.daemon_id for r in results], total)
    # A client that sent none of them finds each on the daemon that ran it.
    with Client(_targets(fleet)) as other:
        for result in results:
            info = other.get_call(result.call_id)
            assert (info.state, info.daemon_id) == (CallState.SUCCEEDED, result.daemon_id)


def test_call_status_asks_the_daemon_that_holds_the_call(fleet: list[Member]) -> None:
    with Client(_targets(fleet)) as client:
        results = [client.call("execute_python_code", QUICK) for _ in range(24)]
        assert all(r.ok for r in results), _failed(results)
        assert len({r.daemon_id for r in results}) >= 2  # calls on several daemons
        # Each call_status has an id of its own, routed by the id it asks about.
        statuses = [client.call("call_status", {"call_id": r.call_id}) for r in results]
    for result, status in zip(results, statuses, strict=True):
        assert status.ok and status.data["state"] == "succeeded", status
        assert status.daemon_id == result.daemon_id


def test_a_retry_with_the_same_call_id_runs_once_on_its_daemon(
    fleet: list[Member], host_dir: Path
) -> None:
    targets = _targets(fleet)
    # Another order of the same targets, as another process may be configured.
    with Client(targets) as first, Client(targets[::-1]) as second:
        for n in range(9):  # enough ids to land on each daemon
            marker = host_dir / f"ran-{n}"
            code = f"open({str(marker)!r}, 'a').write('x')\nprint('ok')"
            call_id = f"once-{n}-{uuid.uuid4().hex}"
            answers = [
                client.call("execute_python_code", {"code": code}, call_id=call_id)
                for client in (first, second, first)
            ]
            assert all(a.ok and a.call_id == call_id for a in answers), answers
            assert len({a.daemon_id for a in answers}) == 1, answers
            assert marker.read_text() == "x", f"{call_id} ran more than once"


def test_sessions_stay_on_their_daemon_with_their_state(fleet: list[Member]) -> None:
    with Client(_targets(fleet)) as client:
        sessions = [client.session() for _ in range(6)]
        try:
            assert all(s.daemon_id in IDS for s in sessions)
            for n, session in enumerate(sessions):
                session.call("execute_python_code", {"code": f"counter = {n}"})
            for _ in range(3):
                for session in sessions:
                    result = session.call("execute_python_code", {"code": "counter += 10"})
                    assert result.ok, result
                    assert result.daemon_id == session.daemon_id
            for n, session in enumerate(sessions):
                last = session.call("execute_python_code", {"code": "print(counter)"})
                assert last.data["stdout"] == f"{n + 30}\n"
                assert last.daemon_id == session.daemon_id
        finally:
            for session in sessions:
                with contextlib.suppress(Exception):
                    session.close()


# ---------------------------------------------------------------- one killed


def _sessions_on_every_daemon(client: Client, limit: int = 24) -> dict[str, Session]:
    """Open sessions until each daemon holds one (rendezvous of fresh ids picks);
    close the extra ones. Daemon id -> its session."""
    kept: dict[str, Session] = {}
    extra = []
    for _ in range(limit):
        session = client.session()
        if session.daemon_id in kept:
            extra.append(session)
        else:
            kept[session.daemon_id] = session
        if len(kept) == len(IDS):
            break
    for session in extra:
        session.close()
    assert set(kept) == set(IDS), f"{limit} sessions never reached {set(IDS) - set(kept)}"
    return kept


def test_a_killed_daemon_loses_only_its_calls_and_comes_back(fleet: list[Member]) -> None:
    victim = fleet[1]
    others = [m for m in fleet if m is not victim]
    answers: list[ToolResult | BaseException] = []
    with Client(_targets(fleet)) as client:
        sessions = _sessions_on_every_daemon(client)
        for daemon_id, session in sessions.items():
            session.call("execute_python_code", {"code": f"owner = {daemon_id!r}"})

        def one(_: int) -> None:
            try:
                answers.append(client.call("execute_python_code", _sleeping(0.4)))
            except BaseException as exc:  # every answer is judged below
                answers.append(exc)

        pool = ThreadPoolExecutor(20)
        futures = [pool.submit(one, n) for n in range(120)]
        time.sleep(1.0)
        victim.kill()
        deadline = time.monotonic() + 60
        for future in futures:
            future.result(timeout=max(0.1, deadline - time.monotonic()))  # nothing hangs
        pool.shutdown()

        errors = [a for a in answers if isinstance(a, BaseException)]
        assert not errors, errors[:3]
        results = [a for a in answers if isinstance(a, ToolResult)]
        lost = [r for r in results if not r.ok]
        assert all(_is_lost_on(r, victim) for r in lost), _failed(lost)
        assert all(r.ok for r in results if r.daemon_id != victim.daemon_id), _failed(results)
        assert lost, "the kill came too late: no call was caught on the killed daemon"

        # The sessions of the two that live keep their state; the victim's is lost, by name.
        for member in others:
            kept = sessions[member.daemon_id].call("execute_python_code", {"code": "print(owner)"})
            assert kept.ok and kept.data["stdout"] == f"{member.daemon_id}\n", kept
        with pytest.raises(SessionEndedError) as ended:
            sessions[victim.daemon_id].call("execute_python_code", {"code": "print(owner)"})
        assert ended.value.reason == "daemon_lost"
        assert victim.daemon_id in str(ended.value)

        # New calls go to the two that live.
        after = [client.call("execute_python_code", QUICK) for _ in range(30)]
        assert all(r.ok for r in after), _failed(after)
        assert {r.daemon_id for r in after} <= {m.daemon_id for m in others}

        # Back with its state and its id: it takes calls again, and its journal
        # says the calls the kill cut short were lost.
        victim.spawn()
        victim.wait_serving()
        came_back = _lands_on(client, victim)
        assert came_back.ok
        for result in lost[:5]:
            info = client.get_call(result.call_id)
            assert (info.state, info.daemon_id) == (CallState.LOST, victim.daemon_id)
        for member in others:
            sessions[member.daemon_id].close()


def _lands_on(client: Client, member: Member) -> ToolResult:
    """Call until a call runs on `member` (the SDK re-checks a daemon it lost on
    an interval); that call's result."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        result = client.call("execute_python_code", QUICK)
        assert result.ok, result
        if result.daemon_id == member.daemon_id:
            return result
        time.sleep(0.05)
    raise AssertionError(f"no call reached {member.daemon_id} within {SETTLE_S}s of its restart")


# ----------------------------------------------------------- rolling restart


def test_a_rolling_restart_under_load_fails_no_call(fleet: list[Member]) -> None:
    stop = threading.Event()
    answers: list[ToolResult | BaseException] = []

    with Client(_targets(fleet)) as client:

        def load() -> None:
            while not stop.is_set():
                try:
                    answers.append(client.call("execute_python_code", _sleeping(0.2)))
                except BaseException as exc:  # judged below
                    answers.append(exc)

        workers = [threading.Thread(target=load, daemon=True) for _ in range(12)]
        for worker in workers:
            worker.start()
        try:
            for member in fleet:
                time.sleep(0.5)
                assert member.stop(60) == 0, member.log()
                member.spawn()
                member.wait_serving()
                _lands_on(client, member)
        finally:
            stop.set()
            for worker in workers:
                worker.join(60)
    assert not any(w.is_alive() for w in workers), "a call hung"
    failed = _failed(answers)
    assert not failed, f"{len(failed)} of {len(answers)} calls failed: {failed[:5]}"
    assert len(answers) > 30
    assert {a.daemon_id for a in answers if isinstance(a, ToolResult)} == set(IDS)


# --------------------------------------------------------------- loopback TCP


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_three_daemons_on_loopback_ports_with_their_default_ids(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    ports = [_free_port() for _ in IDS]
    members = [
        Member("", tmp_path_factory.mktemp("tcp"), listen=f"127.0.0.1:{port}") for port in ports
    ]
    try:
        _start_all(members)
        host = socket.gethostname()
        with Client(_targets(members)) as client, ThreadPoolExecutor(10) as pool:
            results = list(pool.map(lambda _: client.call("execute_python_code", QUICK), range(90)))
        assert all(r.ok for r in results), _failed(results)
        spread = Counter(r.daemon_id for r in results)
        assert set(spread) == {f"{host}:{port}" for port in ports}, spread
        assert min(spread.values()) > 0.15 * 90, spread
        with Client(_targets(members)[::-1]) as other:
            for result in results[:30]:
                assert other.get_call(result.call_id).daemon_id == result.daemon_id
    finally:
        _stop_all(members)


# ---------------------------------------------------------------- AsyncClient


def test_async_calls_spread_and_a_kill_loses_only_that_daemons_calls(
    fleet: list[Member],
) -> None:
    victim = fleet[2]

    async def scenario() -> None:
        async with AsyncClient(_targets(fleet)) as client:
            limit = asyncio.Semaphore(20)

            async def one(args: dict[str, str]) -> ToolResult:
                async with limit:
                    return await client.call("execute_python_code", args)

            quick = await asyncio.gather(*(one(QUICK) for _ in range(150)))
            assert all(r.ok for r in quick), _failed(quick)
            _spread([r.daemon_id for r in quick], 150)
            session = await _async_session_on(client, victim.daemon_id)

            loaded = [asyncio.create_task(one(_sleeping(0.4))) for _ in range(60)]
            await asyncio.sleep(1.0)
            victim.kill()
            done, pending = await asyncio.wait(loaded, timeout=60)
            assert not pending, "calls hung after the kill"
            results = [task.result() for task in done]  # none raised
            lost = [r for r in results if not r.ok]
            assert all(_is_lost_on(r, victim) for r in lost), _failed(lost)
            assert all(r.ok for r in results if r.daemon_id != victim.daemon_id), _failed(results)
            with pytest.raises(SessionEndedError) as ended:
                await session.call("execute_python_code", QUICK)
            assert ended.value.reason == "daemon_lost"
            assert victim.daemon_id in str(ended.value)
            after = await asyncio.gather(*(one(QUICK) for _ in range(30)))
            assert all(r.ok and r.daemon_id != victim.daemon_id for r in after), _failed(after)

    asyncio.run(asyncio.wait_for(scenario(), 90))


async def _async_session_on(client: AsyncClient, daemon_id: str, limit: int = 24) -> AsyncSession:
    """An open session on `daemon_id` (others opened on the way are closed)."""
    for _ in range(limit):
        session = await client.session()
        if session.daemon_id == daemon_id:
            return session
        await session.close()
    raise AssertionError(f"{limit} sessions never reached {daemon_id}")


def test_the_fleet_fixture_restarts_what_a_test_left_down(fleet: list[Member]) -> None:
    # Runs after the async kill (file order): its victim serves again.
    with Client(_targets(fleet)) as client:
        assert _lands_on(client, fleet[2]).ok
