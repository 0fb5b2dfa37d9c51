"""What a refused sandbox reads (a 403 it can act on) and what the operator's log says.

A refusal's body names the host, the port, the reason, the rule and what the
sandbox may reach instead, so a model can change course. It never holds a
secret's value: only names, rules and hosts the sandbox itself sent.

The log gets one line per denial, but at most one per (gate, host, reason) per
second (later ones are counted into the next line) and at most
`LINES_PER_SECOND` per gate: 10,000 refused connections do not write 10,000
lines.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

from tooljaild.egress.rules import Rule

SHOWN_RULES = 10
"""Rules a refusal lists of what the sandbox may reach."""

LINES_PER_SECOND = 20
"""Denial log lines one gate may write per second."""

_KEYS_KEPT = 4096

_WHY = {
    "not_allowed": "no egress rule allows it",
    "deny_rule": "a deny rule refuses it",
    "port_not_allowed": "the rule for this host allows other ports only",
    "ip_literal": "an IP address is reachable only when a rule names it; use the host name",
    "private_address": "it leads to a private, special or this host's own address",
    "resolve_failed": "the name does not resolve",
    "host_mismatch": "the Host header does not name the host the request goes to",
    "sni_mismatch": "the TLS server name does not match the CONNECT host",
    "secret_leak": "a secret's placeholder may be sent only to that secret's hosts",
    "connection_limit": "this sandbox has as many connections open as it may",
    "bad_request": "the request is not a proxy request this proxy serves",
    "no_egress": "this sandbox has no network (no egress rules were given to it)",
}


def may_reach(allow: Sequence[Rule]) -> str:
    """What a sandbox may reach, shortened to `SHOWN_RULES` rules."""
    if not allow:
        return "nothing"
    shown = ", ".join(rule.describe() for rule in allow[:SHOWN_RULES])
    more = len(allow) - SHOWN_RULES
    return f"{shown} and {more} more" if more > 0 else shown


def refusal_text(
    host: str, port: int, reason: str, rule: str, allow: Sequence[Rule], detail: str = ""
) -> str:
    """The body of a refusal: one line a person and a model can act on."""
    why = detail or _WHY.get(reason, reason)
    by = f" (rule {rule})" if rule and rule not in why else ""
    where = f"{host}:{port}" if host else "this connection"
    return (
        f"tooljail egress: refused {where} ({reason}): {why}{by}; "
        f"this sandbox may reach: {may_reach(allow)}\n"
    )


def response(status: int, phrase: str, text: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, with a text body."""
    body = text.encode("utf-8", "replace")
    return (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode("ascii") + body


class DenialLog:
    """Writes denial lines to `logger`, rate-limited (see the module docstring).

    Used from the egress loop only (not thread-safe).
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        # (label, host, reason) -> (second it last wrote, repeats since)
        self._last: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()
        # label -> (second, lines written in it, lines held back)
        self._per_gate: dict[str, tuple[int, int, int]] = {}

    def denied(self, label: str, host: str, port: int, reason: str, rule: str) -> None:
        now = time.monotonic()
        key = (label, host, reason)
        last = self._last.get(key)
        if last is not None and now - last[0] < 1.0:
            self._last[key] = (last[0], last[1] + 1)
            return
        second = int(now)
        at, lines, held = self._per_gate.get(label, (second, 0, 0))
        if at != second:
            at, lines = second, 0
        if lines >= LINES_PER_SECOND:
            self._per_gate[label] = (at, lines, held + 1)
            return
        repeats = last[1] if last is not None else 0
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > _KEYS_KEPT:
            self._last.popitem(last=False)
        self._per_gate[label] = (at, lines + 1, 0)
        self._log.warning(
            "egress: refused %s:%s for %s (%s)",
            host or "-",
            port,
            label,
            reason,
            extra={
                "sandbox": label,
                "host": host,
                "port": port,
                "reason": reason,
                "rule": rule,
                "repeats": repeats,
                "held_back": held,
            },
        )

    def forget(self, label: str) -> None:
        """Drop a closed gate's state."""
        self._per_gate.pop(label, None)
