"""The call manager's rules, with a scripted sandbox: no processes, no network."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tooljail import (
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    CallState,
    CallStatus,
    Effect,
    InvalidArgumentsError,
    InvalidRequestError,
    OverloadedError,
    ShuttingDownError,
    StreamKind,
    ToolError,
    ToolNotFoundError,
)
from tooljaild.calls import NO_OUTPUT_MESSAGE, CallManager
from tooljaild.sandbox.base import OutputSink, RunOutcome, RunRequest, Termination
from tooljaild.sandbox.fake import FakeSandbox
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.catalog import BUILTIN_TOOLS
from tooljaild.tools.registry import Registry, Tool, ToolOptions

Script = Callable[[RunRequest, OutputSink], Awaitable[RunOutcome]]


def user_tool(name: str = "echo", **options: Any) -> Tool:
    return Tool(
        name=name,
        description="test tool",
        input_schema={
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "additionalProperties": False,
        },
        options=ToolOptions(**options),
        source="user",
        module_path="/tools/t.py",
        function=name,
    )


class Harness:
    """A CallManager whose sandboxes run `self.script`."""

    def __init__(self, tmp_path: Path, tools: list[Tool], **settings: Any) -> None:
        self.script: Script = self.returns(None)
        self.sandboxes: list[FakeSandbox] = []
        self.settings = Settings(state_dir=tmp_path, pool_size=0, **settings)
        self.pool = SandboxPool(self._new, 0)
        self.manager = CallManager(
            self.settings, Registry(tools, builtins=BUILTIN_TOOLS), self.pool
        )

    def _new(self) -> FakeSandbox:
        async def play(request: RunRequest, sink: OutputSink) -> RunOutcome:
            return await self.script(request, sink)

        sandbox = FakeSandbox(play)
        self.sandboxes.append(sandbox)
        return sandbox

    @staticmethod
    def returns(value: Any, kind: str = "json", output: bytes = b"") -> Script:
        async def script(request: RunRequest, sink: OutputSink) -> RunOutcome:
            if output:
                sink(StreamKind.STDOUT, output)
            if value is None:
                return RunOutcome(Termination.RETURNED, value_kind="none", exit_code=0)
            return RunOutcome(Termination.RETURNED, value_kind=kind, value=value, exit_code=0)  # type: ignore[arg-type]

        return script

    @staticmethod
    def sleeps(seconds: float, then: Any = "done") -> Script:
        async def script(request: RunRequest, sink: OutputSink) -> RunOutcome:
            sink(StreamKind.STDOUT, b"started\n")
            await asyncio.sleep(seconds)
            return RunOutcome(Termination.RETURNED, value_kind="text", value=then)

        return script


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path, [user_tool(), user_tool("slow", timeout_s=1, kill_after_s=3)])


async def finish(harness: Harness, tool: str, args: str = "{}", **kw: Any) -> Any:
    call = harness.manager.submit(tool, args, **kw)
    return await asyncio.wait_for(call.answered.wait(), 10)


async def test_python_code_success_has_stdout_stderr_and_exit_code(harness: Harness) -> None:
    harness.script = harness.returns(None, output=b"42\n")
    result = await finish(harness, "execute_python_code", '{"code": "print(42)"}')
    assert result.status is CallStatus.SUCCESS
    assert result.effect is Effect.APPLIED
    assert result.data == {"stdout": "42\n", "stderr": "", "exit_code": 0}
    assert harness.sandboxes[0].requests[0].kind == "code"
    assert harness.sandboxes[0].requests[0].payload == {"code": "print(42)"}


async def test_raised_exception_is_an_error_result_with_type_message_traceback(
    harness: Harness,
) -> None:
    async def raises(request: RunRequest, sink: OutputSink) -> RunOutcome:
        return RunOutcome(
            Termination.RAISED,
            exit_code=1,
            error=ToolError(type="ValueError", message="bad", traceback="Traceback ..."),
        )

    harness.script = raises
    result = await finish(harness, "execute_python_code", '{"code": "x"}')
    assert result.status is CallStatus.ERROR
    assert result.effect is Effect.APPLIED
    assert result.error == ToolError(type="ValueError", message="bad", traceback="Traceback ...")
    assert result.data["exit_code"] == 1
    assert "ValueError: bad" in result.message


async def test_signal_death_reports_negative_exit_code(harness: Harness) -> None:
    async def segv(request: RunRequest, sink: OutputSink) -> RunOutcome:
        return RunOutcome(
            Termination.SIGNALED, signal=11, error=ToolError(type="Signal", message="SIGSEGV (11)")
        )

    harness.script = segv
    result = await finish(harness, "execute_python_code", '{"code": "x"}')
    assert result.status is CallStatus.ERROR
    assert result.data["exit_code"] == -11
    assert "SIGSEGV" in result.message


@pytest.mark.parametrize(
    ("value", "kind", "status", "data", "message"),
    [
        (None, "none", CallStatus.SUCCESS, None, NO_OUTPUT_MESSAGE),
        ({"a": 1}, "json", CallStatus.SUCCESS, {"a": 1}, ""),
        ([1, 2], "json", CallStatus.SUCCESS, [1, 2], ""),
        ("plain", "text", CallStatus.SUCCESS, "plain", ""),
        (
            {"status": "partial", "data": [1], "message": "half"},
            "json",
            CallStatus.PARTIAL,
            [1],
            "half",
        ),
        ({"error": "no such city"}, "json", CallStatus.ERROR, None, ""),
        # Only the daemon may say timeout: such a dict is plain data.
        ({"status": "timeout"}, "json", CallStatus.SUCCESS, {"status": "timeout"}, ""),
        (
            {"status": "success", "extra": 1},
            "json",
            CallStatus.SUCCESS,
            {"status": "success", "extra": 1},
            "",
        ),
    ],
)
async def test_user_tool_return_values(
    harness: Harness, value: Any, kind: str, status: CallStatus, data: Any, message: str
) -> None:
    harness.script = harness.returns(value, kind)
    result = await finish(harness, "echo")
    assert (result.status, result.data, result.message) == (status, data, message)
    if value == {"error": "no such city"}:
        assert result.error == ToolError(type="Error", message="no such city")


async def test_bad_requests_are_refused_before_anything_runs(harness: Harness) -> None:
    m = harness.manager
    with pytest.raises(ToolNotFoundError):
        m.submit("nope", "{}")
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        m.submit("echo", "{oops")
    with pytest.raises(InvalidArgumentsError) as info:
        m.submit("echo", '{"x": "a"}')
    assert (info.value.parameter, info.value.expected, info.value.actual) == (
        "x",
        "integer",
        "string",
    )
    with pytest.raises(InvalidRequestError, match="call_id"):
        m.submit("echo", "{}", call_id="has space")
    with pytest.raises(BadTimeoutError, match="outside the bounds"):
        m.submit("echo", "{}", timeout_s=5000)
    with pytest.raises(BadTimeoutError):
        m.submit("echo", "{}", timeout_s=0.01)
    assert harness.sandboxes == []


async def test_same_call_id_same_arguments_is_the_same_call(harness: Harness) -> None:
    harness.script = harness.sleeps(0.05)
    first = harness.manager.submit("echo", '{"x": 1}', call_id="job-1")
    again = harness.manager.submit("echo", '{ "x" : 1 }', call_id="job-1")
    assert again is first
    await first.answered.wait()
    assert len(harness.sandboxes) == 1
    with pytest.raises(CallIdConflictError, match="other arguments"):
        harness.manager.submit("echo", '{"x": 2}', call_id="job-1")


async def test_timeout_kills_and_says_it_may_still_take_effect(harness: Harness) -> None:
    harness.script = harness.sleeps(30)
    call = harness.manager.submit("execute_python_code", '{"code": "x"}', timeout_s=1)
    result = await asyncio.wait_for(call.answered.wait(), 5)
    assert result.status is CallStatus.TIMEOUT
    assert result.effect is Effect.UNKNOWN
    assert not result.still_running
    assert "may still take effect" in result.message
    assert result.data["stdout"] == "started\n"
    await call.ended.wait()
    assert harness.sandboxes[0].killed
    assert call.state is CallState.TIMED_OUT


async def test_kill_after_keeps_the_call_running_detached(harness: Harness) -> None:
    harness.script = harness.sleeps(1.5, then="real outcome")
    call = harness.manager.submit("slow", "{}")
    caller = await asyncio.wait_for(call.answered.wait(), 5)
    assert caller.status is CallStatus.TIMEOUT
    assert caller.still_running
    assert call.info().state is CallState.RUNNING
    assert call.info().result == caller
    await asyncio.wait_for(call.ended.wait(), 5)
    info = call.info()
    assert info.state is CallState.SUCCEEDED
    assert info.result is not None
    assert info.result.data == "real outcome"
    assert not info.result.still_running
    assert not harness.sandboxes[0].killed


async def test_kill_after_is_a_hard_limit(harness: Harness) -> None:
    harness.script = harness.sleeps(30)
    call = harness.manager.submit("slow", "{}")
    await asyncio.wait_for(call.ended.wait(), 6)
    assert call.state is CallState.TIMED_OUT
    assert call.result is not None and "kill_after_s" in call.result.message
    assert harness.sandboxes[0].killed


async def test_cancel_running_call(harness: Harness) -> None:
    harness.script = harness.sleeps(30)
    call = harness.manager.submit("echo", "{}", call_id="c1")
    await asyncio.wait_for(call.running.wait(), 5)
    state = await harness.manager.cancel("c1")
    assert state is CallState.CANCELLED
    result = call.answered.result()
    assert (result.status, result.effect) == (CallStatus.CANCELLED, Effect.UNKNOWN)
    with pytest.raises(CallNotFoundError):
        await harness.manager.cancel("unknown")


async def test_cancel_queued_call_never_runs(tmp_path: Path) -> None:
    h = Harness(tmp_path, [user_tool()], max_concurrent=1)
    h.script = h.sleeps(30)
    running = h.manager.submit("echo", "{}")
    await asyncio.wait_for(running.running.wait(), 5)
    queued = h.manager.submit("echo", "{}", call_id="q")
    await asyncio.sleep(0.05)
    assert queued.state is CallState.QUEUED
    await h.manager.cancel("q")
    result = queued.answered.result()
    assert (result.status, result.effect) == (CallStatus.CANCELLED, Effect.NONE)
    assert len(h.sandboxes) == 1
    await h.manager.cancel(running.call_id)


async def test_overload_is_refused_with_a_retry_hint(tmp_path: Path) -> None:
    h = Harness(tmp_path, [user_tool()], max_concurrent=1, max_queue=1)
    h.script = h.sleeps(30)
    calls = [h.manager.submit("echo", "{}"), h.manager.submit("echo", "{}")]
    with pytest.raises(OverloadedError) as info:
        h.manager.submit("echo", "{}")
    assert info.value.retry_after_s > 0
    for call in calls:
        await h.manager.cancel(call.call_id)


async def test_drain_answers_every_caller(harness: Harness) -> None:
    harness.script = harness.sleeps(30)
    call = harness.manager.submit("echo", "{}")
    await asyncio.wait_for(call.running.wait(), 5)
    await harness.manager.drain(0.1)
    result = call.answered.result()
    assert result.status is CallStatus.CANCELLED
    assert "shut down" in result.message
    with pytest.raises(ShuttingDownError):
        harness.manager.submit("echo", "{}")


async def test_no_sandbox_means_an_error_result_with_no_effect(harness: Harness) -> None:
    harness.pool = SandboxPool(lambda: FakeSandbox(fail_start=True), 0)
    manager = CallManager(harness.settings, harness.manager.registry, harness.pool)
    call = manager.submit("echo", "{}")
    result = await asyncio.wait_for(call.answered.wait(), 5)
    assert (result.status, result.effect) == (CallStatus.ERROR, Effect.NONE)
    assert result.error is not None and result.error.type == "SandboxUnavailable"


async def test_stream_replays_from_the_start_and_ends_with_the_callers_answer(
    harness: Harness,
) -> None:
    async def chatty(request: RunRequest, sink: OutputSink) -> RunOutcome:
        for i in range(3):
            sink(StreamKind.STDOUT, f"{i}\n".encode())
            await asyncio.sleep(0.01)
        return RunOutcome(Termination.RETURNED)

    harness.script = chatty
    call = harness.manager.submit("execute_python_code", '{"code": "x"}')
    await call.answered.wait()
    events = [e async for e in call.stream()]
    assert [(e.seq, e.data) for e in events] == [(1, b"0\n"), (2, b"1\n"), (3, b"2\n")]


async def test_get_forgets_beyond_the_bound(tmp_path: Path) -> None:
    h = Harness(tmp_path, [user_tool()], remembered_calls=2)
    ids = []
    for _ in range(3):
        call = h.manager.submit("echo", "{}")
        await call.ended.wait()
        await asyncio.sleep(0)
        ids.append(call.call_id)
    with pytest.raises(CallNotFoundError):
        h.manager.get(ids[0])
    assert h.manager.get(ids[2]).state is CallState.SUCCEEDED


async def test_a_tool_past_the_output_limit_is_stopped(tmp_path: Path) -> None:
    from tooljaild.settings.sandbox import Limits

    h = Harness(tmp_path, [user_tool()], limits=Limits(output_limit_bytes=10_000))

    async def chatty_forever(request: RunRequest, sink: OutputSink) -> RunOutcome:
        while True:
            sink(StreamKind.STDOUT, b"x" * 1000 + b"\n")
            await asyncio.sleep(0.001)

    h.script = chatty_forever
    call = h.manager.submit("execute_python_code", '{"code": "x"}')
    result = await asyncio.wait_for(call.answered.wait(), 5)
    assert (result.status, result.effect) == (CallStatus.ERROR, Effect.UNKNOWN)
    assert result.error is not None and result.error.type == "OutputLimit"
    assert "10000 bytes" in result.message
    assert h.sandboxes[0].killed


async def test_slots_serve_waiters_in_order_and_pass_on_a_cancelled_hand_over() -> None:
    from tooljaild.calls.admission import Slots

    slots = Slots(1)
    assert slots.try_take()
    assert not slots.try_take()
    order: list[str] = []

    async def wait(name: str) -> None:
        await slots.take()
        order.append(name)

    first, second, third = (asyncio.create_task(wait(n)) for n in ("first", "second", "third"))
    await asyncio.sleep(0)
    slots.give()  # handed to "first"...
    first.cancel()  # ...which is cancelled before it runs: the slot goes to "second"
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["second"]
    assert first.cancelled()
    await second
    slots.give()
    await third
    assert order == ["second", "third"]
    slots.give()
    assert slots.try_take()  # free again, and nobody is waiting


async def test_free_slots_go_to_waiting_clients_in_turn() -> None:
    from tooljaild.calls.admission import Slots

    slots = Slots(1)
    assert slots.try_take()
    order: list[str] = []

    async def wait(client: str, name: str) -> None:
        await slots.take(client)
        order.append(name)
        slots.give()

    # One client queues four calls before another queues one: the other's call
    # does not wait behind all four.
    tasks = [asyncio.create_task(wait("greedy", f"g{i}")) for i in range(4)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(wait("polite", "p0")))
    await asyncio.sleep(0)
    slots.give()
    await asyncio.gather(*tasks)
    assert order == ["g0", "p0", "g1", "g2", "g3"]


async def test_output_and_calls_kept_stay_bounded_when_calls_end_out_of_order(
    tmp_path: Path,
) -> None:
    # Issue 21 (around finding 12): a call that ended out of admission order never
    # had its output released, and one long call kept every later call in memory.
    harness = Harness(tmp_path, [user_tool()], remembered_calls=20)
    slow_script, fast_script = harness.sleeps(1.0), harness.returns("x", output=b"y" * 1000)
    runs: list[RunRequest] = []

    async def first_slow(request: RunRequest, sink: OutputSink) -> RunOutcome:
        runs.append(request)
        return await (slow_script if len(runs) == 1 else fast_script)(request, sink)

    harness.script = first_slow
    slow = harness.manager.submit("echo", "{}")
    fast = [harness.manager.submit("echo", "{}") for _ in range(100)]
    for call in fast:
        await asyncio.wait_for(call.ended.wait(), 10)
    assert not slow.state.finished
    remembered = harness.manager._book.calls  # what the manager keeps in memory
    assert len(remembered) <= 21 and slow.call_id in remembered
    holding = [c for c in fast if c.events._bytes]
    assert len(holding) <= 64, len(holding)
    await asyncio.wait_for(slow.ended.wait(), 10)
