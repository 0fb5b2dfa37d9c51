"""What a call makes into artifacts, daemon side: its output spilled whole past
the head and tail, a result too large offloaded to a preview, and the artifact
frames a sandbox sends (checked, bounded, in order) written to the store."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_call_results import make_call, python_tool
from tests.unit.test_calls import user_tool
from tests.unit.test_channels import OK
from tooljail import StreamKind
from tooljail.errors import ArtifactNotFoundError
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.calls import Call, results
from tooljaild.calls.artifacts import PREVIEW_BYTES
from tooljaild.sandbox import runner_channel
from tooljaild.sandbox.base import ArtifactPart, RunOutcome, RunRequest, Termination
from tooljaild.sandbox.channels import FrameChannel
from tooljaild.sandbox.frames import (
    MAX_ARTIFACT_PART_BYTES,
    MAX_ARTIFACTS_PER_CALL,
    MAX_FRAME_BYTES,
    MAX_FRAME_CONTAINERS,
    CallFrames,
)
from tooljaild.sandbox.runner_channel import PipeEnds, RunnerPipes
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.settings.artifacts import ArtifactSettings
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.registry import Tool

KiB = 1024


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ArtifactStore]:
    opened = ArtifactStore.open(tmp_path / "artifacts", ArtifactSettings(offload_bytes=1000))
    yield opened
    opened.close()


def call_with(
    store: ArtifactStore,
    tmp_path: Path,
    tool: Tool | None = None,
    *,
    output_bytes: int = 4 * KiB,
    output_limit_bytes: int = 0,
) -> Call:
    settings = Settings(state_dir=tmp_path, pool_size=0)
    limits = Limits(output_bytes=output_bytes, output_limit_bytes=output_limit_bytes)
    call = Call("c1", tool or python_tool(), {}, "fp", 5.0, settings, limits, "me", store)
    call.session_id = "s1"
    return call


RETURNED = RunOutcome(Termination.RETURNED, value_kind="none")


# ------------------------------------------------------------------ output spill


async def test_small_output_makes_no_artifact_and_no_file(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path)
    call.sink(StreamKind.STDOUT, b"x" * (2 * KiB))  # exactly what the head and tail keep
    call.sink(StreamKind.STDERR, b"warning\n")
    result = results.result_of(call, RETURNED, None)
    assert not result.truncated and result.artifacts == ()
    assert result.message == ""
    assert [p.name for p in (tmp_path / "artifacts").iterdir() if p.is_dir()] == []


async def test_output_past_the_head_and_tail_is_spilled_whole_per_stream(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path)
    written = b"".join(b"line %06d\n" % i for i in range(5000))
    for i in range(0, len(written), 777):  # chunks that straddle the first drop
        call.sink(StreamKind.STDOUT, written[i : i + 777])
    call.sink(StreamKind.STDERR, b"small\n")
    result = results.result_of(call, RETURNED, None)
    assert result.truncated
    assert "truncated" in result.data["stdout"]
    (ref,) = result.artifacts
    assert (ref.name, ref.mime_type, ref.size_bytes) == ("stdout.txt", "text/plain", len(written))
    assert store.read(ref.artifact_id, "me") == written  # the middle is not lost
    info = store.get(ref.artifact_id, "me")
    assert (info.call_id, info.session_id, info.source) == ("c1", "s1", "output")
    assert ref.artifact_id in result.message and "read_artifact" in result.message
    # Built again (a final result after "still running"): the same artifacts, once.
    again = results.result_of(call, RETURNED, None)
    assert again.artifacts == result.artifacts


async def test_both_streams_spill_to_their_own_artifacts(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path)
    out, err = b"o" * (10 * KiB), b"e" * (3 * KiB)
    call.sink(StreamKind.STDOUT, out)  # one chunk larger than everything kept
    call.sink(StreamKind.STDERR, err)
    refs = {r.name: r for r in results.result_of(call, RETURNED, None).artifacts}
    assert store.read(refs["stdout.txt"].artifact_id, "me") == out
    assert store.read(refs["stderr.txt"].artifact_id, "me") == err


async def test_the_spill_stops_at_the_output_limit(store: ArtifactStore, tmp_path: Path) -> None:
    call = call_with(store, tmp_path, output_limit_bytes=10 * KiB)
    for _ in range(20):
        call.sink(StreamKind.STDOUT, b"y" * KiB)
    result = results.result_of(call, RETURNED, call.stop_reason)
    (ref,) = result.artifacts
    assert ref.size_bytes == 10 * KiB


async def test_an_unfinished_call_leaves_nothing_behind(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path)
    call.sink(StreamKind.STDOUT, b"z" * (10 * KiB))
    call.compact()  # ended without a result built (a bug of ours): the spill is dropped
    assert store.list("me") == []
    assert not list((tmp_path / "artifacts").rglob("*.part"))


# ------------------------------------------------------------------ result offload


def returned(value: Any) -> RunOutcome:
    return RunOutcome(Termination.RETURNED, value_kind="json", value=value)


async def test_a_large_result_becomes_a_preview_and_an_artifact(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path, user_tool())
    value = [{"n": i, "s": "é" * 5} for i in range(2000)]
    result = results.result_of(call, returned(value), None)
    (ref,) = result.artifacts
    assert (ref.name, ref.mime_type) == ("result.json", "application/json")
    stored = store.read(ref.artifact_id, "me")
    assert json.loads(stored) == value
    assert isinstance(result.data, str) and len(result.data.encode()) <= PREVIEW_BYTES
    assert stored.decode().startswith(result.data)
    assert stored.decode()[len(result.data)] == "\n"  # whole lines, as read_artifact counts
    assert f"first {result.data.count(chr(10)) + 1} lines" in result.message
    assert ref.artifact_id in result.message and "read_artifact" in result.message
    assert store.get(ref.artifact_id, "me").source == "result"


async def test_a_result_within_the_bound_is_returned_whole(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path, user_tool())
    result = results.result_of(call, returned(list(range(100))), None)
    assert result.data == list(range(100)) and result.artifacts == ()


async def test_an_envelopes_data_is_offloaded_and_its_message_kept(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path, user_tool())
    envelope = {"status": "success", "data": "d" * 5000, "message": "Found it."}
    result = results.result_of(call, returned(envelope), None)
    assert result.message.startswith("Found it. The result")
    assert json.loads(store.read(result.artifacts[0].artifact_id, "me")) == "d" * 5000


async def test_the_python_tools_data_is_never_offloaded(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path, output_bytes=64 * KiB)
    call.sink(StreamKind.STDOUT, b"p" * 5000)  # over offload_bytes, within the head and tail
    result = results.result_of(call, RETURNED, None)
    assert result.data["stdout"] == "p" * 5000 and result.artifacts == ()


async def test_without_a_store_nothing_changes(tmp_path: Path) -> None:
    call = make_call(tmp_path)
    call.sink(StreamKind.STDOUT, b"q" * 100_000)
    result = results.result_of(call, returned(["v"] * 100_000), None)
    assert result.artifacts == () and len(result.data) == 100_000


# ------------------------------------------------------------------ frames from sandboxes


def frame(
    name: str = "plot.png",
    data: bytes = b"\x89PNG",
    part: int = 0,
    last: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "t": "artifact",
        "name": name,
        "mime_type": "image/png",
        "source": "figure",
        "data_b64": base64.b64encode(data).decode(),
        "part": part,
        "last": last,
        **extra,
    }


def frames_for(kind: str = "code", keep: bool = True) -> tuple[CallFrames, list[ArtifactPart]]:
    parts: list[ArtifactPart] = []

    def sink(part: ArtifactPart) -> bool:
        parts.append(part)
        return keep

    channel = FrameChannel(lambda item: None, MAX_FRAME_BYTES, MAX_FRAME_CONTAINERS)
    frames = CallFrames(kind, lambda k, d: None, channel, seal=False, keeper=True, artifacts=sink)
    channel.on_frame = frames.on_frame
    return frames, parts


@pytest.mark.parametrize("kind", ["code", "file", "user"])
async def test_artifact_parts_go_to_the_sink_in_order(kind: str) -> None:
    frames, parts = frames_for(kind)
    frames.on_frame(frame("a.csv", b"1,2\n", 0, False))
    frames.on_frame(frame("a.csv", b"3,4\n", 1, True))
    frames.on_frame(frame("b.png", b"PNG", 0, True))
    frames.on_frame(OK)
    frames.on_frame({"t": "exit", "code": 0, "signal": None})
    assert frames.broken is None and frames.artifact_count == 2
    assert [(p.name, p.data, p.part, p.last) for p in parts] == [
        ("a.csv", b"1,2\n", 0, False),
        ("a.csv", b"3,4\n", 1, True),
        ("b.png", b"PNG", 0, True),
    ]


async def test_the_largest_part_is_taken() -> None:
    frames, parts = frames_for()
    frames.on_frame(frame(data=b"\0" * MAX_ARTIFACT_PART_BYTES))
    assert frames.broken is None and len(parts[0].data) == MAX_ARTIFACT_PART_BYTES


@pytest.mark.parametrize(
    ("kind", "sent", "why"),
    [
        ("describe", [frame()], "from a 'describe' request"),
        ("workspace", [frame()], "from a 'workspace' request"),
        ("code", [frame(name="")], "name is not a string"),
        ("code", [frame(name="n" * 256)], "name is not a string"),
        ("code", [{**frame(), "mime_type": 5}], "mime_type is not a string"),
        ("code", [{**frame(), "source": "output"}], "from source 'output'"),
        ("code", [{**frame(), "data_b64": "!!!!"}], "not base64"),
        ("code", [{**frame(), "data_b64": None}], "without base64 data"),
        ("code", [frame(data=b"\0" * (MAX_ARTIFACT_PART_BYTES + 3))], "at most"),
        ("code", [{**frame(), "part": "0"}], "integer part"),
        ("code", [{**frame(), "part": True}], "integer part"),
        ("code", [{**frame(), "part": -1}], "integer part"),
        ("code", [{**frame(), "last": 1}], "boolean last"),
        ("code", [frame(part=1)], "part 1 of 'plot.png' out of order"),
        ("code", [frame(last=False), frame(part=2)], "out of order"),
        ("code", [frame(last=False), frame(name="other.png", part=1)], "names another"),
        ("code", [frame(last=False), frame(name="next.png")], "before the last part"),
        ("code", [frame(last=False), OK], "result frame before the last part"),
        ("code", [OK, frame()], "after the result frame"),
    ],
)
async def test_a_malformed_artifact_frame_is_a_protocol_error(
    kind: str, sent: list[dict[str, Any]], why: str
) -> None:
    frames, _parts = frames_for(kind)
    for item in sent:
        frames.on_frame(item)
    assert frames.done.done()
    assert frames.broken is not None and why in frames.broken, frames.broken
    assert len(frames.broken) < 200


async def test_more_than_64_artifacts_are_refused() -> None:
    frames, parts = frames_for()
    for i in range(MAX_ARTIFACTS_PER_CALL):
        frames.on_frame(frame(f"f{i}.png"))
    assert frames.broken is None
    frames.on_frame(frame("one-more.png"))
    assert frames.broken == f"more than {MAX_ARTIFACTS_PER_CALL} artifacts"
    assert len(parts) == MAX_ARTIFACTS_PER_CALL


@pytest.mark.parametrize("keep", [True, False])
async def test_kept_artifact_bytes_do_not_count_against_the_frame_budget(
    keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 20_000
    monkeypatch.setattr(runner_channel, "MAX_FRAME_BYTES_PER_CALL", budget)
    frames, parts = frames_for(keep=keep)
    frames._channel.limit(budget)
    for i in range(5):  # 5 x 8 KiB of base64: twice the budget
        line = json.dumps(frame(f"f{i}.bin", b"\1" * 6000)).encode() + b"\n"
        frames._channel.data_received(line)
    if keep:
        assert frames.broken is None and len(parts) == 5
    else:  # dropped by the store (past its bound): they eat the budget
        assert frames.broken == "more frame bytes than one call may send"


def write_parts(call: Call, *parts: ArtifactPart) -> list[bool]:
    assert call.made is not None
    return [call.made.part(p) for p in parts]


async def test_the_call_writes_parts_to_the_store_and_lists_them_in_its_result(
    store: ArtifactStore, tmp_path: Path
) -> None:
    call = call_with(store, tmp_path)
    request = call.with_artifacts(RunRequest("code", {"code": "pass"}))
    assert request.artifacts is not None
    kept = write_parts(
        call,
        ArtifactPart("report.csv", "text/csv", "outputs", b"a,b\n", 0, False),
        ArtifactPart("report.csv", "text/csv", "outputs", b"1,2\n", 1, True),
        ArtifactPart("fig.png", "image/png", "figure", b"PNG", 0, True),
    )
    assert kept == [True, True, True]
    result = results.result_of(call, RETURNED, None)
    assert [r.name for r in result.artifacts] == ["report.csv", "fig.png"]
    assert store.read(result.artifacts[0].artifact_id, "me") == b"a,b\n1,2\n"
    info = store.get(result.artifacts[1].artifact_id, "me")
    assert (info.call_id, info.source, info.tool) == ("c1", "figure", "execute_python_code")
    with pytest.raises(ArtifactNotFoundError):
        store.get(result.artifacts[1].artifact_id, "someone-else")


async def test_a_part_past_the_per_artifact_bound_is_cut_and_said(tmp_path: Path) -> None:
    small = ArtifactStore.open(tmp_path / "a", ArtifactSettings(max_artifact_bytes=1024))
    try:
        call = call_with(small, tmp_path)
        kept = write_parts(
            call,
            ArtifactPart("big.bin", "application/octet-stream", "outputs", b"1" * 1000, 0, False),
            ArtifactPart("big.bin", "application/octet-stream", "outputs", b"2" * 1000, 1, True),
        )
        assert kept == [True, False]
        result = results.result_of(call, RETURNED, None)
        assert result.artifacts[0].size_bytes == 1024
        assert "cut at 1024 bytes" in result.message
    finally:
        small.close()


async def test_an_artifact_left_unfinished_is_dropped(store: ArtifactStore, tmp_path: Path) -> None:
    call = call_with(store, tmp_path)
    write_parts(call, ArtifactPart("half.bin", "x/y", "outputs", b"h", 0, False))
    call.compact()  # the call was killed mid-artifact
    assert store.list("me") == []
    assert not list((tmp_path / "artifacts").rglob("*.part"))


# ------------------------------------------------------------------ in a session


class _Sandbox:
    """What SessionSandbox needs of its RunnerSandbox, for hand-fed frames."""

    id = "fake-session"

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True

    async def outcome_of(self, frames: CallFrames) -> RunOutcome:
        if frames.broken is not None:
            return RunOutcome(Termination.RUNNER_LOST)
        return RunOutcome(Termination.RETURNED, value_kind="none")

    def usage_from_now(self) -> None:
        pass

    def measure(self, outcome: RunOutcome) -> None:
        pass


class _Session:
    """A SessionSandbox on real pipes, whose frame pipe the test writes."""

    def __init__(self) -> None:
        ends = PipeEnds().__enter__()
        self.frames_w = ends.theirs[3]  # request, stdout, stderr, frames
        self._theirs = ends.theirs
        self.pipes = RunnerPipes(*ends.ours)
        self.sandbox = _Sandbox()
        self.session = SessionSandbox(self.sandbox, self.pipes)  # type: ignore[arg-type]
        self.pipes.frames.on_frame = self.session._on_frame

    def write(self, *frames: dict[str, Any]) -> None:
        for item in frames:
            os.write(self.frames_w, b"\n" + json.dumps(item).encode() + b"\n")

    def close(self) -> None:
        self.pipes.close()
        for fd in self._theirs:
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.fixture
async def session_pipes() -> AsyncIterator[_Session]:
    fake = _Session()
    yield fake
    fake.close()


RESULT_1 = {**OK, "seq": 1, "reset": False, "resets": 0}


def _tag(session_pipes: _Session) -> str:
    """The running call's tag: every frame of the call must carry it."""
    running = session_pipes.session._call
    assert running is not None
    return running.tag


async def test_a_sessions_artifact_frames_reach_the_calls_sink(session_pipes: _Session) -> None:
    parts: list[ArtifactPart] = []
    request = RunRequest("code", {"code": "pass"}, artifacts=lambda p: parts.append(p) is None)
    waiting = session_pipes.session.begin(request, lambda k, d: None)
    tag = _tag(session_pipes)
    session_pipes.write(
        {**frame("fig.png", b"P1", 0, False), "seq": 1, "tag": tag},
        {**frame("fig.png", b"P2", 1, True), "seq": 1, "tag": tag},
        {**RESULT_1, "tag": tag},
    )
    end = await asyncio.wait_for(waiting, 10)
    assert end.outcome.termination is Termination.RETURNED
    assert [(p.name, p.data, p.part) for p in parts] == [
        ("fig.png", b"P1", 0),
        ("fig.png", b"P2", 1),
    ]
    assert not session_pipes.sandbox.closed


async def test_artifact_frames_of_no_call_or_another_are_dropped(
    session_pipes: _Session,
) -> None:
    """A frame without the running call's seq and tag is nobody's: dropped and
    counted, never the call's, and the session lives on (issue 21, finding 7)."""
    parts: list[ArtifactPart] = []
    request = RunRequest("code", {"code": "pass"}, artifacts=lambda p: parts.append(p) is None)
    waiting = session_pipes.session.begin(request, lambda k, d: None)
    tag = _tag(session_pipes)
    session_pipes.write(
        frame(),  # no seq, no tag
        {**frame(), "seq": 2, "tag": tag},  # a later call's seq
        {**frame(), "seq": 1, "tag": "f" * 32},  # a forged tag
        {**RESULT_1, "tag": "f" * 32},  # a forged result
        {**RESULT_1, "tag": tag},
    )
    end = await asyncio.wait_for(waiting, 10)
    assert end.outcome.termination is Termination.RETURNED
    assert parts == []
    assert session_pipes.session.stale_frames == 4
    assert not session_pipes.sandbox.closed


@pytest.mark.parametrize(
    ("kind", "sent", "why"),
    [
        ("workspace", [{**frame(), "seq": 1}], "from a 'workspace' request"),
        ("code", [{**frame(part=1), "seq": 1}], "out of order"),
    ],
)
async def test_a_bad_artifact_frame_in_a_session_ends_it(
    session_pipes: _Session, kind: str, sent: list[dict[str, Any]], why: str
) -> None:
    parts: list[ArtifactPart] = []
    payload: dict[str, Any] = {"code": "pass"} if kind == "code" else {"op": "ls", "args": {}}
    request = RunRequest(kind, payload, artifacts=lambda p: parts.append(p) is None)  # type: ignore[arg-type]
    waiting = session_pipes.session.begin(request, lambda k, d: None)
    running = session_pipes.session._call
    assert running is not None
    session_pipes.write(*({**item, "tag": running.tag} for item in sent))
    end = await asyncio.wait_for(waiting, 10)
    assert end.outcome.termination is Termination.RUNNER_LOST
    assert running.frames.broken is not None and why in running.frames.broken
    assert session_pipes.sandbox.closed  # a broken runner ends its session
    assert parts == []
