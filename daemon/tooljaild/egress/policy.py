"""What one sandbox may reach, and how the levels of policy make it.

Levels, each within the one above (`narrow`): the daemon's ceiling (`[egress]`
allow) > an identity's allowance (the tokens file) > a tool (`@tool(sandbox=
{"egress": [...]})`) > a session > a call. The most specific level given is
what the sandbox may reach; nothing asked at any level is no network at all.
The ceiling's deny rules always win, whatever a level allows.

`EgressPolicy.decide` runs once per connection on the proxy's loop, so a policy
indexes its rules when it is made: exact hosts in a dict, wildcards by their
suffix, so a decision costs a few dict lookups whatever the number of rules.
"""

from __future__ import annotations

import secrets as _random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tooljaild.egress.rules import (
    EgressNotAllowed,
    Rule,
    is_ip_literal,
    narrow,
    normalize_host,
    valid_host,
)
from tooljaild.egress.secrets import SecretEntry, load_secrets
from tooljaild.settings.config import ConfigError

if TYPE_CHECKING:
    from tooljaild.auth.policy import Identity
    from tooljaild.settings.config import Settings

__all__ = [
    "NO_EGRESS",
    "PLACEHOLDER_PREFIX",
    "REASONS",
    "EgressCeiling",
    "EgressPolicy",
    "HeldSecret",
    "Verdict",
]

REASONS = (
    "not_allowed",
    "deny_rule",
    "port_not_allowed",
    "ip_literal",
    "private_address",
    "resolve_failed",
    "sni_mismatch",
    "host_mismatch",
    "secret_leak",
    "connection_limit",
    "bad_request",
    "no_egress",
)
"""Why a connection was refused: in results, the metric's `reason` label, 403 bodies."""

PLACEHOLDER_PREFIX = "tooljail-secret-"


@dataclass(frozen=True, repr=False)
class HeldSecret:
    """A secret a sandbox holds: its value stays on the host, the sandbox sees `placeholder`.

    Attributes:
        name: The environment variable that holds the placeholder in the sandbox.
        value: The secret itself: never shown (not in repr, messages or logs).
        hosts: Where the proxy may send the value.
        placeholder: "tooljail-secret-" and 32 random hex digits, new for each
            holder (never derived from the value).
    """

    name: str
    value: str
    hosts: tuple[Rule, ...]
    placeholder: str

    @classmethod
    def hold(cls, entry: SecretEntry) -> HeldSecret:
        """The secret of `entry` with a new placeholder."""
        return cls(
            name=entry.name,
            value=entry.value,
            hosts=entry.hosts,
            placeholder=PLACEHOLDER_PREFIX + _random.token_hex(16),
        )

    def allowed_for(self, host: str, port: int) -> bool:
        """Whether the value may be sent to `host`:`port`."""
        host = normalize_host(host)
        if not (0 < port < 65536 and valid_host(host)):
            return False
        return any(r.port_matches(port) and r.host_matches(host) for r in self.hosts)

    def __repr__(self) -> str:
        hosts = ", ".join(r.text for r in self.hosts)
        return f"HeldSecret(name={self.name!r}, hosts=[{hosts}], value=<hidden>)"


@dataclass(frozen=True)
class Verdict:
    """A decision on one connection.

    Attributes:
        allowed: Whether it may go.
        reason: "allowed", or one of `REASONS`.
        rule: The rule's text that allowed or refused it ("" when none did).
    """

    allowed: bool
    reason: str
    rule: str


_Indexed = tuple[tuple[int, Rule], ...]


def _index(rules: Sequence[Rule]) -> tuple[dict[str, _Indexed], dict[str, _Indexed]]:
    """(exact host -> rules, wildcard suffix ".x.com" -> rules), each with its position."""
    exact: dict[str, list[tuple[int, Rule]]] = {}
    suffix: dict[str, list[tuple[int, Rule]]] = {}
    for i, rule in enumerate(rules):
        if rule.wildcard:
            suffix.setdefault(rule.host[1:], []).append((i, rule))
        else:
            exact.setdefault(rule.host, []).append((i, rule))
    return (
        {k: tuple(v) for k, v in exact.items()},
        {k: tuple(v) for k, v in suffix.items()},
    )


def _candidates(
    host: str, exact: dict[str, _Indexed], suffix: dict[str, _Indexed]
) -> list[tuple[int, Rule]]:
    """The rules whose host is `host` (normalized), in the order they were written."""
    found = list(exact.get(host, ()))
    if suffix and not is_ip_literal(host):
        # Each parent of "a.b.x.com" in turn: ".b.x.com", ".x.com", ".com".
        dot = host.find(".")
        while dot > 0:
            found.extend(suffix.get(host[dot:], ()))
            dot = host.find(".", dot + 1)
        found.sort(key=lambda pair: pair[0])
    return found


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach now, and the secrets it holds.

    Attributes:
        allow: Rules that allow a connection (the first that matches names it).
        deny: Rules that refuse one, whatever `allow` says.
        secrets: The secrets whose placeholders the proxy swaps.
    """

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()
    secrets: tuple[HeldSecret, ...] = ()
    _allow_index: tuple[dict[str, _Indexed], dict[str, _Indexed]] = field(
        init=False, repr=False, compare=False
    )
    _deny_index: tuple[dict[str, _Indexed], dict[str, _Indexed]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Frozen: the indexes are set once here, never changed (a policy is swapped whole).
        object.__setattr__(self, "_allow_index", _index(self.allow))
        object.__setattr__(self, "_deny_index", _index(self.deny))

    def decide(self, host: str, port: int) -> Verdict:
        """Whether a connection to `host`:`port` may go, and by which rule.

        Deny rules win ("deny_rule"); else the first allow rule matching host and
        port ("allowed"); a host some rule names on other ports only:
        "port_not_allowed"; no rule: "not_allowed"; a policy without any allow
        rule: "no_egress"; a host that is neither a name nor an address, or a
        port outside 1..65535: "bad_request". An IP literal matches only a rule
        naming that address.
        """
        if not self.allow:
            return Verdict(False, "no_egress", "")
        name = normalize_host(host)
        if not (0 < port < 65536 and valid_host(name)):
            return Verdict(False, "bad_request", "")
        for _, rule in _candidates(name, *self._deny_index):
            if rule.port_matches(port):
                return Verdict(False, "deny_rule", rule.text)
        found = _candidates(name, *self._allow_index)
        for _, rule in found:
            if rule.port_matches(port):
                return Verdict(True, "allowed", rule.text)
        if found:
            return Verdict(False, "port_not_allowed", found[0][1].text)
        return Verdict(False, "not_allowed", "")

    @property
    def intercept(self) -> bool:
        """Whether the proxy terminates this sandbox's TLS (it holds secrets)."""
        return bool(self.secrets)

    @property
    def empty(self) -> bool:
        """Whether it allows nothing (no network)."""
        return not self.allow

    def with_allow(self, allow: Sequence[Rule]) -> EgressPolicy:
        """The same policy with other allow rules: the secrets (and their
        placeholders, which the sandbox already holds) stay."""
        return replace(self, allow=tuple(allow))

    def describe(self) -> str:
        """What it allows, for a refusal's message ("api.example.com:80,443, ...")."""
        return ", ".join(r.describe() for r in self.allow) if self.allow else "nothing"


NO_EGRESS = EgressPolicy()
"""No network: what a sandbox gets when no level asks for any."""

_LEVELS = (
    ("tool", "the caller's allowance"),
    ("session", "the tool"),
    ("call", "the session"),
)


class EgressCeiling:
    """The daemon-wide bound on egress, and the secrets it can hand out.

    Built from the settings at start and on each reload (`from_settings`); each
    call or session asks it for its `EgressPolicy` (`policy`).

    Attributes:
        allow: `[egress] allow`: nothing any level asks for may go beyond it.
        deny: `[egress] deny`: refused whatever any level allows.
        secrets: The secrets file's entries, by name.
    """

    def __init__(
        self,
        allow: Sequence[Rule] = (),
        deny: Sequence[Rule] = (),
        secrets: Mapping[str, SecretEntry] | None = None,
    ) -> None:
        self.allow: tuple[Rule, ...] = tuple(allow)
        self.deny: tuple[Rule, ...] = tuple(deny)
        self.secrets: Mapping[str, SecretEntry] = dict(secrets or {})

    def __repr__(self) -> str:
        return (
            f"EgressCeiling(allow={[r.text for r in self.allow]}, "
            f"deny={[r.text for r in self.deny]}, secrets={sorted(self.secrets)})"
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> EgressCeiling:
        """The ceiling of `settings`: `[egress]` and the secrets file it names.

        Reads the secrets file (and checks `[egress] ca_file` can be read), so
        call it off the event loop. No `[egress]` section: a ceiling that allows
        nothing.

        Raises:
            ConfigError: Naming the key, file or secret at fault: an unreadable
                or exposed file, a bad entry, a secret whose hosts lie outside
                `[egress] allow`, a secrets file without `[egress]`. Never a value.
        """
        egress = settings.egress
        path = settings.secrets.file
        if egress is None:
            if path is not None:
                raise ConfigError(
                    f"[secrets] file {path} needs an [egress] section: secrets are only "
                    "sent to hosts [egress] allow"
                )
            return cls()
        if egress.ca_file is not None:
            try:
                with open(egress.ca_file, "rb") as f:
                    f.read(1)
            except OSError as e:
                raise ConfigError(
                    f"[egress] ca_file {egress.ca_file} cannot be read: {e.strerror or e}"
                ) from None
        ceiling = cls(egress.allow_rules(), egress.deny_rules())
        entries = {} if path is None else load_secrets(path)
        for entry in entries.values():
            for rule in entry.hosts:
                if not any(a.covers(rule) for a in ceiling.allow):
                    raise ConfigError(
                        f"the secrets file {path}: secret {entry.name}: host {rule.text} is "
                        f"not within [egress] allow ({', '.join(r.text for r in ceiling.allow)})"
                    )
        ceiling.secrets = entries
        return ceiling

    def allowance(
        self, identity_rules: tuple[Rule, ...] | None, *, who: str = "the identity"
    ) -> tuple[Rule, ...]:
        """What a caller may reach at most: its identity's rules, else the ceiling.

        Raises:
            EgressNotAllowed: The identity's rules reach beyond the ceiling.
        """
        if identity_rules is None:
            return self.allow
        return narrow(
            self.allow, identity_rules, f"the allowance of {who}", above_what="[egress] allow"
        )

    def policy(
        self,
        *,
        allowance: tuple[Rule, ...],
        tool: tuple[Rule, ...] | None,
        session: tuple[Rule, ...] | None,
        call: tuple[Rule, ...] | None,
        secrets: Sequence[str],
        allowed_secrets: frozenset[str] | None,
        what: str,
    ) -> EgressPolicy:
        """The policy of one sandbox (a call's or a session's).

        Args:
            allowance: What the caller may reach (`allowance`).
            tool: The tool's rules; None: it asks for none.
            session: The session's rules; None: none asked.
            call: The call's rules; None: none asked.
            secrets: The secrets asked for (the tool's, the session's, the call's).
            allowed_secrets: The secrets the caller may use; None: every one.
            what: What runs, for messages ("tool 'news'", "session s-1").

        Returns:
            The most specific level given, with the ceiling's deny rules and the
            secrets, each with a new placeholder. No level asked: `NO_EGRESS`.

        Raises:
            EgressNotAllowed: A level asks for more than the one above allows
                (naming the rule); an unknown secret, or one the caller may not
                use (naming it); secrets asked where no egress is.
        """
        prefix = f"{what}: " if what else ""
        current = allowance
        above = _LEVELS[0][1]
        effective: tuple[Rule, ...] | None = None
        for (level, _), rules in zip(_LEVELS, (tool, session, call), strict=True):
            if rules is None:
                continue
            current = narrow(current, rules, f"{prefix}the {level}", above_what=above)
            effective = current
            above = f"the {level}"
        names = list(dict.fromkeys(secrets))
        held = tuple(self._hold(name, allowed_secrets, prefix) for name in names)
        if not effective:
            if held:
                raise EgressNotAllowed(
                    f"{prefix}asks for secret {held[0].name} but for no egress: a secret "
                    f"goes only to its hosts ({', '.join(r.text for r in held[0].hosts)}); "
                    "ask for egress to them too",
                    rule=held[0].name,
                )
            return NO_EGRESS
        return EgressPolicy(allow=effective, deny=self.deny, secrets=held)

    def _hold(self, name: str, allowed: frozenset[str] | None, prefix: str) -> HeldSecret:
        entry = self.secrets.get(name)
        if entry is None:
            raise EgressNotAllowed(f"{prefix}no secret {name} in the secrets file", rule=name)
        if allowed is not None and name not in allowed:
            raise EgressNotAllowed(
                f"{prefix}the secret {name} is not among those this caller may use "
                "(the tokens file's `secrets`)",
                rule=name,
            )
        return HeldSecret.hold(entry)

    def check_identities(self, identities: Iterable[Identity]) -> None:
        """Refuse identities whose rules reach beyond the ceiling or whose secrets
        the secrets file lacks (at start and at reload, so that a typo is found
        then rather than at each of that identity's calls).

        Raises:
            ConfigError: Naming the identity and the rule or secret at fault.
        """
        for identity in identities:
            try:
                self.allowance(identity.egress, who=f"identity {identity.name!r}")
            except EgressNotAllowed as e:
                raise ConfigError(f"the tokens file: {e.message}") from None
            missing = sorted((identity.secrets or frozenset()) - self.secrets.keys())
            if missing:
                raise ConfigError(
                    f"the tokens file: identity {identity.name!r} names secret "
                    f"{missing[0]}, which the secrets file does not hold"
                )
