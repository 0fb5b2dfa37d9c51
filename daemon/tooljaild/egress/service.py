"""The daemon's egress as calls and sessions use it: each sandbox's policy, gate and env.

`EgressService` is what the call manager and the session manager hold when the
daemon has an `[egress]` section (None when it has not: then nothing of egress
runs, and a request that asks for egress or secrets is refused by
`require_egress` with FAILED_PRECONDITION). It puts together the pieces the
other egress modules define: the daemon's ceiling (`EgressCeiling`, replaced
whole at a reload), the one proxy (`EgressProxy`), and the environment a
sandbox with egress gets (`egress_env`).

Where each level's rules come from:

- the caller's allowance: its identity's `egress` in the tokens file (None:
  the ceiling, `[egress] allow`);
- the tool's: its profile's `sandbox.egress` and its `secrets`;
- the session's: `CreateSession`'s `egress` and `secrets` (then
  `SetSessionEgress`);
- the call's: `CallRequest`'s `egress` and `secrets`.

Each level may only narrow the one above (`EgressCeiling.policy`:
`EgressNotAllowed`, a PERMISSION_DENIED naming the rule). Rules a client sends
that do not parse are INVALID_ARGUMENT naming the rule (`parse_asked`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

from tooljail.errors import EgressUnavailableError, InvalidRequestError
from tooljaild.auth.policy import Identity
from tooljaild.egress.env import egress_env
from tooljaild.egress.gate import EgressGate
from tooljaild.egress.policy import EgressCeiling, EgressPolicy
from tooljaild.egress.proxy import EgressProxy
from tooljaild.egress.rules import Rule, parse_rules
from tooljaild.settings.egress import PackagesSettings

__all__ = [
    "MAX_ASKED_RULES",
    "NO_EGRESS_MESSAGE",
    "EgressService",
    "parse_asked",
    "require_egress",
]

log = logging.getLogger("tooljaild.egress")

MAX_ASKED_RULES = 256
"""Egress rules one request may carry (as the SDK's bound): more is refused
before any is parsed, so a request cannot make the daemon parse and compare
thousands of rules."""

NO_EGRESS_MESSAGE = "this daemon has no [egress] section; the sandbox has no network"
"""What a request asking for egress or secrets of a daemon without egress is told."""


def require_egress(
    service: EgressService | None, *, asked: bool, what: str
) -> EgressService | None:
    """`service`, or None when nothing is asked; refuse asking a daemon without egress.

    Args:
        asked: Some level (tool, session, call) asks for egress or secrets.
        what: What asks, for the message ("the call", "tool 'news'").

    Raises:
        EgressUnavailableError: `asked` and the daemon has no `[egress]`.
    """
    if asked and service is None:
        raise EgressUnavailableError(
            f"{what} asks for egress or secrets, but {NO_EGRESS_MESSAGE}: ask without "
            "them, or ask the daemon's operator to configure [egress]"
        )
    return service if asked else None


def parse_asked(texts: Sequence[str], where: str) -> tuple[Rule, ...] | None:
    """Rules a client sent (None: it sent none).

    Raises:
        InvalidRequestError: A rule does not parse; the message names it.
    """
    if not texts:
        return None
    if len(texts) > MAX_ASKED_RULES:
        raise InvalidRequestError(
            f"{where} names {len(texts)} rules; at most {MAX_ASKED_RULES} (use wildcards)"
        )
    try:
        return parse_rules(texts, where)
    except ValueError as exc:
        raise InvalidRequestError(f"bad egress rule: {exc}") from None


class EgressService:
    """The ceiling, the proxy, and the gates opened through it.

    Args:
        ceiling: The daemon's `[egress]` and secrets (`EgressCeiling.from_settings`).
        proxy: The one egress proxy, started.
        packages: `[packages]`, for pip's settings in each sandbox; None: none.
        max_connections: `[limits] max_egress_connections`, per gate.
    """

    def __init__(
        self,
        ceiling: EgressCeiling,
        proxy: EgressProxy,
        *,
        packages: PackagesSettings | None,
        max_connections: int,
    ) -> None:
        self.ceiling = ceiling
        """Replaced whole at a reload: a policy made before keeps what it was made of."""
        self.proxy = proxy
        self.packages = packages
        self.max_connections = max_connections
        self._gates: weakref.WeakSet[EgressGate] = weakref.WeakSet()
        self._lock = threading.Lock()  # the gauge is read from the metrics thread

    def policy(
        self,
        identity: Identity | None,
        *,
        tool: tuple[Rule, ...] | None = None,
        session: tuple[Rule, ...] | None = None,
        call: tuple[Rule, ...] | None = None,
        secrets: Sequence[str] = (),
        what: str,
    ) -> EgressPolicy:
        """The policy of one sandbox, each level within the one above.

        Raises:
            EgressNotAllowed: A level asks for more than the one above, or for
                a secret the caller may not use (PERMISSION_DENIED, naming it).
        """
        ceiling = self.ceiling
        identity_rules = None if identity is None else identity.egress
        who = "the caller" if identity is None else f"identity {identity.name!r}"
        allowance = ceiling.allowance(identity_rules, who=who)
        return ceiling.policy(
            allowance=allowance,
            tool=tool,
            session=session,
            call=call,
            secrets=secrets,
            allowed_secrets=None if identity is None else identity.secrets,
            what=what,
        )

    def narrowed(self, base: EgressPolicy, allow: EgressPolicy) -> EgressPolicy:
        """`base` (a session's, whose secrets' placeholders its sandbox holds)
        with the allow and deny rules of `allow` (a new policy checked for it)."""
        return dataclasses.replace(base, allow=allow.allow, deny=allow.deny)

    def env(self, policy: EgressPolicy) -> dict[str, str]:
        """The variables a sandbox with `policy` gets: the proxy, the CA bundle,
        pip's index, and each held secret's placeholder (never its value)."""
        # env.py's protocol reads index_url as a str; PackagesSettings' may be
        # None, which egress_env tests (`if packages.index_url`) before use.
        return egress_env(policy, self.packages)  # type: ignore[arg-type]

    def open_gate(self, directory: Path, policy: EgressPolicy, label: str) -> EgressGate:
        """Open the gate of the sandbox whose egress directory is `directory`.

        Blocks until the proxy listens there (the proxy's loop, another thread:
        well under a millisecond), so the sandbox's first connection finds it.
        """
        gate = self.proxy.open_gate(
            directory, policy, max_connections=self.max_connections, label=label
        )
        with self._lock:
            self._gates.add(gate)
        return gate

    def open_connections(self) -> int:
        """Client connections open through every live gate now (the metric's gauge)."""
        with self._lock:
            gates = list(self._gates)
        return sum(g.open_connections for g in gates)
