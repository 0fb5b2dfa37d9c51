"""Running one call in a session: its turn, its run, and how a timeout stops it.

A session call runs in the session's interpreter, in the session's turn (one
at a time, in order). Stopping it (its timeout, a cancel, its output limit)
keeps the session when it can:

1. the running code gets a KeyboardInterrupt (`SessionSandbox.interrupt`);
2. if the call has not ended `interrupt_grace_s` later, the interpreter is
   killed and restarted, with every process of the call (`reset`): its
   variables are gone, its workspace files kept;
3. if even that gets no answer within `reset_timeout_s`, the session is
   given up (reason "sandbox_died").

The result says which (`session_reset`), in words a model reads
(`results.in_session`). A daemon shutting down ends its sessions instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from tooljail.errors import SessionEndedError
from tooljail.types import ToolResult
from tooljaild.calls import egress, results, terms
from tooljaild.calls.call import Call, StopReason
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_channel import SessionCallEnd
from tooljaild.sessions.manager import SessionManager
from tooljaild.sessions.session import Session


def start_in_session(
    call: Call, session: Session, on_start: Callable[[Call, str], None]
) -> Coroutine[Any, Any, SessionCallEnd]:
    """Send the call's request into the session (whose turn the caller holds) now;
    return what waits for its end.

    Raises:
        SandboxError: The session's sandbox has ended.
    """
    request = call.with_artifacts(
        terms.run_request(call.tool, call.arguments, session.terms.limits)
    )
    egress.enter_session(call, session)
    try:
        waiter = session.channel.begin(request, call.sink)
    except BaseException:
        egress.leave_session(call, session)
        raise
    session.calls += 1
    on_start(call, session.channel.id)
    return waiter


async def run_in_session(
    call: Call,
    session: Session,
    sessions: SessionManager,
    on_start: Callable[[Call, str], None],
    started: Coroutine[Any, Any, SessionCallEnd] | None = None,
) -> ToolResult:
    """See the call to its end in `session`; its result. Gives the turn back.

    Args:
        on_start: Told the call and the sandbox id once the call's request is sent.
        started: The call's end, when it was started already (`start_in_session`,
            in the turn); None: wait for the turn and start it here.
    """
    if started is None and not await _wait_for_turn(call, session):
        if session.end_reason:
            return results.session_gone(call, session.id, session.end_reason)
        return results.not_started(call)
    try:
        if started is None:
            if call.stop_reason is not None:
                return results.not_started(call)
            try:
                started = start_in_session(call, session, on_start)
            except SandboxError:
                await sessions.end(session, session.end_reason or "sandbox_died")
                return results.session_gone(call, session.id, session.end_reason)
        end = await _supervise(call, session, sessions, started)
        if session.channel.ended.done():  # its sandbox is gone: so is the session, now
            await sessions.end(session, session.end_reason or "sandbox_died")
        result = results.in_session(call, end, call.stop_reason, session)
        if end.reset and session.open:
            # A reset kills the session's background processes too: this result names them.
            ended = await session.processes.end_all("reset")
            result = results.with_processes_ended(result, ended)
        return result if call.gate is None else egress.with_net(call, result)
    finally:
        egress.leave_session(call, session)
        session.give_turn()


async def _wait_for_turn(call: Call, session: Session) -> bool:
    """Take the session's turn; False if the call is stopped or the session ends first."""
    turn = asyncio.ensure_future(session.take_turn())
    stop = call.stop_requested.wait()
    either: set[asyncio.Future[Any]] = {turn, stop}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not turn.done():
        turn.cancel()
        with contextlib.suppress(asyncio.CancelledError, SessionEndedError):
            await turn
        if not turn.cancelled() and turn.exception() is None:
            session.give_turn()  # it came as the stop did: pass it on
        return False
    return turn.exception() is None


async def _supervise(
    call: Call,
    session: Session,
    sessions: SessionManager,
    waiter: Coroutine[Any, Any, SessionCallEnd],
) -> SessionCallEnd:
    """Wait for the call's end; its timeout or a stop interrupts it, then resets."""
    settings = sessions.settings
    loop = asyncio.get_running_loop()
    over: asyncio.Future[None] = loop.create_future()
    stopping: asyncio.Future[None] | None = None

    async def stop_it() -> None:
        if call.stop_reason is StopReason.SHUTDOWN:
            await sessions.end(session, "shutdown")
            return
        session.channel.interrupt()
        await asyncio.wait({over}, timeout=settings.interrupt_grace_s)
        if over.done() or not session.open:
            return
        if not await session.channel.reset(settings.reset_timeout_s):
            await sessions.end(session, "sandbox_died")

    def kill() -> None:
        nonlocal stopping
        if stopping is None:
            stopping = asyncio.ensure_future(stop_it())

    # In a session a call never runs on detached past its timeout (kill_after_s):
    # the next call in line waits for the session's turn.
    timer = loop.call_later(call.timeout_s, call.request_stop, StopReason.TIMEOUT)
    try:
        call.kill_with(kill)
        try:
            result = await waiter
        finally:
            over.set_result(None)
        if stopping is not None:
            await stopping
        return result
    finally:
        call.kill_with(None)
        timer.cancel()
