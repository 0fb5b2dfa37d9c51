"""The daemon's ends of a sandbox's pipes: a request written whole, output read to
its end; and the frame pipe read as a hostile sandbox writes it (runner_channel)."""

from __future__ import annotations

import asyncio
import os

import pytest

from tooljail import StreamKind
from tooljaild.sandbox.channels import FrameChannel, FrameItem, Malformed, PipeReader, PipeWriter
from tooljaild.sandbox.frames import (
    MAX_FRAME_BYTES,
    MAX_FRAME_CONTAINERS,
    MAX_FRAMES_PER_CALL,
    CallFrames,
)


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.ended: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set_result(exc)


async def test_a_request_larger_than_the_pipe_arrives_whole_then_end_of_file() -> None:
    """A 5 MiB request (a pipe holds 64 KiB) goes in as the reader makes room."""
    r, w = os.pipe()
    request = bytes(range(256)) * (5 * 4096)
    reader = _Collect()
    PipeReader(r, reader)
    writer = PipeWriter(w)
    writer.write_and_close(request)
    assert writer.is_closing()  # the rest is pending
    assert await asyncio.wait_for(reader.ended, 10) is None
    assert bytes(reader.data) == request
    assert writer.is_closing()


async def test_a_request_to_a_reader_that_is_gone_is_dropped_quietly() -> None:
    r, w = os.pipe()
    os.close(r)
    writer = PipeWriter(w)
    writer.write_and_close(b"x" * 100_000)  # EPIPE: nothing to tell, nothing raised
    assert writer.is_closing()
    writer.close()  # and closing again is harmless


async def test_closing_a_reader_tells_its_protocol_once() -> None:
    r, w = os.pipe()
    collect = _Collect()
    reader = PipeReader(r, collect)
    os.write(w, b"early")
    await asyncio.sleep(0.05)
    reader.close()
    reader.close()
    assert await collect.ended is None
    assert bytes(collect.data) == b"early"
    os.close(w)


# ------------------------------------------------------------ the frame pipe, hostile


class _Frames:
    """A FrameChannel fed by hand, and what it delivered."""

    def __init__(self, max_bytes: int = 1024, max_containers: int = 100) -> None:
        self.items: list[FrameItem] = []
        self.channel = FrameChannel(self.items.append, max_bytes, max_containers)

    def feed(self, *chunks: bytes) -> list[FrameItem]:
        for chunk in chunks:
            self.channel.data_received(chunk)
        return self.items


def _reasons(items: list[FrameItem]) -> list[str]:
    return [item.reason for item in items if isinstance(item, Malformed)]


async def test_frames_split_across_reads_arrive_whole_and_empty_lines_are_skipped() -> None:
    got = _Frames().feed(b'\n{"t": "rea', b'dy", "worker": 2}\n\n\n{"t"', b': "x"}\n')
    assert got == [{"t": "ready", "worker": 2}, {"t": "x"}]


async def test_a_line_past_the_bound_is_dropped_unheld_and_the_next_frame_counts() -> None:
    frames = _Frames(max_bytes=1024)
    got = frames.feed(b"x" * 700, b"y" * 700, b"z" * 100_000, b'z\n{"t": "ok"}\n')
    assert _reasons(got) == ["a line longer than 1024 bytes"]
    assert got[-1] == {"t": "ok"}
    assert len(frames.channel._buffer) == 0  # the rest of the long line was never held


async def test_lines_that_are_no_frames_are_reported_never_raised() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # RecursionError inside json
    got = _Frames(max_bytes=10**6).feed(
        b"\xff\xfe not utf-8\n",
        b"not json\n",
        b"[1, 2]\n",
        b"9" * 5000 + b"\n",  # an int past Python's digit limit
        deep + b"\n",
    )
    assert _reasons(got) == [
        "a line that is not UTF-8",
        "a line that is not JSON",
        "a JSON line that is not an object",
        "a line that is not JSON",
        "a line that is not JSON",
    ]


async def test_a_line_of_many_containers_is_refused_before_it_is_parsed() -> None:
    line = b'{"t": "result", "v": [' + b"{}," * 200_000 + b"{}]}\n"
    got = _Frames(max_bytes=10**6, max_containers=1000).feed(line)
    assert _reasons(got) == ["more than 1000 JSON arrays and objects"]


async def test_past_its_byte_budget_the_pipe_is_refused_once_and_discarded() -> None:
    frames = _Frames()
    frames.channel.limit(100)
    got = frames.feed(b"\n" * 60, b"\n" * 60, b'{"t": "late"}\n')
    assert got == [Malformed("more frame bytes than one call may send", fatal=True)]


def _call(
    kind: str = "code", *, seal: bool = False, keeper: bool = True
) -> tuple[CallFrames, list[tuple[StreamKind, bytes]]]:
    out: list[tuple[StreamKind, bytes]] = []
    channel = FrameChannel(lambda item: None, MAX_FRAME_BYTES, MAX_FRAME_CONTAINERS)
    frames = CallFrames(kind, lambda k, d: out.append((k, d)), channel, seal=seal, keeper=keeper)
    channel.on_frame = frames.on_frame
    return frames, out


OK = {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
FAILED = {
    "t": "result",
    "ok": False,
    "exit_code": 1,
    "error": {"type": "ValueError", "message": "m", "traceback": "tb"},
}


async def test_a_generator_tools_yields_go_to_the_sink_and_its_exit_ends_the_call() -> None:
    frames, out = _call("user")
    for frame in ({"t": "yield", "v": {"a": 1}}, {"t": "yield", "v": None}, OK):
        frames.on_frame(frame)
    assert not frames.done.done()
    frames.on_frame({"t": "exit", "code": 0, "signal": None})
    assert frames.done.done() and frames.broken is None
    assert out == [(StreamKind.YIELD, b'{"a": 1}'), (StreamKind.YIELD, b"null")]
    assert frames.yields == 2 and frames.result == OK


@pytest.mark.parametrize(
    ("kind", "frame", "why"),
    [
        ("code", {"t": "yield", "v": 1}, "cannot yield"),
        ("file", {"t": "yield", "v": 1}, "cannot yield"),
        ("user", {"t": "yield"}, "without a value"),
        ("code", {"t": "ready", "worker": 2}, "type 'ready'"),
        ("code", {"t": "bogus" * 100}, "type 'bogusbogus"),
        ("code", {"t": None}, "type None"),
        ("code", {**OK, "ok": "yes"}, "boolean ok"),
        ("code", {**OK, "exit_code": "0"}, "integer exit_code"),
        ("code", {**OK, "exit_code": True}, "integer exit_code"),
        ("code", {**OK, "kind": "json", "value": [1]}, "which returns none"),
        ("user", {**OK, "kind": "pickle"}, "kind 'pickle'"),
        ("user", {**OK, "kind": "text", "value": 5}, "not of its kind"),
        ("user", {**OK, "kind": "none", "value": 5}, "not of its kind"),
        ("describe", {**OK, "kind": "json", "value": {}}, "not a list"),
        ("code", {**FAILED, "error": "boom"}, "well-formed error"),
        ("code", {**FAILED, "error": {"type": 1, "message": "", "traceback": ""}}, "error"),
        ("code", {**OK, "sealed": True}, "no seal was asked for"),
        ("code", {**OK, "sealed": "yes"}, "no seal was asked for"),
        ("code", {"t": "exit", "code": "0", "signal": None}, "integer code"),
    ],
)
async def test_a_frame_that_breaks_the_protocol_ends_the_call(
    kind: str, frame: dict[str, object], why: str
) -> None:
    frames, out = _call(kind)
    frames.on_frame(frame)
    assert frames.done.done()
    assert frames.broken is not None and why in frames.broken, frames.broken
    assert len(frames.broken) < 200  # what the sandbox wrote is not echoed whole
    assert out == []
    frames.on_frame(OK)  # and nothing after counts
    assert frames.result is None


async def test_an_exit_frame_where_no_keeper_writes_one_is_refused() -> None:
    frames, _ = _call("code", seal=True, keeper=False)
    frames.on_frame({"t": "exit", "code": 0, "signal": None})
    assert frames.broken == "a frame of type 'exit' during a call"


async def test_a_second_result_is_refused_and_a_sealed_one_ends_the_call() -> None:
    frames, _ = _call("code")
    frames.on_frame(OK)
    frames.on_frame(FAILED)
    assert frames.broken == "a second result frame"
    sealed, _ = _call("code", seal=True, keeper=False)
    sealed.on_frame({**OK, "sealed": True})
    assert sealed.done.done() and sealed.sealed and sealed.broken is None


async def test_lines_that_are_no_frames_are_skipped_but_bounded() -> None:
    frames, _ = _call("code")
    frames.on_frame(Malformed("a line that is not JSON"))
    assert not frames.done.done()
    for _ in range(MAX_FRAMES_PER_CALL):
        frames.on_frame(Malformed("a line that is not JSON"))
    assert frames.broken == f"more than {MAX_FRAMES_PER_CALL} lines of frames"


async def test_a_flood_of_yields_from_a_generator_is_bounded() -> None:
    frames, out = _call("user")
    for _ in range(MAX_FRAMES_PER_CALL + 10):
        frames.on_frame({"t": "yield", "v": 1})
    assert frames.broken == f"more than {MAX_FRAMES_PER_CALL} lines of frames"
    assert len(out) == MAX_FRAMES_PER_CALL
