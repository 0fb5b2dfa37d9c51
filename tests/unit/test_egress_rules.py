"""Egress rules: the grammar, what a rule matches and covers, and narrowing levels."""

from __future__ import annotations

import pytest

from tooljail.errors import PermissionDeniedError, TooljailError
from tooljaild.egress.rules import (
    DEFAULT_PORTS,
    EgressNotAllowed,
    Rule,
    narrow,
    parse_rule,
    parse_rules,
)
from tooljaild.settings.egress_rules import (
    check_secret_name,
    parse_address,
    parse_deny_rules,
    parse_host_key,
)


@pytest.mark.parametrize(
    ("text", "host", "ports"),
    [
        ("api.example.com", "api.example.com", DEFAULT_PORTS),
        ("API.Example.COM.", "api.example.com", DEFAULT_PORTS),
        ("api.example.com:443", "api.example.com", frozenset({443})),
        ("api.example.com:80,443,8080", "api.example.com", frozenset({80, 443, 8080})),
        ("api.example.com:*", "api.example.com", None),
        ("*.githubusercontent.com", "*.githubusercontent.com", DEFAULT_PORTS),
        ("10.0.0.5:8080", "10.0.0.5", frozenset({8080})),
        ("10.0.0.5", "10.0.0.5", DEFAULT_PORTS),
        ("[::1]:443", "::1", frozenset({443})),
        ("[0:0::1]", "::1", DEFAULT_PORTS),
        ("::1", "::1", DEFAULT_PORTS),
        ("xn--bcher-kva.example", "xn--bcher-kva.example", DEFAULT_PORTS),
        ("localhost", "localhost", DEFAULT_PORTS),
    ],
)
def test_the_rule_syntax(text: str, host: str, ports: frozenset[int] | None) -> None:
    rule = parse_rule(text)
    assert (rule.host, rule.ports, rule.text) == (host, ports, text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("*", "every host"),
        ("*:443", "every host"),
        ("a.*.com", "may only open a rule"),
        ("**.x.com", "may only open a rule"),
        ("api.example.com:0", "port '0'"),
        ("api.example.com:65536", "port '65536'"),
        ("api.example.com:http", "port 'http'"),
        ("api.example.com:", "port ''"),
        ("api example.com", "whitespace"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("-bad.example.com", "'-bad'"),
        ("a..b", "''"),
        ("::1:99999", "[::1]:443"),
        ("[10.0.0.1]:80", "IPv6 address only"),
        ("[::1", "without ']'"),
        ("[::1]443", "after ']'"),
        ("10.0.0", "whole IP address"),
        ("010.0.0.1", "whole IP address"),
        ("*.10.0.0.1", "whole IP address"),
        ("0x7f000001", "whole IP address"),
        ("0x7f.1:80", "whole IP address"),
        ("[fe80::1%eth0]", "zone"),
        ("a" * 64 + ".com", "not a host name label"),
        ("http://api.example.com", "not a URL or a path: write api.example.com"),
        ("api.example.com/path", "not a URL or a path"),
        ("user@api.example.com", "not a URL"),
    ],
)
def test_a_bad_rule_is_refused_saying_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rule(text)
    assert says in str(info.value)
    if text.strip():
        assert repr(text.strip())[:20] in str(info.value) or text[:5] in str(info.value)


def test_parse_rules_names_where_and_refuses_a_lone_string() -> None:
    assert [r.host for r in parse_rules(["a.com", "*.b.com"], "allow")] == ["a.com", "*.b.com"]
    with pytest.raises(ValueError, match=r"^\[egress\] allow: 'x y'"):
        parse_rules(["a.com", "x y"], "[egress] allow")
    with pytest.raises(ValueError, match="a list of strings"):
        parse_rules("a.com", "allow")


@pytest.mark.parametrize(
    ("rule", "host", "port", "matches"),
    [
        ("api.example.com", "api.example.com", 443, True),
        ("api.example.com", "API.EXAMPLE.COM.", 80, True),
        ("api.example.com", "api.example.com", 8443, False),
        ("api.example.com", "x.api.example.com", 443, False),
        ("api.example.com", "example.com", 443, False),
        ("*.x.com", "a.x.com", 443, True),
        ("*.x.com", "a.b.x.com", 443, True),
        ("*.x.com", "x.com", 443, False),  # a wildcard's parent is refused
        ("*.x.com", "evilx.com", 443, False),
        ("*.x.com", "a.x.com.evil.net", 443, False),
        ("api.example.com:*", "api.example.com", 22, True),
        ("10.0.0.5:8080", "10.0.0.5", 8080, True),
        ("10.0.0.5:8080", "10.0.0.6", 8080, False),
        ("[::1]:443", "[::1]", 443, True),
        ("[::1]:443", "0:0:0:0:0:0:0:1", 443, True),
        ("*.0.0.1", "127.0.0.1", 443, None),  # not a rule at all (see above)
    ],
)
def test_what_a_rule_matches(rule: str, host: str, port: int, matches: bool | None) -> None:
    if matches is None:
        with pytest.raises(ValueError):
            parse_rule(rule)
        return
    assert parse_rule(rule).matches(host, port) is matches


def test_an_ip_literal_is_matched_only_by_a_rule_naming_it() -> None:
    # No name rule, wildcard or not, reaches an address: an IP is named or refused.
    assert not parse_rule("*.com").matches("127.0.0.1", 443)
    assert not parse_rule("localhost").matches("127.0.0.1", 443)
    assert parse_rule("127.0.0.1").matches("127.0.0.1", 443)


@pytest.mark.parametrize(
    ("above", "other", "covers"),
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "api.example.com:443", True),
        ("api.example.com:443", "api.example.com", False),  # 80 too
        ("api.example.com:*", "api.example.com:22,443", True),
        ("api.example.com", "api.example.com:*", False),
        ("*.x.com", "a.x.com", True),
        ("*.x.com", "*.a.x.com", True),
        ("*.x.com", "*.x.com:443", True),
        ("*.x.com", "x.com", False),
        ("*.a.x.com", "*.x.com", False),
        ("a.x.com", "*.x.com", False),
        ("10.0.0.5:*", "10.0.0.5:8080", True),
        ("*.com", "10.0.0.5", False),
    ],
)
def test_what_a_rule_covers(above: str, other: str, covers: bool) -> None:
    assert parse_rule(above).covers(parse_rule(other)) is covers


def test_narrow_returns_what_is_asked_when_each_rule_is_covered() -> None:
    above = parse_rules(["*.example.com", "pypi.org:443"], "above")
    asked = parse_rules(["api.example.com:443", "pypi.org:443"], "asked")
    assert narrow(above, asked, "the call") == asked
    assert narrow(above, (), "the call") == ()


def test_narrow_refuses_asking_for_more_naming_the_rule_and_what_is_allowed() -> None:
    above = parse_rules(["*.example.com", "pypi.org:443"], "above")
    with pytest.raises(EgressNotAllowed) as info:
        narrow(above, parse_rules(["pypi.org"], "asked"), "tool 'news'", above_what="the session")
    e = info.value
    assert e.rule == "pypi.org"
    assert isinstance(e, PermissionDeniedError) and isinstance(e, TooljailError)
    assert e.code == "permission_denied"
    assert e.message == (
        "tool 'news' asks for egress to pypi.org, which the session does not allow: "
        "it allows only *.example.com, pypi.org:443"
    )
    with pytest.raises(EgressNotAllowed, match="allows only no egress at all"):
        narrow((), parse_rules(["a.com"], "asked"), "the call")


def test_a_deny_rule_without_ports_denies_every_port() -> None:
    evil, one = parse_deny_rules(["evil.example.com", "other.example.com:25"], "deny")
    assert evil.ports is None and evil.matches("evil.example.com", 8443)
    assert one.ports == frozenset({25})


def test_hosts_map_keys_and_addresses() -> None:
    assert parse_host_key("pypi.internal") == ("pypi.internal", None)
    assert parse_host_key("API.example.com:443") == ("api.example.com", 443)
    assert parse_address("10.0.0.5:8080") == ("10.0.0.5", 8080)
    assert parse_address("[::1]:8443") == ("::1", 8443)
    assert parse_address("mirror.lan:3141") == ("mirror.lan", 3141)
    for bad in ("*.x.com", "x.com:0", "x.com:80,443", "x y"):
        with pytest.raises(ValueError):
            parse_host_key(bad)
    for bad in ("10.0.0.5", "10.0.0.5:", "[::1]", ":80", "x.com:99999"):
        with pytest.raises(ValueError):
            parse_address(bad)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("NEWS_API_KEY", True),
        ("_x", True),
        ("a1", True),
        ("1A", False),
        ("A-B", False),
        ("", False),
        ("PATH", False),
        ("HTTPS_PROXY", False),
        ("LD_PRELOAD", False),
        ("PYTHONPATH", False),
        ("PIP_INDEX_URL", False),
    ],
)
def test_secret_names_are_environment_variables_the_sandbox_does_not_need(
    name: str, ok: bool
) -> None:
    assert (check_secret_name(name) is None) is ok


def test_rule_describe_is_canonical() -> None:
    assert parse_rule("A.com").describe() == "a.com:80,443"
    assert parse_rule("[::1]:*").describe() == "[::1]:*"
    assert str(parse_rule("a.com:443")) == "a.com:443"
    assert Rule("a.com", None, "a.com:*").wildcard is False
