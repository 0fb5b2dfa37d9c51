"""How the `call_status` tool (`tooljaild.tools.builtin.call_status`) learns of a call:
the owner rule of GetCall (`CallHistory.visible`, approvers too), then all that is
known of the call (`CallHistory.info`), lent to in-daemon tools as `Services.calls`.
"""

from __future__ import annotations

from tooljail.errors import CallNotFoundError
from tooljail.types import CallInfo
from tooljaild.auth.policy import Identity
from tooljaild.calls.history import CallHistory
from tooljaild.tools.in_daemon import CallLookup

__all__ = ["lookup_in"]


def lookup_in(history: CallHistory) -> CallLookup:
    """A `CallLookup` over `history`: what GetCall would answer `identity`, or None
    where GetCall answers NOT_FOUND (an unknown id, or another's call)."""

    def lookup(call_id: str, identity: Identity | None) -> CallInfo | None:
        try:
            call = history.visible(call_id, identity, approvers_too=True)
        except CallNotFoundError:
            return None
        return history.info(call)

    return lookup
