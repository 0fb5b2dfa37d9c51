"""What a caller asks for, and the checks it passes before the manager admits it.

`CallRequest` is a request as the edge read it (no gRPC here); `CallManager.admit`
takes it through, in this order: the caller's policy (`check_policy`), its
arguments (`check_arguments`: bounded, off the event loop when large), whose
session and call id it names (`check_owner`), then the admission itself. The
ownership checks and the admission run with no await between them: an id free
when checked is still free when the call takes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from tooljail.errors import (
    CallIdConflictError,
    InvalidRequestError,
    PermissionDeniedError,
)
from tooljaild.auth.policy import Identity
from tooljaild.calls import terms
from tooljaild.calls.book import CallBook
from tooljaild.calls.call import Call
from tooljaild.sessions.manager import SessionManager
from tooljaild.settings.config import Settings
from tooljaild.tools.registry import Tool


@dataclass(frozen=True)
class CallRequest:
    """A call as its caller asks for it (the fields of a Call or Run request)."""

    tool: str
    arguments_json: str
    """The arguments as sent: a JSON object, "" for none."""
    call_id: str = ""
    """The caller's idempotency key; "": a new id is made."""
    timeout_s: float = 0.0
    """0: the tool's default."""
    session_id: str = ""
    """The session to run in; "": a fresh sandbox."""
    egress: tuple[str, ...] = ()
    """Egress rules the call asks for, as sent (`calls.egress.policy_for`)."""
    secrets: tuple[str, ...] = ()
    """Names of the secrets the call asks to hold."""


@dataclass(frozen=True)
class CheckedRequest:
    """A request the manager has checked and will admit: what each path makes its call of."""

    call_id: str
    """The id the caller gave; "": a new one is made."""
    tool: Tool
    arguments: dict[str, Any]
    arguments_json: str
    """The arguments as sent, for the journal."""
    fingerprint: str
    timeout_s: float
    client: str
    rerun: bool
    """The id is taken over by a rerun of a lost call of an idempotent tool."""
    gated: bool
    """The caller's policy makes it wait for an approver first."""
    identity: Identity | None = None
    """The authenticated caller (None: no authentication): its egress allowance."""
    egress: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    """The egress rules and secrets asked for (`CallRequest`'s)."""


def without_needless_session(request: CallRequest, tool: Tool) -> CallRequest:
    """`request`, its session dropped for a tool that answers at once
    (`BuiltinRun.at_once`: call_status): it needs none, and a session that ended
    must not keep a model from learning what became of its calls."""
    if request.session_id and tool.run is not None and tool.run.at_once:
        return dataclasses.replace(request, session_id="")
    return request


def check_policy(identity: Identity | None, tool_name: str) -> None:
    """Refuse a tool outside the caller's allow-list (None: no tokens, no policy).

    Raises:
        PermissionDeniedError: The identity may not call that tool.
    """
    if identity is not None and not identity.may_use(tool_name):
        raise PermissionDeniedError(f"this identity may not call the tool {tool_name!r}")


async def check_arguments(
    tool: Tool, arguments_json: str, settings: Settings
) -> terms.CheckedArguments:
    """Decode and check a request's arguments: bounded in their shape before any
    decoding (`terms.check_shape`), and on a thread when large, so that no
    request holds the event loop for long.

    Raises:
        InvalidRequestError, InvalidArgumentsError: As `terms.parse_arguments`.
    """
    if len(arguments_json) <= terms.CHECK_ON_LOOP_BYTES:
        return terms.CheckedArguments(tool, terms.parse_arguments(tool, arguments_json, settings))
    values = await asyncio.to_thread(terms.parse_arguments, tool, arguments_json, settings)
    return terms.CheckedArguments(tool, values)


def owned_by(call: Call, identity: Identity) -> bool:
    """Whether `call` is `identity`'s own, live or answered from the journal (which
    records each call's client). A call journaled before it did (client "") is
    nobody's: every identity treats it as another's (an identity's name is never "")."""
    return call.client == identity.name


def check_owner(
    request: CallRequest, identity: Identity, book: CallBook, sessions: SessionManager | None
) -> None:
    """Refuse a request naming another identity's session or call id.

    The call id is checked before the admission sees it: that would answer with
    the other's call (same arguments), run it again in its owner's place (a
    lost call of an idempotent tool), or name its tool (other arguments).

    Raises:
        SessionNotFoundError, SessionEndedError: The session is not the
            identity's (in the very words said of an id never used).
        InvalidRequestError: A session is named and the daemon serves none.
        CallIdConflictError: The id is another's (or a call's from before calls
            had owners), whatever the arguments.
    """
    if request.session_id:
        if sessions is None:
            raise InvalidRequestError("this daemon serves no sessions")
        sessions.get(request.session_id, identity.name)
    if request.call_id:
        call = book.find(request.call_id)
        if call is not None and not owned_by(call, identity):
            raise CallIdConflictError(
                f"the call id {request.call_id!r} is taken; use another (or none)"
            )
