"""One session as the daemon holds it: its terms, its sandbox, its turn, its end.

A session is a sandbox kept for a sequence of calls: a live interpreter and a
workspace (`sandbox.session_channel.SessionSandbox`). Its calls take turns
(`turn`): one runs, the others wait in order, at most `max_queued_calls` of
them. What a session may hold is its `SessionTerms`: the daemon's bounds
(`[sessions]`, `[limits]`), lowered where its creator asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tooljail.errors import InvalidRequestError, OverloadedError, SessionEndedError
from tooljail.types import SessionInfo, SessionState
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.egress.gate import EgressGate
from tooljaild.egress.policy import NO_EGRESS, EgressPolicy
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.sessions.process_output import RingBudget
from tooljaild.sessions.processes import ProcessTable
from tooljaild.settings.sandbox import Limits
from tooljaild.settings.sessions import SessionSettings

__all__ = [
    "END_MESSAGES",
    "Session",
    "SessionOptions",
    "SessionTerms",
    "ended_error",
]

END_MESSAGES = {
    "closed": "it was closed",
    "idle_ttl": "it had no call for its idle TTL and was closed",
    "max_lifetime": "it reached its maximum lifetime and was closed",
    "sandbox_died": "its sandbox ended (its processes were killed or it could not be restarted)",
    "shutdown": "the daemon shut down",
    "daemon_restart": "the daemon was restarted (or killed) while it was open",
}
"""Each end reason, as the end of the sentence "session S has ended: ..."."""


def ended_error(session_id: str, reason: str) -> SessionEndedError:
    """The error for a request naming a session that has ended."""
    why = END_MESSAGES.get(reason, reason or "it ended")
    return SessionEndedError(
        f"session {session_id!r} has ended: {why}. Its state is gone (its interpreter's "
        "variables and its workspace files); nothing ran. Create a new session and "
        "rebuild what you need in it.",
        reason=reason,
    )


@dataclass(frozen=True)
class SessionOptions:
    """What a session's creator asked for; 0 (or False) takes the daemon's bound."""

    idle_ttl_s: float = 0.0
    max_lifetime_s: float = 0.0
    memory_bytes: int = 0
    pids: int = 0
    cpus: float = 0.0
    workspace_bytes: int = 0
    keep_processes: bool = False


@dataclass(frozen=True)
class SessionTerms:
    """What a session may hold: its options within the daemon's bounds."""

    idle_ttl_s: float
    max_lifetime_s: float
    limits: Limits
    """The daemon's limits with the session's sandbox-wide ones lowered."""
    keep_processes: bool

    @classmethod
    def resolve(
        cls, options: SessionOptions, settings: SessionSettings, limits: Limits
    ) -> SessionTerms:
        """The terms for `options` on a daemon with these bounds.

        Raises:
            InvalidRequestError: An option is negative, or above the daemon's bound.
        """
        idle = _lower("idle_ttl_s", options.idle_ttl_s, settings.idle_ttl_s)
        lifetime = _lower("max_lifetime_s", options.max_lifetime_s, settings.max_lifetime_s)
        lowered = {
            "sandbox_memory_bytes": _lower(
                "memory_bytes", options.memory_bytes, limits.sandbox_memory_bytes
            ),
            "sandbox_pids": _lower("pids", options.pids, limits.sandbox_pids),
            "cpus": _lower("cpus", options.cpus, limits.cpus),
            "workspace_bytes": _lower(
                "workspace_bytes", options.workspace_bytes, limits.workspace_bytes
            ),
        }
        if lowered["workspace_bytes"] < 1024**2:
            raise InvalidRequestError(
                f"workspace_bytes {options.workspace_bytes} is below the smallest workspace (1 MiB)"
            )
        if lowered["sandbox_pids"] and lowered["sandbox_pids"] < 8:
            raise InvalidRequestError(
                f"pids {options.pids} leaves no room for the session's own processes: "
                "ask for 8 or more"
            )
        return cls(
            idle_ttl_s=float(idle),
            max_lifetime_s=float(lifetime),
            limits=limits.model_copy(update=lowered),
            keep_processes=options.keep_processes,
        )


def _lower(name: str, asked: float, bound: float) -> float:
    """`asked` if it is within `bound` (0: no bound), else an error; 0 asks for the bound."""
    if asked != asked or asked < 0:  # NaN too
        raise InvalidRequestError(f"{name} must be 0 (the daemon's bound) or positive")
    if not asked:
        return bound
    if bound and asked > bound:
        raise InvalidRequestError(
            f"{name} {asked:g} is above this daemon's bound of {bound:g}: a session may "
            "only lower its bounds (ask for less, or 0 for the bound)"
        )
    return asked


class Session:
    """A session: its id, who opened it, its terms, its sandbox and its calls.

    Args:
        session_id: Unguessable; whoever knows it may use the session.
        client: Who opened it (the bounds per client count it there).
        terms: What it may hold.
        channel: Its sandbox, opened as a session.
        settings: The daemon's session settings (queue bound, processes).
        artifacts: Where its processes' output goes past their rings (None: nowhere).
        budget: The daemon's bound on every process output ring (None: none).
    """

    def __init__(
        self,
        session_id: str,
        client: str,
        terms: SessionTerms,
        channel: SessionSandbox,
        settings: SessionSettings,
        artifacts: ArtifactStore | None = None,
        budget: RingBudget | None = None,
    ) -> None:
        self.id = session_id
        self.client = client
        self.terms = terms
        self.channel = channel
        self.created = time.monotonic()
        self.created_unix = time.time()
        self.last_used = self.created
        self.calls = 0
        self.end_reason = ""
        """Why it ended; "" while it is open."""
        self._settings = settings
        self._line: deque[asyncio.Future[None]] = deque()
        """Those waiting for the turn, first first."""
        self._busy = False
        """Someone holds the turn."""
        self.egress_rules: tuple[str, ...] = ()
        """Its egress rules as asked (at creation, then `SetSessionEgress`)."""
        self.egress_policy: EgressPolicy = NO_EGRESS
        """What it may reach now; its secrets' placeholders are in its environment."""
        self.egress_gate: EgressGate | None = None
        """Its gate at the egress proxy, from the first time it had egress to its end."""
        self.egress_dir: Path | None = None
        """Its sandbox's egress directory (None: the daemon has no `[egress]`)."""
        self.processes = ProcessTable(
            session_id,
            client,
            channel.spawn,  # type: ignore[arg-type]  # a SandboxProcess is SandboxProcessLike
            channel.stats,
            max_processes=settings.max_processes,
            ring_bytes=settings.process_output_ring_bytes,
            artifacts=artifacts,
            budget=budget,
        )
        """Its background processes (`sessions.processes`), which end with it."""

    @property
    def open(self) -> bool:
        return not self.end_reason

    @property
    def busy(self) -> bool:
        """A call or an operation holds its turn, or waits for one."""
        return self._busy or bool(self._line)

    @property
    def resets(self) -> int:
        return self.channel.resets

    def touch(self) -> None:
        """Count as a use for its idle TTL: its background processes' RPCs and tools
        take no turn, yet a client reading a server's log is using the session."""
        self.last_used = time.monotonic()

    def options_json(self) -> str:
        """Its terms, for the journal."""
        terms = asdict(self.terms)
        terms["limits"] = self.terms.limits.model_dump()
        return json.dumps(terms, sort_keys=True)

    def check_open(self) -> None:
        """Raises SessionEndedError when the session has ended."""
        if self.end_reason:
            raise ended_error(self.id, self.end_reason)

    def check_room(self) -> None:
        """Raises OverloadedError when its queue of calls is full."""
        if len(self._line) >= self._settings.max_queued_calls:
            raise OverloadedError(
                f"session {self.id!r} already has {len(self._line)} calls waiting for their "
                f"turn (at most {self._settings.max_queued_calls}): its calls run one at a "
                "time; wait for one to end",
                retry_after_s=1.0,
            )

    def try_take_turn(self) -> bool:
        """Take the session's turn now if nobody holds it or waits for it."""
        if self._busy or self._line or self.end_reason:
            return False
        self._busy = True
        return True

    async def take_turn(self) -> None:
        """Wait for the session's turn: calls and file operations run one at a time,
        in the order they asked. Cancelling the wait gives up the place in line.
        Give the turn back with `give_turn`.

        Raises:
            SessionEndedError: The session ended before the turn came (the turn
                is not held then).
        """
        if not self.try_take_turn():
            self.check_open()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._line.append(waiter)
            try:
                await waiter  # resolved by `give_turn`: the turn is ours then
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self.give_turn()  # handed over as we were cancelled: pass it on
                else:
                    with contextlib.suppress(ValueError):
                        self._line.remove(waiter)
                raise
        if self.end_reason:
            self.give_turn()
            raise ended_error(self.id, self.end_reason)

    def give_turn(self) -> None:
        """Let the next call or operation in line run (the turn passes to it)."""
        self.last_used = time.monotonic()
        while self._line:
            waiter = self._line.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy = False

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """`take_turn` ... `give_turn`, as a context manager."""
        await self.take_turn()
        try:
            yield
        finally:
            self.give_turn()

    def info(self) -> SessionInfo:
        limits = self.terms.limits
        return SessionInfo(
            session_id=self.id,
            state=SessionState.OPEN if self.open else SessionState.CLOSED,
            end_reason=self.end_reason,
            sandbox_id=self.channel.id,
            created_unix=self.created_unix,
            last_used_unix=self.created_unix + (self.last_used - self.created),
            idle_ttl_s=self.terms.idle_ttl_s,
            max_lifetime_s=self.terms.max_lifetime_s,
            memory_bytes=limits.sandbox_memory_bytes,
            pids=limits.sandbox_pids,
            cpus=limits.cpus,
            workspace_bytes=limits.workspace_bytes,
            keep_processes=self.terms.keep_processes,
            calls=self.calls,
            queued=len(self._line),
            resets=self.resets,
            egress=self.egress_rules,
            secrets=tuple(s.name for s in self.egress_policy.secrets),
        )
