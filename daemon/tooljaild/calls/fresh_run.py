"""A call in a fresh sandbox: a slot, a sandbox from its pool, the run, both given back.

The path of every call that names no session and is no in-daemon built-in
(`CallManager.submit`). `start_now` starts it before `submit` returns when a slot
and a ready sandbox are free; else the call's task waits for them
(`start_later`); both end in `_start`, which sends the request into the
sandbox. `supervise` then awaits the run's end: the call's timeout or a stop
kills the sandbox, and the sandbox goes back to its pool and the slot to the
next call, however the run ends.

The manager keeps what every path shares: the call's running and end (it
passes them in), approval, and letting go of the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tooljail.types import ToolResult
from tooljaild.calls import egress, results, terms
from tooljaild.calls.admission import Slots, take_slot
from tooljaild.calls.call import Call, StopReason
from tooljaild.egress.service import EgressService
from tooljaild.sandbox.base import RunOutcome, Sandbox, SandboxError
from tooljaild.sandbox.pool import SandboxPool

__all__ = ["FreshRunner", "Run"]


@dataclass(frozen=True)
class Run:
    """A started call: its sandbox (from `pool`) holds its request, and `outcome`
    waits for the run's end. A run also holds one of the daemon's running slots."""

    pool: SandboxPool
    sandbox: Sandbox
    outcome: Coroutine[Any, Any, RunOutcome]


class FreshRunner:
    """Starts calls in fresh sandboxes and sees each run to its end.

    Args:
        slots: The daemon's running slots (`Admission.slots`): a run holds one.
        running: Marks a call running in a sandbox (its request is on the way).
        end: Ends a call with its result.
        egress: The daemon's egress; None: no `[egress]` (no call has network).
    """

    def __init__(
        self,
        slots: Slots,
        running: Callable[[Call, str], None],
        end: Callable[[Call, ToolResult], None],
        *,
        egress: EgressService | None = None,
    ) -> None:
        self._slots = slots
        self._running = running
        self._end = end
        self._egress = egress

    def start_now(self, call: Call, pool: SandboxPool) -> Run | None:
        """Start the call before `submit` returns, when nothing has to wait.

        With a free slot and a ready sandbox, the request goes into the
        sandbox's pipe right here: the tool starts while the RPC handler is
        still answering, a task switch earlier than from the call's own task.
        None (nothing held) when something has to wait: the call's task starts it.
        """
        if not self._slots.try_take():
            return None
        sandbox = pool.try_acquire()
        if sandbox is None:
            self._slots.give()
            return None
        try:
            return self._start(call, pool, sandbox)
        except SandboxError:
            # Broke down while it waited: the call's own task gets another.
            self._slots.give()
            return None

    async def start_later(self, call: Call, pool: SandboxPool) -> Run | None:
        """Wait for a slot, then for a sandbox, and start the call; None when it
        ended without running (stopped while queued; no sandbox to be had)."""
        if not await take_slot(self._slots, call):
            self._end(call, results.not_started(call))
            return None
        try:
            if call.stop_reason is not None:  # stopped as its slot came
                self._end(call, results.not_started(call))
            else:
                try:
                    sandbox = await pool.acquire()
                    return self._start(call, pool, sandbox)
                except SandboxError as exc:
                    self._end(call, results.sandbox_failed(call, str(exc)))
        except BaseException:
            self._slots.give()
            raise
        self._slots.give()
        return None

    def _start(self, call: Call, pool: SandboxPool, sandbox: Sandbox) -> Run:
        """Send the call's request into `sandbox` and mark the call running.

        Raises:
            SandboxError: The sandbox broke down (it is given back to `pool`).
        """
        request = call.with_artifacts(terms.run_request(call.tool, call.arguments, call.limits))
        try:
            if not call.egress.empty:  # the gate opens as late as can be, once per call
                try:
                    request = egress.open_fresh(self._egress, call, sandbox, request)
                except OSError as exc:
                    raise SandboxError(f"cannot open the sandbox's egress gate: {exc}") from exc
            outcome = sandbox.begin(request, call.sink)
        except BaseException:
            egress.close_fresh(call)
            pool.release(sandbox)
            raise
        self._running(call, sandbox.id)
        return Run(pool, sandbox, outcome)

    async def supervise(self, call: Call, run: Run) -> None:
        """Wait for a started call's end; its timeout or a stop kills its sandbox.
        Gives the run's sandbox and slot back."""
        loop = asyncio.get_running_loop()
        killing: asyncio.Future[None] | None = None
        timers: list[asyncio.TimerHandle] = []

        # The run is awaited right here; a timeout or a stop kills the sandbox
        # from a callback, and the run then ends with the tree.
        def kill() -> None:
            nonlocal killing
            if killing is None:
                killing = asyncio.ensure_future(run.sandbox.kill())

        def on_timeout() -> None:
            kill_after = call.tool.options.kill_after_s
            if kill_after > call.timeout_s and call.stop_reason is None:
                # The caller hears "timeout, still running" now; the call runs on
                # detached until kill_after_s, and GetCall tells its real end.
                call.answer(results.timed_out(call, still_running=True))
                timers.append(
                    loop.call_later(
                        kill_after - call.timeout_s, call.request_stop, StopReason.HARD_TIMEOUT
                    )
                )
            else:
                call.request_stop(StopReason.TIMEOUT)

        try:
            timers.append(loop.call_later(call.timeout_s, on_timeout))
            call.kill_with(kill)
            outcome = await run.outcome
            if killing is not None:
                await killing
            call.kill_with(None)
            result = results.result_of(call, outcome, call.stop_reason)
            self._end(call, result if call.gate is None else egress.with_net(call, result))
        finally:
            egress.close_fresh(call)
            call.kill_with(None)
            for timer in timers:
                timer.cancel()
            run.pool.release(run.sandbox)
            self._slots.give()
