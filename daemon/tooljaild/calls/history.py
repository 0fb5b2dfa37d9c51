"""What a caller may learn of the daemon's calls: one call if it may see it
(`visible`), and all that is known of it (`info`: what the live call holds,
completed from the journal).

The owner rule, in one place for GetCall, Cancel, Attach, ListCalls
(`list_calls`, whose rules are `tooljaild.calls.listing`'s) and the
`call_status` tool: an authenticated caller sees its own calls only, live or
answered from the journal; another's is "not found" in the very words said of
an id never used; with `approvers_too`, an approver sees any call (to judge
what it approves). Without authentication every caller sees every call.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from tooljail.errors import InvalidRequestError
from tooljail.types import CallInfo
from tooljaild.auth.policy import Identity
from tooljaild.calls.admission import unknown_call
from tooljaild.calls.book import CallBook
from tooljaild.calls.call import Call
from tooljaild.calls.intake import owned_by
from tooljaild.calls.listing import check_query, overlay, scope
from tooljaild.journal.store import CallQuery, JournalError

log = logging.getLogger(__name__)


class CallHistory:
    """The calls as callers see them, over the manager's `CallBook`."""

    def __init__(self, book: CallBook) -> None:
        self._book = book

    def visible(
        self, call_id: str, identity: Identity | None, *, approvers_too: bool = False
    ) -> Call:
        """The call, if `identity` may see it (see the module's rule).

        Raises:
            CallNotFoundError: No call of that id, or none the caller may see.
        """
        call = self._book.get(call_id)
        if identity is None or owned_by(call, identity):
            return call
        seen = approvers_too and identity.approver
        if not call.client:
            # Only the daemon's log says why: telling the caller would tell it the id exists.
            log.info(
                "call %s predates the journal's record of owners: it is %s %s",
                call_id,
                "shown to approvers only, such as" if seen else "not shown to",
                identity.name,
            )
        if not seen:
            raise unknown_call(call_id)
        return call

    def info(self, call: Call) -> CallInfo:
        """All that is known of `call`: its live state and result from memory,
        its arguments (and what memory let go) from the journal's row."""
        live = call.info()
        journal = self._book.journal
        if live.arguments_json or journal is None:
            return live
        try:
            entry = journal.get(call.call_id)
        except JournalError as exc:  # the live part still answers
            log.error("cannot read call %s from the journal: %s", call.call_id, exc)
            return live
        if entry is None:
            return live
        recorded = entry.info()
        return live.model_copy(
            update={
                "arguments_json": recorded.arguments_json,
                "arguments_truncated": recorded.arguments_truncated,
                "arguments_bytes": recorded.arguments_bytes,
                "arguments_sha256": live.arguments_sha256 or recorded.arguments_sha256,
                "session_id": live.session_id or recorded.session_id,
            }
        )

    def list_calls(
        self, query: CallQuery, identity: Identity | None, client_name: str = ""
    ) -> tuple[list[CallInfo], str]:
        """A page of the calls `identity` may see that `query` asks for, newest
        first, and the cursor of the next page ("" on the last).

        `query.client` is ignored: `client_name` asks for one client's calls,
        which `listing.scope` allows or refuses. Unfinished rows are overlaid
        with their live call (`listing.overlay`); one that ended meanwhile is
        left out of a page of running calls. A page ends early once its calls'
        arguments and results pass `Settings.list_calls_max_bytes`.

        Cost: one journal read on the event loop (the journal's connection is
        the loop's), ~1-5 ms for a page of 50 from 100,000 calls.

        Raises:
            PermissionDeniedError: `client_name` is another's, and `identity`
                is neither an approver nor the operator.
            BadQueryError: An unsound query (INVALID_ARGUMENT).
            InvalidRequestError: The daemon keeps no journal.
            JournalError: The read failed.
        """
        journal = self._book.journal
        if journal is None:
            # The daemon always opens one (`Daemon._open_journal`): only a bare
            # CallManager of a unit test has none.
            raise InvalidRequestError("this daemon keeps no journal: it lists no calls")
        query = check_query(replace(query, client=scope(identity, client_name)))
        entries, cursor = journal.list_calls(query, self._book.settings.list_calls_max_bytes)
        calls: list[CallInfo] = []
        for entry in entries:
            info = entry.info()
            live = self._book.calls.get(entry.call_id) if entry.ended is None else None
            if live is not None:
                info = overlay(info, live)
                if query.running and info.state.finished:
                    continue
            calls.append(info)
        return calls, cursor
