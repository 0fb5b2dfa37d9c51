"""The approval queue's methods of `Client` and `AsyncClient`, for an approver.

Each client class takes them from here (`Client(_SyncApprovals)`,
`AsyncClient(_AsyncApprovals)`): the flows are `_ClientPlans`'s, the watches
`tooljail._approvals`'s; the contract of each is in `_SyncApprovals`'s docstrings.
"""

from __future__ import annotations

from tooljail._approvals import ApprovalWatch, AsyncApprovalWatch
from tooljail._async_router import AsyncRouter
from tooljail._call_types import CallInfo
from tooljail._client_plans import _ClientPlans
from tooljail._router import Router

__all__ = ["_AsyncApprovals", "_SyncApprovals"]


class _SyncApprovals(_ClientPlans):
    """`Client`'s approval methods."""

    _router: Router

    def list_approvals(self) -> list[CallInfo]:
        """The calls waiting for an approver that this identity may decide, oldest
        first: each with its arguments (cut past the daemon's journal bound, see
        `CallInfo.arguments_note`), who asked (`client_name`) and when
        (`received_at`). Over many daemons, every reachable daemon's, merged.

        Only an identity with `approver = true` may, and it sees the calls of the
        tools its own policy lets it call (those it may approve).

        Raises:
            PermissionDeniedError: When this identity is no approver (or the
                daemon has no tokens file: nobody is).
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_list_approvals())

    def watch_approvals(self) -> ApprovalWatch:
        """The approval queue, live: an iterator of `ApprovalEvent` and a context
        manager (closing it ends the watch, from another thread too).

        First a REQUESTED event for each call waiting now (as `list_approvals`),
        then each new request (REQUESTED) and each end of waiting (DECIDED: the
        call's state says approved, denied, timed out, cancelled or revoked), as
        they happen; iteration ends when the daemon stops. It returns once the
        daemon has the watch in place. Over many daemons it watches every daemon
        reachable now, merged (see `tooljail._approvals`). Not retried: after an
        error, watch again (it starts with the calls waiting then).

        Raises:
            PermissionDeniedError: When this identity is no approver (at once),
                or stops being one (from the iterator: a reload took it away).
            OverloadedError: When the daemon serves as many watches as it
                allows (at once; see `retry_after_s`), or this watch fell
                behind its reader (from the iterator): watch again.
            TransportError: When the RPC fails.
        """
        calls = self._router.run(self._plan_watch_approvals())
        return ApprovalWatch(calls, self._router.map_error)


class _AsyncApprovals(_ClientPlans):
    """`AsyncClient`'s approval methods: `_SyncApprovals`'s, awaited."""

    _router: AsyncRouter

    async def list_approvals(self) -> list[CallInfo]:
        """The calls waiting for this approver, oldest first. See `Client.list_approvals`."""
        return await self._router.run(self._plan_list_approvals())

    async def watch_approvals(self) -> AsyncApprovalWatch:
        """The approval queue, live: `async with await client.watch_approvals() as w:`
        (`async for event in w`). See `Client.watch_approvals`."""
        calls = await self._router.run(self._plan_watch_approvals())
        return await AsyncApprovalWatch.open(calls, self._router.map_error)
