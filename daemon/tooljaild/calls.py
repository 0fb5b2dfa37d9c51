"""The call manager: admission, states, timeouts, cancellation and results.

It knows nothing of gRPC. A call goes QUEUED -> RUNNING -> one final state; its
output goes to an `EventLog` that any number of readers follow; its caller gets
exactly one result. See DESIGN.md "Result semantics" for what each result says.

Effects: a tool that ended by itself (returned, raised, exited, crashed) has
`effect=applied`: whatever it did is done and nothing more will happen. A tool
stopped from outside (timeout, cancel, shutdown) has `effect=unknown`. A call
that never reached a sandbox has `effect=none`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from tooljail._errors import (
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    InvalidArgumentsError,
    InvalidRequestError,
    OverloadedError,
    ShuttingDownError,
    ToolNotFoundError,
)
from tooljail._types import (
    TIMEOUT_MESSAGE,
    CallInfo,
    CallState,
    CallStatus,
    Effect,
    StreamKind,
    ToolError,
    ToolResult,
)
from tooljaild.config import Settings
from tooljaild.journal import Journal, JournalEntry, JournalError
from tooljaild.output import Event, EventLog, HeadTail
from tooljaild.registry import Registry, Tool, validate_arguments
from tooljaild.sandbox.base import (
    Limits,
    RunOutcome,
    RunRequest,
    Sandbox,
    SandboxError,
    Termination,
)
from tooljaild.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)

CALL_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
NO_OUTPUT_MESSAGE = "Tool executed successfully (no output)"
CANCELLED_MESSAGE = (
    "The call was cancelled while it ran. It may have taken effect in part: check "
    "before calling it again."
)
SHUTDOWN_MESSAGE = (
    "The daemon shut down while the call ran. It may have taken effect in part: check "
    "before calling it again."
)
PYTHON_BUILTINS = {"execute_python_code", "execute_python_code_stream", "execute_python_file"}
PRUNE_EVERY = 1000
"""Finished calls between two prunings of the journal (by age and row count)."""
KEPT_EVENT_LOGS = 64
"""Finished calls whose output chunks stay readable; older ones keep only their result."""
ENVELOPE_KEYS = {"status", "data", "message", "error"}


class Call:
    """One execution of a tool, from admission to its final result."""

    def __init__(
        self,
        call_id: str,
        tool: Tool,
        arguments: dict[str, Any],
        fingerprint: str,
        timeout_s: float,
        settings: Settings,
        limits: Limits,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.call_id = call_id
        self.tool = tool
        self.arguments = arguments
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self.limits = limits
        self.state = CallState.QUEUED
        self.sandbox_id = ""
        self.created = time.monotonic()
        self.started_at: float | None = None
        self.events = EventLog(settings.event_buffer_bytes)
        limit = max(1024, limits.output_bytes // 2)
        self.stdout = HeadTail(limit)
        self.stderr = HeadTail(limit)
        self.started: asyncio.Future[str] = loop.create_future()
        """Resolves with the sandbox id when the call starts running."""
        self.caller_result: asyncio.Future[ToolResult] = loop.create_future()
        """The one result the caller's stream ends with (set through `answer`)."""
        self._answer_waiters: list[asyncio.Future[ToolResult]] = []
        self.final: ToolResult | None = None
        self.done = asyncio.Event()
        self.stop_reason: str | None = None
        self._stop = asyncio.Event()
        self.client = ""
        """Who asked for the call (see `CallManager.submit`)."""
        self.on_stop: Callable[[], None] | None = None
        """Called by `request_stop` while the call runs: stops its sandbox."""

    @classmethod
    def recorded(cls, entry: JournalEntry, tool: Tool, settings: Settings) -> Call:
        """A call this daemon knows only from the journal: over, with its result."""
        call = cls(entry.call_id, tool, {}, entry.fingerprint, entry.timeout_s, settings, Limits())
        call.sandbox_id = entry.sandbox_id or ""
        result = entry.result()
        call.state = entry.state
        if result is not None:
            call.final = result
            call.answer(result)
        call.started.cancel()
        call.events.close()
        call.done.set()
        return call

    def sink(self, stream: StreamKind, data: bytes) -> None:
        if stream is StreamKind.STDOUT:
            self.stdout.add(data)
        elif stream is StreamKind.STDERR:
            self.stderr.add(data)
        self.events.append(stream, data)
        limit = self.limits.output_limit_bytes
        if limit and self.stdout.total + self.stderr.total > limit:
            self.request_stop("output_limit")

    def answer(self, result: ToolResult) -> None:
        """Give the caller its result, once: the call's end, or "timeout, still running"."""
        if self.caller_result.done():
            return
        self.caller_result.set_result(result)
        waiters, self._answer_waiters = self._answer_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(result)

    def answer_waiter(self) -> asyncio.Future[ToolResult]:
        """The caller's result, for one RPC to await.

        Cancelling it (the RPC is gone) cancels nothing else, as `shield` would
        do, and the RPC resumes one turn of the event loop sooner than through
        a shield: on the call path, that is the time it takes to answer.
        """
        if self.caller_result.done():
            return self.caller_result  # awaiting a done future never suspends
        waiter: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        self._answer_waiters.append(waiter)
        return waiter

    def compact(self) -> None:
        """Let go of what only a running call needs (its result is built by now)."""
        self.arguments = {}
        self.stdout, self.stderr = HeadTail(0), HeadTail(0)

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()
        if self.on_stop is not None:
            self.on_stop()

    def info(self) -> CallInfo:
        result = self.final
        if result is None and self.caller_result.done():
            result = self.caller_result.result()
        return CallInfo(call_id=self.call_id, tool=self.tool.name, state=self.state, result=result)

    async def stream(self, from_seq: int = 1) -> AsyncIterator[Event]:
        """The call's output chunks, live, ending where the caller's result stands."""
        async for event in self.events.follow(from_seq, until=self.caller_result):
            yield event


class CallManager:
    """Admits, runs, times out, cancels and remembers calls."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        pool: SandboxPool | Callable[[Tool], SandboxPool],
        journal: Journal | None = None,
    ) -> None:
        """
        Args:
            pool: Where every call's sandbox comes from; or, per tool, the pool of
                its sandbox profile (`PoolSet.pool_for`).
        """
        self._settings = settings
        self._registry = registry
        self._pool_for = (lambda _tool: pool) if isinstance(pool, SandboxPool) else pool
        self._calls: OrderedDict[str, Call] = OrderedDict()
        self._with_events: OrderedDict[str, Call] = OrderedDict()
        self._slots = _Slots(settings.max_concurrent)
        self._active = 0
        self._by_client: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._journal = journal
        self._finished_since_prune = 0
        self._unrecorded: list[tuple[Call, ToolResult]] = []
        """Calls answered but not yet journaled as over (see `_finish`)."""
        self.draining = False

    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def active(self) -> int:
        """Calls queued or running."""
        return self._active

    # ------------------------------------------------------------------ admission

    def submit(
        self,
        tool_name: str,
        arguments_json: str,
        call_id: str = "",
        timeout_s: float = 0.0,
        client: str = "",
    ) -> Call:
        """Admit a call, or return the call already admitted under the same id.

        `client` names who asks (an agent host): each client may hold at most
        `max_calls_per_client` running and queued calls, and free slots go to
        the waiting clients in turn, so one cannot starve the others.

        A known id is answered even while the daemon drains: a client retrying
        after a dropped connection re-attaches to its call.

        Raises:
            ShuttingDownError: The daemon is draining (and the id is not known).
            ToolNotFoundError: No such tool.
            InvalidRequestError: The arguments are not JSON, or the call id is malformed.
            InvalidArgumentsError: The arguments do not fit the tool's schema.
            BadTimeoutError: The timeout is outside the tool's bounds.
            CallIdConflictError: The id belongs to a call with other arguments.
            OverloadedError: The queue is full.
        """
        tool = self._registry.get(tool_name)
        arguments = self._parse_arguments(tool, arguments_json)
        timeout = self._timeout_for(tool, timeout_s)
        fingerprint = _fingerprint(tool.name, arguments)
        rerun = False
        if call_id:
            if not CALL_ID.match(call_id):
                raise InvalidRequestError(
                    "call_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -"
                )
            existing = self._calls.get(call_id) or self._from_journal(call_id, tool)
            if existing is not None:
                if existing.fingerprint != fingerprint:
                    raise CallIdConflictError(
                        f"call id {call_id!r} is already used by a call of "
                        f"{existing.tool.name!r} with other arguments; use a new id"
                    )
                if not (existing.state is CallState.LOST and tool.options.idempotent):
                    return existing
                # A lost call of an idempotent tool runs again under its id.
                self._calls.pop(call_id, None)
                rerun = True
        else:
            call_id = uuid.uuid4().hex
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down and takes no new calls")
        limit = self._settings.max_concurrent + self._settings.max_queue
        if self._active >= limit:
            raise OverloadedError(
                f"the daemon is at its bound of {limit} running and queued calls; "
                "try again shortly",
                retry_after_s=1.0,
            )
        own = self._settings.per_client_limit()
        if self._by_client[client] >= own:
            raise OverloadedError(
                f"this client already has {own} running and queued calls, its share of "
                "the daemon; try again when some have finished",
                retry_after_s=1.0,
            )
        call = Call(
            call_id, tool, arguments, fingerprint, timeout, self._settings, self._limits_for(tool)
        )
        call.client = client
        if self._journal is not None:
            # Committed before the call can start: a call the journal does not
            # know never ran, so a retry after a crash cannot run it twice.
            self._journal.admitted(
                call_id,
                tool=tool.name,
                fingerprint=fingerprint,
                arguments_json=arguments_json,
                timeout_s=timeout,
                idempotent=tool.options.idempotent,
                replace=rerun,
            )
        begun = self._begin_now(call)
        self._calls[call_id] = call
        self._active += 1
        self._by_client[client] += 1
        task = asyncio.create_task(self._run(call, begun), name=f"call-{call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return call

    def _parse_arguments(self, tool: Tool, arguments_json: str) -> dict[str, Any]:
        try:
            arguments = json.loads(arguments_json) if arguments_json.strip() else {}
        except ValueError as exc:
            raise InvalidRequestError(f"arguments are not valid JSON: {exc}") from exc
        validated = validate_arguments(tool, arguments)
        if tool.builtin == "execute_python_file":
            validated = {**validated, "path": self._resolve_file(str(validated["path"]))}
        return dict(validated)

    def _resolve_file(self, path: str) -> str:
        dirs = [d.resolve() for d in self._settings.files_dirs]
        if not dirs:
            raise InvalidArgumentsError(
                "execute_python_file is not enabled: no files directory is configured "
                "(start the daemon with --files-dir DIR)",
                parameter="path",
                expected="a file inside a configured files directory",
                actual=path,
            )
        candidates = [Path(path)] if Path(path).is_absolute() else [d / path for d in dirs]
        for candidate in candidates:
            real = candidate.resolve()
            if any(real.is_relative_to(d) for d in dirs) and real.is_file():
                return str(real)
        raise InvalidArgumentsError(
            f"no file {path!r} inside the files directories "
            f"({', '.join(str(d) for d in dirs)}); paths may not leave them",
            parameter="path",
            expected="a file inside " + ", ".join(str(d) for d in dirs),
            actual=path,
        )

    def _timeout_for(self, tool: Tool, requested: float) -> float:
        s = self._settings
        upper = min(tool.options.max_timeout_s, s.max_timeout_s)
        if not requested:
            default = tool.options.timeout_s if tool.source == "user" else s.default_timeout_s
            return min(default, upper)
        if not s.min_timeout_s <= requested <= upper:
            raise BadTimeoutError(
                f"timeout {requested:g}s is outside the bounds of {tool.name!r}: "
                f"{s.min_timeout_s:g} to {upper:g} seconds"
            )
        return requested

    # ------------------------------------------------------------------ lookups

    def _from_journal(self, call_id: str, tool: Tool | None = None) -> Call | None:
        """A call the journal knows (over, or lost to a crash), as a finished Call."""
        if self._journal is None:
            return None
        entry = self._journal.get(call_id)
        if entry is None:
            return None
        if tool is None or tool.name != entry.tool:
            try:
                tool = self._registry.get(entry.tool)
            except ToolNotFoundError:  # served no more: the record still answers
                tool = Tool(name=entry.tool, input_schema={"type": "object"}, source="user")
        return Call.recorded(entry, tool, self._settings)

    def get(self, call_id: str) -> Call:
        """The call with that id, from memory or else from the journal.

        Raises:
            CallNotFoundError: The daemon does not know or no longer remembers it.
        """
        call = self._calls.get(call_id) or self._from_journal(call_id)
        if call is None:
            raise CallNotFoundError(
                f"no call {call_id!r} is known to this daemon (it may have been "
                "forgotten: the journal keeps calls for a bounded time and number)"
            )
        return call

    async def cancel(self, call_id: str) -> CallState:
        """Stop a call. Returns its state afterwards.

        Raises:
            CallNotFoundError: Unknown id.
        """
        call = self.get(call_id)
        if not call.state.finished:
            call.request_stop("cancelled")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.done.wait(), 10.0)
        return call.state

    # ------------------------------------------------------------------ running

    def _begin_now(self, call: Call) -> _Begun | None:
        """Start the call before `submit` returns, when nothing has to wait.

        With a free slot and a ready sandbox, the request goes into the
        sandbox's pipe right here: the tool starts while the RPC handler is
        still answering, a task switch earlier than from the call's own task.
        """
        if not self._slots.try_take():
            return None
        sandbox = self._pool_for(call.tool).try_acquire()
        if sandbox is None:
            self._slots.give()
            return None
        try:
            waiter = sandbox.begin(self._request(call), call.sink)
        except SandboxError:
            # Broke down while it waited: the call's own task gets another.
            self._pool_for(call.tool).release(sandbox)
            self._slots.give()
            return None
        self._mark_running(call, sandbox)
        return sandbox, waiter

    def _mark_running(self, call: Call, sandbox: Sandbox) -> None:
        call.state = CallState.RUNNING
        call.started_at = time.monotonic()
        call.sandbox_id = sandbox.id
        call.started.set_result(sandbox.id)
        if self._journal is not None:
            try:
                self._journal.running(call.call_id, sandbox.id)
            except JournalError as exc:  # the call runs on; its end says it, or it is lost
                log.error("cannot journal call %s as running: %s", call.call_id, exc)

    async def _run(self, call: Call, begun: _Begun | None = None) -> None:
        try:
            if begun is not None:
                try:
                    await self._see_through(call, *begun)
                finally:
                    self._slots.give()
            else:
                await self._run_admitted(call)
        except Exception as exc:  # a bug of ours must still answer the caller
            log.exception("call %s failed inside the daemon", call.call_id)
            self._finish(call, self._internal_error(call, exc))
        finally:
            self._active -= 1
            self._by_client[call.client] -= 1
            if not self._by_client[call.client]:
                del self._by_client[call.client]
            call.events.close()
            call.compact()
            self._forget_old()

    async def _run_admitted(self, call: Call) -> None:
        if not self._slots.try_take():
            # Queued behind max_concurrent calls: wait for a slot, or for a stop.
            stop_wait = asyncio.ensure_future(call._stop.wait())
            slot = asyncio.ensure_future(self._slots.take(call.client))
            try:
                await asyncio.wait({slot, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop_wait.cancel()
            if not slot.done():
                slot.cancel()
                self._finish(call, self._not_run(call, "the call was cancelled before it started"))
                return
        try:
            await self._execute(call)
        finally:
            self._slots.give()

    async def _execute(self, call: Call) -> None:
        if call.stop_reason is not None:
            self._finish(call, self._not_run(call, "the call was cancelled before it started"))
            return
        try:
            sandbox = await self._pool_for(call.tool).acquire()
        except SandboxError as exc:
            self._finish(call, self._sandbox_failed(call, str(exc)))
            return
        try:
            waiter = sandbox.begin(self._request(call), call.sink)
        except BaseException:
            self._pool_for(call.tool).release(sandbox)
            raise
        self._mark_running(call, sandbox)
        await self._see_through(call, sandbox, waiter)

    async def _see_through(
        self, call: Call, sandbox: Sandbox, waiter: Coroutine[Any, Any, RunOutcome]
    ) -> None:
        """Wait for a started call's end; a timeout or a stop kills its sandbox."""
        loop = asyncio.get_running_loop()
        reason: str | None = None
        killing: asyncio.Future[None] | None = None
        timers: list[asyncio.TimerHandle] = []

        # The run is awaited right here; a timeout or a stop request kills the
        # sandbox from a callback, and the run then ends with the tree.
        def stop(why: str) -> None:
            nonlocal reason, killing
            if killing is None:
                reason = why
                killing = asyncio.ensure_future(sandbox.kill())

        def on_timeout() -> None:
            kill_after = call.tool.options.kill_after_s
            if kill_after > call.timeout_s and call.stop_reason is None:
                # The caller hears "timeout, still running" now; the call runs on
                # detached until kill_after_s, and GetCall tells its real end.
                call.answer(self._timeout_result(call, still_running=True))
                timers.append(loop.call_later(kill_after - call.timeout_s, stop, "hard_timeout"))
            else:
                stop(call.stop_reason or "timeout")

        try:
            timers.append(loop.call_later(call.timeout_s, on_timeout))
            call.on_stop = lambda: stop(call.stop_reason or "cancelled")
            if call.stop_reason is not None:
                stop(call.stop_reason)
            outcome = await waiter
            if killing is not None:
                await killing
            self._finish(call, self._result(call, outcome, reason))
        finally:
            call.on_stop = None
            for timer in timers:
                timer.cancel()
            self._pool_for(call.tool).release(sandbox)

    def _limits_for(self, tool: Tool) -> Limits:
        limits = self._settings.limits
        if tool.options.limits:
            limits = Limits.model_validate({**limits.model_dump(), **tool.options.limits})
        return limits

    def _request(self, call: Call) -> RunRequest:
        tool, args = call.tool, call.arguments
        limits = call.limits
        if tool.builtin in ("execute_python_code", "execute_python_code_stream"):
            return RunRequest("code", {"code": args["code"]}, limits)
        if tool.builtin == "execute_python_file":
            return RunRequest(
                "file", {"path": args["path"], "args": list(args.get("args") or [])}, limits
            )
        return RunRequest(
            "user",
            {"module_path": tool.module_path, "function": tool.function, "args": args},
            limits,
        )

    # ------------------------------------------------------------------ results

    def _finish(self, call: Call, result: ToolResult) -> None:
        call.final = result
        call.state = _state_of(result)
        call.answer(result)
        if not call.started.done():
            call.started.cancel()
        call.done.set()
        # Recorded a turn of the event loop later, once the caller's RPC has
        # answered: the journal's write is then not on the call's path. A crash
        # in between (microseconds) leaves the call `lost` in the journal.
        if not self._unrecorded:
            asyncio.get_running_loop().call_soon(self._record_ends)
        self._unrecorded.append((call, result))

    def _record_ends(self) -> None:
        ends, self._unrecorded = self._unrecorded, []
        for call, result in ends:
            self._journal_finished(call, result)
            log.info(
                "call finished",
                extra={
                    "call_id": call.call_id,
                    "tool": call.tool.name,
                    "status": result.status.value,
                    "duration_s": round(result.duration_s, 4),
                    "sandbox": call.sandbox_id,
                },
            )

    def _journal_finished(self, call: Call, result: ToolResult) -> None:
        if self._journal is None:
            return
        try:
            self._journal.finished(call.call_id, call.state, result.model_dump_json())
        except JournalError as exc:
            # After a restart the call shows as lost: honest, if less precise.
            log.error("cannot journal the end of call %s: %s", call.call_id, exc)
            return
        self._finished_since_prune += 1
        if self._finished_since_prune >= PRUNE_EVERY:
            self._finished_since_prune = 0
            try:
                self._journal.prune()
            except JournalError as exc:
                log.error("cannot prune the journal: %s", exc)

    def _duration(self, call: Call) -> float:
        return time.monotonic() - (call.started_at or call.created)

    def _base(self, call: Call, **fields: Any) -> ToolResult:
        output = call.stdout.total + call.stderr.total
        truncated = call.stdout.truncated or call.stderr.truncated
        return ToolResult(
            call_id=call.call_id,
            tool=call.tool.name,
            duration_s=self._duration(call),
            output_bytes=output,
            truncated=truncated,
            **fields,
        )

    def _python_data(self, call: Call, exit_code: int | None) -> dict[str, Any]:
        return {"stdout": call.stdout.text(), "stderr": call.stderr.text(), "exit_code": exit_code}

    def _timeout_result(self, call: Call, *, still_running: bool) -> ToolResult:
        message = TIMEOUT_MESSAGE.format(timeout=call.timeout_s)
        if still_running:
            message += (
                f" It keeps running detached for up to {call.tool.options.kill_after_s:g}s "
                f"from its start; ask for call {call.call_id!r} later to learn how it ended."
            )
        data = self._python_data(call, None) if call.tool.builtin in PYTHON_BUILTINS else None
        return self._base(
            call,
            status=CallStatus.TIMEOUT,
            effect=Effect.UNKNOWN,
            message=message,
            still_running=still_running,
            data=data,
            error=ToolError(type="Timeout", message=f"no result within {call.timeout_s:g}s"),
        )

    def _result(self, call: Call, outcome: RunOutcome, reason: str | None) -> ToolResult:
        python = call.tool.builtin in PYTHON_BUILTINS
        if reason in ("timeout", "hard_timeout"):
            if reason == "hard_timeout":
                result = self._timeout_result(call, still_running=False)
                return result.model_copy(
                    update={
                        "message": f"The call was killed at its kill_after_s limit of "
                        f"{call.tool.options.kill_after_s:g}s; it may have taken effect in part.",
                    }
                )
            return self._timeout_result(call, still_running=False)
        if reason == "output_limit":
            limit = call.limits.output_limit_bytes
            return self._base(
                call,
                status=CallStatus.ERROR,
                effect=Effect.UNKNOWN,
                message=f"The tool wrote more than {limit} bytes of output and was stopped. "
                "It may have taken effect in part: check before calling it again.",
                data=self._python_data(call, None) if python else None,
                error=ToolError(type="OutputLimit", message=f"output past {limit} bytes"),
            )
        if reason in ("cancelled", "shutdown"):
            return self._base(
                call,
                status=CallStatus.CANCELLED,
                effect=Effect.UNKNOWN,
                message=CANCELLED_MESSAGE if reason == "cancelled" else SHUTDOWN_MESSAGE,
                data=self._python_data(call, None) if python else None,
                error=ToolError(type="Cancelled", message=f"stopped: {reason}"),
            )
        exit_code = outcome.exit_code
        if outcome.signal:
            exit_code = -outcome.signal
        if outcome.termination is Termination.RETURNED or (
            outcome.termination is Termination.EXITED and outcome.exit_code == 0
        ):
            if python:
                return self._base(
                    call,
                    status=CallStatus.SUCCESS,
                    effect=Effect.APPLIED,
                    data=self._python_data(call, 0),
                )
            return self._user_value(call, outcome)
        error = outcome.error or ToolError(type="Error", message="the tool failed")
        message = _failure_message(outcome, error)
        effect = (
            Effect.UNKNOWN if outcome.termination is Termination.RUNNER_LOST else Effect.APPLIED
        )
        return self._base(
            call,
            status=CallStatus.ERROR,
            effect=effect,
            message=message,
            error=error,
            data=self._python_data(call, exit_code) if python else None,
        )

    def _user_value(self, call: Call, outcome: RunOutcome) -> ToolResult:
        value, kind = outcome.value, outcome.value_kind
        if kind == "none":
            message = (
                f"Tool streamed {outcome.yields} values" if outcome.yields else NO_OUTPUT_MESSAGE
            )
            return self._base(
                call, status=CallStatus.SUCCESS, effect=Effect.APPLIED, message=message
            )
        envelope = _envelope(value) if kind == "json" else None
        if envelope is not None:
            return self._base(call, effect=Effect.APPLIED, **envelope)
        return self._base(call, status=CallStatus.SUCCESS, effect=Effect.APPLIED, data=value)

    def _not_run(self, call: Call, why: str) -> ToolResult:
        return self._base(
            call,
            status=CallStatus.CANCELLED,
            effect=Effect.NONE,
            message=f"The tool did not run: {why}.",
            error=ToolError(type="Cancelled", message=why),
        )

    def _sandbox_failed(self, call: Call, why: str) -> ToolResult:
        return self._base(
            call,
            status=CallStatus.ERROR,
            effect=Effect.NONE,
            message="The tool did not run: no sandbox could be started. Try again later.",
            error=ToolError(type="SandboxUnavailable", message=why),
        )

    def _internal_error(self, call: Call, exc: Exception) -> ToolResult:
        return self._base(
            call,
            status=CallStatus.ERROR,
            effect=Effect.UNKNOWN,
            message="The daemon failed while running the call; it may have taken effect.",
            error=ToolError(type="InternalError", message=f"{type(exc).__name__}: {exc}"),
        )

    def _forget_old(self) -> None:
        """Bound memory: drop the oldest finished calls and old output logs."""
        limit = self._settings.remembered_calls
        while len(self._calls) > limit:
            oldest_id, oldest = next(iter(self._calls.items()))
            if not oldest.state.finished:
                break
            del self._calls[oldest_id]
        if self._calls:
            newest = next(reversed(self._calls.values()))
            if newest.state.finished:
                self._with_events[newest.call_id] = newest
        while len(self._with_events) > KEPT_EVENT_LOGS:
            _, old = self._with_events.popitem(last=False)
            old.events.release()

    # ------------------------------------------------------------------ shutdown

    async def drain(self, grace_s: float) -> None:
        """Stop taking calls, let running ones finish for `grace_s`, then stop them.

        Every stopped call gets its result (cancelled, effect unknown) before
        this returns.
        """
        self.draining = True
        running = [c for c in self._calls.values() if not c.state.finished]
        if running:
            log.info("draining %d calls for up to %.1fs", len(running), grace_s)
            await asyncio.wait(
                [asyncio.create_task(c.done.wait()) for c in running], timeout=grace_s
            )
        for call in self._calls.values():
            if not call.state.finished:
                call.request_stop("shutdown")
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=15.0)
        self._record_ends()


def _fingerprint(tool: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _state_of(result: ToolResult) -> CallState:
    if result.still_running:
        return CallState.RUNNING
    return {
        CallStatus.SUCCESS: CallState.SUCCEEDED,
        CallStatus.PARTIAL: CallState.SUCCEEDED,
        CallStatus.ERROR: CallState.FAILED,
        CallStatus.TIMEOUT: CallState.TIMED_OUT,
        CallStatus.CANCELLED: CallState.CANCELLED,
        CallStatus.LOST: CallState.LOST,
    }[result.status]


def _failure_message(outcome: RunOutcome, error: ToolError) -> str:
    t = outcome.termination
    if t is Termination.RAISED:
        return f"The tool raised {error.type}: {error.message}"
    if t is Termination.EXITED:
        return f"The program exited with code {outcome.exit_code}."
    if t in (
        Termination.SIGNALED,
        Termination.CPU_LIMIT,
        Termination.FILE_SIZE_LIMIT,
        Termination.OUT_OF_MEMORY,
    ):
        return f"The program was terminated: {error.message}."
    return f"The tool failed: {error.message}"


def _envelope(value: Any) -> dict[str, Any] | None:
    """Read a returned dict of exactly the envelope shape as the result itself."""
    if not isinstance(value, dict) or not value or not set(value) <= ENVELOPE_KEYS:
        return None
    if "status" not in value:
        if set(value) != {"error"}:
            return None
        value = {"status": "error", **value}
    try:
        status = CallStatus(value["status"])
    except ValueError:
        return None
    if status in (CallStatus.TIMEOUT, CallStatus.CANCELLED, CallStatus.LOST):
        return None  # only the daemon says these
    raw_error = value.get("error")
    error = None
    if raw_error is not None:
        if isinstance(raw_error, dict):
            error = ToolError(
                type=str(raw_error.get("type", "Error")),
                message=str(raw_error.get("message", "")),
                traceback=str(raw_error.get("traceback", "")),
            )
        else:
            error = ToolError(type="Error", message=str(raw_error))
    message = value.get("message")
    return {
        "status": status,
        "data": value.get("data"),
        "message": "" if message is None else str(message),
        "error": error,
    }


_Begun = tuple[Sandbox, Coroutine[Any, Any, RunOutcome]]
"""A call started in `submit`: its sandbox, and what waits for its outcome."""


class _Slots:
    """At most `n` calls run at once; the others wait, and free slots go to the
    waiting clients in turn (in arrival order within each client).

    asyncio.Semaphore cannot be taken without awaiting, which `submit` must not,
    and knows nothing of clients.
    """

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def try_take(self) -> bool:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self, client: str = "") -> None:
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot just as the wait was cancelled: pass it on
            else:
                queue = self._waiting.get(client)
                if queue is not None:
                    with contextlib.suppress(ValueError):
                        queue.remove(waiter)
                    if not queue:
                        del self._waiting[client]
            raise

    def give(self) -> None:
        while self._waiting:
            client, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(client)  # the next slot: another client first
            else:
                del self._waiting[client]
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the waiter
                return
        self._free += 1
