"""The journal's rows as values: a call (`JournalEntry`) and a session
(`SessionRecord`), read from the calls and sessions tables, and what a call
the daemon lost becomes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tooljail.common import utc_from_unix
from tooljail.types import CallInfo, CallState, CallStatus, Effect, ToolError, ToolResult

LOST_MESSAGE = (
    "The daemon stopped while the call ran. It may or may not have taken effect: check "
    "whether it did before calling it again."
)
LOST_WAITING_MESSAGE = (
    "The daemon stopped while the call waited for approval: it did not run. Call it "
    "again to ask for approval again."
)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One call as the journal recorded it. Times are wall clock (`time.time()`)."""

    call_id: str
    tool: str
    fingerprint: str
    """sha256 of the canonical tool + arguments JSON: same id, other fingerprint = conflict."""
    state: CallState
    created: float
    """When it was admitted (received): `CallInfo.received_at`."""
    started: float | None
    ended: float | None
    """Set exactly when `state` is a final state."""
    timeout_s: float
    idempotent: bool
    """The tool's flag when the call was admitted."""
    sandbox_id: str
    arguments_bytes: int
    """Length of the full arguments JSON, in UTF-8 bytes."""
    arguments_json: str
    """The arguments JSON, cut to the journal's `max_argument_bytes`."""
    result_json: str | None
    """The final `ToolResult` as JSON; None while the call is unfinished."""
    client: str = ""
    """Who made the call (`Call.client`): the authenticated identity's name, or
    without authentication the name the client claimed; "" for a call journaled
    before schema version 3, which recorded nobody."""
    session_id: str = ""
    """The session it ran in; "" for a fresh sandbox, and for calls journaled
    before schema version 4 (whose result still names it)."""
    status: str = ""
    """Its result's status (`CallStatus` value) once it ended; "" before, and
    for calls journaled before schema version 4."""
    arguments_sha256: str = ""
    """SHA-256 of its canonical arguments JSON; "" for calls journaled before
    schema version 4."""

    @property
    def arguments_truncated(self) -> bool:
        """True when `arguments_json` is only the start of the arguments."""
        return len(self.arguments_json.encode()) < self.arguments_bytes

    def result(self) -> ToolResult | None:
        """The final result, or None while the call is unfinished."""
        if self.result_json is None:
            return None
        return ToolResult.model_validate_json(self.result_json)

    def info(self) -> CallInfo:
        """The call as `GetCall` and `ListCalls` answer it (without the daemon's id)."""
        return CallInfo(
            call_id=self.call_id,
            tool=self.tool,
            state=self.state,
            result=self.result(),
            arguments_json=self.arguments_json,
            arguments_truncated=self.arguments_truncated,
            arguments_bytes=self.arguments_bytes,
            arguments_sha256=self.arguments_sha256,
            client_name=self.client,
            session_id=self.session_id,
            received_at=utc_from_unix(self.created),
            started_at=utc_from_unix(self.started),
            ended_at=utc_from_unix(self.ended),
            timeout_s=self.timeout_s,
            sandbox_id=self.sandbox_id,
        )


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session as the journal keeps it: enough to say, after a restart, that it
    existed and why it ended."""

    session_id: str
    client: str
    created: float
    ended: float | None
    end_reason: str
    sandbox_id: str
    options_json: str


def entry_of(row: tuple[Any, ...]) -> JournalEntry:
    """The entry of a calls row read with `tooljaild.journal.file.COLUMNS`."""
    (call_id, tool, fingerprint, state, created, started, ended) = row[:7]
    (timeout_s, idempotent, sandbox_id, arguments_bytes, arguments, result, client) = row[7:14]
    (session_id, status, arguments_sha256) = row[14:]
    return JournalEntry(
        call_id=call_id,
        tool=tool,
        fingerprint=fingerprint,
        state=CallState(state),
        created=created,
        started=started,
        ended=ended,
        timeout_s=timeout_s,
        idempotent=bool(idempotent),
        sandbox_id=sandbox_id,
        arguments_bytes=arguments_bytes,
        arguments_json=arguments,
        result_json=result,
        client=client,
        session_id=session_id,
        status=status,
        arguments_sha256=arguments_sha256,
    )


def mark_lost(entry: JournalEntry, now: float) -> JournalEntry:
    """`entry`, ended `lost` at `now`: the daemon that held it died."""
    # A call still awaiting approval never reached a sandbox: nothing happened.
    waited = entry.state is CallState.AWAITING_APPROVAL
    result = ToolResult(
        call_id=entry.call_id,
        tool=entry.tool,
        status=CallStatus.LOST,
        effect=Effect.NONE if waited else Effect.UNKNOWN,
        message=LOST_WAITING_MESSAGE if waited else LOST_MESSAGE,
        error=ToolError(
            type="Lost", message=f"the daemon stopped while the call was {entry.state}"
        ),
        session_id=entry.session_id,
        arguments_sha256=entry.arguments_sha256,
    )
    return dataclasses.replace(
        entry,
        state=CallState.LOST,
        ended=now,
        result_json=result.model_dump_json(),
        status=CallStatus.LOST.value,
    )
