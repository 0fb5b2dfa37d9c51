"""A session's egress: its policy at creation, its one gate, and `SetSessionEgress`.

A session asks for egress rules and secrets when it is created; its sandbox's
interpreter starts with the proxy's environment (its secrets' placeholders
among it) whenever the daemon has `[egress]`, so that rules given later
(`set_egress`) need no restart of its interpreter. It gets one gate at the
proxy for its life, opened the first time it has rules and closed with it;
`set_egress` replaces the gate's policy, which decides each new connection
from that moment (open ones are kept).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tooljaild.auth.policy import Identity
from tooljaild.egress.policy import NO_EGRESS, EgressPolicy
from tooljaild.egress.service import EgressService, parse_asked, require_egress
from tooljaild.sessions.session import Session

__all__ = ["open_gate", "policy_for", "set_egress"]

log = logging.getLogger("tooljaild.egress")


def policy_for(
    service: EgressService | None,
    identity: Identity | None,
    egress: Sequence[str],
    secrets: Sequence[str],
    session_id: str,
) -> EgressPolicy:
    """A new session's egress policy; NO_EGRESS when it asks for none.

    Raises:
        EgressUnavailableError: Egress or secrets asked of a daemon without `[egress]`.
        InvalidRequestError: A rule does not parse (named).
        EgressNotAllowed: They ask for more than `identity` may (PERMISSION_DENIED).
    """
    live = require_egress(service, asked=bool(egress or secrets), what="the session")
    if live is None:
        return NO_EGRESS
    rules = parse_asked(egress, "the session's egress")
    return live.policy(identity, session=rules, secrets=secrets, what=f"session {session_id}")


def open_gate(service: EgressService | None, session: Session) -> None:
    """Open `session`'s gate with its policy (once: later changes go through it)."""
    if service is None or session.egress_gate is not None:
        return
    if session.egress_dir is None:
        log.warning("session %s has egress, but its sandbox has no egress directory", session.id)
        return
    session.egress_gate = service.open_gate(
        session.egress_dir, session.egress_policy, label=f"session {session.id}"
    )


def set_egress(
    service: EgressService | None,
    session: Session,
    rules: Sequence[str],
    identity: Identity | None,
) -> None:
    """Give `session` the egress `rules` (within `identity`'s allowance), live.

    Its secrets stay (their placeholders are in its environment); [] cuts it
    off the network. A running call that asked for less than the session gets
    the new rules from now on too.

    Raises:
        EgressUnavailableError: The daemon has no `[egress]`.
        InvalidRequestError: A rule does not parse (named).
        EgressNotAllowed: A rule is beyond `identity`'s allowance (PERMISSION_DENIED).
    """
    live = require_egress(service, asked=True, what=f"session {session.id}")
    assert live is not None
    parsed = parse_asked(rules, "egress")
    checked = NO_EGRESS
    if parsed is not None:
        checked = live.policy(identity, session=parsed, what=f"session {session.id}")
    new = live.narrowed(session.egress_policy, checked)
    session.egress_policy, session.egress_rules = new, tuple(rules)
    if session.egress_gate is not None:
        session.egress_gate.set_policy(new)  # new connections, at once
    elif not new.empty:
        open_gate(live, session)
    log.info("session egress set", extra={"session": session.id, "egress": list(rules)})
