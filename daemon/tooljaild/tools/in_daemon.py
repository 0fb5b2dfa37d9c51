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
where it may have taken effect (an upload interrupted).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tooljail.errors import TooljailError

if TYPE_CHECKING:
    from tooljaild.artifacts.store import ArtifactStore
    from tooljaild.egress.package_cache import PackageCache
    from tooljaild.sessions.manager import SessionManager
    from tooljaild.sessions.session import Session
    from tooljaild.settings.config import Settings

__all__ = ["DaemonCall", "Handler", "Services", "ToolFailure"]


@dataclass(frozen=True)
class Services:
    """What the daemon lends its in-daemon tools."""

    settings: Settings
    artifacts: ArtifactStore | None = None
    sessions: SessionManager | None = None
    packages: PackageCache | None = None
    """The daemon's package cache (install_packages), when egress and a cache are on."""


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


class ToolFailure(TooljailError):
    """An in-daemon tool failed in a way its caller (a model) should read.

    Args:
        type_: The error's type in the result (e.g. "ArtifactGone", "StorageUnavailable").
        message: A sentence the model can act on.
        effect_unknown: It may have taken effect in part (else: it did nothing).
    """

    def __init__(self, type_: str, message: str, *, effect_unknown: bool = False) -> None:
        super().__init__(message)
        self.type = type_
        self.effect_unknown = effect_unknown


Handler = Callable[[DaemonCall], Awaitable[Any]]
"""An in-daemon tool's implementation."""
