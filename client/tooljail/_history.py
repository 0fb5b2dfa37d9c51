"""`list_calls` without I/O: its arguments checked into a `ListCallsRequest`,
and, over many daemons, their pages merged newest first under one cursor.

Over many daemons the cursor is composite: each daemon's own cursor, by its
`daemon_id`, encoded in one string (`encode_cursors`). A page asks each daemon
for `limit` calls after its cursor, merges them newest first and keeps the
first `limit`. A daemon whose calls were all kept moves to its own
`next_cursor`; one of which only some were kept is asked again for exactly
that many (`Merge.partial`), so that its next cursor is one it made itself,
after the last call shown: no call is lost or shown twice, whatever arrives
between pages. One of which none were kept stays where it was; if that was its
start, it is pinned there (`PIN`: its calls received up to its newest one
answered), so that calls it receives later, newer than the pages shown, do not
come up in a later page. A daemon's page
may hold fewer than `limit` calls (its byte bound): then no call older than
that page's last is shown yet, from any daemon, so the order holds across pages.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tooljail._types import CallStatus
from tooljail._wire import status_to_proto
from tooljail.errors import InvalidRequestError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Merge",
    "decode_cursors",
    "encode_cursors",
    "from_cursor",
    "list_calls_request",
]

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
"""The daemon's bounds on a page (ListCallsRequest.limit)."""

_ROUTED = "r1."
"""How a composite cursor starts (a daemon's own never does: it is base64 of JSON)."""

PIN = "until:"
"""A daemon's place in a composite cursor before any call of it was shown: its
calls received before the time that follows (never a daemon's own cursor,
which is base64)."""
_PIN_MARGIN_S = 2e-6
"""A call's time on the wire may sit up to a microsecond below the daemon's own."""

_RUNNING = {None: pb.RUNNING_FILTER_ANY, True: pb.RUNNING_FILTER_RUNNING}
_RUNNING[False] = pb.RUNNING_FILTER_ENDED


def list_calls_request(
    *,
    tool: str | None,
    session_id: str | None,
    status: CallStatus | str | None,
    since: datetime.datetime | float | None,
    until: datetime.datetime | float | None,
    running: bool | None,
    client_name: str | None,
    limit: int,
    cursor: str | None,
) -> pb.ListCallsRequest:
    """The request `Client.list_calls` sends, its arguments checked.

    Raises:
        TypeError: An argument of the wrong type.
        InvalidRequestError: A status that is not a `CallStatus` (or its value),
            a time before the epoch or not finite, `since` after `until`, or a
            limit outside 1..1000.
    """
    texts = {"tool": tool, "session_id": session_id, "client_name": client_name, "cursor": cursor}
    for name, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
    if running is not None and not isinstance(running, bool):
        raise TypeError(f"running must be True, False or None, got {running!r}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int, got {type(limit).__name__}")
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(
            f"limit must be 1..{MAX_LIMIT}, not {limit}: page through with `cursor`"
        )
    start, end = _unix(since, "since"), _unix(until, "until")
    if start and end and start > end:
        raise InvalidRequestError(f"since ({since}) is after until ({until}): swap them")
    return pb.ListCallsRequest(
        tool=tool or "",
        session_id=session_id or "",
        status=pb.STATUS_UNSPECIFIED if status is None else status_to_proto(_status(status)),
        since_unix=start,
        until_unix=end,
        running=_RUNNING[running],
        client_name=client_name or "",
        limit=limit,
        cursor=cursor or "",
    )


def _status(status: CallStatus | str) -> CallStatus:
    if not isinstance(status, str):
        raise TypeError(f"status must be a CallStatus or its value, got {type(status).__name__}")
    try:
        return CallStatus(status)
    except ValueError:
        known = ", ".join(s.value for s in CallStatus)
        raise InvalidRequestError(f"status {status!r} is not one of {known}") from None


def _unix(moment: datetime.datetime | float | None, name: str) -> float:
    """A time bound as wire seconds (naive datetimes are UTC); None: 0, no bound."""
    if moment is None:
        return 0.0
    if isinstance(moment, datetime.datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        seconds = moment.timestamp()
    elif isinstance(moment, int | float) and not isinstance(moment, bool):
        seconds = float(moment)
    else:
        raise TypeError(
            f"{name} must be a datetime or unix seconds (float), got {type(moment).__name__}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidRequestError(f"{name} must be a time after the epoch, not {moment!r}")
    return seconds


def encode_cursors(cursors: dict[str, str | None]) -> str:
    """A composite cursor: each daemon's own cursor by its id (None: it has no more)."""
    raw = json.dumps(cursors, separators=(",", ":"), sort_keys=True).encode()
    return _ROUTED + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursors(cursor: str) -> dict[str, str | None]:
    """The daemons' cursors a composite cursor holds; {} for "" (the first page).

    Raises:
        InvalidRequestError: It is not a cursor a routed `list_calls` gave.
    """
    if not cursor:
        return {}
    bad = InvalidRequestError(
        "the cursor is not one list_calls over these daemons gave: pass `next_cursor` "
        "as it came (a cursor of one daemon's pages is not one of many), or none"
    )
    if not cursor.startswith(_ROUTED):
        raise bad
    body = cursor.removeprefix(_ROUTED)
    try:
        value = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise bad from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items()
    ):
        raise bad
    for place in value.values():
        if place is not None and place.startswith(PIN) and not _is_time(place.removeprefix(PIN)):
            raise bad
    return value


def _is_time(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def from_cursor(request: pb.ListCallsRequest, cursor: str, limit: int) -> pb.ListCallsRequest:
    """`request` for one daemon: from its place in a composite cursor (its own
    cursor, or a `PIN`), `limit` calls."""
    asked = pb.ListCallsRequest()
    asked.CopyFrom(request)
    asked.limit = limit
    if cursor.startswith(PIN):
        until = float(cursor.removeprefix(PIN))
        asked.cursor = ""
        asked.until_unix = min(asked.until_unix or until, until)
    else:
        asked.cursor = cursor
    return asked


@dataclass
class Merge:
    """One page merged from many daemons' answers (see the module doc).

    Build it with `Merge.of`; ask each daemon in `partial` again for that many
    calls from its cursor and `settle` its answer; then `page`.
    """

    limit: int
    cursors: dict[str, str | None]
    """Where each daemon stood before this page ("" absent: from the start)."""
    order: list[str] = field(default_factory=list)
    taken: dict[str, list[pb.CallInfo]] = field(default_factory=dict)
    after: dict[str, str | None] = field(default_factory=dict)
    """Each answering daemon's cursor after this page (None: no more)."""
    partial: dict[str, int] = field(default_factory=dict)
    """Daemons of which only that many calls are kept: to ask again."""

    @classmethod
    def of(
        cls,
        limit: int,
        cursors: dict[str, str | None],
        answers: Sequence[tuple[str, pb.ListCallsResponse]],
    ) -> Merge:
        merge = cls(limit, cursors, order=[daemon_id for daemon_id, _ in answers])
        rows = [
            (-info.received_at_unix, at, n, daemon_id, info)
            for at, (daemon_id, answer) in enumerate(answers)
            for n, info in enumerate(answer.calls)
        ]
        rows.sort(key=lambda row: row[:3])
        # A daemon with more to give may have calls newer than another's shown
        # ones just past its page (a page its byte bound ended early): only
        # calls at least as new as each such page's last are shown now.
        frontier = max(
            (a.calls[-1].received_at_unix for _, a in answers if a.next_cursor and a.calls),
            default=-math.inf,
        )
        kept = {daemon_id: 0 for daemon_id, _ in answers}
        for row in rows[:limit]:
            if -row[0] < frontier:
                break
            kept[row[3]] += 1
        for daemon_id, answer in answers:
            k = kept[daemon_id]
            merge.taken[daemon_id] = list(answer.calls[:k])
            if k == len(answer.calls):
                merge.after[daemon_id] = answer.next_cursor or None
            else:
                was = merge.cursors.get(daemon_id) or ""
                if not k and not was:  # pinned at its start: nothing newer comes later
                    was = f"{PIN}{answer.calls[0].received_at_unix + _PIN_MARGIN_S!r}"
                merge.after[daemon_id] = was
                if k:
                    merge.partial[daemon_id] = k
        return merge

    def settle(self, daemon_id: str, answer: pb.ListCallsResponse | None) -> None:
        """The second answer of a daemon in `partial` (None: it did not answer:
        none of its calls is shown, and it stays where it was)."""
        if answer is None:
            self.taken[daemon_id] = []
            return
        self.taken[daemon_id] = list(answer.calls)
        self.after[daemon_id] = answer.next_cursor or None

    def page(self) -> tuple[list[pb.CallInfo], str]:
        """The page's calls, newest first, and its composite next cursor ("" at the end)."""
        calls = [
            (-info.received_at_unix, at, n, info)
            for at, daemon_id in enumerate(self.order)
            for n, info in enumerate(self.taken.get(daemon_id, ()))
        ]
        calls.sort(key=lambda row: row[:3])
        if all(cursor is None for cursor in self.after.values()):
            return [row[3] for row in calls], ""
        # Daemons that did not answer keep their place, unless they had finished.
        cursors: dict[str, Any] = {**self.cursors, **self.after}
        return [row[3] for row in calls], encode_cursors(cursors)
