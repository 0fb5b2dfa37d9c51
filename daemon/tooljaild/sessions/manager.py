"""The session manager: opens, finds, lists, expires and closes sessions.

It knows nothing of gRPC, and runs no call itself (`calls.in_session` does,
in the session's turn). What it guarantees:

- bounds: at most `max_sessions` open at once, `max_sessions_per_client` per
  client; past either, `OverloadedError` (RESOURCE_EXHAUSTED) with a hint of
  when an idle session will expire;
- ends: a session ends once, for one reason (closed, idle TTL, lifetime, its
  sandbox died, shutdown); its sandbox is destroyed with everything in it;
  calls waiting for its turn end without running;
- memory of ends: a request naming an ended session learns why
  (`SessionEndedError`), from memory for the last `remembered_ended`, from the
  journal after that and after a restart (sessions open when the daemon died
  are marked "daemon_restart" at start), and "not found" only for an id never
  seen.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import tempfile
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from tooljail.errors import (
    InternalError,
    InvalidPathError,
    InvalidRequestError,
    OverloadedError,
    SessionEndedError,
    SessionNotFoundError,
    ShuttingDownError,
    TooljailError,
    WorkspaceFileNotFoundError,
    WorkspaceFullError,
)
from tooljail.types import SessionInfo, SessionState
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.auth.policy import Identity
from tooljaild.egress.service import EgressService
from tooljaild.journal.store import Journal, JournalError
from tooljaild.sandbox.base import RunRequest, Sandbox, SandboxError, Termination
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.sessions import egress as session_egress
from tooljaild.sessions.process_output import RingBudget
from tooljaild.sessions.session import Session, SessionOptions, SessionTerms, ended_error
from tooljaild.sessions.transfers import Spool, Transfers
from tooljaild.settings.sandbox import Limits
from tooljaild.settings.sessions import SessionSettings

__all__ = ["FILE_CHUNK_BYTES", "SessionManager"]

log = logging.getLogger(__name__)

FILE_CHUNK_BYTES = 1024 * 1024
"""Bytes of a file moved into or out of a sandbox per operation (and per streamed chunk)."""
OPERATION_TIMEOUT_S = 60.0
"""How long one file operation may take in the sandbox before the session is given up."""
_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_FILE_ERRORS: dict[str, type[TooljailError]] = {
    "InvalidPathError": InvalidPathError,
    "FileNotFoundError": WorkspaceFileNotFoundError,
    "WorkspaceFullError": WorkspaceFullError,
}
"""The sandbox's error types of file operations the files RPCs answer with their own code."""


def _drop(stream: Any, data: bytes) -> None:
    """The sink of a file operation: it prints nothing anyone reads."""


class SessionManager:
    """The daemon's sessions.

    Args:
        settings: `[sessions]`.
        limits: The daemon's `[limits]`, which a session may lower.
        sandbox_for: A started, unused sandbox with these limits (from the warm pool
            when they are the pool's).
        journal: Where sessions are recorded; None: nowhere (tests).
        spool_dir: Where uploads wait on disk (private to the daemon); None: a
            fresh private directory under the system's temporary one.
        egress: The daemon's egress (`[egress]`); None: sessions have no network,
            and asking for egress or secrets is refused.
        artifacts: Where the output of sessions' background processes goes past
            their rings (owned by each session's client); None: it is dropped.
    """

    def __init__(
        self,
        settings: SessionSettings,
        limits: Limits,
        sandbox_for: Callable[[Limits], Awaitable[Sandbox]],
        journal: Journal | None = None,
        *,
        open_timeout_s: float = 30.0,
        spool_dir: Path | None = None,
        egress: EgressService | None = None,
        artifacts: ArtifactStore | None = None,
    ) -> None:
        self.egress = egress
        self.artifacts = artifacts
        self._settings = settings
        self.ring_budget = RingBudget(settings.process_output_memory_bytes)
        """Every session's process output rings together (`process_output_memory_bytes`)."""
        self._limits = limits
        self._sandbox_for = sandbox_for
        self._journal = journal
        self._open_timeout_s = open_timeout_s
        self._sessions: dict[str, Session] = {}
        self._ended: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Recently ended sessions: their reason and their client (its owner)."""
        self._opening: defaultdict[str, int] = defaultdict(int)
        self._closing: set[asyncio.Task[None]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self.draining = False
        if spool_dir is None:
            spool_dir = Path(tempfile.mkdtemp(prefix="tooljail-spool-"))
        self.transfers = Transfers(settings, spool_dir)
        """The files API's places and spool (`sessions.transfers`)."""

    @property
    def settings(self) -> SessionSettings:
        return self._settings

    def __len__(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------------ life

    def start(self, recovered: bool = True) -> None:
        """Watch sessions for their idle TTL and lifetime; and, once, mark the sessions
        the journal holds as open ended: the daemon that held them is gone."""
        if self._journal is not None and recovered:
            try:
                lost = self._journal.recover_sessions("daemon_restart")
            except JournalError as exc:
                log.error("cannot mark the sessions of the last run ended: %s", exc)
            else:
                if lost:
                    log.warning(
                        "sessions lost in a restart",
                        extra={"sessions": len(lost), "ids": [r.session_id for r in lost][:20]},
                    )
        self.transfers.start()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap(), name="session-reaper")

    async def stop(self) -> None:
        """End every session (reason "shutdown") and stop watching."""
        self.draining = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await asyncio.gather(*(self.end(s, "shutdown") for s in list(self._sessions.values())))
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=15.0)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(self._reap_every_s())
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if now - session.created >= session.terms.max_lifetime_s:
                    self._end_soon(session, "max_lifetime")
                elif not session.busy and now - session.last_used >= session.terms.idle_ttl_s:
                    self._end_soon(session, "idle_ttl")

    def _reap_every_s(self) -> float:
        shortest = min(
            (min(s.terms.idle_ttl_s, s.terms.max_lifetime_s) for s in self._sessions.values()),
            default=self._settings.idle_ttl_s,
        )
        return min(1.0, max(0.05, shortest / 10))

    # ------------------------------------------------------------------ open

    async def create(
        self,
        options: SessionOptions,
        client: str,
        max_sessions: int | None = None,
        *,
        identity: Identity | None = None,
        egress: Sequence[str] = (),
        secrets: Sequence[str] = (),
    ) -> Session:
        """Open a session for `client`, who may hold `max_sessions` at most (None:
        `max_sessions_per_client`; an identity's own bound replaces it).

        With `egress` (rules) and `secrets` (names), within what `identity` may
        reach and use (None: the daemon's `[egress]` ceiling): the session's
        sandbox gets the egress environment (its secrets' placeholders among
        it) at its interpreter's start, and a gate at the proxy for its life.

        Raises:
            EgressUnavailableError: Egress or secrets asked of a daemon without `[egress]`.
            EgressNotAllowed: They ask for more than the identity may (PERMISSION_DENIED).
            ShuttingDownError: The daemon is draining.
            InvalidRequestError: Sessions are disabled, or an option is out of bounds.
            OverloadedError: The daemon (or this client's share) holds all the
                sessions it may.
            SandboxError: No sandbox could be started or opened as a session.
            JournalError: The session cannot be recorded (its sandbox is closed).
        """
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down and opens no sessions")
        s = self._settings
        if not s.max_sessions:
            raise InvalidRequestError(
                "sessions are disabled on this daemon ([sessions] max_sessions = 0)"
            )
        terms = SessionTerms.resolve(options, s, self._limits)
        session_id = uuid.uuid4().hex
        policy = session_egress.policy_for(self.egress, identity, egress, secrets, session_id)
        self._check_room(client, max_sessions)
        self._opening[client] += 1
        try:
            sandbox = await self._sandbox_for(terms.limits)
            channel = await SessionSandbox.open(
                sandbox,  # type: ignore[arg-type]  # every backend's sandbox is a RunnerSandbox
                keep_processes=terms.keep_processes,
                quota_bytes=terms.limits.workspace_bytes,
                limits=terms.limits,
                timeout_s=self._open_timeout_s,
                idle_output_bytes_per_s=s.idle_output_bytes_per_s,
                # With [egress], every session's interpreter has the proxy's
                # variables (and its relay): SetSessionEgress may give it network
                # later. Without a gate, the relay's connections find no proxy.
                env=None if self.egress is None else self.egress.env(policy),
            )
        finally:
            self._opening[client] -= 1
            if not self._opening[client]:
                del self._opening[client]
        session = Session(session_id, client, terms, channel, s, self.artifacts, self.ring_budget)
        session.egress_rules, session.egress_policy = tuple(egress), policy
        session.egress_dir = sandbox.egress_dir
        if not policy.empty:
            try:
                session_egress.open_gate(self.egress, session)
            except BaseException:
                await channel.close()
                raise
        if self._journal is not None:
            try:
                self._journal.session_opened(
                    session.id,
                    client=client,
                    sandbox_id=channel.id,
                    options_json=session.options_json(),
                    created=session.created_unix,
                )
            except JournalError:
                await channel.close()
                raise
        self._sessions[session.id] = session
        channel.ended.add_done_callback(lambda _: self._end_soon(session, "sandbox_died"))
        log.info(
            "session opened",
            extra={"session": session.id, "client": client, "sandbox": channel.id},
        )
        return session

    def set_egress(
        self,
        session_id: str,
        rules: Sequence[str],
        *,
        identity: Identity | None,
        client: str | None,
    ) -> SessionInfo:
        """Replace the egress rules of an open session of `client`'s (None: anyone's),
        for new connections at once (`sessions.egress.set_egress`).

        Raises:
            EgressUnavailableError, InvalidRequestError, EgressNotAllowed: As
                `sessions.egress.set_egress`.
            SessionNotFoundError, SessionEndedError: As `get`.
        """
        session = self.get(session_id, client)
        session_egress.set_egress(self.egress, session, rules, identity)
        return session.info()

    def _check_room(self, client: str, limit: int | None = None) -> None:
        s = self._settings
        per_client = s.max_sessions_per_client if limit is None else limit
        held = sum(1 for x in self._sessions.values() if x.client == client)
        held += self._opening.get(client, 0)
        if len(self._sessions) + sum(self._opening.values()) >= s.max_sessions:
            raise OverloadedError(
                f"this daemon holds all the sessions it may ({s.max_sessions}): close one "
                "you no longer need, or try again when an idle one expires",
                retry_after_s=self._retry_after_s(),
            )
        if held >= per_client:
            raise OverloadedError(
                f"this client holds all the sessions one client may ({per_client}"
                "): close one you no longer need first",
                retry_after_s=self._retry_after_s(client),
            )

    def _retry_after_s(self, client: str | None = None) -> float:
        """When an idle session (of `client`, if given) will expire, within [1, 60] s."""
        now = time.monotonic()
        soonest = min(
            (
                min(
                    s.last_used + s.terms.idle_ttl_s - now,
                    s.created + s.terms.max_lifetime_s - now,
                )
                for s in self._sessions.values()
                if (client is None or s.client == client) and not s.busy
            ),
            default=60.0,
        )
        return round(min(60.0, max(1.0, soonest)), 1)

    # ------------------------------------------------------------------ find

    def get(self, session_id: str, client: str | None = None) -> Session:
        """The open session with that id; with `client`, only if it is that client's.

        Another client's session, open or ended, reads exactly as an id never
        known: the answer says nothing of whether it exists.

        Raises:
            InvalidRequestError: The id is malformed.
            SessionEndedError: The session (`client`'s, if given) has ended (why: its `reason`).
            SessionNotFoundError: No session of that id (of `client`'s) was ever known here.
        """
        session = self._sessions.get(session_id)
        if session is not None and (client is None or session.client == client):
            session.check_open()
            return session
        if session is not None:
            raise _unknown(session_id)
        raise self._gone(session_id, client)

    def _gone(self, session_id: str, client: str | None) -> TooljailError:
        """Why there is no open session `session_id` (of `client`'s, unless None)."""
        if not _SESSION_ID.fullmatch(session_id):
            return InvalidRequestError(
                f"session id {session_id[:140]!r} is malformed: 1 to 128 of A-Z a-z 0-9 . _ : -"
            )
        reason, owner = self._ended.get(session_id, (None, None))
        if reason is None and self._journal is not None:
            try:
                record = self._journal.get_session(session_id)
            except JournalError as exc:
                log.error("cannot read session %s from the journal: %s", session_id, exc)
                record = None
            if record is not None:
                reason, owner = record.end_reason or "daemon_restart", record.client
        if reason is not None and (client is None or owner == client):
            return ended_error(session_id, reason)
        return _unknown(session_id)

    def list(self, client: str | None = None) -> list[SessionInfo]:
        """The open sessions, oldest first; of `client` only, unless None."""
        return [s.info() for s in self._sessions.values() if client is None or s.client == client]

    # ------------------------------------------------------------------ end

    async def close(self, session_id: str, client: str | None = None) -> SessionInfo:
        """Close a session at its client's request; an ended one answers its end.
        With `client`, only that client's (another's reads as never known, see `get`).

        Raises:
            InvalidRequestError: The id is malformed.
            SessionNotFoundError: No session of that id (of `client`'s) was ever known here.
        """
        session = self._sessions.get(session_id)
        if session is not None and client is not None and session.client != client:
            raise _unknown(session_id)
        if session is None:
            error = self._gone(session_id, client)
            if isinstance(error, SessionEndedError):
                return SessionInfo(
                    session_id=session_id, state=SessionState.CLOSED, end_reason=error.reason
                )
            raise error
        await self.end(session, "closed")
        return session.info()

    def _end_soon(self, session: Session, reason: str) -> None:
        if not session.open:
            return
        task = asyncio.ensure_future(self.end(session, reason))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def end(self, session: Session, reason: str) -> None:
        """End `session` for `reason` (once; later reasons are ignored): its sandbox
        and everything in it are destroyed; a running call ends with it."""
        if not session.open:
            return
        session.end_reason = reason
        self._sessions.pop(session.id, None)
        self._ended[session.id] = (reason, session.client)
        while len(self._ended) > self._settings.remembered_ended:
            self._ended.popitem(last=False)
        if self._journal is not None:
            try:
                self._journal.session_ended(session.id, reason)
            except JournalError as exc:
                log.error("cannot journal the end of session %s: %s", session.id, exc)
        log.info(
            "session ended",
            extra={
                "session": session.id,
                "reason": reason,
                "calls": session.calls,
                "resets": session.resets,
            },
        )
        if session.egress_gate is not None:
            session.egress_gate.close()
        await session.channel.close()
        # Its sandbox is gone, and every process in it: mark them killed, keep
        # their spilled output (the close does not wait on a sandbox that hangs).
        await session.processes.end_all(reason)

    # ------------------------------------------------------------------ files

    async def operation(
        self, session: Session, op: str, args: dict[str, Any], *, turn_held: bool = False
    ) -> Any:
        """Run one workspace operation in the session's sandbox, in its turn (taken
        here, unless the caller holds it: `turn_held`).

        Raises:
            SessionEndedError: The session ended before or during it.
            InvalidPathError, WorkspaceFileNotFoundError, WorkspaceFullError: As
                the sandbox found.
            InvalidRequestError: Another refusal of the sandbox's (its message says).
            InternalError: The sandbox did not answer; the session is given up.
        """
        limits = session.terms.limits
        request = RunRequest(
            "workspace",
            {"op": op, "args": args, "quota_bytes": limits.workspace_bytes},
            limits,
        )
        async with contextlib.nullcontext() if turn_held else session.turn():
            try:
                waiter = session.channel.begin(request, _drop)
            except SandboxError as exc:
                raise ended_error(session.id, session.end_reason or "sandbox_died") from exc
            try:
                end = await asyncio.wait_for(waiter, OPERATION_TIMEOUT_S)
            except TimeoutError:
                await self.end(session, "sandbox_died")
                raise InternalError(
                    f"the workspace operation {op!r} got no answer from session "
                    f"{session.id!r} within {OPERATION_TIMEOUT_S:g}s; the session was "
                    "given up"
                ) from None
        outcome = end.outcome
        if outcome.termination is Termination.RETURNED:
            return outcome.value
        if not session.open or outcome.termination in (
            Termination.RUNNER_LOST,
            Termination.KILLED,
        ):
            raise ended_error(session.id, session.end_reason or "sandbox_died")
        error = outcome.error
        kind = error.type if error is not None else ""
        message = error.message if error is not None else f"the operation {op!r} failed"
        raise _FILE_ERRORS.get(kind, InvalidRequestError)(message)

    async def upload(self, session: Session, path: str, spool: Spool) -> tuple[str, int]:
        """Write the file `spool` holds (all of an upload's bytes, already on disk)
        into the session's workspace, replacing it as a whole at the end: nothing
        is left half-written. Each piece takes the session's turn on its own.

        Returns:
            The path as the workspace names it, and its size.
        """
        upload_id = uuid.uuid4().hex
        done: dict[str, Any] = {}
        try:
            # The whole upload in one turn: each piece is read from the spool only
            # once it can go, so an upload waiting for the turn holds no memory.
            async with session.turn():
                offset = 0
                while True:
                    piece = await spool.read(offset, FILE_CHUNK_BYTES)
                    first, offset = offset == 0, offset + len(piece)
                    last = offset >= spool.size or not piece
                    done = await self._put(session, path, upload_id, piece, first=first, last=last)
                    if last:
                        break
        except BaseException:
            if session.open:
                with contextlib.suppress(TooljailError, asyncio.CancelledError):
                    await asyncio.shield(
                        self.operation(
                            session, "upload_abort", {"upload_id": upload_id, "path": path}
                        )
                    )
            raise
        return str(done.get("path", path)), int(done.get("size_bytes", 0))

    async def _put(
        self, session: Session, path: str, upload_id: str, data: bytes, *, first: bool, last: bool
    ) -> dict[str, Any]:
        args = {
            "path": path,
            "upload_id": upload_id,
            "data_b64": base64.b64encode(data).decode(),
            "first": first,
            "last": last,
        }
        value = await self.operation(session, "upload_chunk", args, turn_held=True)
        return value if isinstance(value, dict) else {}

    async def download(self, session: Session, path: str) -> Any:
        """The file's bytes, in chunks of `FILE_CHUNK_BYTES` (an async iterator)."""
        offset = 0
        while True:
            value = await self.operation(
                session,
                "download_chunk",
                {"path": path, "offset": offset, "length": FILE_CHUNK_BYTES},
            )
            if not isinstance(value, dict) or not isinstance(value.get("data_b64"), str):
                raise InternalError(f"the sandbox answered a download of {path!r} malformed")
            data = base64.b64decode(value["data_b64"])
            offset += len(data)
            yield data
            if value.get("eof") or not data:
                return


def _unknown(session_id: str) -> SessionNotFoundError:
    """The one answer for an id of no session the caller may see (never known,
    forgotten, or another client's)."""
    return SessionNotFoundError(
        f"no session {session_id!r} is known to this daemon (was it opened on another "
        "daemon?). Create one with CreateSession."
    )
