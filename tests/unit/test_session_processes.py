"""The sessions floor's background processes against a fake sandbox process:
the output log's offsets, ring and spill, follow and re-attach, limits, end_all."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

from tooljail.errors import (
    InvalidPathError,
    InvalidRequestError,
    ProcessLimitError,
    ProcessNotFoundError,
)
from tooljail.types import ProcessState
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import SpawnError
from tooljaild.sessions.process_output import MIN_RING_BYTES, RingBudget
from tooljaild.sessions.processes import (
    OutputLog,
    ProcessTable,
    SpawnSpec,
    check_env,
    command_argv,
    parse_signal,
)
from tooljaild.settings.artifacts import ArtifactSettings


@dataclass(frozen=True)
class _Exit:
    code: int | None
    signal: int | None
    killed: bool


class FakeProcess:
    """A SandboxProcess whose output and end the test drives."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exited: asyncio.Future[_Exit] = asyncio.get_running_loop().create_future()
        self._queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self.stdin = bytearray()
        self.stdin_closed = False
        self.signals: list[int] = []
        self.ignore_term = False

    def emit(self, stream: str, data: bytes) -> None:
        self._queue.put_nowait((stream, data))

    def finish(self, code: int | None = 0, sig: int | None = None, killed: bool = False) -> None:
        if not self.exited.done():
            self._queue.put_nowait(None)
            self.exited.set_result(_Exit(code, sig, killed))

    async def output(self) -> tuple[str, bytes] | None:
        return await self._queue.get()

    async def write(self, data: bytes) -> None:
        if self.exited.done() or self.stdin_closed:
            raise SandboxError("gone")
        self.stdin += data

    def close_stdin(self) -> None:
        self.stdin_closed = True

    def signal(self, signum: int, *, foreground: bool = False) -> None:
        self.signals.append(signum)
        if signum == signal.SIGKILL or (signum == signal.SIGTERM and not self.ignore_term):
            self.finish(None, signum)


class FakeSandbox:
    def __init__(self, pids: int = 1000) -> None:
        self.processes: list[FakeProcess] = []
        self.pids = pids
        self.specs: list[SpawnSpec] = []

    async def spawn(self, spec: SpawnSpec) -> FakeProcess:
        if len([p for p in self.processes if not p.exited.done()]) >= self.pids:
            raise SpawnError("fork: Resource temporarily unavailable", limit=True)
        self.specs.append(spec)
        p = FakeProcess(100 + len(self.processes))
        self.processes.append(p)
        return p

    async def stats(self, pids: Collection[int]) -> dict[int, tuple[float, int]]:
        return {pid: (0.5, 4096) for pid in pids}


def _table(
    sandbox: FakeSandbox,
    *,
    max_processes: int = 32,
    ring: int = 4096,
    store: ArtifactStore | None = None,
    budget: RingBudget | None = None,
) -> ProcessTable:
    return ProcessTable(
        "s1",
        "alice",
        sandbox.spawn,  # type: ignore[arg-type]
        sandbox.stats,
        max_processes=max_processes,
        ring_bytes=ring,
        artifacts=store,
        budget=budget,
    )


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _whole(chunks: list) -> bytes:  # type: ignore[type-arg]
    return b"".join(c.data for c in chunks)


async def test_offsets_are_absolute_over_both_streams() -> None:
    sb = FakeSandbox()
    table = _table(sb)
    info = await table.start_command("echo hi", name="x")
    p = sb.processes[0]
    p.emit("stdout", b"abc")
    p.emit("stderr", b"DE")
    p.emit("stdout", b"f")
    await _settle()
    chunks, nxt, skipped = table.read(info.process_id, 0)
    assert [(c.offset, c.stream, c.data) for c in chunks] == [
        (0, "stdout", b"abc"),
        (3, "stderr", b"DE"),
        (5, "stdout", b"f"),
    ]
    assert (nxt, skipped) == (6, 0)
    only_err, nxt, _ = table.read(info.process_id, 0, select="stderr")
    assert _whole(only_err) == b"DE" and nxt == 6
    part, nxt, _ = table.read(info.process_id, 1, limit=3)
    assert _whole(part) == b"bcD" and nxt == 4
    assert table.read(info.process_id, 100) == ([], 100, 0)
    with pytest.raises(InvalidRequestError, match="negative"):
        table.read(info.process_id, -1)


async def test_ring_spills_to_an_artifact_so_every_offset_stays_readable(tmp_path: Path) -> None:
    store = ArtifactStore.open(tmp_path / "a", ArtifactSettings())
    sb = FakeSandbox()
    table = _table(sb, ring=4096, store=store)
    info = await table.start_command(argv=["yes"])
    p = sb.processes[0]
    expected = bytearray()
    for i in range(200):
        data = (f"line {i} " * 10 + "\n").encode()
        stream = "stderr" if i % 7 == 0 else "stdout"
        p.emit(stream, data)
        expected += data
    await _settle()
    log = table.get(info.process_id).output
    assert log is not None and log.ring_start > 0
    got = bytearray()
    offset = 0
    while offset < len(expected):
        chunks, offset, skipped = table.read(info.process_id, offset, limit=1000)
        assert skipped == 0
        got += _whole(chunks)
    assert bytes(got) == bytes(expected)
    # the streams' tags survive the spill
    err, _, _ = table.read(info.process_id, 0, limit=len(expected), select="stderr")
    assert all(c.stream == "stderr" for c in err) and _whole(err).startswith(b"line 0 ")
    p.finish(0)
    await _settle()
    ended = table.get(info.process_id).info()
    assert ended.state is ProcessState.EXITED and ended.exit_code == 0
    assert ended.output_artifact_id
    assert store.read(ended.output_artifact_id, "alice") == bytes(expected)
    # the whole output is in the artifact: the ring is let go, reads come from it
    assert ended.ring_start == len(expected)
    chunks, _, _ = table.read(info.process_id, 0, limit=100)
    assert _whole(chunks) == bytes(expected[:100])
    tail, nxt, _ = table.read(info.process_id, len(expected) - 50)
    assert _whole(tail) == bytes(expected[-50:]) and nxt == len(expected)
    got = bytearray()
    offset = 0
    while offset < len(expected):
        chunks, offset, _ = table.read(info.process_id, offset, select="stderr")
        got += _whole(chunks)
    assert bytes(got) == b"".join(
        (f"line {i} " * 10 + "\n").encode() for i in range(200) if i % 7 == 0
    )
    store.close()


async def test_without_a_store_what_the_ring_drops_is_skipped_and_said() -> None:
    log = OutputLog(4096, None)
    log.append("stdout", b"a" * 5000)
    log.append("stdout", b"b" * 100)
    chunks, nxt, skipped = log.read(0)
    assert skipped == 5100 - 4096 and chunks[0].offset == skipped and chunks[0].skipped == skipped
    assert nxt == 5100


async def test_follow_reattaches_with_no_byte_lost_or_repeated() -> None:
    sb = FakeSandbox()
    table = _table(sb, ring=1 << 20)
    info = await table.start_command("server")
    p = sb.processes[0]
    whole = b"".join(f"{i}\n".encode() for i in range(300))

    async def produce() -> None:
        for i in range(300):
            p.emit("stdout" if i % 2 else "stderr", f"{i}\n".encode())
            if i % 10 == 0:
                await asyncio.sleep(0.001)
        p.finish(0)

    producer = asyncio.create_task(produce())
    got = bytearray()
    offset = 0
    follower = table.follow(info.process_id, 0)
    async for chunk in follower:
        assert chunk.offset == offset
        got += chunk.data
        offset = chunk.end
        if len(got) > 200:
            break  # the stream drops mid-way
    await follower.aclose()
    async for chunk in table.follow(info.process_id, offset):
        assert chunk.offset == offset
        got += chunk.data
        offset = chunk.end
    await producer
    assert bytes(got) == whole


async def test_follow_past_the_end_waits_for_output() -> None:
    sb = FakeSandbox()
    table = _table(sb)
    info = await table.start_command("x")
    p = sb.processes[0]

    async def first() -> bytes:
        async for chunk in table.follow(info.process_id, 3):
            return chunk.data
        return b""

    task = asyncio.create_task(first())
    await _settle()
    assert not task.done()
    p.emit("stdout", b"abcdef")
    assert await asyncio.wait_for(task, 2) == b"def"


async def test_limits_stdin_signals_and_stop() -> None:
    sb = FakeSandbox(pids=3)
    table = _table(sb, max_processes=2)
    a = await table.start_command("a")
    await table.start_command("b")
    with pytest.raises(ProcessLimitError, match="max_processes"):
        await table.start_command("c")
    table2 = _table(sb, max_processes=10)
    await table2.start_command("c")
    with pytest.raises(ProcessLimitError, match="pids limit"):
        await table2.start_command("d")
    await table.write(a.process_id, b"hello", eof=True)
    assert sb.processes[0].stdin == b"hello" and sb.processes[0].stdin_closed
    sb.processes[0].ignore_term = True
    stopped = await table.stop(a.process_id, grace_s=0.05)
    assert sb.processes[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert stopped.state is ProcessState.EXITED and stopped.signal == signal.SIGKILL
    with pytest.raises(InvalidRequestError, match="no more input"):
        await table.write(a.process_id, b"x")
    with pytest.raises(ProcessNotFoundError, match="no process 'p-000000000000'"):
        table.get("p-000000000000")
    listed = await table.list()
    assert [i.state for i in listed] == [ProcessState.EXITED, ProcessState.RUNNING]
    assert listed[1].cpu_s == 0.5 and listed[1].memory_bytes == 4096


async def test_end_all_kills_and_lists_what_ended() -> None:
    sb = FakeSandbox()
    table = _table(sb)
    a = await table.start_command("a")
    b = await table.start_command("b")
    sb.processes[1].finish(3)
    await _settle()
    ended = await table.end_all("reset")
    assert [i.process_id for i in ended] == [a.process_id]
    assert ended[0].state is ProcessState.KILLED
    assert table.get(b.process_id).info().exit_code == 3
    assert await table.end_all("reset") == []
    # killed by the sandbox's sweep before end_all: still named once
    c = await table.start_command("c")
    sb.processes[2].finish(None, signal.SIGKILL, killed=True)
    await _settle()
    assert [i.process_id for i in await table.end_all("closed")] == [c.process_id]
    with pytest.raises(SandboxError):
        await table.start_command("d")


def test_bad_input() -> None:
    with pytest.raises(InvalidRequestError, match="exactly one"):
        command_argv("", [])
    with pytest.raises(InvalidRequestError, match="exactly one"):
        command_argv("ls", ["ls"])
    with pytest.raises(InvalidRequestError, match="at most 4096"):
        command_argv("", [""] * 5000)
    assert command_argv("", ["ls", "a b"])[1] == "ls 'a b'"
    assert command_argv("echo hi", [])[0][-1] == "echo hi"
    with pytest.raises(InvalidRequestError, match="'='"):
        check_env({"A=B": "x"})
    with pytest.raises(InvalidRequestError, match="NUL"):
        check_env({"A": "x\0"})
    assert parse_signal("term") == signal.SIGTERM and parse_signal("SIGINT") == signal.SIGINT
    assert parse_signal(9) == 9 and parse_signal(None) == signal.SIGTERM
    with pytest.raises(InvalidRequestError):
        parse_signal("NOPE")


async def test_cwd_outside_the_workspace_is_refused() -> None:
    table = _table(FakeSandbox())
    for bad in ("/etc", "../x", "a/../../b"):
        with pytest.raises(InvalidPathError):
            await table.start_command("ls", cwd=bad)


async def test_every_ring_together_stays_within_the_daemons_budget(tmp_path: Path) -> None:
    """Many sessions x processes x rings cannot hold more than the budget (plus
    a small ring each): the process writing past it lets go of its oldest bytes,
    which its artifact keeps readable."""
    store = ArtifactStore.open(tmp_path / "a", ArtifactSettings())
    budget = RingBudget(256 * 1024)
    sb = FakeSandbox()
    tables = [_table(sb, ring=128 * 1024, store=store, budget=budget) for _ in range(4)]
    infos = [await t.start_command("yes", name="y") for t in tables]
    whole = bytes(range(256)) * 512  # 128 KiB each
    for p in sb.processes:
        p.emit("stdout", whole)
        await _settle()
    assert budget.held <= budget.limit + MIN_RING_BYTES * len(tables)
    # Every offset of every process is still readable, from its artifact.
    for table, info in zip(tables, infos, strict=True):
        chunks, nxt, skipped = table.read(info.process_id, 0)
        assert (_whole(chunks), nxt, skipped) == (whole, len(whole), 0)
    # Processes forgotten or sessions ended give their bytes back.
    for table in tables:
        await table.end_all("closed")
    assert budget.held == 0
