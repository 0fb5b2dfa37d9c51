"""`Client`'s history methods (`list_calls`, `iter_calls`), beside it: the blocking
client's module is at its size bound. Each body runs a flow of `_ClientPlans`
(`_plan_list_calls`), as `Client`'s other methods do; `AsyncClient` awaits the
same flow.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

from tooljail._call_types import CallInfo, CallPage
from tooljail._client_plans import _ClientPlans
from tooljail._router import Router
from tooljail._types import CallStatus

__all__ = ["_ClientWithHistory"]


class _ClientWithHistory(_ClientPlans):
    """`_ClientPlans` with `Client`'s history methods (blocking)."""

    _router: Router

    def list_calls(
        self,
        *,
        tool: str | None = None,
        session_id: str | None = None,
        status: CallStatus | str | None = None,
        since: datetime.datetime | float | None = None,
        until: datetime.datetime | float | None = None,
        running: bool | None = None,
        client_name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> CallPage:
        """A page of the calls the daemon knows (its journal's), newest first.

        An identity sees its own calls only; an approver, or the operator (a
        daemon without tokens, or root and the daemon's own user on its Unix
        socket), sees every client's and may name one. Each filter narrows;
        None leaves it open. Over many daemons, their pages are merged newest
        first, and `next_cursor` holds each daemon's place: no call is lost or
        shown twice across pages (a daemon unreachable meanwhile is skipped).

        Args:
            tool: Only calls of this tool.
            session_id: Only calls in this session.
            status: Only calls that ended so (a `CallStatus`, or its value
                such as "timeout").
            since: Only calls received at or after this time: a datetime
                (naive ones are UTC) or unix seconds.
            until: Only calls received before this time (as `since`).
            running: True: only calls not ended yet (queued, awaiting
                approval, running); False: only ended ones; None: both.
            client_name: Only this client's calls: an approver's or the
                operator's question (PERMISSION_DENIED for anyone else naming
                another client). None: the caller's own, or for them, everyone's.
            limit: Calls per page, 1..1000.
            cursor: The `next_cursor` of the page before; None: the first page.

        Returns:
            The page: `.calls` (each a whole `CallInfo`: arguments, who, when,
            how it ended) and `.next_cursor` ("" on the last page).

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When a value is out of range (a status, a
                time, `since` after `until`, the limit) or the cursor is not
                one a page gave.
            PermissionDeniedError: When `client_name` names another client and
                this identity is neither an approver nor the operator.
            TransportError: When the RPC fails.
        """
        return self._router.run(
            self._plan_list_calls(tool=tool, session_id=session_id, status=status, since=since,
                                  until=until, running=running, client_name=client_name,
                                  limit=limit, cursor=cursor)
        )  # fmt: skip

    def iter_calls(self, **filters: Any) -> Iterator[CallInfo]:
        """Every call `list_calls(**filters)` finds, page after page (newest first).

        Raises:
            As `list_calls`, when a page is asked for.
        """
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_calls(**filters, cursor=cursor)
            yield from page.calls
            if not page.next_cursor:
                return
            cursor = page.next_cursor
