"""Where the egress proxy connects: addresses refused, names resolved once, the hosts map first."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.resolve import (
    Lookup,
    OwnAddresses,
    Resolved,
    Unreachable,
    forbidden_kind,
    ip_literal,
)
from tooljaild.egress.rules import parse_rules
from tooljaild.egress.usage import MAX_DENIALS, UsageBook


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "10.0.0.5",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "100.64.0.1",  # CGNAT
        "0.0.0.0",
        "224.0.0.1",  # multicast
        "240.0.0.1",  # reserved
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",  # ULA
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "64:ff9b::a00:5",  # NAT64 of 10.0.0.5
        "192.0.2.1",  # documentation
    ],
)
def test_private_and_special_addresses_are_refused(address: str) -> None:
    assert forbidden_kind(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert not forbidden_kind(ipaddress.ip_address(address))


def test_ip_literal_reads_brackets() -> None:
    assert ip_literal("[::1]") == ipaddress.ip_address("::1")
    assert ip_literal("10.0.0.5") == ipaddress.ip_address("10.0.0.5")
    assert ip_literal("api.example.com") is None


def test_own_addresses_include_loopback_and_are_cached() -> None:
    own = OwnAddresses(ttl_s=60)
    first = own.get()
    assert ipaddress.ip_address("127.0.0.1") in first
    assert own.get() is first


def _policy(*rules: str) -> EgressPolicy:
    return EgressPolicy(allow=parse_rules(rules, "test"))


def _lookup(answers: dict[str, list[str]], **kwargs: float) -> tuple[Lookup, list[str]]:
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        if host == "slow.test":
            await asyncio.sleep(10)
        if host not in answers:
            raise OSError("no such name")
        return answers[host]

    return Lookup(resolver=resolver, **kwargs), asked


async def test_any_private_answer_refuses_the_name() -> None:
    lookup, _ = _lookup({"mixed.test": ["93.184.216.34", "10.0.0.5"]})
    found = await lookup.resolve("mixed.test", 443, hosts=HostsMap(), policy=_policy("mixed.test"))
    assert isinstance(found, Unreachable) and found.reason == "private_address"
    assert "10.0.0.5" in found.detail


async def test_a_rule_naming_the_address_lets_it_through() -> None:
    lookup, _ = _lookup({"intra.test": ["10.0.0.5"]})
    found = await lookup.resolve(
        "intra.test", 443, hosts=HostsMap(), policy=_policy("intra.test", "10.0.0.5:443")
    )
    assert found == Resolved(("10.0.0.5",), 443)


async def test_public_answers_are_kept_in_order_without_repeats() -> None:
    lookup, _ = _lookup({"pub.test": ["93.184.216.34", "93.184.216.34", "2606:4700::1"]})
    found = await lookup.resolve("pub.test", 80, hosts=HostsMap(), policy=_policy("pub.test"))
    assert found == Resolved(("93.184.216.34", "2606:4700::1"), 80)


async def test_the_hosts_map_comes_first_and_is_not_checked() -> None:
    lookup, asked = _lookup({})
    hosts = HostsMap({("pypi.internal", None): ("10.0.0.5", 8080)})
    found = await lookup.resolve("pypi.internal", 80, hosts=hosts, policy=_policy("pypi.internal"))
    assert found == Resolved(("10.0.0.5",), 8080, mapped=True)
    assert asked == []


async def test_unresolvable_and_slow_names_fail() -> None:
    lookup, _ = _lookup({}, timeout_s=0.05)
    gone = await lookup.resolve("gone.test", 80, hosts=HostsMap(), policy=_policy("gone.test"))
    slow = await lookup.resolve("slow.test", 80, hosts=HostsMap(), policy=_policy("slow.test"))
    assert isinstance(gone, Unreachable) and gone.reason == "resolve_failed"
    assert isinstance(slow, Unreachable) and slow.reason == "resolve_failed"
    assert "within" in slow.detail


async def test_an_own_address_is_refused_even_when_public() -> None:
    class Own(OwnAddresses):
        def get(self) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
            return frozenset({ipaddress.ip_address("93.184.216.34")})

    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    lookup = Lookup(resolver=resolver, own=Own())
    found = await lookup.resolve("me.test", 80, hosts=HostsMap(), policy=_policy("me.test"))
    assert isinstance(found, Unreachable) and found.reason == "private_address"


def test_denials_are_bounded_and_counted_per_mark() -> None:
    book = UsageBook()
    book.deny("a.test", 443, "not_allowed")
    mark = book.mark()
    for i in range(1000):
        book.deny(f"h{i}.test", 443, "not_allowed")
    book.deny("a.test", 443, "not_allowed")
    book.deny("a.test", 443, "not_allowed")
    _, found = book.since(mark)
    assert len(found) == MAX_DENIALS
    # The most recent kinds are kept; a.test counts only what came after the mark.
    assert found[-1].host == "a.test" and found[-1].count == 2
    assert found[0].host == f"h{1000 - MAX_DENIALS + 1}.test"


def test_usage_since_a_mark() -> None:
    book = UsageBook()
    book.connection()
    book.bytes(out=10, into=20)
    mark = book.mark()
    book.connection()
    book.bytes(out=1, into=2)
    usage, found = book.since(mark)
    assert (usage.connections, usage.bytes_out, usage.bytes_in) == (1, 1, 2)
    assert found == ()


def test_long_hosts_are_cut() -> None:
    book = UsageBook()
    book.deny("x" * 10_000, 80, "not_allowed")
    (denial,) = book.since(book.mark().__class__(book.usage().__class__(), 0, {}))[1]
    assert len(denial.host) == 255
