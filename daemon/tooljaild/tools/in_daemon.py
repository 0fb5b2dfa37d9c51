"""Built-in tools that run in the daemon itself, not in a sandbox.

Some built-ins act on what only the daemon holds: the artifact store (the
artifact tools), credentials of an object store (`upload_file`). They run no
model-written code, so they need no sandbox: their `BuiltinRun` has kind
"daemon" and an `in_daemon` handler, which the call manager awaits (within the
call's timeout) with a `DaemonCall`: the call's checked arguments, who asks,
its session if any, and the daemon's `Services`.

A handler returns the result's data (a JSON value; a dict of the envelope's
shape is read as the result itself, as for user tools), or raises `ToolFailure`
for a failure the model should read (a result with status error, effect
applied: nothing was left half-done), or `ToolFailure(..., effect_unknown=True)`
where it may have taken effect (an upload interrupted), or
`ToolFailure(..., effect_none=True)` where it did nothing at all (a status
lookup of an unknown call).

`Services.calls` is how a tool learns of other calls (`call_status`): the call
manager, a floor above, fills it with its owner rule (`CallLookup`); tools
never import `calls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tooljail.errors import TooljailError
from tooljail.types import CallInfo
from tooljaild.auth.policy import Identity

if TYPE_CHECKING:
    from tooljaild.artifacts.store import ArtifactStore
    from tooljaild.egress.package_cache import PackageCache
    from tooljaild.sessions.manager import SessionManager
    from tooljaild.sessions.session import Session
    from tooljaild.settings.config import Settings

__all__ = ["CallLookup", "DaemonCall", "Handler", "Services", "ToolFailure"]


class CallLookup(Protocol):
    """What the daemon knows of one call, if the caller may see it (the owner rule
    of GetCall: `calls.history.CallHistory.visible`, then `.info`)."""

    def __call__(self, call_id: str, identity: Identity | None) -> CallInfo | None:
        """The call's `CallInfo`; None when no call of that id is known to the
        daemon, or `identity` may not see it (the two read the same)."""
        ...


@dataclass(frozen=True)
class Services:
    """What the daemon lends its in-daemon tools."""

    settings: Settings
    artifacts: ArtifactStore | None = None
    sessions: SessionManager | None = None
    packages: PackageCache | None = None
    """The daemon's package cache (install_packages), when egress and a cache are on."""
    calls: CallLookup | None = None
    """The daemon's calls as callers may see them (call_status); the call manager
    fills it. None: no calls are known (a tool run without a manager)."""


@dataclass(frozen=True)
class DaemonCall:
    """One call of an in-daemon tool."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    client: str
    """Who asks: the owner of the artifacts it may read."""
    session: Session | None
    """The session the call names, if any (its workspace, through its turn)."""
    services: Services
    identity: Identity | None = None
    """The authenticated caller (None: no authentication), for the owner rules."""


class ToolFailure(TooljailError):
    """An in-daemon tool failed in a way its caller (a model) should read.

    Args:
        type_: The error's type in the result (e.g. "ArtifactGone", "StorageUnavailable").
        message: A sentence the model can act on.
        effect_unknown: It may have taken effect in part (else: it did nothing).
        effect_none: It did nothing at all (the result's effect is none, not applied).
    """

    def __init__(
        self,
        type_: str,
        message: str,
        *,
        effect_unknown: bool = False,
        effect_none: bool = False,
    ) -> None:
        super().__init__(message)
        self.type = type_
        self.effect_unknown = effect_unknown
        self.effect_none = effect_none


Handler = Callable[[DaemonCall], Awaitable[Any]]
"""An in-daemon tool's implementation."""
