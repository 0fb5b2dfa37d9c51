"""rpc ListApprovals and rpc WatchApprovals: the approval queue, for an approver.

Who may: an identity with `approver = true`, as for Approve
(`Approvals.check_approver`), and it sees the calls it may decide: those of
tools its own policy lets it call. Anyone else is PERMISSION_DENIED, in words
that say who may. Without a tokens file nobody is an approver (no call can
wait for one there): both RPCs are PERMISSION_DENIED, as Approve is.

ListApprovals answers the calls waiting now, oldest first, each a whole
`CallInfo` (arguments cut to the journal's bound, who asked, when).

WatchApprovals sends a REQUESTED event per call waiting now, then each new
request and each end of waiting (DECIDED) as it happens (`calls.approval_feed`).
Each event is written with `context.write`, racing the watcher's failure: a
reader that falls behind its backlog bound, or whose approver right a reload
took away, has its stream ended with that error (RESOURCE_EXHAUSTED or
PERMISSION_DENIED) even while a write to it is stuck. At shutdown the stream
ends cleanly (OK) once the calls that waited are settled and sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc.aio

from tooljail.types import ApprovalEvent, ApprovalEventKind
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.wire import call_info_to_proto
from tooljaild.auth.policy import Identity
from tooljaild.calls.approval_feed import Watcher
from tooljaild.calls.approvals import Approvals

__all__ = ["list_approvals", "watch_approvals"]

_KIND = {
    ApprovalEventKind.REQUESTED: pb.APPROVAL_EVENT_KIND_REQUESTED,
    ApprovalEventKind.DECIDED: pb.APPROVAL_EVENT_KIND_DECIDED,
}


def list_approvals(
    approvals: Approvals, identity: Identity | None, daemon_id: str
) -> pb.ListApprovalsResponse:
    """The ListApprovals RPC's answer.

    Raises:
        PermissionDeniedError: The caller is no approver.
    """
    approvals.check_approver(identity)
    calls = [event.call for event in approvals.requests(identity)]
    return pb.ListApprovalsResponse(calls=[_named(call_info_to_proto(i), daemon_id) for i in calls])


async def watch_approvals(
    approvals: Approvals,
    identity: Identity | None,
    context: grpc.aio.ServicerContext,
    daemon_id: str,
) -> AsyncIterator[pb.ApprovalEvent]:
    """The WatchApprovals RPC: writes its events itself (see the module doc).

    Raises:
        PermissionDeniedError: The caller is no approver (or stopped being one).
        OverloadedError: Too many watches, or this one fell behind.
    """
    watcher = approvals.watch(identity)
    try:
        # The watch is in place: its client's `watch_approvals()` returns now, and
        # a request made after that is told.
        await context.send_initial_metadata(())
        while (event := await watcher.next()) is not None:
            await _write(context, watcher, _message(event, daemon_id))
    finally:
        approvals.feed.unsubscribe(watcher)
    return
    yield  # an async generator (the error edge wraps one), which writes its own messages


async def _write(
    context: grpc.aio.ServicerContext, watcher: Watcher, message: pb.ApprovalEvent
) -> None:
    """Write `message`, or raise the watcher's error if it fails first: a reader
    that reads nothing must not keep a failed watch open."""
    if watcher.error is not None:
        raise watcher.error
    write = asyncio.ensure_future(context.write(message))
    # Its outcome is retrieved whatever happens here (a cancelled write is not
    # awaited: our own cancel must not be swallowed), so none is "never retrieved".
    write.add_done_callback(_retrieve)
    failed = asyncio.ensure_future(watcher.failed.wait())
    try:
        await asyncio.wait((write, failed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        failed.cancel()
        if not write.done():
            write.cancel()
    if not write.done():
        assert watcher.error is not None  # only a failure ends the wait before the write
        raise watcher.error
    write.result()


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


def _message(event: ApprovalEvent, daemon_id: str) -> pb.ApprovalEvent:
    return pb.ApprovalEvent(
        kind=_KIND[event.kind], call=_named(call_info_to_proto(event.call), daemon_id)
    )


def _named(info: pb.CallInfo, daemon_id: str) -> pb.CallInfo:
    """`info` naming this daemon (as the servicer's `_named` does for GetCall)."""
    info.daemon_id = daemon_id
    if info.HasField("result"):
        info.result.daemon_id = daemon_id
    return info
