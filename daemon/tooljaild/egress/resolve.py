"""Where the proxy connects: names resolved on the host, and addresses it refuses.

The sandbox has no resolver; the proxy resolves every name itself, once per
connection, checks every address the name resolved to, and then connects to
an address it checked (never a second lookup: a name cannot answer a public
address to the check and a private one to the connect, i.e. no DNS rebinding).

Refused addresses (reason `private_address`), unless a rule names that exact
address: loopback, private, link-local (169.254/16 with the cloud metadata
service, fe80::/10), multicast, unspecified, reserved, shared (CGNAT
100.64/10), unique-local (fc00::/7), an IPv6 form that carries one of those
(IPv4-mapped, 6to4, NAT64, Teredo), and the host's own addresses. A name the
operator maps in `[egress.hosts]` is not checked: the operator named that
address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

from tooljaild.egress.hosts import HostsMap

RESOLVE_TIMEOUT_S = 5.0
"""How long a name may take to resolve before the connection is refused."""

OWN_ADDRESSES_TTL_S = 60.0
"""How long the host's own interface addresses are cached."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves (name, port) to address strings; raises OSError when it cannot."""

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class _Policy(Protocol):
    def decide(self, host: str, port: int) -> _VerdictLike: ...


class _VerdictLike(Protocol):
    @property
    def allowed(self) -> bool: ...


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's resolver (`getaddrinfo` in the loop's executor), TCP addresses only."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def ip_literal(host: str) -> IPAddress | None:
    """`host` as an address when it is an IP literal ("10.0.0.5", "::1", "[::1]")."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def forbidden_kind(ip: IPAddress) -> bool:
    """Whether `ip` is of a kind the proxy never reaches unless named (not own-address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None and forbidden_kind(inner):
            return True
    return (
        not ip.is_global
        or ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or (isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT)
    )


class OwnAddresses:
    """This host's interface addresses, re-read at most every `ttl_s` seconds."""

    def __init__(self, ttl_s: float = OWN_ADDRESSES_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._at = -float("inf")
        self._addresses: frozenset[IPAddress] = frozenset()

    def get(self) -> frozenset[IPAddress]:
        now = time.monotonic()
        if now - self._at >= self._ttl_s:
            found: set[IPAddress] = set()
            for addrs in psutil.net_if_addrs().values():
                for addr in addrs:
                    if addr.family in (socket.AF_INET, socket.AF_INET6):
                        # "fe80::1%eth0": the zone is not part of the address.
                        ip = ip_literal(addr.address.split("%", 1)[0])
                        if ip is not None:
                            found.add(ip)
            self._addresses = frozenset(found)
            self._at = now
        return self._addresses


@dataclass(frozen=True)
class Resolved:
    """Where to connect: checked addresses, in the order to try them."""

    addresses: tuple[str, ...]
    port: int
    mapped: bool = False
    """Whether the operator's hosts map gave the address."""


@dataclass(frozen=True)
class Unreachable:
    """Why a name gives nowhere to connect: `private_address` or `resolve_failed`."""

    reason: str
    detail: str


class Lookup:
    """Resolves a name for the proxy and checks where it leads."""

    def __init__(
        self,
        *,
        resolver: Resolver | None = None,
        own: OwnAddresses | None = None,
        timeout_s: float = RESOLVE_TIMEOUT_S,
    ) -> None:
        self._resolver = resolver or system_resolver
        self._own = own or OwnAddresses()
        self._timeout_s = timeout_s

    def refused(self, ip: IPAddress) -> bool:
        """Whether `ip` is private, special or this host's own."""
        return forbidden_kind(ip) or ip in self._own.get()

    async def resolve(
        self, host: str, port: int, *, hosts: HostsMap, policy: _Policy
    ) -> Resolved | Unreachable:
        """Where `host:port` leads, or why it leads nowhere the sandbox may go.

        The hosts map first (its address counts as named: no check); else the
        resolver, bounded by the timeout; ANY refused address refuses the name
        (a name that answers one public and one private address is not trusted
        with either), unless an allow rule names that exact address.
        """
        mapped = hosts.lookup(host, port)
        if mapped is not None:
            return Resolved((mapped[0],), mapped[1], mapped=True)
        try:
            async with asyncio.timeout(self._timeout_s):
                found = await self._resolver(host, port)
        except TimeoutError:
            return Unreachable(
                "resolve_failed", f"{host} did not resolve within {self._timeout_s:g} s"
            )
        except (OSError, UnicodeError) as exc:
            return Unreachable("resolve_failed", f"{host} does not resolve ({exc})")
        addresses: list[str] = []
        for text in found:
            ip = ip_literal(text.split("%", 1)[0])
            if ip is None:
                continue
            if self.refused(ip) and not policy.decide(str(ip), port).allowed:
                return Unreachable(
                    "private_address",
                    f"{host} resolves to {ip}, a private, special or this host's own address",
                )
            if str(ip) not in addresses:
                addresses.append(str(ip))
        if not addresses:
            return Unreachable("resolve_failed", f"{host} resolves to no address")
        return Resolved(tuple(addresses), port)
