"""The approval queue's watchers (`tooljaild.calls.approval_feed`), without a daemon:
the bounds of watchers and of each backlog, what a watcher sees, a reload, a stop.
(Through a real daemon: tests/integration/test_approval_queue.py.)"""

from __future__ import annotations

import asyncio

import pytest

from tooljail.errors import OverloadedError, PermissionDeniedError, ShuttingDownError
from tooljail.types import ApprovalEventKind, CallInfo, CallState
from tooljaild.auth.policy import Identity
from tooljaild.calls.approval_feed import EVENT_OVERHEAD_BYTES, ApprovalFeed, cut_arguments

OPS = Identity(name="ops", approver=True)
NARROW = Identity(name="narrow", approver=True, tools=frozenset({"ls"}))


def _info(call_id: str, tool: str = "execute_python_code", arguments: str = "{}") -> CallInfo:
    return CallInfo(
        call_id=call_id, tool=tool, state=CallState.AWAITING_APPROVAL, arguments_json=arguments
    )


def test_a_watcher_starts_with_the_waiting_calls_it_may_decide_then_hears_new_ones() -> None:
    async def main() -> None:
        feed = ApprovalFeed()
        waiting = [
            feed.publish(ApprovalEventKind.REQUESTED, i) for i in (_info("a"), _info("b", "ls"))
        ]
        ops, narrow = feed.subscribe(OPS, waiting), feed.subscribe(NARROW, waiting)
        feed.publish(ApprovalEventKind.DECIDED, _info("a"))
        assert [(e.kind, e.call.call_id) for e in [await ops.next() for _ in range(3)]] == [
            (ApprovalEventKind.REQUESTED, "a"),
            (ApprovalEventKind.REQUESTED, "b"),
            (ApprovalEventKind.DECIDED, "a"),
        ]
        event = await narrow.next()
        assert event is not None and event.call.call_id == "b"  # its tool only
        feed.close()
        assert await narrow.next() is None
        with pytest.raises(ShuttingDownError):
            feed.subscribe(OPS, [])

    asyncio.run(main())


def test_watchers_are_bounded_in_all_and_per_identity() -> None:
    feed = ApprovalFeed(max_watchers=2, per_identity=1)
    first = feed.subscribe(OPS, [])
    with pytest.raises(OverloadedError, match="per_identity"):
        feed.subscribe(OPS, [])
    feed.subscribe(NARROW, [])
    with pytest.raises(OverloadedError, match=r"max_approval_watchers\)"):
        feed.subscribe(Identity(name="third", approver=True), [])
    feed.unsubscribe(first)
    feed.unsubscribe(first)  # idempotent
    feed.subscribe(OPS, [])
    assert feed.watching == 2


def test_a_backlog_past_its_bound_is_dropped_and_the_watcher_told_to_watch_again() -> None:
    async def main() -> None:
        feed = ApprovalFeed(buffer_bytes=64 * 1024, max_argument_bytes=64 * 1024)
        watcher = feed.subscribe(OPS, [])
        big = '"' + "x" * (60 * 1024) + '"'
        feed.publish(ApprovalEventKind.REQUESTED, _info("one", arguments=big))  # one always fits
        assert not watcher.failed.is_set()
        feed.publish(ApprovalEventKind.REQUESTED, _info("two", arguments=big))
        assert watcher.failed.is_set()
        with pytest.raises(OverloadedError, match="watch again") as raised:
            await watcher.next()
        assert raised.value.retry_after_s
        # A snapshot larger than the bound does not end a new watch: it is held anyway.
        snapshot = [
            feed.publish(ApprovalEventKind.REQUESTED, _info(f"s{i}", arguments=big))
            for i in range(3)
        ]
        fresh = feed.subscribe(Identity(name="fresh", approver=True), snapshot)
        assert not fresh.failed.is_set()
        assert [(await fresh.next()).call.call_id for _ in range(3)] == ["s0", "s1", "s2"]  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_reload_ends_the_watch_of_an_identity_no_longer_an_approver() -> None:
    async def main() -> None:
        feed = ApprovalFeed()
        ops, narrow = feed.subscribe(OPS, []), feed.subscribe(NARROW, [])
        now = {"narrow": Identity(name="narrow", approver=True)}  # ops gone; narrow widened
        assert feed.reauthorize(now.get) == 1
        with pytest.raises(PermissionDeniedError, match="reloaded"):
            await ops.next()
        feed.publish(ApprovalEventKind.REQUESTED, _info("wide"))
        event = await narrow.next()
        assert event is not None and event.call.call_id == "wide"
        assert feed.watching == 1

    asyncio.run(main())


def test_arguments_are_cut_as_the_journal_cuts_them() -> None:
    whole = _info("a", arguments='{"k": "' + "é" * 100 + '"}')
    cut = cut_arguments(whole, 50)
    assert cut.arguments_truncated and len(cut.arguments_json.encode()) <= 50
    assert cut.arguments_bytes == len(whole.arguments_json.encode())
    assert cut_arguments(whole, 10_000) is whole
    assert EVENT_OVERHEAD_BYTES > 0
