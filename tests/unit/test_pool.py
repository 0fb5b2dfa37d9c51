"""The warm pool: ready sandboxes, one call each, refilled in the background."""

from __future__ import annotations

import asyncio

import pytest

from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.fake import FakeSandbox
from tooljaild.sandbox.pool import SandboxPool


class SlowFake(FakeSandbox):
    """A sandbox whose start takes a while, like a real interpreter start."""

    def __init__(self, delay: float = 0.05, **kw: bool) -> None:
        super().__init__(**kw)
        self.delay = delay

    async def start(self) -> None:
        await asyncio.sleep(self.delay)
        await super().start()


def counting(
    factory: type[FakeSandbox] = SlowFake, **kw: object
) -> tuple[list[FakeSandbox], object]:
    made: list[FakeSandbox] = []

    def make() -> FakeSandbox:
        box = factory(**kw)  # type: ignore[arg-type]
        made.append(box)
        return box

    return made, make


async def test_fills_to_size_and_never_hands_out_a_sandbox_twice() -> None:
    made, make = counting()
    pool = SandboxPool(make, 3)  # type: ignore[arg-type]
    pool.start()
    assert await pool.wait_ready(timeout_s=5)
    assert pool.ready_count == 3
    first, second = await pool.acquire(), await pool.acquire()
    assert first is not second
    assert first.alive and second.alive
    assert await pool.wait_ready(timeout_s=5)  # refilled in the background
    assert pool.ready_count == 3
    assert len(made) == 5
    await pool.close()
    assert all(box.closed for box in made if box not in (first, second))


async def test_an_empty_pool_hands_out_the_next_sandbox_started_rather_than_a_new_one() -> None:
    made, make = counting(delay=0.2)
    pool = SandboxPool(make, 2)  # type: ignore[arg-type]
    pool.start()  # two starts in flight, none ready yet
    box = await asyncio.wait_for(pool.acquire(), 5)
    assert box in made[:2]
    await pool.close()


async def test_pool_size_zero_starts_one_sandbox_per_call() -> None:
    made, make = counting(delay=0)
    pool = SandboxPool(make, 0)  # type: ignore[arg-type]
    pool.start()
    await asyncio.sleep(0.01)
    assert made == []
    box = await pool.acquire()
    assert box.alive and made == [box]
    await pool.close()


async def test_start_failures_surface_as_sandbox_errors() -> None:
    _, make = counting(delay=0, fail_start=True)
    pool = SandboxPool(make, 2)  # type: ignore[arg-type]
    pool.start()
    with pytest.raises(SandboxError, match="refused to start"):
        await asyncio.wait_for(pool.acquire(), 5)
    await pool.close()


async def test_idle_sandboxes_are_let_go_down_to_the_minimum_and_come_back() -> None:
    made, make = counting(delay=0)
    pool = SandboxPool(make, 4, min_idle=1, idle_ttl_s=0.05)  # type: ignore[arg-type]
    pool.start()
    assert await pool.wait_ready(timeout_s=5)
    await asyncio.sleep(0.2)
    assert pool.ready_count == 1
    assert sum(b.closed for b in made) == 3
    box = await pool.acquire()  # demand: the pool fills up again
    assert box.alive
    assert await pool.wait_ready(timeout_s=5)
    assert pool.ready_count == 4
    await pool.close()


async def test_acquire_after_close_is_refused() -> None:
    _, make = counting(delay=0)
    pool = SandboxPool(make, 1)  # type: ignore[arg-type]
    await pool.close()
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire()


async def test_a_sandbox_is_replaced_after_its_call_unless_the_pool_runs_low() -> None:
    from tooljaild.sandbox import pool as pool_module

    made, make = counting(delay=0)
    pool = SandboxPool(make, 4)  # type: ignore[arg-type]
    pool.start()
    assert await pool.wait_ready(timeout_s=5)
    box = await pool.acquire()  # three left: the replacement waits for the call
    await asyncio.sleep(pool_module.AFTER_CALL_S)
    assert len(made) == 4
    pool.release(box)  # the call is over: replaced a moment later
    assert await pool.wait_ready(timeout_s=5)
    assert len(made) == 5
    # A call that outlasts REFILL_LATER_S does not keep the pool short.
    long_call = await pool.acquire()
    await asyncio.sleep(pool_module.REFILL_LATER_S * 2)
    assert pool.ready_count == 4 and len(made) == 6
    # Running low (under half left), the pool refills at once.
    taken = [await pool.acquire() for _ in range(3)]
    assert pool.ready_count == 1
    await asyncio.sleep(0.01)
    assert len(made) > 6
    for sandbox in (long_call, *taken):
        pool.release(sandbox)
    await pool.close()
