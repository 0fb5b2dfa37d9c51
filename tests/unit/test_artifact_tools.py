"""The artifact tools' handlers on a real store in a temporary directory."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tooljaild.artifacts.store import ArtifactStore, Origin
from tooljaild.runner._workspace_read import MAX_READ_BYTES
from tooljaild.settings.artifacts import ArtifactSettings
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin import artifacts as artifact_tools
from tooljaild.tools.builtin.artifacts import (
    MAX_LISTED,
    list_artifacts,
    read_artifact,
    search_artifact,
    tail_artifact,
)
from tooljaild.tools.in_daemon import DaemonCall, Services, ToolFailure

OWNER = "agent-a"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ArtifactStore]:
    store = ArtifactStore.open(tmp_path / "artifacts", ArtifactSettings(max_bytes=4 * 1024**3))
    yield store
    store.close()


def _run(store: ArtifactStore, handler: Any, client: str = OWNER, **arguments: Any) -> Any:
    services = Services(settings=Settings(), artifacts=store)
    call = DaemonCall("call-1", handler.__name__, arguments, client, None, services)
    return asyncio.run(handler(call))


def _put_lines(store: ArtifactStore, count: int, name: str = "out.txt") -> str:
    data = "".join(f"line {i}\n" for i in range(1, count + 1)).encode()
    return store.put(name, "text/plain", data, Origin(OWNER, "c0"), "output").artifact_id


def test_read_pages_through_numbered_lines(store: ArtifactStore) -> None:
    artifact_id = _put_lines(store, 50)
    page = _run(store, read_artifact, artifact_id=artifact_id, offset=10, limit=5)
    assert page["content"].splitlines() == [f"{n:6}\tline {n}" for n in range(11, 16)]
    assert page["total_lines"] == 50
    assert page["lines"] == "11-15"
    assert "35 more lines left" in page["note"] and "offset=15" in page["note"]
    last = _run(store, read_artifact, artifact_id=artifact_id, offset=45)
    assert last["lines"] == "46-50" and "note" not in last
    past = _run(store, read_artifact, artifact_id=artifact_id, offset=80)
    assert "past the end" in past["note"] and "50 lines" in past["note"]


def test_read_is_bounded_in_bytes(store: ArtifactStore) -> None:
    line = "x" * 1000 + "\n"
    data = (line * 1000).encode()
    artifact_id = store.put("big", "text/plain", data, Origin(OWNER), "output").artifact_id
    page = _run(store, read_artifact, artifact_id=artifact_id)
    assert len(page["content"].encode()) <= MAX_READ_BYTES
    shown = int(page["lines"].split("-")[1])
    assert 100 < shown < 1000
    assert page["total_lines"] == 1000
    assert f"offset={shown}" in page["note"] and "KiB cap" in page["note"]


def test_tail_of_a_big_file_reads_only_its_end(store: ArtifactStore) -> None:
    count = 2_000_000  # ~26 MB
    artifact_id = _put_lines(store, count)
    tracemalloc.start()
    try:
        tail = _run(store, tail_artifact, artifact_id=artifact_id, lines=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tail["content"].splitlines() == [f"{n:6}\tline {n}" for n in range(count - 2, count + 1)]
    assert tail["total_lines"] == count
    assert tail["lines"] == f"{count - 2}-{count}"
    assert "read_artifact" in tail["note"]
    assert peak < 4 * 1024 * 1024  # blocks, not the 26 MB


def test_tail_without_a_final_newline_and_of_a_short_file(store: ArtifactStore) -> None:
    artifact_id = store.put("t", "text/plain", b"a\nb\nc", Origin(OWNER), "output").artifact_id
    tail = _run(store, tail_artifact, artifact_id=artifact_id, lines=10)
    assert tail["content"] == "     1\ta\n     2\tb\n     3\tc\n"
    assert "note" not in tail
    empty = store.put("e", "text/plain", b"", Origin(OWNER), "output").artifact_id
    assert _run(store, tail_artifact, artifact_id=empty)["note"] == "The artifact is empty."


def test_search_finds_lines_with_their_numbers(store: ArtifactStore) -> None:
    artifact_id = _put_lines(store, 100_000)
    found = _run(store, search_artifact, artifact_id=artifact_id, pattern=r"^line 5000\d$")
    assert found["matches"].splitlines() == [f"{n}:line {n}" for n in range(50000, 50010)]
    assert found["match_count"] == 10 and found["total_lines"] == 100_000
    many = _run(store, search_artifact, artifact_id=artifact_id, pattern="7")
    assert len(many["matches"].splitlines()) == 200
    assert many["match_count"] > 200 and "first 200" in many["note"]
    none = _run(store, search_artifact, artifact_id=artifact_id, pattern="nothing")
    assert none["match_count"] == 0 and "No line" in none["note"]


def test_a_bad_regex_is_a_clear_failure(store: ArtifactStore) -> None:
    artifact_id = _put_lines(store, 3)
    with pytest.raises(ToolFailure) as failure:
        _run(store, search_artifact, artifact_id=artifact_id, pattern="(unclosed")
    assert failure.value.type == "InvalidPattern"
    assert "not a valid regular expression" in failure.value.message


def test_another_clients_artifact_is_not_found(store: ArtifactStore) -> None:
    artifact_id = _put_lines(store, 3)
    for handler, extra in (
        (read_artifact, {}),
        (tail_artifact, {}),
        (search_artifact, {"pattern": "line"}),
    ):
        with pytest.raises(ToolFailure) as failure:
            _run(store, handler, client="agent-b", artifact_id=artifact_id, **extra)
        assert failure.value.type == "ArtifactNotFound"
        assert "line" not in failure.value.message.replace("list_artifacts", "")
    assert _run(store, list_artifacts, client="agent-b")["artifacts"] == []


def test_a_gone_artifact_says_why(store: ArtifactStore) -> None:
    deleted = _put_lines(store, 3)
    store.delete(deleted, OWNER)
    with pytest.raises(ToolFailure) as failure:
        _run(store, read_artifact, artifact_id=deleted)
    assert failure.value.type == "ArtifactGone" and "deleted" in failure.value.message
    # Its file removed under the index (evicted between lookup and read).
    evicted = _put_lines(store, 3)
    store.path(evicted, OWNER).unlink()
    with pytest.raises(ToolFailure) as failure:
        _run(store, tail_artifact, artifact_id=evicted)
    assert failure.value.type == "ArtifactGone" and "evicted" in failure.value.message


def test_an_image_is_described_not_dumped(store: ArtifactStore) -> None:
    artifact_id = store.put("plot.png", "image/png", PNG, Origin(OWNER), "figure").artifact_id
    for handler, extra in ((read_artifact, {}), (search_artifact, {"pattern": "x"})):
        answer = _run(store, handler, artifact_id=artifact_id, **extra)
        assert answer["binary"] is True and answer["type"] == "PNG image"
        assert "content" not in answer and "matches" not in answer
        assert "\\x" not in str(answer["note"]) and "get_artifact" in answer["note"]
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"></svg>\n'
    svg_id = store.put("p.svg", "image/svg+xml", svg, Origin(OWNER), "figure").artifact_id
    assert "<svg" in _run(store, read_artifact, artifact_id=svg_id)["content"]


def test_list_is_the_callers_newest_first_and_bounded(store: ArtifactStore) -> None:
    first = store.put("a", "text/plain", b"a", Origin(OWNER, "c1", "s1"), "output")
    second = store.put("b", "text/plain", b"b", Origin(OWNER, "c2"), "result")
    store.put("x", "text/plain", b"x", Origin("agent-b", "c1"), "output")
    listed = _run(store, list_artifacts)
    ids = [a["artifact_id"] for a in listed["artifacts"]]
    assert ids == [second.artifact_id, first.artifact_id]
    assert listed["artifacts"][1]["session_id"] == "s1"
    assert [a["name"] for a in _run(store, list_artifacts, call_id="c1")["artifacts"]] == ["a"]
    assert _run(store, list_artifacts, session_id="s1")["count"] == 1
    for i in range(MAX_LISTED):
        store.put(f"n{i}", "text/plain", b"n", Origin(OWNER), "output")
    bounded = _run(store, list_artifacts)
    assert len(bounded["artifacts"]) == MAX_LISTED and bounded["count"] == MAX_LISTED
    assert "call_id" in bounded["note"] and bounded["next_page_token"] in bounded["note"]
    rest = _run(store, list_artifacts, page_token=bounded["next_page_token"])
    assert [a["artifact_id"] for a in rest["artifacts"]] == ids  # the two oldest
    assert "next_page_token" not in rest
    with pytest.raises(ToolFailure) as bad:
        _run(store, list_artifacts, page_token="not-a-token")
    assert bad.value.type == "InvalidPageToken"


def test_without_a_store_the_tools_say_so(store: ArtifactStore) -> None:
    services = Services(settings=Settings())
    call = DaemonCall("c", "list_artifacts", {}, OWNER, None, services)
    with pytest.raises(ToolFailure) as failure:
        asyncio.run(list_artifacts(call))
    assert failure.value.type == "ArtifactsUnavailable"


def test_the_in_daemon_tools_are_served_and_promise_no_sandbox() -> None:
    from tooljaild.sandbox.backends import Promises
    from tooljaild.tools.builtin.catalog import RUNS, builtin_tools

    names = ["read_artifact", "tail_artifact", "search_artifact", "list_artifacts", "upload_file"]
    tools = {t.name: t for t in builtin_tools(Promises(isolated=True, network=False, memory="1"))}
    for name in names:
        assert RUNS[name].kind == "daemon" and RUNS[name].in_daemon is not None
        description = tools[name].description
        assert "sandbox" not in description and "network" not in description


def test_a_stopped_search_stops_its_thread(
    store: ArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact_id = _put_lines(store, 500_000)
    services = Services(settings=Settings(), artifacts=store)
    arguments = {"artifact_id": artifact_id, "pattern": r"(a|b)*c$"}
    call = DaemonCall("c", "search_artifact", arguments, OWNER, None, services)
    read = 0
    reached, cancelled = threading.Event(), threading.Event()
    lines_of = artifact_tools._lines_of

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal read
        for line in lines_of(*args, **kwargs):
            read += 1
            if read == 1000:  # the thread is searching: hold it until the call is stopped
                reached.set()
                cancelled.wait(10)
            yield line

    monkeypatch.setattr(artifact_tools, "_lines_of", counted)

    async def stopped() -> None:
        task = asyncio.create_task(search_artifact(call))
        await asyncio.to_thread(reached.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled.set()

    asyncio.run(stopped())  # waits for the executor's threads: the search's too
    # It stopped at its next line once asked, far from the artifact's end.
    assert read < 250_000, read
