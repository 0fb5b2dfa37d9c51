"""What one gate's sandbox did on the network: usage counters and denials.

A gate's `UsageBook` is written by the egress loop (one thread) and read by the
daemon's call path (another thread), so every access takes its lock; each
critical section is a few integer operations.

Denials are kept per distinct `(host, port, reason)` with a count, at most
`MAX_DENIALS` of them: a sandbox that makes 10,000 refused connections costs 64
entries, not 10,000. When a new kind arrives and the book is full, the kind
updated longest ago is dropped (a long session's old denials make room for the
current call's).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

MAX_DENIALS = 64
"""Distinct (host, port, reason) denials a gate keeps, each with a count."""

MAX_HOST_CHARS = 255
"""A denial's host is cut to this length (a DNS name has at most 253)."""


@dataclass(frozen=True)
class NetUsage:
    """Network use between two points in a gate's life.

    `connections` counts connections the proxy made upstream (allowed ones);
    `bytes_out` counts bytes sent by the sandbox towards the world, `bytes_in`
    bytes the world sent back to it.
    """

    connections: int = 0
    bytes_out: int = 0
    bytes_in: int = 0


@dataclass(frozen=True)
class EgressDenial:
    """A refused kind of connection or request, `count` times."""

    host: str
    port: int
    reason: str
    rule: str = ""
    count: int = 1


@dataclass(frozen=True)
class GateMark:
    """A point in a gate's life; `EgressGate.since(mark)` tells what came after.

    Opaque to callers: the usage counters then, and each kept denial's count.
    """

    usage: NetUsage
    seq: int
    counts: dict[int, int] = field(default_factory=dict)


@dataclass
class _Entry:
    ident: int
    host: str
    port: int
    reason: str
    rule: str
    count: int
    last_seq: int


class UsageBook:
    """Thread-safe counters and bounded denials of one gate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections = 0
        self._bytes_out = 0
        self._bytes_in = 0
        self._seq = 0
        self._ids = itertools.count(1)
        # Insertion order is update order: an update moves the entry to the end,
        # so the first entry is the one updated longest ago.
        self._denials: dict[tuple[str, int, str], _Entry] = {}

    def connection(self) -> None:
        """Count one connection made upstream."""
        with self._lock:
            self._connections += 1

    def bytes(self, out: int = 0, into: int = 0) -> None:
        """Count bytes sent out (`out`) and received back (`into`)."""
        with self._lock:
            self._bytes_out += out
            self._bytes_in += into

    def deny(self, host: str, port: int, reason: str, rule: str = "") -> None:
        """Record one denial, merged with earlier ones of the same kind."""
        host = host[:MAX_HOST_CHARS]
        key = (host, port, reason)
        with self._lock:
            self._seq += 1
            entry = self._denials.pop(key, None)
            if entry is None:
                if len(self._denials) >= MAX_DENIALS:
                    del self._denials[next(iter(self._denials))]
                entry = _Entry(next(self._ids), host, port, reason, rule, 0, 0)
            entry.count += 1
            entry.last_seq = self._seq
            self._denials[key] = entry

    def usage(self) -> NetUsage:
        with self._lock:
            return NetUsage(self._connections, self._bytes_out, self._bytes_in)

    def mark(self) -> GateMark:
        """The current point, for `since`."""
        with self._lock:
            return GateMark(
                NetUsage(self._connections, self._bytes_out, self._bytes_in),
                self._seq,
                {e.ident: e.count for e in self._denials.values()},
            )

    def since(self, mark: GateMark) -> tuple[NetUsage, tuple[EgressDenial, ...]]:
        """Usage and denials after `mark`, denials oldest first."""
        with self._lock:
            usage = NetUsage(
                self._connections - mark.usage.connections,
                self._bytes_out - mark.usage.bytes_out,
                self._bytes_in - mark.usage.bytes_in,
            )
            denials = tuple(
                EgressDenial(
                    e.host, e.port, e.reason, e.rule, e.count - mark.counts.get(e.ident, 0)
                )
                for e in self._denials.values()
                if e.last_seq > mark.seq
            )
        return usage, denials
