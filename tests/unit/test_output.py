"""What a call keeps of its output, and how readers follow it."""

from __future__ import annotations

import asyncio

from tooljail import StreamKind
from tooljaild.calls.output import EVENT_OVERHEAD_BYTES, EventLog, HeadTail


def test_head_tail_keeps_everything_under_the_limit() -> None:
    kept = HeadTail(100)
    kept.add(b"hello ")
    kept.add(b"world")
    assert kept.text() == "hello world"
    assert not kept.truncated
    assert kept.total == 11


def test_head_tail_keeps_both_ends_and_marks_the_gap() -> None:
    kept = HeadTail(20)
    kept.add(b"HEAD------")
    for _ in range(1000):
        kept.add(b"x" * 100)
    kept.add(b"------TAIL")
    text = kept.text()
    assert text.startswith("HEAD------\n[... ")
    assert text.endswith("\n------TAIL")
    assert kept.truncated
    assert kept.total == 100_020
    assert "100000 bytes truncated" in text


async def test_event_log_replays_then_follows_live() -> None:
    log = EventLog(1024)
    log.append(StreamKind.STDOUT, b"a")

    async def read() -> list[tuple[int, bytes]]:
        return [(e.seq, e.data) async for e in log.follow()]

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.01)
    log.append(StreamKind.STDERR, b"b")
    log.close()
    assert await reader == [(1, b"a"), (2, b"b")]


async def test_slow_reader_is_told_what_it_missed() -> None:
    log = EventLog(2 * (4 + EVENT_OVERHEAD_BYTES))  # room for two 4-byte chunks
    for i in range(10):
        log.append(StreamKind.STDOUT, f"{i:04d}".encode())
    log.close()
    events = [e async for e in log.follow(1)]
    assert events[0].stream is StreamKind.NOTICE
    assert b"8 output chunks dropped" in events[0].data
    assert [e.seq for e in events[1:]] == [9, 10]


async def test_reader_stops_where_the_callers_result_stands() -> None:
    log = EventLog(1024)
    until: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def read() -> list[bytes]:
        return [e.data async for e in log.follow(1, until=until)]

    reader = asyncio.create_task(read())
    log.append(StreamKind.STDOUT, b"before")
    await asyncio.sleep(0.01)
    until.set_result(None)  # the caller got its (timeout) result
    await asyncio.sleep(0.01)
    log.append(StreamKind.STDOUT, b"after")  # printed by the call running on detached
    assert await asyncio.wait_for(reader, 1) == [b"before"]


def test_a_character_across_the_head_tail_split_survives() -> None:
    kept = HeadTail(10)
    kept.add(b"abcd" + "é".encode() + b"xyz")  # é straddles byte 5
    assert kept.text() == "abcdéxyz"


async def test_a_reader_behind_keeps_its_place_while_chunks_arrive() -> None:
    """Chunks appended while a reader handles its notice are neither lost nor misplaced."""
    log = EventLog(max_bytes=4 * (1024 + EVENT_OVERHEAD_BYTES))
    for _ in range(10):
        log.append(StreamKind.STDOUT, b"x" * 1024)
    reader = log.follow(1)
    notice = await reader.__anext__()
    assert notice.stream is StreamKind.NOTICE and b"6 output chunks dropped" in notice.data
    for _ in range(10):
        log.append(StreamKind.STDOUT, b"y" * 1024)
    log.close()
    rest = [e async for e in reader]
    notices = [e for e in rest if e.stream is StreamKind.NOTICE]
    seqs = [e.seq for e in rest if e.stream is not StreamKind.NOTICE]
    assert seqs == list(range(17, 21))
    assert b"10 output chunks dropped" in notices[0].data
    # Every chunk is either read or counted in a notice: nothing vanishes.
    assert 6 + 10 + len(seqs) == 20


async def test_chunks_dropped_from_the_front_are_freed_at_once() -> None:
    import tracemalloc

    log = EventLog(max_bytes=1 << 20)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):  # 250 MiB through a 1 MiB log, in 256 KiB chunks
            log.append(StreamKind.STDOUT, b"x" * (256 << 10))
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 4 << 20, f"the log holds {held >> 20} MiB"
    assert log.last_seq == 1000
    assert log.first_seq > 990


async def test_a_flood_of_tiny_chunks_keeps_the_log_within_its_budget() -> None:
    """One byte at a time: the chunks' bookkeeping counts, not only their bytes."""
    budget = 64 * 1024
    log = EventLog(budget)
    for _ in range(200_000):
        log.append(StreamKind.STDOUT, b"x")
    kept = log.last_seq - log.first_seq + 1
    assert kept * (1 + EVENT_OVERHEAD_BYTES) <= budget
    assert kept == budget // (1 + EVENT_OVERHEAD_BYTES)
