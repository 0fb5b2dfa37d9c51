"""The journal's sessions table: a session recorded as open before its id is
given out, and why it ended, so that a call naming one that died with the
daemon learns why (decision 43). A part of `tooljaild.journal.store.Journal`,
over its connection."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from typing import TYPE_CHECKING

from tooljaild.journal.rows import SessionRecord

__all__ = ["SessionLog"]

_SESSION_OPENED = """
    INSERT INTO sessions (session_id, client, created, sandbox_id, options)
    VALUES (?, ?, ?, ?, ?)
"""
_SESSION_ENDED = """
    UPDATE sessions SET ended = ?, end_reason = ? WHERE session_id = ? AND ended IS NULL
"""
_SESSION_COLUMNS = "session_id, client, created, ended, end_reason, sandbox_id, options"
_GET_SESSION = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE session_id = ?"
_OPEN_SESSIONS = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE ended IS NULL ORDER BY created"
_PRUNE_SESSIONS = "DELETE FROM sessions WHERE ended IS NOT NULL AND ended < ?"
_COUNT_ENDED_SESSIONS = "SELECT count(*) FROM sessions WHERE ended IS NOT NULL"
_PRUNE_OLDEST_SESSIONS = """
    DELETE FROM sessions WHERE rowid IN (
        SELECT rowid FROM sessions WHERE ended IS NOT NULL ORDER BY ended, rowid LIMIT ?
    )
"""


class SessionLog:
    """The sessions part of `Journal` (its connection, bound and error handling)."""

    _db: sqlite3.Connection
    max_session_rows: int
    _sessions_ended_since_prune: int = 0

    if TYPE_CHECKING:

        def _errors(
            self, doing: str, *, write: bool = True
        ) -> contextlib.AbstractContextManager[None]: ...

    def session_opened(
        self,
        session_id: str,
        *,
        client: str,
        sandbox_id: str,
        options_json: str,
        created: float | None = None,
    ) -> None:
        """Record a session as open, before its id is given to anyone.

        Raises:
            JournalError: The write failed (the session must not be handed out).
        """
        when = time.time() if created is None else created
        with self._errors("recording a session"), self._db:
            self._db.execute(_SESSION_OPENED, (session_id, client, when, sandbox_id, options_json))

    def session_ended(self, session_id: str, reason: str, ended: float | None = None) -> None:
        """Record why a session ended (once: a later call changes nothing).

        Raises:
            JournalError: The write failed.
        """
        when = time.time() if ended is None else ended
        with self._errors("recording a session's end"), self._db:
            self._db.execute(_SESSION_ENDED, (when, reason, session_id))
            # Sessions end without any call finishing (create, close, again): their
            # rows are bounded here too, not only when `prune` runs after calls.
            # Every tenth of the bound: each time about as many rows go as came.
            self._sessions_ended_since_prune += 1
            if self._sessions_ended_since_prune >= max(1, self.max_session_rows // 10):
                self._sessions_ended_since_prune = 0
                self._prune_oldest_sessions()

    def _prune_sessions(self, cutoff: float) -> None:
        """Delete the ended sessions past the age `cutoff`, then the oldest past
        `max_session_rows` (in the caller's transaction)."""
        self._db.execute(_PRUNE_SESSIONS, (cutoff,))
        self._prune_oldest_sessions()

    def _prune_oldest_sessions(self) -> None:
        """Delete the oldest ended sessions past `max_session_rows` (in a transaction)."""
        (ended,) = self._db.execute(_COUNT_ENDED_SESSIONS).fetchone()
        excess = ended - self.max_session_rows
        if excess > 0:
            self._db.execute(_PRUNE_OLDEST_SESSIONS, (excess,))

    def get_session(self, session_id: str) -> SessionRecord | None:
        """The session with that id, if the journal still holds it.

        Raises:
            JournalError: The read failed.
        """
        with self._errors("reading a session", write=False):
            row = self._db.execute(_GET_SESSION, (session_id,)).fetchone()
        return None if row is None else SessionRecord(*row)

    def recover_sessions(self, reason: str, now: float | None = None) -> list[SessionRecord]:
        """Mark every session still open as ended for `reason`: the daemon that held
        it died, and its sandbox with it. Call it once after `open`.

        Returns:
            The sessions so ended, oldest first, as they were.

        Raises:
            JournalError: The write failed; nothing was marked.
        """
        when = time.time() if now is None else now
        with self._errors("marking open sessions ended"), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = [SessionRecord(*row) for row in self._db.execute(_OPEN_SESSIONS)]
            self._db.executemany(_SESSION_ENDED, [(when, reason, r.session_id) for r in rows])
        return rows
