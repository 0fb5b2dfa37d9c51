"""The calls package's seams on their own: `Once`, the ending table in
`calls.results`, the terms a call runs with, and the fast start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_calls import Harness, user_tool
from tooljail import CallState, CallStatus, Effect, ToolError
from tooljaild.calls import Call, StopReason, results, terms
from tooljaild.calls.call import Once
from tooljaild.sandbox.base import RunOutcome, Termination
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS
from tooljaild.tools.registry import Tool


def make_call(tmp_path: Path, tool: Tool | None = None) -> Call:
    settings = Settings(state_dir=tmp_path, pool_size=0)
    tool = tool or user_tool()
    return Call("c1", tool, {}, "fp", 5.0, settings, Limits(output_limit_bytes=2048))


def python_tool() -> Tool:
    return next(t for t in BUILTIN_TOOLS if t.name == "execute_python_code")


# ------------------------------------------------------------------ Once


async def test_once_wakes_every_waiter_and_a_cancelled_waiter_cancels_nothing() -> None:
    once: Once[int] = Once()
    first, second = once.wait(), once.wait()
    first.cancel()  # its RPC went away
    assert not once.done()
    assert once.set(7)
    assert not once.set(8)  # given once
    assert await second == 7
    assert once.result() == 7
    assert (await once.wait()) == 7  # a late waiter gets it at once


async def test_a_waiter_resumes_in_the_turn_after_the_value_is_given() -> None:
    once: Once[str] = Once()
    woke: list[str] = []

    async def waiter() -> None:
        woke.append(await once.wait())

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the waiter is waiting
    once.set("answer")
    await asyncio.sleep(0)  # one turn: no shield's extra hop
    assert woke == ["answer"]
    await task


async def test_closing_a_once_cancels_its_waiters_and_later_ones() -> None:
    once: Once[int] = Once()
    waiter = once.wait()
    once.close()
    assert waiter.cancelled() and once.wait().cancelled()
    assert not once.set(1)
    with pytest.raises(asyncio.InvalidStateError):
        once.result()


# ------------------------------------------------------------------ results


async def test_a_stop_decides_whatever_the_sandbox_says(tmp_path: Path) -> None:
    call = make_call(tmp_path, python_tool())
    returned = RunOutcome(Termination.RETURNED, exit_code=0)
    killed = RunOutcome(Termination.KILLED, signal=9)
    expected = {
        StopReason.TIMEOUT: (CallStatus.TIMEOUT, "Timeout"),
        StopReason.HARD_TIMEOUT: (CallStatus.TIMEOUT, "Timeout"),
        StopReason.CANCELLED: (CallStatus.CANCELLED, "Cancelled"),
        StopReason.SHUTDOWN: (CallStatus.CANCELLED, "Cancelled"),
        StopReason.OUTPUT_LIMIT: (CallStatus.ERROR, "OutputLimit"),
        StopReason.REVOKED: (CallStatus.CANCELLED, "IdentityRevoked"),
    }
    assert set(expected) == set(StopReason)
    for stop, (status, error_type) in expected.items():
        for outcome in (returned, killed):
            result = results.result_of(call, outcome, stop)
            assert result.status is status, stop
            assert result.effect is Effect.UNKNOWN, stop
            assert result.error is not None and result.error.type == error_type, stop
            assert result.data == {"stdout": "", "stderr": "", "exit_code": None}
    hard = results.result_of(call, killed, StopReason.HARD_TIMEOUT)
    assert "kill_after_s" in hard.message
    shutdown = results.result_of(call, killed, StopReason.SHUTDOWN)
    assert "shut down" in shutdown.message


@pytest.mark.parametrize(
    ("termination", "effect"),
    [
        (Termination.RAISED, Effect.APPLIED),
        (Termination.SIGNALED, Effect.APPLIED),
        (Termination.CPU_LIMIT, Effect.APPLIED),
        (Termination.FILE_SIZE_LIMIT, Effect.APPLIED),
        (Termination.OUT_OF_MEMORY, Effect.APPLIED),
        (Termination.RUNNER_LOST, Effect.UNKNOWN),
        (Termination.KILLED, Effect.UNKNOWN),  # killed, but not for a stop of the call's
    ],
)
async def test_an_ending_without_a_stop_is_what_the_sandbox_says(
    tmp_path: Path, termination: Termination, effect: Effect
) -> None:
    call = make_call(tmp_path)
    outcome = RunOutcome(termination, error=ToolError(type="X", message="why"))
    result = results.result_of(call, outcome, None)
    assert (result.status, result.effect) == (CallStatus.ERROR, effect)
    assert result.error is not None


async def test_an_exit_code_of_zero_is_success_for_python_tools(tmp_path: Path) -> None:
    call = make_call(tmp_path, python_tool())
    exited = results.result_of(call, RunOutcome(Termination.EXITED, exit_code=0), None)
    assert (exited.status, exited.data["exit_code"]) == (CallStatus.SUCCESS, 0)
    failed = results.result_of(call, RunOutcome(Termination.EXITED, exit_code=3), None)
    assert (failed.status, failed.data["exit_code"]) == (CallStatus.ERROR, 3)
    assert failed.message == "The program exited with code 3."


async def test_results_say_the_state_a_call_ends_in(tmp_path: Path) -> None:
    call = make_call(tmp_path)
    running_on = results.timed_out(call, still_running=True)
    assert results.state_of(running_on) is CallState.RUNNING
    assert "keeps running detached" in running_on.message
    assert results.state_of(results.not_run(call, "why")) is CallState.CANCELLED
    failed = results.sandbox_failed(call, "no room")
    assert (results.state_of(failed), failed.effect) == (CallState.FAILED, Effect.NONE)
    internal = results.internal_error(call, RuntimeError("bug"))
    assert internal.error is not None and internal.error.message == "RuntimeError: bug"


# ------------------------------------------------------------------ terms


@pytest.mark.parametrize(
    ("options", "requested", "expected"),
    [
        ({}, 0.0, 7.0),  # no timeout_s of its own: the daemon's default
        ({"timeout_s": 180.0}, 0.0, 180.0),  # set, even to the field's default value
        ({"timeout_s": 3.0}, 0.0, 3.0),
        ({}, 20.0, 20.0),
        ({"max_timeout_s": 5.0}, 0.0, 5.0),  # the default, capped by the tool's bound
        ({"kill_after_s": 30.0}, 0.0, 7.0),  # loads: no timeout_s of its own to exceed
    ],
)
def test_a_calls_timeout(
    tmp_path: Path, options: dict[str, Any], requested: float, expected: float
) -> None:
    settings = Settings(state_dir=tmp_path, default_timeout_s=7, max_timeout_s=600)
    tool = user_tool(**options)
    assert terms.timeout_for(tool, requested, settings) == expected


def test_tool_info_reports_the_timeouts_in_force(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, default_timeout_s=7, max_timeout_s=600)
    info = terms.tool_info(user_tool(kill_after_s=300), settings)
    assert (info.timeout_s, info.max_timeout_s, info.kill_after_s) == (7, 600, 300)
    builtin = terms.tool_info(python_tool(), settings)
    assert (builtin.timeout_s, builtin.max_timeout_s) == (7, 600)


# ------------------------------------------------------------------ the fast start


async def test_with_a_slot_and_a_ready_sandbox_the_call_runs_before_submit_returns(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, [user_tool()])
    h.pool = SandboxPool(h._new, 1)
    h.manager = type(h.manager)(h.settings, h.manager.registry, h.pool)
    h.pool.start()
    assert await h.pool.wait_ready(1, timeout_s=5)
    call = h.manager.submit("echo", "{}")
    # No await between: the request went into the sandbox inside submit.
    assert call.state is CallState.RUNNING and call.running.done()
    assert call.running.result() == h.sandboxes[0].id
    assert (await asyncio.wait_for(call.answered.wait(), 5)).status is CallStatus.SUCCESS
    await asyncio.wait_for(call.ended.wait(), 5)
    await h.pool.close()
