"""What the daemon tells of its calls' history: a call as the journal knows it,
a page of calls (`list_calls`), and the approval queue's events."""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from tooljail._types import CallState, ToolResult
from tooljail.common import utc_from_unix

__all__ = [
    "ApprovalEvent",
    "ApprovalEventKind",
    "CallInfo",
    "CallPage",
    "unix_from_utc",
    "utc_from_unix",
]


class CallInfo(BaseModel):
    """What the daemon knows of a call: who made it, with what, when, and how it ended."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    tool: str
    state: CallState
    result: ToolResult | None = None
    """The final outcome once the call ended; while a timed-out call runs on
    detached, the timeout result with `still_running`."""
    daemon_id: str = ""
    """The daemon that holds the call; "" from an old daemon that does not say."""
    arguments_json: str = ""
    """The arguments as JSON, as the journal keeps them: only their start when
    `arguments_truncated` (and then not valid JSON); "" from an old daemon."""
    arguments_truncated: bool = False
    arguments_bytes: int = 0
    """The whole arguments' length, in UTF-8 bytes."""
    arguments_sha256: str = ""
    """SHA-256 (hex) of the canonical JSON arguments (`tooljail.common.arguments_sha256`)."""
    client_name: str = ""
    """Who made the call (the identity, or the name the client claimed)."""
    session_id: str = ""
    """The session it ran in; "" for a fresh sandbox of its own."""
    received_at: datetime.datetime | None = None
    """When the daemon received it (UTC); None from an old daemon."""
    started_at: datetime.datetime | None = None
    """When it reached a sandbox (UTC); None when it never did."""
    ended_at: datetime.datetime | None = None
    """When it ended (UTC); None while it goes on."""
    timeout_s: float = 0.0
    sandbox_id: str = ""
    """The sandbox it ran in; "" when it never reached one."""

    @property
    def running(self) -> bool:
        """True while the call has not ended (queued, awaiting approval, running)."""
        return not self.state.finished

    @property
    def arguments(self) -> dict[str, Any] | None:
        """The arguments, decoded; None when they were cut (see `arguments_note`)
        or not told."""
        if self.arguments_truncated or not self.arguments_json:
            return None
        value = json.loads(self.arguments_json)
        return value if isinstance(value, dict) else None

    @property
    def arguments_note(self) -> str:
        """What was cut from the arguments, in words; "" when nothing was."""
        if not self.arguments_truncated:
            return ""
        kept = len(self.arguments_json.encode())
        return (
            f"arguments cut: the first {kept:,} of {self.arguments_bytes:,} bytes are kept "
            "(the rest is not recorded)"
        )


class CallPage(BaseModel):
    """One page of `list_calls`: newest first."""

    model_config = ConfigDict(frozen=True)

    calls: tuple[CallInfo, ...] = ()
    next_cursor: str = ""
    """Pass as `cursor` for the next page; "" on the last page."""


class ApprovalEventKind(enum.StrEnum):
    """What happened to a call in the approval queue."""

    REQUESTED = "requested"
    """It now waits for a decision (or did when the watch began)."""
    DECIDED = "decided"
    """It waits no more: approved, denied, cancelled, revoked, or the daemon
    stopped; its state says which way it went."""


class ApprovalEvent(BaseModel):
    """One event of `watch_approvals`."""

    model_config = ConfigDict(frozen=True)

    kind: ApprovalEventKind
    call: CallInfo


def unix_from_utc(moment: datetime.datetime | None) -> float:
    """A datetime (naive ones are taken as UTC) as a wire time; None: 0."""
    if moment is None:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
