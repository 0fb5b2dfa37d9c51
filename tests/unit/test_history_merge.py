"""The pure parts of call history: merging many daemons' pages, the composite
cursor, the listing rules and the CLI's times (the RPC itself is tested through
a real daemon in tests/integration/test_call_history.py)."""

from __future__ import annotations

import argparse
import datetime
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from tooljail import CallInfo, CallState, CallStatus, ToolResult
from tooljail._history import Merge, decode_cursors, encode_cursors, from_cursor
from tooljail.errors import InvalidRequestError, PermissionDeniedError
from tooljail.v1 import tooljail_pb2 as pb
from tooljaild.auth.policy import Identity
from tooljaild.calls.listing import check_query, overlay, scope
from tooljaild.cli.history import parse_when
from tooljaild.journal.history import BadQueryError, CallQuery, encode_cursor, select
from tooljaild.journal.store import Journal


class FakeDaemon:
    """A daemon's journal as ListCalls pages it: newest first, a keyset cursor
    (as the journal's: calls received later never shift a later page)."""

    def __init__(self, name: str, times: list[float]) -> None:
        self.name = name
        self.calls: list[pb.CallInfo] = []
        for t in times:
            self.receive(t)

    def receive(self, at: float) -> None:
        """A new call, received at `at`."""
        self.calls.append(
            pb.CallInfo(call_id=f"{self.name}-{len(self.calls)}", received_at_unix=at)
        )
        self.calls.sort(key=self._key)

    @staticmethod
    def _key(call: pb.CallInfo) -> tuple[float, str]:
        return -call.received_at_unix, call.call_id

    def page(self, asked: pb.ListCallsRequest) -> pb.ListCallsResponse:
        rows = [
            c for c in self.calls if not asked.until_unix or c.received_at_unix < asked.until_unix
        ]
        if asked.cursor:
            at, call_id = asked.cursor.split("|")
            rows = [c for c in rows if self._key(c) > (-float(at), call_id)]
        more = len(rows) > asked.limit
        rows = rows[: asked.limit]
        last = rows[-1] if rows else None
        cursor = f"{last.received_at_unix!r}|{last.call_id}" if more and last else ""
        return pb.ListCallsResponse(calls=rows, next_cursor=cursor)


def page_all(
    daemons: list[FakeDaemon], limit: int, between: Callable[[], None] = lambda: None
) -> list[list[str]]:
    """Every page over `daemons`, as the SDK's routed flow asks them (`between`
    runs after each page: calls received while a host pages)."""
    pages: list[list[str]] = []
    cursor = ""
    request = pb.ListCallsRequest()
    while True:
        cursors = decode_cursors(cursor)
        answers = [
            (d.name, d.page(from_cursor(request, cursors.get(d.name) or "", limit)))
            for d in daemons
            if cursors.get(d.name, "") is not None
        ]
        merge = Merge.of(limit, cursors, answers)
        for name, k in merge.partial.items():
            daemon = next(d for d in daemons if d.name == name)
            merge.settle(name, daemon.page(from_cursor(request, cursors.get(name) or "", k)))
        calls, cursor = merge.page()
        assert len(calls) <= limit
        pages.append([c.call_id for c in calls])
        between()
        if not cursor:
            return pages


@pytest.mark.parametrize("limit", [1, 3, 7, 50])
def test_merged_pages_hold_every_call_once_newest_first(limit: int) -> None:
    rng = random.Random(limit)
    daemons = [
        FakeDaemon(name, [float(rng.randint(0, 40)) for _ in range(n)])  # ties on purpose
        for name, n in (("a", 23), ("b", 0), ("c", 9), ("d", 31))
    ]
    pages = page_all(daemons, limit)
    flat = [call_id for page in pages for call_id in page]
    everything = {c.call_id: c.received_at_unix for d in daemons for c in d.calls}
    assert sorted(flat) == sorted(everything)
    times = [everything[call_id] for call_id in flat]
    assert times == sorted(times, reverse=True)
    assert all(len(page) == limit for page in pages[:-1])


@pytest.mark.parametrize("limit", [1, 3, 7])
def test_calls_received_while_paging_come_in_no_later_page(limit: int) -> None:
    # "c" is older than every call of "a": the first pages take none of its
    # calls, and it must not then show the calls it receives meanwhile.
    daemons = [FakeDaemon("a", [float(100 + i) for i in range(12)]), FakeDaemon("c", [1.0, 2.0])]
    before = {c.call_id for d in daemons for c in d.calls}
    clock = iter(range(1000, 2000))

    def newer() -> None:
        for daemon in daemons:
            daemon.receive(float(next(clock)))

    flat = [call_id for page in page_all(daemons, limit, newer) for call_id in page]
    assert sorted(flat) == sorted(before)


def test_the_composite_cursor_round_trips_and_refuses_others() -> None:
    cursors: dict[str, str | None] = {"host-a:7070": "WzEsMl0", "host-b:7070": None}
    assert decode_cursors(encode_cursors(cursors)) == cursors
    assert decode_cursors("") == {}
    pinned: dict[str, str | None] = {"host-a:7070": "until:12.5"}
    assert decode_cursors(encode_cursors(pinned)) == pinned
    bad_pin = encode_cursors({"host-a:7070": "until:nan"})
    for bad in (
        "WzEsMl0",
        "r1.!!!",
        "r1.WzEsMl0",
        encode_cursors({}).replace("e30", "WzFd"),
        bad_pin,
        encode_cursors({"host-a:7070": "until:soon"}),
    ):
        with pytest.raises(InvalidRequestError, match="not one list_calls"):
            decode_cursors(bad)


def test_scope_is_the_owner_rule() -> None:
    agent, approver = Identity(name="a"), Identity(name="ops", approver=True)
    assert scope(None, "") is None and scope(None, "x") == "x"
    assert scope(approver, "") is None and scope(approver, "a") == "a"
    assert scope(agent, "") == "a" and scope(agent, "a") == "a"
    with pytest.raises(PermissionDeniedError, match="only an approver or the operator"):
        scope(agent, "b")


@pytest.mark.parametrize(
    "query",
    [
        CallQuery(status="finished"),
        CallQuery(since=-1.0),
        CallQuery(until=float("inf")),
        CallQuery(since=20.0, until=10.0),
    ],
)
def test_unsound_queries_are_bad(query: CallQuery) -> None:
    with pytest.raises(BadQueryError):
        check_query(query)


def test_sound_edge_queries_pass() -> None:
    for query in (CallQuery(since=10.0, until=10.0), CallQuery(until=5.0), CallQuery()):
        assert check_query(query) is query


def test_the_cli_reads_iso_times_and_spans() -> None:
    now = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
    assert parse_when("2h", now) == now - datetime.timedelta(hours=2)
    assert parse_when("1.5d", now) == now - datetime.timedelta(hours=36)
    assert parse_when("2026-12-01T09:00:00") == datetime.datetime(
        2026, 12, 1, 9, tzinfo=datetime.UTC
    )
    offset = parse_when("2026-12-01T09:00:00+02:00")
    assert offset.astimezone(datetime.UTC).hour == 7
    with pytest.raises(argparse.ArgumentTypeError, match="neither an ISO 8601"):
        parse_when("yesterday")


@pytest.mark.parametrize(
    ("query", "index"),
    [
        (CallQuery(), "calls_by_created"),
        (CallQuery(client="a"), "calls_by_client"),
        (CallQuery(tool="t"), "calls_by_tool"),
        (CallQuery(session_id="s"), "calls_by_session"),
        (CallQuery(status="lost"), "calls_by_status"),
        (CallQuery(running=True), "calls_unfinished"),
        (CallQuery(since=1.0, until=2.0), "calls_by_created"),
        (CallQuery(session_id="s", cursor=encode_cursor(5.0, 7)), "calls_by_session"),
    ],
)
def test_each_filter_walks_its_own_index_without_a_sort(
    tmp_path: Path, query: CallQuery, index: str
) -> None:
    # The partial indexes (session, status) are used only when the query names
    # their WHERE term: without it a session's page walked every call (33 ms of 100,000).
    with Journal.open(tmp_path / "journal.sqlite3") as journal:
        sql, params = select(query)
        plan = " ".join(r[-1] for r in journal._db.execute("EXPLAIN QUERY PLAN " + sql, params))
    assert f"USING INDEX {index}" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


class ByteBoundDaemon(FakeDaemon):
    """A daemon whose pages end early (its byte bound): at most `most` calls each."""

    def __init__(self, name: str, times: list[float], most: int) -> None:
        super().__init__(name, times)
        self.most = most

    def page(self, asked: pb.ListCallsRequest) -> pb.ListCallsResponse:
        bounded = pb.ListCallsRequest()
        bounded.CopyFrom(asked)
        bounded.limit = min(asked.limit, self.most)
        return super().page(bounded)


def test_a_daemon_whose_pages_end_early_keeps_the_order_across_pages() -> None:
    rng = random.Random(3)
    daemons = [
        ByteBoundDaemon("a", [rng.uniform(0, 100) for _ in range(40)], most=3),
        FakeDaemon("b", [rng.uniform(0, 100) for _ in range(40)]),
    ]
    flat = [call_id for page in page_all(daemons, 10) for call_id in page]
    everything = {c.call_id: c.received_at_unix for d in daemons for c in d.calls}
    assert sorted(flat) == sorted(everything)
    times = [everything[call_id] for call_id in flat]
    assert times == sorted(times, reverse=True)


class _Answered:
    def __init__(self, result: ToolResult | None) -> None:
        self._result = result

    def done(self) -> bool:
        return self._result is not None

    def result(self) -> ToolResult | None:
        return self._result


def test_an_unfinished_row_takes_the_live_calls_state_result_and_times() -> None:
    received = datetime.datetime(2026, 12, 2, 9, 0, tzinfo=datetime.UTC)
    row = CallInfo(
        call_id="c", tool="t", state=CallState.RUNNING, received_at=received,
        arguments_json='{"a": 1}', arguments_bytes=8,
    )  # fmt: skip
    ended = ToolResult(call_id="c", status=CallStatus.SUCCESS)
    # Ended in memory, not yet in the journal (a turn of the event loop behind).
    live = SimpleNamespace(
        state=CallState.SUCCEEDED, result=ended, answered=_Answered(ended),
        started_wall=received.timestamp() + 1, ended_wall=received.timestamp() + 2,
        sandbox_id="sbx-1",
    )  # fmt: skip
    shown = overlay(row, live)  # type: ignore[arg-type]
    assert (shown.state, shown.result, shown.sandbox_id) == (CallState.SUCCEEDED, ended, "sbx-1")
    assert shown.ended_at == received + datetime.timedelta(seconds=2)
    assert shown.arguments == {"a": 1}  # the journal's, bounded
    # A detached call past its timeout: its caller's answer, while it runs on.
    timed_out = ToolResult(call_id="c", status=CallStatus.TIMEOUT, still_running=True)
    detached = SimpleNamespace(
        state=CallState.RUNNING, result=None, answered=_Answered(timed_out),
        started_wall=received.timestamp() + 1, ended_wall=None, sandbox_id="sbx-1",
    )  # fmt: skip
    shown = overlay(row, detached)  # type: ignore[arg-type]
    assert shown.state is CallState.RUNNING and shown.result == timed_out
    assert shown.ended_at is None
