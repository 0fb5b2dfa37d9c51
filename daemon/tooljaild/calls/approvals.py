"""Calls that wait for an approver before they run.

An identity's policy may list tools in `approval` (tooljaild.auth.policy): its
calls of them are admitted (journaled, counted in their client's share) but
wait in state AWAITING_APPROVAL until an identity with `approver = true` says
yes or no, the call is stopped (cancelled, the daemon shuts down), or
`[auth] approval_timeout_s` passes. Approved, the call goes on as any other
(queued for a slot, then run); its own timeout starts when it runs. Otherwise
it ends without running, with effect none and a message a model can act on.

The waiting call's stream starts with a NOTICE chunk (seq 1) saying it waits
and how to decide (`waiting_notice`); the journal records the state, so a
daemon that dies while a call waits marks it lost with effect none.

Waiting holds no sandbox, so a waiting call does not count against the
daemon's bound of running and queued calls, nor its identity's share of it:
otherwise two identities could fill that bound with calls nobody decides on
and refuse everyone else for the whole approval timeout. Its own bound is
per identity (`[auth] max_calls_awaiting_approval`): past it, that identity's
next call needing approval is refused (RESOURCE_EXHAUSTED with a retry hint),
and no other identity is. Approved, the call counts in as any other (it
waits for room in its identity's share if it must: `Admission.wait_for_room`)
and leaves the approvals' count then (`let_go`).

Who decides: an identity with `approver = true`, on a call of a tool its own
policy lets it call: an approver limited to some tools vouches for those
only (it may still deny any call: refusing never runs anything). A reason is
at most `[auth] max_reason_chars` characters.

Who is told: the approval queue publishes to its watchers
(`tooljaild.calls.approval_feed`, the WatchApprovals streams): a REQUESTED
event when a call is held, a DECIDED event once its wait is over and its state
says how (`settled`, which the manager calls after it booked a refused call's
end). `waiting` lists the calls held and not yet settled (ListApprovals).

Nothing here knows gRPC: the manager holds an `Approvals` and calls
`check_room` and `hold` at admission and `wait` in the call's task; the
Approve RPC reaches `decide`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tooljail.errors import (
    InvalidRequestError,
    NotAwaitingApprovalError,
    OverloadedError,
    PermissionDeniedError,
)
from tooljail.types import (
    ApprovalEvent,
    ApprovalEventKind,
    CallInfo,
    CallState,
    CallStatus,
    StreamKind,
    ToolError,
    ToolResult,
)
from tooljaild.auth.policy import Identity
from tooljaild.calls import results
from tooljaild.calls.approval_feed import ApprovalFeed, Watcher
from tooljaild.calls.call import Call, StopReason
from tooljaild.calls.output import Event
from tooljaild.journal.store import DEFAULT_MAX_ARGUMENT_BYTES, Journal, JournalError
from tooljaild.settings.auth import AuthSettings

log = logging.getLogger(__name__)

NOTICE_SEQ = 1
"""The waiting notice is the call's first chunk: it is appended at admission."""


@dataclass(frozen=True)
class Decision:
    """An approver's answer to one waiting call."""

    approve: bool
    approver: str
    reason: str = ""


def notice_text(call_id: str, timeout_s: float) -> str:
    """What a waiting call's stream says first: that it waits, and how to decide."""
    return (
        f"[call {call_id} waits for approval before it runs: an approver runs "
        f"`tooljail approve {call_id}` or `tooljail deny {call_id} --reason ...`; "
        f"without a decision within {timeout_s:g}s it ends without running]\n"
    )


def waiting_notice(call: Call, timeout_s: float) -> Event | None:
    """The NOTICE chunk a stream of `call` starts with while it waits; None if it
    does not wait. The RPC sends it before the call runs (a call's chunks are
    otherwise sent once it starts), so a caller knows at once why nothing happens."""
    if call.state is not CallState.AWAITING_APPROVAL:
        return None
    return Event(NOTICE_SEQ, StreamKind.NOTICE, notice_text(call.call_id, timeout_s).encode())


def denied(call: Call, decision: Decision) -> ToolResult:
    """The result of a call an approver refused: it did not run."""
    why = decision.reason or "no reason given"
    return _refused(
        call,
        f"The tool did not run: the call was denied by approver {decision.approver!r} "
        f"({why}). Do not repeat it unchanged: tell the user it was refused and why, or "
        "reach the goal another way.",
        ToolError(type="ApprovalDenied", message=f"denied by {decision.approver}: {why}"),
    )


def timed_out(call: Call, timeout_s: float) -> ToolResult:
    """The result of a call no approver decided on in time: it did not run."""
    return _refused(
        call,
        f"The tool did not run: it needs an approver's consent and none came within "
        f"{timeout_s:g}s. Tell the user it awaits approval, or call it again later to ask "
        "again.",
        ToolError(type="ApprovalTimeout", message=f"no decision within {timeout_s:g}s"),
    )


def _refused(call: Call, message: str, error: ToolError) -> ToolResult:
    # not_run gives effect none, the duration and the call's identity fields.
    result = results.not_run(call, error.message)
    return result.model_copy(
        update={"status": CallStatus.ERROR, "message": message, "error": error}
    )


class Approvals:
    """The calls waiting for an approver, and their decisions."""

    def __init__(
        self,
        timeout_s: float,
        journal: Journal | None = None,
        *,
        per_identity: int = 16,
        max_reason_chars: int = 1000,
        feed: ApprovalFeed | None = None,
        describe: Callable[[Call], CallInfo] = Call.info,
    ) -> None:
        """
        Args:
            timeout_s: How long a call waits for a decision (`[auth] approval_timeout_s`).
            journal: Records the waiting state; None: nothing is recorded.
            per_identity: Calls one identity may have held here at once
                (`[auth] max_calls_awaiting_approval`).
            max_reason_chars: The longest reason a decision may give.
            feed: Its watchers; None: a feed with the default bounds.
            describe: A call's whole `CallInfo` for its watchers (`CallHistory.info`).
        """
        self.feed = feed or ApprovalFeed()
        self._describe = describe
        self._pending: dict[str, tuple[Call, ApprovalEvent]] = {}
        """Calls held and not yet settled, in the order they were held (oldest first),
        each with the REQUESTED event told of it: built once, and shared by every
        watcher's snapshot and ListApprovals."""
        self.timeout_s = timeout_s
        self.per_identity = per_identity
        self.max_reason_chars = max_reason_chars
        self._journal = journal
        self._waiting: dict[str, asyncio.Future[Decision]] = {}
        self._held: dict[str, str] = {}
        """Calls held and not yet counted in (call id -> client), waiting or approved."""
        self._by_client: Counter[str] = Counter()

    @classmethod
    def from_settings(
        cls, auth: AuthSettings, journal: Journal | None, describe: Callable[[Call], CallInfo]
    ) -> Approvals:
        """The approvals `[auth]` describes, their watchers' bounds too."""
        feed = ApprovalFeed(
            max_watchers=auth.max_approval_watchers,
            per_identity=auth.max_approval_watchers_per_identity,
            buffer_bytes=auth.approval_watch_buffer_bytes,
            # What the journal keeps of arguments is what a watcher is told.
            max_argument_bytes=(
                DEFAULT_MAX_ARGUMENT_BYTES if journal is None else journal.max_argument_bytes
            ),
        )
        return cls(
            auth.approval_timeout_s,
            journal,
            per_identity=auth.max_calls_awaiting_approval,
            max_reason_chars=auth.max_reason_chars,
            feed=feed,
            describe=describe,
        )

    def check_room(self, client: str) -> None:
        """Refuse a call needing approval when its identity has its bound held.

        Raises:
            OverloadedError: `client` has `per_identity` calls held already.
        """
        if self._by_client[client] >= self.per_identity:
            raise OverloadedError(
                f"this identity already has {self.per_identity} calls waiting for approval "
                "(or approved and waiting for room), its bound; ask an approver to decide "
                "on them, or try again when some have ended",
                retry_after_s=min(30.0, self.timeout_s),
            )

    def let_go(self, call: Call) -> None:
        """`call` leaves the approvals' count: it was counted in among the running
        and queued calls, or it ended. Nothing happens for a call not held."""
        client = self._held.pop(call.call_id, None)
        if client is None:
            return
        self._by_client[client] -= 1
        if not self._by_client[client]:
            del self._by_client[client]

    def held(self, client: str) -> int:
        """How many calls of `client` are held (waiting, or approved and not counted in)."""
        return self._by_client[client]

    def hold(self, call: Call) -> None:
        """Make an admitted (journaled), not yet started call wait for approval.

        Its state becomes AWAITING_APPROVAL, its stream gets the waiting notice,
        and the journal records it (a failed write is logged: after a restart
        such a call shows as lost with effect unknown, pessimistic but honest).
        """
        call.state = CallState.AWAITING_APPROVAL
        call.events.append(StreamKind.NOTICE, notice_text(call.call_id, self.timeout_s).encode())
        self._waiting[call.call_id] = asyncio.get_running_loop().create_future()
        if call.call_id not in self._held:
            self._held[call.call_id] = call.client
            self._by_client[call.client] += 1
        self._record(call, CallState.AWAITING_APPROVAL)
        if call.call_id not in self._pending:
            requested = self.feed.publish(ApprovalEventKind.REQUESTED, self._describe(call))
            self._pending[call.call_id] = (call, requested)
        log.info(
            "call awaits approval",
            extra={"call_id": call.call_id, "tool": call.tool.name, "client": call.client},
        )

    async def wait(self, call: Call) -> ToolResult | None:
        """Wait for the decision on a held call. None: approved, the call is queued
        again and may start; else the result it ends with (denied, timed out,
        stopped while it waited), effect none.

        Waits at most `timeout_s`; a stop (`Call.request_stop`) ends the wait at once.
        """
        decision = self._waiting.get(call.call_id)
        if decision is None:  # never held: nothing to wait for
            return None
        stop = call.stop_requested.wait()
        either: set[asyncio.Future[Any]] = {decision, stop}
        try:
            await asyncio.wait(either, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._waiting.pop(call.call_id, None)
        if call.stop_reason is not None:  # a stop outweighs a decision in the same turn
            if call.stop_reason is StopReason.CANCELLED:
                return results.not_run(call, "the call was cancelled while it waited for approval")
            if call.stop_reason is StopReason.REVOKED:
                return results.revoked(call)
            return results.not_run(call, "the daemon shut down while the call waited for approval")
        if not decision.done():
            decision.cancel()
            log.info("call approval timed out", extra={"call_id": call.call_id})
            return timed_out(call, self.timeout_s)
        answer = decision.result()
        if not answer.approve:
            return denied(call, answer)
        call.state = CallState.QUEUED
        self._record(call, CallState.QUEUED)
        call.events.append(
            StreamKind.NOTICE, f"[call {call.call_id} approved by {answer.approver}]\n".encode()
        )
        return None

    def settled(self, call: Call) -> None:
        """`call` waits no more, and its state says how (queued once approved; ended
        when denied, timed out or stopped): its watchers are told (DECIDED).
        Nothing happens for a call not held, or settled already."""
        if self._pending.pop(call.call_id, None) is None:
            return
        self.feed.publish(ApprovalEventKind.DECIDED, self._describe(call))

    def requests(self, approver: Identity | None = None) -> list[ApprovalEvent]:
        """The REQUESTED events of the calls waiting for a decision now, oldest
        first; with `approver`, of those it may decide (its policy lets it call
        their tool). Each the event told when the call was held (its arguments
        cut to the journal's bound): no call is described again."""
        pending = [
            (call, event)
            for call, event in self._pending.values()
            if call.state is CallState.AWAITING_APPROVAL
            and (approver is None or approver.may_use(call.tool.name))
        ]
        return [event for _, event in sorted(pending, key=lambda p: p[0].received_at)]

    def watch(self, approver: Identity | None) -> Watcher:
        """A watcher of the queue for `approver`: first the calls waiting now that
        it may decide, then each new one and each end of waiting (see the feed).

        Raises:
            PermissionDeniedError: `approver` may not decide (as `check_approver`).
            OverloadedError: The bounds of watchers are reached (see the feed).
        """
        self.check_approver(approver)
        assert approver is not None  # check_approver refuses None
        return self.feed.subscribe(approver, self.requests(approver))

    def check_decision(self, call: Call, approver: Identity, decision: Decision) -> None:
        """Refuse a decision `approver` may not give on `call`, or one too long.

        Raises:
            InvalidRequestError: The reason is longer than `max_reason_chars`.
            PermissionDeniedError: It approves a tool its own policy does not let
                it call: an approver vouches for what it may do itself (a
                deny runs nothing, and is allowed on any call).
        """
        if len(decision.reason) > self.max_reason_chars:
            raise InvalidRequestError(
                f"the reason is {len(decision.reason)} characters long; at most "
                f"{self.max_reason_chars} are kept: shorten it"
            )
        if decision.approve and not approver.may_use(call.tool.name):
            raise PermissionDeniedError(
                f"this approver may not approve calls of {call.tool.name!r}: its own policy "
                "does not let it call that tool (it may deny the call; an approver whose "
                "tools include it must approve)"
            )

    @staticmethod
    def check_approver(identity: Identity | None) -> str:
        """The approver's name, if `identity` may decide on waiting calls.

        Raises:
            PermissionDeniedError: It may not (or nobody is authenticated: a
                daemon without a tokens file has no approvers).
        """
        if identity is None:
            # No tokens file (or no identity on this connection): no call here
            # can await approval, and nobody may decide.
            raise PermissionDeniedError(
                "approving (and listing or watching the calls awaiting approval) needs an "
                "identity with approver = true ([auth] tokens_file); this caller has none"
            )
        if not identity.approver:
            raise PermissionDeniedError(
                f"identity {identity.name!r} may not approve, deny, list or watch calls "
                "awaiting approval: only an identity with approver = true in the daemon's "
                "tokens file may"
            )
        return identity.name

    def decide(self, call: Call, decision: Decision) -> None:
        """Give the decision on `call`; its task acts on it (see `wait`).

        Raises:
            NotAwaitingApprovalError: The call does not wait for approval (it
                was decided on already, or never needed it).
            PermissionDeniedError: The approver made the call and approves it:
                consent must come from someone else (denying one's own call,
                like cancelling it, is allowed).
        """
        waiting = self._waiting.get(call.call_id)
        if waiting is None or waiting.done() or call.state is not CallState.AWAITING_APPROVAL:
            raise NotAwaitingApprovalError(
                f"call {call.call_id!r} is not awaiting approval (it is {call.state.value})"
            )
        if decision.approve and decision.approver == call.client:
            raise PermissionDeniedError(
                f"call {call.call_id!r} is {decision.approver!r}'s own: another approver "
                "must approve it (it may still be denied or cancelled)"
            )
        waiting.set_result(decision)
        if decision.approve:
            # At once, not a turn later: the approver's answer shows it queued.
            call.state = CallState.QUEUED
        log.info(
            "call approved" if decision.approve else "call denied",
            extra={
                "call_id": call.call_id,
                "approver": decision.approver,
                "reason": decision.reason,
            },
        )

    def _record(self, call: Call, state: CallState) -> None:
        if self._journal is None:
            return
        with contextlib.suppress(ValueError):  # no row: a journal that forgot it
            try:
                self._journal.waiting(call.call_id, state)
            except JournalError as exc:
                log.error("cannot journal call %s as %s: %s", call.call_id, state.value, exc)
