"""A draining daemon stops listening only once its clients have heard that it drains.

While a daemon drains (SIGTERM) it refuses new calls and sessions with
`ShuttingDownError` (UNAVAILABLE, never run: a client sends them elsewhere), and
health says NOT_SERVING. A client routing over many daemons learns it from
either. But the moment the server stops listening, an RPC that has arrived and
is not yet handed to a handler is answered CANCELLED by gRPC, not UNAVAILABLE
(grpc/grpc#41785): its client cannot tell whether it ran. A client that still
sends new work is one that has not heard yet; so the daemon keeps refusing
until no new work was refused for a quiet moment (bounded by the shutdown
grace), and only then stops listening. A daemon nobody sends to stops at once.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["LINGER_MAX_S", "QUIET_S", "Refusals"]

QUIET_S = 1.0
"""How long no new work must be refused before the daemon stops listening:
longer than a busy client takes between two calls, so each has heard."""

LINGER_MAX_S = 5.0
"""The longest a drained daemon listens on for that (within its shutdown grace):
a client that keeps sending to a daemon that refuses it does not hold its stop."""


class Refusals:
    """When new work was last refused because the daemon drains."""

    def __init__(self) -> None:
        self._last: float | None = None

    def note(self) -> None:
        """A call or session was just refused: the daemon drains."""
        self._last = time.monotonic()

    async def quiet(self, limit_s: float, quiet_s: float = QUIET_S) -> None:
        """Return once `quiet_s` passed without a refusal (at once when there was
        none for that long, or never one), or after `limit_s` at most."""
        deadline = time.monotonic() + max(0.0, limit_s)
        while self._last is not None:
            now = time.monotonic()
            wait = min(self._last + quiet_s, deadline) - now
            if wait <= 0:
                return
            await asyncio.sleep(wait)
