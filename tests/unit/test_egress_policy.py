"""Egress policy: a connection's verdict, and the levels that make a sandbox's policy."""

from __future__ import annotations

import time

import pytest

from tooljaild.auth.policy import Identity
from tooljaild.egress.policy import (
    NO_EGRESS,
    PLACEHOLDER_PREFIX,
    REASONS,
    EgressCeiling,
    EgressPolicy,
    HeldSecret,
    Verdict,
)
from tooljaild.egress.rules import EgressNotAllowed, Rule, parse_rules
from tooljaild.egress.secrets import SecretEntry
from tooljaild.settings.config import ConfigError
from tooljaild.settings.egress_rules import parse_deny_rules

VALUE = "s3cr3t-value-never-shown"


def _rules(*texts: str) -> tuple[Rule, ...]:
    return parse_rules(texts, "test")


def _policy(allow: tuple[str, ...], deny: tuple[str, ...] = ()) -> EgressPolicy:
    return EgressPolicy(allow=_rules(*allow), deny=parse_deny_rules(deny, "deny"))


def test_decide_deny_wins_then_the_first_allow_rule() -> None:
    p = _policy(("*.example.com", "api.example.com:443", "pypi.org"), ("evil.example.com",))
    assert p.decide("api.example.com", 443) == Verdict(True, "allowed", "*.example.com")
    assert p.decide("evil.example.com", 443) == Verdict(False, "deny_rule", "evil.example.com")
    # A deny rule without ports denies every port, even one an allow rule names.
    assert p.decide("evil.example.com", 8443).reason == "deny_rule"
    assert p.decide("pypi.org", 80) == Verdict(True, "allowed", "pypi.org")
    assert p.decide("PyPI.org.", 443).allowed


def test_decide_says_port_not_allowed_when_only_the_host_matches() -> None:
    p = _policy(("api.example.com:443", "*.example.com:8443"))
    assert p.decide("api.example.com", 80) == Verdict(
        False, "port_not_allowed", "api.example.com:443"
    )
    assert p.decide("a.example.com", 443) == Verdict(
        False, "port_not_allowed", "*.example.com:8443"
    )


def test_decide_refuses_what_no_rule_names() -> None:
    p = _policy(("*.example.com", "10.0.0.5:8080"))
    assert p.decide("example.com", 443) == Verdict(False, "not_allowed", "")  # the parent
    assert p.decide("evil.net", 443).reason == "not_allowed"
    assert p.decide("10.0.0.6", 8080).reason == "not_allowed"
    assert p.decide("10.0.0.5", 8080).allowed
    assert p.decide("[::1]", 443).reason == "not_allowed"


def test_nothing_allowed_is_no_egress() -> None:
    assert NO_EGRESS.empty and not NO_EGRESS.intercept
    assert NO_EGRESS.decide("api.example.com", 443) == Verdict(False, "no_egress", "")
    assert "no_egress" in REASONS and "connection_limit" in REASONS


def test_the_first_rule_written_names_the_verdict_across_exact_and_wildcard() -> None:
    p = _policy(("*.b.example.com", "a.b.example.com", "*.example.com"))
    assert p.decide("a.b.example.com", 443).rule == "*.b.example.com"
    p = _policy(("a.b.example.com", "*.b.example.com"))
    assert p.decide("a.b.example.com", 443).rule == "a.b.example.com"


def test_decide_is_fast_with_many_rules() -> None:
    # Per connection, on the proxy's loop: a dict lookup per label, not a scan.
    allow = tuple(f"h{i}.example{i % 50}.com" for i in range(5000)) + tuple(
        f"*.w{i}.net" for i in range(5000)
    )
    p = _policy(allow, ("evil.w7.net",))
    start = time.perf_counter()
    for i in range(20_000):
        p.decide(f"x.y.w{i % 5000}.net", 443)
    elapsed = time.perf_counter() - start
    assert p.decide("x.y.w4999.net", 443).allowed
    assert p.decide("evil.w7.net", 443).reason == "deny_rule"
    assert elapsed < 2.0, elapsed  # ~0.05 s here; a scan of 10,000 rules would take minutes


def _entry(
    name: str = "NEWS_API_KEY", hosts: tuple[str, ...] = ("api.example.com",)
) -> SecretEntry:
    return SecretEntry(name=name, value=VALUE, hosts=_rules(*hosts))


def test_a_held_secret_has_a_new_random_placeholder_and_hides_its_value() -> None:
    a, b = HeldSecret.hold(_entry()), HeldSecret.hold(_entry())
    for held in (a, b):
        assert held.placeholder.startswith(PLACEHOLDER_PREFIX)
        assert len(held.placeholder) == len(PLACEHOLDER_PREFIX) + 32
        int(held.placeholder[len(PLACEHOLDER_PREFIX) :], 16)
        assert VALUE not in held.placeholder
        assert VALUE not in repr(held) and VALUE not in str(held)
    assert a.placeholder != b.placeholder
    assert a.allowed_for("API.example.com", 443) and not a.allowed_for("evil.com", 443)
    policy = EgressPolicy(allow=_rules("api.example.com"), secrets=(a,))
    assert policy.intercept and VALUE not in repr(policy)
    assert VALUE not in repr(_entry()) and VALUE not in str(_entry())


def _ceiling() -> EgressCeiling:
    return EgressCeiling(
        allow=_rules("*.example.com", "pypi.org:443", "files.pythonhosted.org:443"),
        deny=parse_deny_rules(["evil.example.com"], "deny"),
        secrets={"NEWS_API_KEY": _entry(), "OTHER": _entry("OTHER", ("b.example.com",))},
    )


def test_nothing_asked_at_any_level_is_no_network() -> None:
    c = _ceiling()
    p = c.policy(
        allowance=c.allow,
        tool=None,
        session=None,
        call=None,
        secrets=(),
        allowed_secrets=None,
        what="tool 'x'",
    )
    assert p is NO_EGRESS


def test_the_most_specific_level_given_is_what_the_sandbox_may_reach() -> None:
    c = _ceiling()
    tool = _rules("*.example.com")
    session = _rules("api.example.com", "b.example.com")
    call = _rules("api.example.com:443")
    base = {"allowance": c.allow, "secrets": (), "allowed_secrets": None, "what": "w"}
    assert c.policy(tool=tool, session=None, call=None, **base).allow == tool  # type: ignore[arg-type]
    assert c.policy(tool=tool, session=session, call=None, **base).allow == session  # type: ignore[arg-type]
    p = c.policy(tool=tool, session=session, call=call, **base)  # type: ignore[arg-type]
    assert p.allow == call and p.deny == c.deny
    assert p.decide("api.example.com", 443).allowed and not p.decide("b.example.com", 443).allowed
    # A session without a tool's rules (the built-ins) narrows the allowance itself.
    assert c.policy(tool=None, session=session, call=None, **base).allow == session  # type: ignore[arg-type]
    # Deny wins whatever a level allows.
    p = c.policy(tool=tool, session=None, call=None, **base)  # type: ignore[arg-type]
    assert p.decide("evil.example.com", 443).reason == "deny_rule"


@pytest.mark.parametrize(
    ("levels", "says"),
    [
        ({"tool": ("pypi.org",)}, "w: the tool asks for egress to pypi.org, which the caller's"),
        (
            {"tool": ("a.example.com",), "session": ("b.example.com",)},
            "w: the session asks for egress to b.example.com, which the tool does not allow",
        ),
        (
            {"session": ("a.example.com:443",), "call": ("a.example.com",)},
            "w: the call asks for egress to a.example.com, which the session does not allow: "
            "it allows only a.example.com:443",
        ),
        ({"call": ("example.com",)}, "the call asks for egress to example.com"),
    ],
)
def test_a_level_asking_for_more_than_the_one_above_is_refused_by_rule(
    levels: dict[str, tuple[str, ...]], says: str
) -> None:
    c = _ceiling()
    given = {k: (_rules(*levels[k]) if k in levels else None) for k in ("tool", "session", "call")}
    with pytest.raises(EgressNotAllowed) as info:
        c.policy(allowance=c.allow, secrets=(), allowed_secrets=None, what="w", **given)
    assert says in info.value.message
    assert info.value.rule in str(levels)


def test_secrets_are_held_by_name_when_known_and_allowed() -> None:
    c = _ceiling()
    base = {"allowance": c.allow, "tool": _rules("api.example.com"), "session": None}
    p = c.policy(
        call=None, secrets=["NEWS_API_KEY", "NEWS_API_KEY"], allowed_secrets=None, what="w", **base
    )  # type: ignore[arg-type]
    assert [s.name for s in p.secrets] == ["NEWS_API_KEY"] and p.intercept
    assert p.secrets[0].value == VALUE
    q = c.policy(call=None, secrets=["NEWS_API_KEY"], allowed_secrets=None, what="w", **base)  # type: ignore[arg-type]
    assert q.secrets[0].placeholder != p.secrets[0].placeholder  # new for every holder
    with pytest.raises(EgressNotAllowed, match="no secret NOPE in the secrets file") as info:
        c.policy(call=None, secrets=["NOPE"], allowed_secrets=None, what="w", **base)  # type: ignore[arg-type]
    assert info.value.rule == "NOPE"
    with pytest.raises(EgressNotAllowed, match="the secret OTHER is not among") as info:
        c.policy(
            call=None,
            secrets=["NEWS_API_KEY", "OTHER"],
            allowed_secrets=frozenset({"NEWS_API_KEY"}),
            what="w",
            **base,  # type: ignore[arg-type]
        )
    assert info.value.rule == "OTHER" and VALUE not in info.value.message


def test_a_secret_without_egress_is_refused() -> None:
    c = _ceiling()
    with pytest.raises(EgressNotAllowed, match="asks for secret NEWS_API_KEY but for no egress"):
        c.policy(
            allowance=c.allow,
            tool=None,
            session=None,
            call=None,
            secrets=["NEWS_API_KEY"],
            allowed_secrets=None,
            what="w",
        )


def test_with_allow_keeps_the_secrets_and_their_placeholders() -> None:
    held = HeldSecret.hold(_entry())
    p = EgressPolicy(allow=_rules("api.example.com"), secrets=(held,))
    q = p.with_allow(_rules("api.example.com:443"))
    assert q.secrets == (held,) and q.allow == _rules("api.example.com:443")
    assert not q.decide("api.example.com", 80).allowed


def test_the_allowance_is_the_identity_s_rules_within_the_ceiling() -> None:
    c = _ceiling()
    assert c.allowance(None) == c.allow
    assert c.allowance(_rules("a.example.com")) == _rules("a.example.com")
    with pytest.raises(
        EgressNotAllowed, match=r"the allowance of identity 'x' asks for egress to b\.com"
    ):
        c.allowance(_rules("b.com"), who="identity 'x'")


def test_check_identities_names_the_identity_at_fault() -> None:
    c = _ceiling()
    c.check_identities([Identity("a"), Identity("b", egress=_rules("a.example.com"))])
    with pytest.raises(ConfigError, match=r"allowance of identity 'bad' asks for egress to b\.com"):
        c.check_identities([Identity("bad", egress=_rules("b.com"))])
    with pytest.raises(ConfigError, match="identity 'bad' names secret NOPE"):
        c.check_identities([Identity("bad", secrets=frozenset({"NOPE", "OTHER"}))])


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("evil.com\x00.example.com", 443),
        ("evil.com/.example.com", 443),
        ("evil.com@a.example.com", 443),
        ("a..example.com", 443),
        ("a b.example.com", 443),
        ("-a.example.com", 443),
        ("a.example.com", 0),
        ("a.example.com", 65536),
        ("", 443),
    ],
)
def test_a_malformed_host_or_port_is_a_bad_request_never_a_wildcard_match(
    host: str, port: int
) -> None:
    p = _policy(("*.example.com:*",))
    assert p.decide(host, port) == Verdict(False, "bad_request", "")
    assert not p.allow[0].matches(host, port)
    assert not HeldSecret.hold(_entry(hosts=("*.example.com:*",))).allowed_for(host, port)
