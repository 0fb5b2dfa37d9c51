"""Questions asked of the journal's history: which calls match (`CallQuery`),
a page of them newest first, and the cursor that continues it.

Each filter has an index of its own (`tooljaild.journal.file.SCHEMA`), keyed
on the filter's column and then `created`: SQLite walks the one it judges
narrowest in `created` order and checks the other filters row by row, so a
page costs about its `limit` rows plus those it skips, not the table.

The cursor is the (created, rowid) of the page's last call, encoded: calls
received at the same instant keep a stable order (the row's id, which every
index holds: the order needs no sort), and calls journaled after
the first page was read do not shift the later pages (they are newer: a new
first page shows them).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from tooljail.errors import InvalidRequestError
from tooljaild.journal.file import COLUMNS

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


class BadQueryError(InvalidRequestError):
    """A query the journal cannot answer: a malformed cursor, a limit out of range.

    An `InvalidRequestError` (so a `ValueError` too): the error edge answers it
    INVALID_ARGUMENT with its message, which says what to pass instead."""


@dataclass(frozen=True, slots=True)
class CallQuery:
    """Which calls to list; each field narrows, its default leaves it open."""

    client: str | None = None
    """Only this client's calls; None: everyone's."""
    tool: str = ""
    session_id: str = ""
    status: str = ""
    """A `CallStatus` value: only calls that ended so."""
    since: float = 0.0
    """Received at or after (wall clock); 0: no bound."""
    until: float = 0.0
    """Received before (wall clock); 0: no bound."""
    running: bool | None = None
    """True: only calls not ended yet; False: only ended ones; None: both."""
    limit: int = DEFAULT_LIMIT
    cursor: str = ""


def encode_cursor(created: float, rowid: int) -> str:
    """The cursor after the call of row `rowid`, received at `created`."""
    raw = json.dumps([created, rowid], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    """The (created, rowid) a cursor stands after.

    Raises:
        BadQueryError: It is not a cursor this journal made.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, rowid = json.loads(raw)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise BadQueryError(
            "the cursor is not one a page of calls gave: pass `next_cursor` as it came, "
            "or none for the first page"
        ) from exc
    if not isinstance(created, int | float) or type(rowid) is not int:
        raise BadQueryError("the cursor is not one a page of calls gave")
    return float(created), rowid


def select(query: CallQuery) -> tuple[str, dict[str, Any]]:
    """The SQL (and its parameters) of one page of `query`, plus one row more:
    the page is full and more follow when `limit + 1` rows come back. Each row
    is `COLUMNS` and then its rowid (for `encode_cursor`).

    Raises:
        BadQueryError: The limit is out of range, or the cursor is malformed.
    """
    if not 1 <= query.limit <= MAX_LIMIT:
        raise BadQueryError(f"limit must be 1..{MAX_LIMIT}, not {query.limit}")
    where: list[str] = []
    params: dict[str, Any] = {"limit": query.limit + 1}
    if query.client is not None:
        where.append("client = :client")
        params["client"] = query.client
    for column in ("tool", "session_id", "status"):
        value = getattr(query, column)
        if value:
            where.append(f"{column} = :{column}")
            params[column] = value
    # The session and status indexes are partial (`!= ''`): SQLite uses one only
    # when the query says its WHERE term itself (a bound value proves nothing), else
    # it walks every call in `created` order (33 ms p50 for a session's page of
    # 100,000 calls, 1.9 ms with the term: bench/bench_history.py).
    if query.session_id:
        where.append("session_id != ''")
    if query.status:
        where.append("status != ''")
    if query.since:
        where.append("created >= :since")
        params["since"] = query.since
    if query.until:
        where.append("created < :until")
        params["until"] = query.until
    if query.running is True:
        where.append("ended IS NULL")
    elif query.running is False:
        where.append("ended IS NOT NULL")
    if query.cursor:
        created, rowid = decode_cursor(query.cursor)
        where.append("(created < :c_created OR (created = :c_created AND rowid < :c_row))")
        params["c_created"], params["c_row"] = created, rowid
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = (
        f"SELECT {COLUMNS}, rowid FROM calls {clause} "
        "ORDER BY created DESC, rowid DESC LIMIT :limit"
    )
    return sql, params
