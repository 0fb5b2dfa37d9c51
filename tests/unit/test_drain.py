"""A drained daemon listens on while clients still send new work (`tooljaild.edge.drain`)."""

from __future__ import annotations

import asyncio
import time

from tooljaild.edge.drain import Refusals


async def _timed(refusals: Refusals, limit_s: float, quiet_s: float) -> float:
    start = time.monotonic()
    await refusals.quiet(limit_s, quiet_s)
    return time.monotonic() - start


async def test_nobody_refused_means_no_wait() -> None:
    assert await _timed(Refusals(), limit_s=5, quiet_s=5) < 0.5


async def test_it_waits_until_refusals_stop_for_the_quiet_time() -> None:
    refusals = Refusals()
    refusals.note()

    async def keep_refusing() -> None:
        for _ in range(4):  # for ~0.4 s
            await asyncio.sleep(0.1)
            refusals.note()

    refusing = asyncio.create_task(keep_refusing())
    waited = await _timed(refusals, limit_s=5, quiet_s=0.3)
    await refusing
    assert 0.6 < waited < 2.0  # the last refusal at ~0.4 s, then 0.3 s quiet


async def test_a_refusal_long_ago_or_a_spent_limit_means_no_wait() -> None:
    refusals = Refusals()
    refusals.note()
    await asyncio.sleep(0.3)
    assert await _timed(refusals, limit_s=5, quiet_s=0.2) < 0.1
    refusals.note()
    assert await _timed(refusals, limit_s=-1, quiet_s=5) < 0.1


async def test_a_client_that_never_stops_is_cut_off_at_the_limit() -> None:
    refusals = Refusals()

    async def refuse_forever() -> None:
        while True:
            refusals.note()
            await asyncio.sleep(0.05)

    refusing = asyncio.create_task(refuse_forever())
    await asyncio.sleep(0)
    try:
        assert 0.4 < await _timed(refusals, limit_s=0.5, quiet_s=0.2) < 1.5
    finally:
        refusing.cancel()
