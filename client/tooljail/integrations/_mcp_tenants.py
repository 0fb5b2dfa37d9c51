"""One MCP client as the daemon sees it through the HTTP bridge: a name, a session, its artifacts.

The HTTP bridge serves many MCP clients with one identity (the bridge's own:
its token, or its uid on a Unix socket). To keep them apart, each MCP session
is a tenant:

- its own client name, `<bridge name>/mcp-<random>`: where the daemon separates
  by client name (sessions, artifacts, fairness without tokens) it separates
  these; a random part, not the MCP session id, which would let anyone who
  reads the daemon's listings join that MCP session;
- its own tooljail session (`--stateful`);
- the artifacts it may reach: those its own calls made (named in their results,
  or listed by `list_artifacts` as of one of its calls or sessions). The bridge
  checks every `artifact_id` argument against them before a call, and filters
  `list_artifacts`, because the daemon's owner is the bridge's identity, of
  which a client name is only a label.

Each set is bounded (`MAX_REMEMBERED`, oldest forgotten first): a long-lived MCP
session cannot grow the bridge without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from tooljail._async_client import AsyncClient
from tooljail._async_session import AsyncSession
from tooljail._client_base import MAX_CLIENT_NAME
from tooljail.errors import TooljailError
from tooljail.integrations.core import Outcome, outcome_of

__all__ = [
    "ARTIFACT_ARG",
    "MAX_REMEMBERED",
    "Recent",
    "Tenant",
    "not_yours",
    "tenant_name",
]

ARTIFACT_ARG = "artifact_id"
"""The argument by which a tool names an artifact (read/tail/search_artifact, upload_file)."""

LIST_TOOL = "list_artifacts"

MAX_REMEMBERED = 10_000
"""Call, session and artifact ids a tenant remembers, each; the oldest are forgotten
first (an artifact that old is then unreachable through the bridge)."""

_SUFFIX = "/mcp-"


def tenant_name(bridge_name: str) -> str:
    """A new tenant's client name: the bridge's, `/mcp-`, 8 random hex digits."""
    suffix = _SUFFIX + secrets.token_hex(4)
    return bridge_name[: MAX_CLIENT_NAME - len(suffix)] + suffix


class Recent:
    """A set of at most `limit` strings; adding past it forgets the oldest."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, item: str) -> None:
        if not item:
            return
        self._items[item] = None
        self._items.move_to_end(item)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def update(self, items: Iterable[str]) -> None:
        for item in items:
            self.add(item)

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)


def not_yours(artifact_id: str) -> str:
    # The daemon's own words for an unknown id: whether another client's exists
    # is not told.
    return (
        f"No artifact {artifact_id[:80]!r} of yours is known to this daemon: check the id "
        "(call list_artifacts to see the artifacts your calls made). The tool did not run."
    )


class Tenant:
    """One MCP client's client, session and reachable ids.

    Args:
        client: Its client (its own name, or over stdio the bridge's).
        owned: The tenant closes `client` in `aclose`.
        guarded: Its artifact arguments are checked and `list_artifacts`
            filtered (the HTTP bridge); over stdio the one client is the bridge.
    """

    def __init__(self, client: AsyncClient, *, owned: bool, guarded: bool) -> None:
        self.client = client
        self.session: AsyncSession | None = None
        self._owned = owned
        self._guarded = guarded
        self.calls = Recent()
        self.sessions = Recent()
        self.artifacts = Recent()
        # Two first calls of one client at once must open one session, not two.
        self.opening = asyncio.Lock()

    @classmethod
    def new(cls, client_for: Callable[[str], AsyncClient], bridge_name: str) -> Tenant:
        """A guarded tenant with a client of its own, named after the bridge."""
        return cls(client_for(tenant_name(bridge_name)), owned=True, guarded=True)

    def refusal(self, tool: str, arguments: dict[str, Any] | None) -> str | None:
        """Why this tenant may not make this call (an id not its own), else None."""
        if not self._guarded or not arguments:
            return None
        artifact_id = arguments.get(ARTIFACT_ARG)
        if artifact_id is not None and str(artifact_id) not in self.artifacts:
            return not_yours(str(artifact_id))
        if tool == LIST_TOOL:
            for key, mine in (("call_id", self.calls), ("session_id", self.sessions)):
                value = arguments.get(key)
                if value and str(value) not in mine:
                    return (
                        f"No {key.removesuffix('_id')} {str(value)[:80]!r} of yours is known: "
                        "call list_artifacts without it to see the artifacts your calls made. "
                        "The tool did not run."
                    )
        return None

    def note(self, tool: str, call_id: str, outcome: Outcome) -> Outcome:
        """Records what a call made reachable; returns its outcome, a listing filtered."""
        self.calls.add(call_id)
        if self.session is not None:
            self.sessions.add(self.session.id)
        self.artifacts.update(a.artifact_id for a in outcome.artifacts)
        if self._guarded and tool == LIST_TOOL:
            return self._filtered(outcome)
        return outcome

    def _filtered(self, outcome: Outcome) -> Outcome:
        """`list_artifacts`'s answer with only this tenant's artifacts in it."""
        result = outcome.result
        if result is None or not isinstance(result.data, dict):
            return outcome
        listed = result.data.get("artifacts")
        if not isinstance(listed, list):
            return outcome
        kept = [
            a
            for a in listed
            if isinstance(a, dict)
            and (
                a.get("call_id") in self.calls
                or a.get("session_id") in self.sessions
                or a.get(ARTIFACT_ARG) in self.artifacts
            )
        ]
        # Made by a call of its own that was still running when its result came back.
        self.artifacts.update(str(a.get(ARTIFACT_ARG)) for a in kept)
        data: dict[str, Any] = {"artifacts": kept, "count": len(kept)}
        if int(result.data.get("count") or 0) > len(listed):
            data["note"] = (
                "Only the newest artifacts were looked at; pass call_id or session_id to "
                "list those of one call or session."
            )
        elif not kept:
            data["note"] = "No artifact of yours is kept (for this call or session if named)."
        return outcome_of(result.model_copy(update={"data": data}))

    async def open_session(self) -> AsyncSession | str:
        """This tenant's session, opened now if it has none; a string says why it cannot."""
        async with self.opening:
            if self.session is None:
                try:
                    self.session = await self.client.session()
                except TooljailError as e:
                    return f"A tooljail session could not be opened: {e}. The tool did not run."
                self.sessions.add(self.session.id)
            return self.session

    def forget(self, session: AsyncSession) -> None:
        """The daemon ended `session`: the next call opens a new one."""
        if self.session is session:
            self.session = None

    async def aclose(self) -> None:
        """Closes its session, then its client if it owns it."""
        session, self.session = self.session, None
        if session is not None:
            # The session may be gone already (ended by the daemon): nothing to close.
            with contextlib.suppress(TooljailError):
                await session.close()
        if self._owned:
            await self.client.close()
