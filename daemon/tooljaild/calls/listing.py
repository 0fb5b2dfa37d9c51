"""ListCalls' rules: whose calls a caller may list (`scope`), which queries are
sound (`check_query`), and a journaled row made true to the live call (`overlay`).

Who sees what, as for GetCall (`tooljaild.calls.history`):

- without authentication (`identity` None: no tokens file, or the operator on
  the Unix socket), every call, and any `client_name` may be named;
- an approver sees every call and may name any client (it judges others' calls);
- any other identity sees its own calls only: the query's client is forced to
  its name, and naming another client is PERMISSION_DENIED (not an empty page:
  the caller asked for something it may not have, and should hear why).
"""

from __future__ import annotations

import datetime
import math

from tooljail.common import utc_from_unix
from tooljail.errors import PermissionDeniedError
from tooljail.types import CallInfo, CallStatus
from tooljaild.auth.policy import Identity
from tooljaild.calls.call import Call
from tooljaild.journal.history import BadQueryError, CallQuery

__all__ = ["check_query", "overlay", "scope"]

_STATUSES = frozenset(s.value for s in CallStatus)


def scope(identity: Identity | None, client_name: str) -> str | None:
    """The client whose calls a query of `identity` may list (see the module's
    rule); None: everyone's.

    Raises:
        PermissionDeniedError: A caller that is neither an approver nor the
            operator names another client.
    """
    if identity is None or identity.approver:
        return client_name or None
    if client_name and client_name != identity.name:
        raise PermissionDeniedError(
            f"only an approver or the operator may list another client's calls "
            f"(client_name={client_name!r}); leave client_name empty to list your own"
        )
    return identity.name


def check_query(query: CallQuery) -> CallQuery:
    """`query`, if it is one the journal can answer (`select` checks the limit
    and the cursor).

    Raises:
        BadQueryError: A status that is not a `CallStatus` value, a time that
            is negative or not finite, or `since` after `until`.
    """
    if query.status and query.status not in _STATUSES:
        raise BadQueryError(f"status {query.status!r} is not one of {', '.join(sorted(_STATUSES))}")
    for name in ("since", "until"):
        value = getattr(query, name)
        if not math.isfinite(value) or value < 0:
            raise BadQueryError(
                f"{name} must be seconds since the epoch (0: no bound), not {value!r}"
            )
    if query.since and query.until and query.since > query.until:
        raise BadQueryError(
            f"since ({_iso(query.since)}) is after until ({_iso(query.until)}): "
            "no call can match; swap them"
        )
    return query


def overlay(recorded: CallInfo, live: Call) -> CallInfo:
    """A journaled row of an unfinished call, made true to the live call in
    memory: its state, result, times and sandbox. The journal lags a turn of
    the event loop at a call's end (`CallBook.end`), and never records a
    detached call's "timeout, still running" answer; memory holds both. The
    arguments stay the journal's: bounded, as a listing must be."""
    result = live.result
    if result is None and live.answered.done():
        result = live.answered.result()
    return recorded.model_copy(
        update={
            "state": live.state,
            "result": result,
            "started_at": utc_from_unix(live.started_wall),
            "ended_at": utc_from_unix(live.ended_wall),
            "sandbox_id": live.sandbox_id,
        }
    )


def _iso(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, tz=datetime.UTC).isoformat()
