"""ListCalls on the wire: the request read into a `CallQuery`, the page written
back, each call naming this daemon. Who may list what, and the page itself, are
`CallHistory.list_calls`'s (`tooljaild.calls.history`, `tooljaild.calls.listing`).
"""

from __future__ import annotations

from tooljail.errors import InvalidRequestError
from tooljail.types import CallStatus
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.wire import call_info_to_proto, status_from_proto
from tooljaild.auth.policy import Identity
from tooljaild.calls.history import CallHistory
from tooljaild.journal.history import DEFAULT_LIMIT, MAX_LIMIT, CallQuery

__all__ = ["list_calls", "query_of"]

_RUNNING: dict[int, bool | None] = {
    pb.RUNNING_FILTER_ANY: None,
    pb.RUNNING_FILTER_RUNNING: True,
    pb.RUNNING_FILTER_ENDED: False,
}


def query_of(request: pb.ListCallsRequest) -> CallQuery:
    """The query a ListCalls request asks (its client named apart: see `list_calls`).

    Raises:
        InvalidRequestError: A status or running filter this daemon does not
            know, or a limit over `MAX_LIMIT` (the journal checks the rest).
    """
    status = ""
    if request.status != pb.STATUS_UNSPECIFIED:
        try:
            status = status_from_proto(request.status).value
        except ValueError:
            raise InvalidRequestError(
                f"status {request.status} is not a Status this daemon knows "
                f"({', '.join(s.value for s in CallStatus)})"
            ) from None
    if request.running not in _RUNNING:
        raise InvalidRequestError(
            f"running {request.running} is not a RunningFilter (ANY, RUNNING or ENDED)"
        )
    if request.limit > MAX_LIMIT:
        raise InvalidRequestError(
            f"limit must be 1..{MAX_LIMIT} (0: {DEFAULT_LIMIT}), not {request.limit}: "
            "page through with next_cursor"
        )
    return CallQuery(
        tool=request.tool,
        session_id=request.session_id,
        status=status,
        since=request.since_unix,
        until=request.until_unix,
        running=_RUNNING[request.running],
        limit=request.limit or DEFAULT_LIMIT,
        cursor=request.cursor,
    )


def list_calls(
    history: CallHistory,
    request: pb.ListCallsRequest,
    identity: Identity | None,
    daemon_id: str,
) -> pb.ListCallsResponse:
    """One page of ListCalls for `identity`, each call naming `daemon_id`.

    Raises:
        InvalidRequestError: The request is unsound (BadQueryError is one).
        PermissionDeniedError: It names another client's calls, and the caller
            may not see them.
        JournalError: The journal cannot be read.
    """
    calls, cursor = history.list_calls(query_of(request), identity, request.client_name)
    answer = pb.ListCallsResponse(next_cursor=cursor)
    for info in calls:
        message = answer.calls.add()
        message.CopyFrom(call_info_to_proto(info))
        message.daemon_id = daemon_id
        if message.HasField("result"):
            message.result.daemon_id = daemon_id
    return answer
