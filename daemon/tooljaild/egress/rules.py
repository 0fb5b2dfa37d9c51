"""Egress rules, and how one level of policy narrows the level above it.

The grammar (`Rule`, `parse_rule`, `parse_rules`) lives on the settings floor
(`tooljaild.settings.egress_rules`), where the config, a tool's profile and the
tokens file check their rules as they read them; it is re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence

from tooljail.errors import PermissionDeniedError
from tooljaild.settings.egress_rules import (
    DEFAULT_PORTS,
    Rule,
    is_ip_literal,
    normalize_host,
    parse_rule,
    parse_rules,
    valid_host,
)

__all__ = [
    "DEFAULT_PORTS",
    "EgressNotAllowed",
    "Rule",
    "is_ip_literal",
    "narrow",
    "normalize_host",
    "parse_rule",
    "parse_rules",
    "valid_host",
]


class EgressNotAllowed(PermissionDeniedError):
    """A level of policy asks for egress (or a secret) the level above does not allow.

    A `PermissionDeniedError`, so the edge answers PERMISSION_DENIED with the
    message, which names the rule (or secret) at fault and what is allowed.

    Attributes:
        rule: The rule as asked (or the secret's name) that is not allowed.
    """

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


def _listing(rules: Sequence[Rule]) -> str:
    return ", ".join(r.text for r in rules) if rules else "no egress at all"


def narrow(
    above: Sequence[Rule],
    asked: Sequence[Rule],
    what: str,
    *,
    above_what: str = "the level above",
) -> tuple[Rule, ...]:
    """`asked`, when each of its rules lies within some rule of `above`.

    A level can only narrow the one above it: a tool's rules within its
    caller's allowance, a session's within that, a call's within the session's.

    Args:
        above: The rules of the level above.
        asked: The rules this level asks for.
        what: Who asks, for the message ("tool 'news'", "the call").
        above_what: Who allows, for the message ("the identity 'agent-a'").

    Raises:
        EgressNotAllowed: Naming the first asked rule no rule above covers.
    """
    for rule in asked:
        if not any(a.covers(rule) for a in above):
            raise EgressNotAllowed(
                f"{what} asks for egress to {rule.text}, which {above_what} does not "
                f"allow: it allows only {_listing(above)}",
                rule=rule.text,
            )
    return tuple(asked)
