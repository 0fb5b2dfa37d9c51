"""The sandbox's side of one proxy connection: answers, refusals and where it may go.

`ClientConn` holds one client connection of a gate and what every kind of
request on it shares: answering a refusal (a 403 the sandbox's code can act
on, recorded as a denial), an upstream failure (a 502, not a denial), and the
order of checks for a destination (each refusal answers before anything is
sent upstream): the policy's rules (deny wins; no rules: `no_egress`; an IP
literal a rule does not name: `ip_literal`), then where the name leads
(`resolve.Lookup`: the hosts map, else the resolver and the address checks).
The proxy then connects to the address it checked, never resolving again.

What the connection needs of the proxy is `ProxyLike` (the proxy module
imports this one, not the other way).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from tooljail.errors import TooljailError
from tooljaild.egress import streams
from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.policy import EgressPolicy
from tooljaild.egress.refusals import refusal_text, response
from tooljaild.egress.resolve import Lookup, Resolved, Unreachable, ip_literal
from tooljaild.egress.swap import SecretLeak

if TYPE_CHECKING:
    from tooljaild.egress.gate import EgressGate
    from tooljaild.egress.tls import InterceptCA

HEAD_TIMEOUT_S = 30.0
"""How long a new connection may take to send its first request head."""

IDLE_TIMEOUT_S = 60.0
"""How long a keep-alive connection may wait between two requests (and an
upstream for its answer's head)."""

CONNECT_TIMEOUT_S = 10.0
"""How long connecting to an upstream address may take."""

CLOSE_TIMEOUT_S = 5.0
"""How long closing a connection may wait for its last bytes to leave."""


class CacheWriter(Protocol):
    """Where a response body is written while it streams to the client."""

    def write(self, data: bytes) -> None: ...
    def commit(self) -> object: ...
    def abort(self) -> None: ...


class PackageCacheLike(Protocol):
    """What the proxy needs of the package cache (`egress/package_cache.py`)."""

    index_hosts: Collection[str]

    def wants(self, host: str) -> bool: ...
    def lookup(self, url: str) -> Path | None: ...
    def writer(self, url: str) -> CacheWriter | None: ...


class ProxyLike(Protocol):
    """What a connection needs of the proxy (`EgressProxy`)."""

    @property
    def hosts(self) -> HostsMap: ...
    @property
    def lookup(self) -> Lookup: ...
    @property
    def ca(self) -> InterceptCA: ...
    @property
    def cache(self) -> PackageCacheLike | None: ...
    def upstream_context(self) -> ssl.SSLContext: ...
    def deny(self, gate: EgressGate, host: str, port: int, reason: str, rule: str) -> None: ...


class Done(TooljailError):
    """The connection was answered (a refusal or an error) and must close.

    Control flow inside the proxy's loop, never raised past a connection; in the
    daemon's error tree like every exception the daemon defines."""

    def __init__(self, message: str = "the connection was answered and closes") -> None:
        super().__init__(message)


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close `writer`, waiting (bounded) for its last bytes to leave, else abort."""
    await streams.close_writer(writer, CLOSE_TIMEOUT_S)


class ClientConn:
    """One client connection of `gate`, read by `reader`, answered through `writer`."""

    def __init__(
        self,
        proxy: ProxyLike,
        gate: EgressGate,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.gate = gate
        self.reader = reader
        self.writer = writer
        # Whether an answer to the current request has begun (no other may follow).
        self.answered = False
        # Whether a tunnel took the client's transport over (the streams are done).
        self.spliced = False

    # -- refusals -----------------------------------------------------------

    async def refuse(
        self,
        host: str,
        port: int,
        reason: str,
        rule: str,
        *,
        detail: str = "",
        status: int = 403,
        record: bool = True,
    ) -> None:
        """Answer a refusal (the connection then closes) and record it as a denial."""
        if record:
            self.proxy.deny(self.gate, host, port, reason, rule)
        text = refusal_text(host, port, reason, rule, self.gate.policy.allow, detail)
        phrase = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}.get(status, "Error")
        await self.send(response(status, phrase, text))

    async def fail(self, status: int, text: str) -> NoReturn:
        """Answer an upstream failure (not a denial) and close."""
        await self.send(response(status, "Bad Gateway", f"tooljail egress: {text}\n"))
        raise Done

    async def send(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            self.writer.write(data)
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.writer.drain()

    # -- destinations -------------------------------------------------------

    async def route(self, host: str, port: int, policy: EgressPolicy) -> Resolved:
        """Where `host:port` may be reached, or a refusal answered (raises Done)."""
        ip = ip_literal(host)
        verdict = policy.decide(str(ip) if ip is not None else host, port)
        if not verdict.allowed:
            reason = verdict.reason
            if ip is not None and reason == "not_allowed":
                reason = "ip_literal"
            await self.refuse(host, port, reason, verdict.rule)
            raise Done
        if ip is not None:
            # A rule names this address: it is reached as named, unchecked.
            return Resolved((str(ip),), port)
        found = await self.proxy.lookup.resolve(host, port, hosts=self.proxy.hosts, policy=policy)
        if isinstance(found, Unreachable):
            status = 502 if found.reason == "resolve_failed" else 403
            await self.refuse(
                host, port, found.reason, verdict.rule, detail=found.detail, status=status
            )
            raise Done
        return found

    async def open_upstream(
        self, host: str, port: int, where: Resolved
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to the first checked address that answers; count the connection."""
        failure = "no address"
        for address in where.addresses:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    opened = await asyncio.open_connection(address, where.port)
            except (OSError, TimeoutError) as exc:
                failure = str(exc) or type(exc).__name__
                continue
            self.gate.book.connection()
            return opened
        await self.fail(502, f"could not connect to {host}:{port}: {failure}")

    async def leak(self, host: str, port: int, leak: SecretLeak) -> None:
        # Only the secret's NAME and where it was found: never its value.
        await self.refuse(
            host,
            port,
            "secret_leak",
            leak.secret,
            detail=(
                f"the placeholder of secret {leak.secret} was sent in the {leak.where}; "
                "it may be sent only to that secret's hosts"
            ),
        )
