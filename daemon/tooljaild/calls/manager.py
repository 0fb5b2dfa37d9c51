"""The call manager: admits calls, starts them, sees them to their end, remembers them.

It knows nothing of gRPC. A call goes QUEUED -> RUNNING -> one final state; its
output goes to an `EventLog` that any number of readers follow; its caller gets
exactly one result (`calls.results` decides what each ending means).

A call in a fresh sandbox is started and seen to its end by `calls.fresh_run`
(at once in `admit` when a slot and a ready sandbox are free, else in the
call's task, `_run`). A call naming a session goes to its
session's turn instead (`_submit_in_session`, run by `calls.in_session`), and a
built-in that runs in the daemon to its handler (`_submit_in_daemon`, run by
`calls.in_daemon_run`). On each path, a call whose caller's policy needs an
approver for its tool first waits for one (`calls.approvals`), in its task.

Every path goes through the same admission (`_check_room`, `_count_in`): the
daemon's bound on running and queued calls and each client's share of it
(`calls.admission`), or, for a call that waits for an approver, its
identity's bound on such calls; approved, it counts in as any other. Once past
them, a tool that caches its successes may answer from the journal (`calls.cache`).

A caller comes in by `admit`, one trip: the checks before the admission
(policy, arguments, whose session and id) are `calls.intake`'s. What is
remembered of calls, in memory and in the journal, is `calls.book`'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from tooljail.common import arguments_sha256
from tooljail.errors import (
    InvalidRequestError,
    SessionNotFoundError,
    ShuttingDownError,
    TooljailError,
)
from tooljail.types import CallState, ToolInfo, ToolResult
from tooljaild.auth.policy import Identity
from tooljaild.calls import cache, intake, results, terms
from tooljaild.calls import egress as call_egress
from tooljaild.calls.admission import Admission, take_slot
from tooljaild.calls.approvals import Approvals, Decision
from tooljaild.calls.book import CallBook
from tooljaild.calls.call import Call, StopReason
from tooljaild.calls.fresh_run import FreshRunner, Run
from tooljaild.calls.history import CallHistory
from tooljaild.calls.in_daemon_run import run_in_daemon
from tooljaild.calls.in_session import run_in_session, start_in_session
from tooljaild.calls.intake import CallRequest, CheckedRequest
from tooljaild.calls.status import lookup_in
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.service import EgressService
from tooljaild.journal.store import Journal
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.sandbox.session_channel import SessionCallEnd
from tooljaild.sessions.manager import SessionManager
from tooljaild.sessions.session import Session
from tooljaild.settings.commands import check_command
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.in_daemon import DaemonCall, Handler, Services
from tooljaild.tools.registry import Registry, Tool
from tooljaild.tools.run import session_required

log = logging.getLogger(__name__)


class CallManager:
    """Admits, runs, times out, cancels and remembers calls."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        pool: SandboxPool | Callable[[Tool], SandboxPool],
        journal: Journal | None = None,
        sessions: SessionManager | None = None,
        *,
        session_misfit: Callable[[Tool], str | None] = lambda _tool: None,
        services: Services | None = None,
        egress: EgressService | None = None,
    ) -> None:
        """
        Args:
            pool: Where every call's sandbox comes from; or, per tool, the pool of
                its sandbox profile (`PoolSet.pool_for`).
            sessions: The daemon's sessions, which calls may name; None: no sessions.
            session_misfit: Why a tool cannot run in a session (its sandbox profile
                is not the sessions'), or None when it can.
            services: What in-daemon tools may use (the artifact store, ...).
            egress: The daemon's egress (`[egress]`); None: no sandbox has network,
                and a call asking for egress or secrets is refused.
        """
        self._settings = settings
        self._registry = registry
        self._pool_for = (lambda _tool: pool) if isinstance(pool, SandboxPool) else pool
        self._book = CallBook(settings, registry, journal)
        self.history = CallHistory(self._book)
        """What callers may learn of the calls (GetCall, ListCalls, call_status)."""
        self._calls = self._book.calls
        self._admission = Admission(settings)
        self.egress = egress
        self._fresh = FreshRunner(
            self._admission.slots, self._book.running, self._book.end, egress=egress
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._sessions = sessions
        self._session_misfit = session_misfit
        services = services or Services(settings, sessions=sessions)
        self._services = dataclasses.replace(services, calls=lookup_in(self.history))
        self.approvals = Approvals.from_settings(settings.auth, journal, self.history.info)
        self.draining = False
        # Observer (tooljaild.app.metrics) of each refusal's code; `on_end` of each end.
        self.on_refused: Callable[[str], None] | None = None

    @property
    def on_end(self) -> Callable[[Call, ToolResult], None] | None:
        """Told of each call's end once answered and recorded (tooljaild.app.metrics)."""
        return self._book.on_end

    @on_end.setter
    def on_end(self, observer: Callable[[Call, ToolResult], None] | None) -> None:
        self._book.on_end = observer

    @property
    def registry(self) -> Registry:
        return self._registry

    def commands_allowed(self, tool: str, identity: Identity | None) -> frozenset[str] | None:
        """The commands allow-list in force for `tool` run by `identity` (None: none)."""
        return self._settings.commands.allowed(
            tool, None if identity is None else identity.commands
        )

    def states(self) -> collections.Counter[CallState]:
        """How many of the calls remembered are in each state."""
        return self._book.states()

    def reconfigure(self, settings: Settings, registry: Registry) -> None:
        """Serve `registry` under `settings` from the next call on (a reload, SIGHUP).

        Calls admitted before keep the tool, terms and sandbox they were admitted
        with. The admission bounds (`max_concurrent`, `max_queue`) stay as built.
        """
        self._settings = self._book.settings = settings
        self._registry = self._book.registry = registry

    @property
    def active(self) -> int:
        """Calls queued or running."""
        return self._admission.active

    def tool_infos(self) -> list[ToolInfo]:
        """The served tools, with the timeouts in force on this daemon."""
        return [terms.tool_info(t, self._settings) for t in self._registry.tools()]

    # ------------------------------------------------------------------ admission

    async def admit(self, request: CallRequest, *, identity: Identity | None, client: str) -> Call:
        """Admit the call `request` asks for, or return the call already admitted
        under its id: the one way in for a caller (the edge's Call and Run).

        In order: the caller's policy may call the tool; the arguments fit it
        (checked off the event loop when large); the session and call id it
        names are not another identity's; then the admission (`submit`). Each
        refusal is told to `on_refused` once.

        Args:
            identity: The authenticated caller (None: no tokens file): its policy
                may refuse the tool or make the call wait for an approver, and
                it owns the call (`client` is then its name).
            client: Who asks, for fairness and ownership (see `submit`).

        Raises:
            PermissionDeniedError: The identity may not call the tool.
            CallIdConflictError: The id is another identity's call's.
            SessionNotFoundError, SessionEndedError: The session is not the
                identity's, or not open.
            And every error of `submit`.
        """
        with self._counting_refusals():
            intake.check_policy(identity, request.tool)
            tool = self._registry.get(request.tool)
            request = intake.without_needless_session(request, tool)
            checked = await intake.check_arguments(tool, request.arguments_json, self._settings)
            # No await from here to the admission: an id or session found free or
            # the caller's here cannot change hands before the call takes it.
            if identity is not None:
                intake.check_owner(request, identity, self._book, self._sessions)
            return self._admit(request, client, identity, checked)

    def submit(
        self,
        tool_name: str,
        arguments_json: str,
        call_id: str = "",
        timeout_s: float = 0.0,
        client: str = "",
        session_id: str = "",
        identity: Identity | None = None,
    ) -> Call:
        """Admit a call now, its arguments checked on the event loop, no ownership
        checked (`admit` is the callers' way in); or return the call already
        admitted under the same id.

        `identity` is the authenticated caller (None: no tokens file): its
        policy may make the call wait for an approver (see calls/approvals.py).

        With a `session_id` the call runs in that session (its interpreter and
        workspace), in its turn: the session's queue bounds it, not the daemon's.

        `client` names who asks (an agent host): each client may hold at most
        `max_calls_per_client` running and queued calls, and free slots go to
        the waiting clients in turn, so one cannot starve the others.

        A known id is answered even while the daemon drains: a client retrying
        after a dropped connection re-attaches to its call.

        With a free slot and a ready sandbox, the call's request is in its
        sandbox before this returns.

        Raises:
            ShuttingDownError: The daemon is draining (and the id is not known).
            ToolNotFoundError: No such tool.
            InvalidRequestError: The arguments are not JSON (or past the bounds
                of their shape: `terms.check_shape`), or the call id is malformed.
            InvalidArgumentsError: The arguments do not fit the tool's schema.
            BadTimeoutError: The timeout is outside the tool's bounds.
            CallIdConflictError: The id belongs to a call with other arguments.
            OverloadedError: The queue (or the session's) is full, the client
                holds its share, or (a call needing approval) its identity has
                its bound of calls waiting for approval.
            SessionNotFoundError, SessionEndedError: No such open session.
        """
        request = CallRequest(tool_name, arguments_json, call_id, timeout_s, session_id)
        with self._counting_refusals():
            return self._admit(request, client, identity, None)

    @contextlib.contextmanager
    def _counting_refusals(self) -> Iterator[None]:
        """Tell `on_refused` the code of the error that refuses a call (once)."""
        try:
            yield
        except TooljailError as exc:
            if self.on_refused is not None:
                self.on_refused(exc.code)
            raise

    def _admit(
        self,
        asked: CallRequest,
        client: str,
        identity: Identity | None,
        checked: terms.CheckedArguments | None,
    ) -> Call:
        """`submit`'s work, without an await; `checked`: the arguments as
        `admit` checked them (None, or for a tool since reloaded: checked here)."""
        if identity is not None:  # its policy's bound on calls, in place of the share
            self._admission.limit_client(client, identity.max_concurrent_calls)
        tool = self._registry.get(asked.tool)
        if checked is not None and checked.tool is tool:
            arguments = checked.values
        else:
            arguments = terms.parse_arguments(tool, asked.arguments_json, self._settings)
        timeout = terms.timeout_for(tool, asked.timeout_s, self._settings)
        fingerprint = terms.fingerprint(
            tool.name, arguments, asked.session_id, asked.egress, asked.secrets
        )
        known, rerun = self._book.known(asked.call_id, tool, fingerprint)
        if known is not None:
            return known
        gated = identity is not None and identity.needs_approval(tool.name)
        if tool.run is not None and tool.run.command_of is not None:
            # The allow-list of commands, before anything is journaled.
            allowed = self.commands_allowed(tool.name, identity)
            check_command(*tool.run.command_of(arguments), allowed)
        request = CheckedRequest(
            asked.call_id,
            tool,
            arguments,
            asked.arguments_json,
            fingerprint,
            timeout,
            client,
            rerun,
            gated,
            identity,
            asked.egress,
            asked.secrets,
        )
        if tool.run is not None and tool.run.needs_session and not asked.session_id:
            raise session_required(tool.name)
        if tool.run is not None and tool.run.in_daemon is not None:
            if asked.egress or asked.secrets:
                raise InvalidRequestError(
                    f"{tool.name!r} runs in the daemon, with no sandbox: it takes no "
                    "egress or secrets; call it without them"
                )
            return self._submit_in_daemon(tool.run.in_daemon, asked.session_id, request)
        if asked.session_id:
            return self._submit_in_session(asked.session_id, request)
        self._check_room(request)
        # Before anything is journaled: a refusal here leaves no trace of a run.
        policy = self._egress_policy_of(request, None)
        if (cached := cache.answer(self._book, request)) is not None:
            return cached  # an earlier success given again, not run (calls/cache.py)
        call = self._new_call(request, terms.limits_for(request.tool, self._settings))
        call.egress = policy
        self._book.admitted(call, request.arguments_json, rerun)
        pool = self._pool_for(tool)  # found once: the run gives its sandbox back to it
        if gated:
            self.approvals.hold(call)
        run = None if gated or self._book.syncing else self._fresh.start_now(call, pool)
        self._calls[call.call_id] = call
        self._count_in(call, request)
        self._spawn(call, self._run(call, pool, run))
        return call

    def _check_room(self, request: CheckedRequest) -> None:
        """Refuse a new call the daemon has no room for, whatever runs it.

        Raises:
            ShuttingDownError: The daemon is draining.
            OverloadedError: No room for it: in all or in its client's share; for
                a call that waits for approval, in its identity's bound of those.
        """
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down and takes no new calls")
        if request.gated:
            # It holds no slot while it waits: it counts in once approved.
            self.approvals.check_room(request.client)
        else:
            self._admission.check_room(request.client, request.tool)

    def _count_in(self, call: Call, request: CheckedRequest) -> None:
        """Count an admitted call among the running and queued (unless it waits
        for approval: `_approved` counts it in then); `_let_go` counts it out."""
        if not request.gated:
            self._admission.admit(call.client)
            call.counted = True

    def _spawn(self, call: Call, work: Coroutine[Any, Any, None]) -> None:
        """Run `work`, the call's task, kept until it ends (drain waits for it)."""
        task = asyncio.create_task(work, name=f"call-{call.call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_call(self, request: CheckedRequest, limits: Limits) -> Call:
        """The call `request` asks for, under its id or a new one."""
        call = Call(
            request.call_id or uuid.uuid4().hex,
            request.tool,
            request.arguments,
            request.fingerprint,
            request.timeout_s,
            self._settings,
            limits,
            request.client,
            self._services.artifacts,
        )
        call.arguments_sha256 = arguments_sha256(request.arguments)
        return call

    def _admitted_here(
        self, request: CheckedRequest, limits: Limits, session: Session | None
    ) -> Call:
        """A call outside the daemon's slots (in `session`, or in the daemon), made,
        journaled and remembered; held for approval if `request` is gated."""
        call = self._new_call(request, limits)
        call.session_id = session.id if session else ""
        self._book.admitted(call, request.arguments_json, request.rerun)
        if request.gated:
            self.approvals.hold(call)
        self._calls[call.call_id] = call
        return call

    def _session_named(self, session_id: str) -> Session:
        """The open session `session_id`.

        Raises:
            SessionNotFoundError, SessionEndedError, InvalidRequestError: As
                `SessionManager.get` (or this daemon serves no sessions).
        """
        if self._sessions is None:
            raise SessionNotFoundError(f"no session {session_id!r}: this daemon serves none")
        return self._sessions.get(session_id)

    def _submit_in_session(self, session_id: str, request: CheckedRequest) -> Call:
        """Admit a call into its session's line (see `submit`)."""
        self._check_room(request)
        session = self._session_named(session_id)
        tool = request.tool
        misfit = self._session_misfit(tool)
        if misfit is not None:
            raise InvalidRequestError(
                f"{tool.name!r} cannot run in a session: {misfit}. Call it without session_id."
            )
        session.check_room()
        policy = self._egress_policy_of(request, session)
        call = self._admitted_here(request, session.terms.limits, session)
        call.egress = policy
        self._count_in(call, request)
        started = None
        # The request is in the sandbox before this returns (unless it awaits approval).
        if not (request.gated or self._book.syncing) and session.try_take_turn():
            try:
                started = start_in_session(call, session, self._book.running)
            except SandboxError:
                session.give_turn()  # the call's task finds out why, in its turn
        self._spawn(call, self._run_in_session(call, session, started))
        return call

    def _egress_policy_of(self, request: CheckedRequest, session: Session | None) -> EgressPolicy:
        """The call's egress policy (`calls.egress.policy_for`: NO_EGRESS at no cost
        when nothing asks for any)."""
        asked = request.egress, request.secrets
        return call_egress.policy_for(
            self.egress,
            request.identity,
            request.tool,
            egress=asked[0],
            secrets=asked[1],
            session=session,
        )

    def _submit_in_daemon(self, handler: Handler, session_id: str, request: CheckedRequest) -> Call:
        """Admit a call of an in-daemon tool (`tooljaild.tools.in_daemon`): no sandbox; it
        counts as any call, and runs in the in-daemon tools' pool of slots."""
        self._check_room(request)
        session = self._session_named(session_id) if session_id else None
        call = self._admitted_here(request, self._settings.limits, session)
        self._count_in(call, request)
        work = DaemonCall(
            call.call_id,
            request.tool.name,
            request.arguments,
            request.client,
            session,
            self._services,
            request.identity,
        )
        self._spawn(call, self._run_in_daemon(call, handler, work))
        return call

    async def _run_in_daemon(self, call: Call, handler: Handler, work: DaemonCall) -> None:
        """An in-daemon call's task: its handler (`calls.in_daemon_run`), its end."""
        slots = self._admission.slots_for(call.tool)
        held = False
        try:
            if not await self._book.settled(call) or not await self._approved(call):
                return
            held = await take_slot(slots, call)
            if not held or call.stop_reason is not None:
                self._book.end(call, results.not_started(call))
                return
            self._book.running(call, "daemon")
            self._book.end(call, await run_in_daemon(call, handler, work))
        except Exception as exc:  # a bug of ours must still answer the caller
            log.exception("call %s failed inside the daemon", call.call_id)
            self._book.end(call, results.internal_error(call, exc))
        finally:
            if held:
                slots.give()
            self._let_go(call)

    async def _run_in_session(
        self,
        call: Call,
        session: Session,
        started: Coroutine[Any, Any, SessionCallEnd] | None,
    ) -> None:
        """A session call's task: its turn (unless `submit` started it), its run, its end."""
        assert self._sessions is not None
        try:
            if not await self._book.settled(call) or not await self._approved(call):
                return
            result = await run_in_session(
                call, session, self._sessions, self._book.running, started
            )
            self._book.end(call, result)
        except Exception as exc:  # a bug of ours must still answer the caller
            log.exception("call %s failed inside the daemon", call.call_id)
            self._book.end(call, results.internal_error(call, exc))
        finally:
            self._let_go(call)

    # ------------------------------------------------------------------ lookups

    def get(self, call_id: str) -> Call:
        """The call with that id, from memory or else from the journal.

        Raises:
            CallNotFoundError: The daemon does not know or no longer remembers it.
        """
        return self._book.get(call_id)

    async def cancel(self, call_id: str) -> CallState:
        """Stop a call; wait up to 10 s for its end. Returns its state afterwards.

        Raises:
            CallNotFoundError: Unknown id.
        """
        call = self.get(call_id)
        if not call.state.finished:
            call.request_stop(StopReason.CANCELLED)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.ended.wait(), 10.0)
        return call.state

    # ------------------------------------------------------------------ approval

    async def _approved(self, call: Call) -> bool:
        """Wait for the decision on a call held for approval (at once True for any
        other call); False when it ended without running (denied, timed out, stopped)."""
        if call.state is not CallState.AWAITING_APPROVAL:
            return True
        refused: ToolResult | None = None
        try:
            refused = await self.approvals.wait(call)
            if refused is not None:
                self._book.end(call, refused)
        finally:
            # Its watchers hear how the wait ended, the state saying it (queued
            # once approved, ended otherwise); on any way out of the wait.
            self.approvals.settled(call)
        if refused is None:
            # Approved: it counts in as any call now, once its client has room.
            if await self._admission.wait_for_room(call.client, call.stop_requested):
                call.counted = True
                self.approvals.let_go(call)
                return True
            self._book.end(call, results.not_started(call))
        return False

    async def decide(
        self, call_id: str, approver: Identity | None, approve: bool, reason: str = ""
    ) -> Call:
        """An approver's decision on a call awaiting approval (see calls/approvals.py).

        Approved, the call is queued to run when this returns; denied, it has ended.

        Raises:
            PermissionDeniedError: `approver` may not decide (checked first: a
                non-approver learns nothing of the call).
            CallNotFoundError: Unknown id.
            NotAwaitingApprovalError: The call does not wait for approval.
            InvalidRequestError: The reason is too long.
        """
        name = self.approvals.check_approver(approver)
        assert approver is not None  # check_approver refuses None
        call = self.get(call_id)
        decision = Decision(approve, name, reason)
        self.approvals.check_decision(call, approver, decision)
        self.approvals.decide(call, decision)
        if not approve:
            await call.ended.wait()  # its task ends it a turn later
        return call

    def revoke(self, may_call: Callable[[str, str], bool]) -> int:
        """Stop every call not yet running whose client may no longer make it
        (`may_call(client, tool)` is False: its identity was removed from the
        tokens file, or may no longer call that tool).

        A call waiting for approval, for its turn or for a slot ends without
        running (effect none, error `IdentityRevoked`, journaled so); a running
        call runs on under the identity it was admitted with.

        Returns:
            How many calls were stopped.
        """
        stopped = 0
        for call in list(self._calls.values()):
            if call.state.finished or call.running.done() or call.stop_requested.done():
                continue
            if not may_call(call.client, call.tool.name):
                call.request_stop(StopReason.REVOKED)
                stopped += 1
        if stopped:
            log.warning("stopped %d calls of revoked identities before they ran", stopped)
        return stopped

    # ------------------------------------------------------------------ running

    async def _run(self, call: Call, pool: SandboxPool, run: Run | None) -> None:
        """The call's task: start it unless `submit` did, see it through, let go."""
        try:
            if run is None:
                if not await self._book.settled(call) or not await self._approved(call):
                    return
                run = await self._fresh.start_later(call, pool)
            if run is not None:
                await self._fresh.supervise(call, run)
        except Exception as exc:  # a bug of ours must still answer the caller
            log.exception("call %s failed inside the daemon", call.call_id)
            self._book.end(call, results.internal_error(call, exc))
        finally:
            self._let_go(call)

    def _let_go(self, call: Call) -> None:
        """A call's task is over: count it out, close its output, drop what only a
        running call needs, and bound what is remembered."""
        if call.counted:
            call.counted = False
            self._admission.release(call.client)
        self.approvals.let_go(call)
        call.events.close()
        call.compact()
        self._book.forget_old(call)

    # ------------------------------------------------------------------ shutdown

    async def drain(self, grace_s: float) -> None:
        """Stop taking calls, let running ones finish for `grace_s`, then stop them.

        Every stopped call gets its result (cancelled, effect unknown) before
        this returns; a call awaiting approval is stopped at once (effect none).
        """
        self.draining = True
        for call in self._calls.values():
            if call.state is CallState.AWAITING_APPROVAL:
                # It has not run and no approver is sure to come within the
                # grace: it ends now (effect none) rather than hold the drain.
                call.request_stop(StopReason.SHUTDOWN)
        running = [c for c in self._calls.values() if not c.state.finished]
        if running:
            log.info("draining %d calls for up to %.1fs", len(running), grace_s)
            await asyncio.wait([c.ended.wait() for c in running], timeout=grace_s)
        for call in self._calls.values():
            if not call.state.finished:
                call.request_stop(StopReason.SHUTDOWN)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=15.0)
        # Every wait is settled and told: the approvals' watches end cleanly.
        self.approvals.feed.close()
        self._book.record_starts()  # a call's start before its end, as they happened
        self._book.record_ends()
