"""The call journal: every call's id, arguments, state and result, in SQLite.

The journal is what lets the daemon tell the truth about a call after the call
has left its memory or the daemon itself has died: a retry with the same call id
gets the recorded outcome instead of a second run, `GetCall` answers after a
restart, and calls that were running when the daemon died are marked `lost`.

Writes, per call, each one short transaction committed before it returns:

- `Journal.admitted` when the call is admitted, *before* it may start: a call the
  journal does not know about never ran, which is what makes a retry with the
  same id safe after a crash. It records who made the call, so that a call
  answered from the journal stays its owner's (the server checks, as for a
  live call);
- `Journal.running` when it reaches a sandbox (the daemon writes it only for a
  call still running `START_WRITE_DELAY_S` later; a shorter one's start goes
  with its end, `finished(started=...)`: see `tooljaild.calls.book`);
- `Journal.finished` with its final `ToolResult` JSON.

Durability: SQLite in WAL mode with `synchronous=NORMAL`. A commit is a write()
into the WAL file without fsync, so every committed write survives the daemon
being SIGKILLed at any moment; an OS crash or power cut may lose the last
commits (never the file's consistency): SQLite syncs only at checkpoints (WAL
past ~1,000 pages, 4 MiB). `durability="power"`: a call awaits `durable()`
before it starts, one fdatasync of the WAL in a thread shared by the calls
admitted meanwhile (`tooljaild.journal.durable`): its admission survives a
power cut too, and the event loop never waits on the disk.

Cost: on these 2-core VMs each write takes ~8-15 µs (p50; 12-30 µs on average
with checkpoints): about one commit in 200 also runs a checkpoint (two fsyncs,
~3-8 ms). That is cheap enough for the event loop, so there is no background
writer: a thread would add a hand-off per write that costs as much as the write,
and a second connection that checkpoints concurrently (tried) cannot reset the
WAL under a steady stream of writes, which then grows without bound.

Threading: a `Journal` holds one connection, opened with `check_same_thread`:
open, use and close it on one thread (the daemon's event loop). Using it from
another thread raises `sqlite3.ProgrammingError`.

Exclusivity: the connection holds an exclusive lock on the file for its whole
life (`locking_mode=EXCLUSIVE`), so a second daemon pointed at the same state
directory fails to open the journal (reason "busy") instead of marking the first
daemon's running calls lost. The price: the file cannot be read with the
`sqlite3` shell while the daemon runs.

File size: `prune` deletes finished rows; SQLite puts their pages on its free
list and reuses them for new rows, so the file grows to about
`max_rows` x (average row size) and then stays there (it never shrinks: no
VACUUM is needed, and none is run). A row is at most `max_argument_bytes` of
arguments plus the result, which the daemon's output cap bounds. The WAL file is
reset after each checkpoint and truncated back to `WAL_SIZE_LIMIT` bytes.

The file itself (schema, opening and checking it, `JournalError` and its
messages) is `tooljaild.journal.file`'s.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

from tooljail.types import CallState
from tooljaild.journal.durable import Durability, Durable
from tooljaild.journal.file import (
    APPLICATION_ID,
    BUSY_TIMEOUT_S,
    COLUMNS,
    SCHEMA_VERSION,
    WAL_SIZE_LIMIT,
    JournalError,
    Reason,
    check_existing,
    check_writable,
    connect,
    create_private,
    journal_error,
    make_private,
    prepare,
)
from tooljaild.journal.history import BadQueryError, CallQuery, encode_cursor, select
from tooljaild.journal.rows import (
    LOST_MESSAGE,
    LOST_WAITING_MESSAGE,
    JournalEntry,
    SessionRecord,
    entry_of,
    mark_lost,
)
from tooljaild.journal.sessions import SessionLog

__all__ = [
    "APPLICATION_ID",
    "BUSY_TIMEOUT_S",
    "DEFAULT_MAX_AGE_S",
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MAX_SESSION_ROWS",
    "LOST_MESSAGE",
    "LOST_WAITING_MESSAGE",
    "SCHEMA_VERSION",
    "WAL_SIZE_LIMIT",
    "BadQueryError",
    "CallQuery",
    "Journal",
    "JournalEntry",
    "JournalError",
    "Reason",
    "SessionRecord",
]

DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_SESSION_ROWS = 10_000
DEFAULT_MAX_ARGUMENT_BYTES = 64 * 1024

_ADMIT = """
    INSERT INTO calls (call_id, tool, fingerprint, state, created, timeout_s, idempotent,
                       arguments_bytes, arguments, client, session_id, arguments_sha256)
    VALUES (:call_id, :tool, :fingerprint, 'queued', :created, :timeout_s, :idempotent,
            :arguments_bytes, :arguments, :client, :session_id, :arguments_sha256)
    ON CONFLICT (call_id) DO UPDATE SET
        tool = excluded.tool, fingerprint = excluded.fingerprint, state = 'queued',
        created = excluded.created, started = NULL, ended = NULL,
        timeout_s = excluded.timeout_s, idempotent = excluded.idempotent, sandbox_id = '',
        arguments_bytes = excluded.arguments_bytes, arguments = excluded.arguments,
        result = NULL, client = excluded.client, session_id = excluded.session_id,
        status = '', arguments_sha256 = excluded.arguments_sha256
    WHERE :replace AND calls.ended IS NOT NULL
"""
_RUNNING = """
    UPDATE calls SET state = 'running', sandbox_id = ?, started = ?
    WHERE call_id = ? AND ended IS NULL
"""
_WAITING = "UPDATE calls SET state = ? WHERE call_id = ? AND ended IS NULL AND started IS NULL"
_FINISHED = """
    UPDATE calls SET state = ?, result = ?, ended = ?, status = ?
    WHERE call_id = ? AND ended IS NULL
"""
_STARTED_AND_FINISHED = """
    UPDATE calls SET state = ?, result = ?, ended = ?, status = ?, sandbox_id = ?, started = ?
    WHERE call_id = ? AND ended IS NULL
"""
_CACHED = f"""
    SELECT {COLUMNS} FROM calls INDEXED BY calls_by_arguments
    WHERE arguments_sha256 = ? AND client = ? AND tool = ? AND status = 'success' AND ended >= ?
    AND (? = '' OR fingerprint = ?)
    ORDER BY ended DESC LIMIT 1
"""
_GET = f"SELECT {COLUMNS} FROM calls WHERE call_id = ?"
_UNFINISHED = f"SELECT {COLUMNS} FROM calls WHERE ended IS NULL ORDER BY created"
_PRUNE_AGE = """DELETE FROM calls WHERE rowid IN (
    SELECT rowid FROM calls WHERE ended IS NOT NULL AND ended < ? ORDER BY ended LIMIT ?)"""
_COUNT_FINISHED = "SELECT count(*) FROM calls WHERE ended IS NOT NULL"
_PRUNE_OLDEST = """
    DELETE FROM calls WHERE rowid IN (
        SELECT rowid FROM calls WHERE ended IS NOT NULL ORDER BY ended, rowid LIMIT ?
    )
"""


class Journal(Durable, SessionLog):
    """The daemon's record of its calls, in one SQLite file. Build it with `open`."""

    def __init__(
        self,
        db: sqlite3.Connection,
        path: Path,
        *,
        created: bool,
        migrated_from: int | None = None,
        max_age_s: float,
        max_rows: int,
        max_argument_bytes: int,
        max_session_rows: int = DEFAULT_MAX_SESSION_ROWS,
    ) -> None:
        self._db = db
        self.path = path
        self.created = created
        """True when this `open` created the journal (first start, or an empty file)."""
        self.migrated_from = migrated_from
        """The schema version this `open` migrated the journal from; None: none was."""
        self.max_age_s = max_age_s
        self.max_rows = max_rows
        self.max_session_rows = max_session_rows
        self._sessions_ended_since_prune = 0
        self.max_argument_bytes = max_argument_bytes
        self.on_write: Callable[[float], None] | None = None
        """Told the seconds of each write (tooljaild.app.metrics); None: nobody."""

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES,
        max_session_rows: int = DEFAULT_MAX_SESSION_ROWS,
        durability: Durability = "crash",
    ) -> Journal:
        """Open the journal at `path`, creating it when there is none.

        An existing file is first checked through a read-only connection: its
        application id, schema version and columns, then `PRAGMA quick_check`,
        which reads every page (~90 ms for 100,000 calls, 100 MB, on these VMs);
        one of an older schema version is then migrated in place, in one
        transaction, keeping every row (`migrated_from` says from which).
        A file that is not a usable journal is reported and left exactly as it
        was (that connection may leave an empty `-wal` and a 32 KiB `-shm` file
        next to it, which SQLite recreates or ignores as needed). A write is then
        made, so a read-only disk is found now rather than at the first call.

        Args:
            path: The journal file, e.g. `<state_dir>/journal.sqlite3`; its
                directory must exist.
            max_age_s: `prune` removes finished calls that ended longer ago.
            max_rows: `prune` keeps at most this many finished calls.
            max_argument_bytes: How much of each call's arguments JSON is kept.
            max_session_rows: How many ended sessions are kept at most (the
                oldest go first; see `session_ended`).
            durability: "crash" or "power" (see `durability`).

        Raises:
            JournalError: The file exists but is not a usable journal (reason
                "corrupt" or "incompatible": move it aside, it is never replaced),
                or it cannot be created or written ("unwritable", "full"), or
                another process holds it ("busy").
        """
        path = Path(path)
        if path.is_dir():
            raise JournalError(
                "unwritable",
                path,
                f"The call journal {path} is a directory, not a file. Move it aside or "
                "point the daemon at another state directory.",
            )
        check_writable(path)
        # Made (or narrowed) 0600 before the writing connection: SQLite's own
        # files follow its mode. An empty file, made just now, is created afresh.
        created = create_private(path) or check_existing(path)
        make_private(path)
        db = connect(path, "rwc" if created else "rw")
        try:
            migrated_from = prepare(db, path, create=created)
        except BaseException:
            db.close()
            raise
        journal = cls(
            db,
            path,
            created=created,
            migrated_from=migrated_from,
            max_age_s=max_age_s,
            max_rows=max_rows,
            max_argument_bytes=max_argument_bytes,
            max_session_rows=max_session_rows,
        )
        try:
            journal.durability = durability
        except JournalError:
            db.close()
            raise
        return journal

    def close(self) -> None:
        """Close the connection (checkpointing the WAL into the file). Idempotent."""
        self.durability = "crash"
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def admitted(
        self,
        call_id: str,
        *,
        tool: str,
        fingerprint: str,
        arguments_json: str,
        timeout_s: float,
        idempotent: bool,
        client: str = "",
        session_id: str = "",
        arguments_sha256: str = "",
        created: float | None = None,
        replace: bool = False,
    ) -> None:
        """Record an admitted call as queued. It must return before the call may start.

        Args:
            call_id: The call's id.
            tool: The tool's name.
            fingerprint: The call's fingerprint (tool + canonical arguments).
            arguments_json: The arguments as JSON; the journal keeps the first
                `max_argument_bytes` of it (cut at a character boundary).
            timeout_s: The call's timeout.
            idempotent: Whether the tool is idempotent.
            client: Who made the call (see `JournalEntry.client`); a rerun
                records its own.
            session_id: The session it runs in; "" for a fresh sandbox.
            arguments_sha256: SHA-256 of its canonical arguments JSON.
            created: Wall-clock admission time; None means now.
            replace: Re-admit an id whose call is finished (an idempotent tool's
                lost call run again): its recorded outcome is overwritten.

        Raises:
            ValueError: The id is already journaled, and `replace` is False or its
                call is unfinished.
            JournalError: The write failed ("full", "unwritable", "io"); the call
                must not run.
        """
        if self._sync is not None:
            self._sync.check()  # a failed sync stops every new call
        encoded = arguments_json.encode()
        kept = encoded[: self.max_argument_bytes].decode(errors="ignore")
        params = {
            "call_id": call_id,
            "tool": tool,
            "fingerprint": fingerprint,
            "created": time.time() if created is None else created,
            "timeout_s": timeout_s,
            "idempotent": idempotent,
            "arguments_bytes": len(encoded),
            "arguments": kept,
            "replace": replace,
            "client": client,
            "session_id": session_id,
            "arguments_sha256": arguments_sha256,
        }
        with self._errors(f"recording the admission of call {call_id!r}"):
            inserted = self._db.execute(_ADMIT, params).rowcount
        if not inserted:
            raise ValueError(f"call {call_id!r} is already in the journal")

    def running(self, call_id: str, sandbox_id: str, started: float | None = None) -> None:
        """Record that a call reached its sandbox.

        Args:
            call_id: An admitted, unfinished call.
            sandbox_id: The sandbox it runs in.
            started: Wall-clock start time; None means now.

        Raises:
            ValueError: No unfinished call has that id.
            JournalError: The write failed.
        """
        when = time.time() if started is None else started
        with self._errors(f"recording the start of call {call_id!r}"):
            updated = self._db.execute(_RUNNING, (sandbox_id, when, call_id)).rowcount
        if not updated:
            raise ValueError(f"no unfinished call {call_id!r} in the journal")

    def waiting(self, call_id: str, state: CallState) -> None:
        """Record that an admitted call waits for approval, or (approved) is queued again.

        Raises:
            ValueError: `state` is neither, or no unstarted unfinished call has that id.
            JournalError: The write failed.
        """
        if state not in (CallState.AWAITING_APPROVAL, CallState.QUEUED):
            raise ValueError(f"{state.value!r} is not a waiting state")
        with self._errors(f"recording call {call_id!r} as {state.value}"):
            updated = self._db.execute(_WAITING, (state.value, call_id)).rowcount
        if not updated:
            raise ValueError(f"no unstarted call {call_id!r} in the journal")

    def finished(
        self,
        call_id: str,
        state: CallState,
        result_json: str,
        ended: float | None = None,
        *,
        status: str = "",
        started: tuple[str, float] | None = None,
    ) -> None:
        """Record a call's final state and result.

        A detached call's "timeout, still running" result is not recorded: while
        the daemon lives it answers for the call from memory, and after a
        restart the call is lost anyway. If this raises, the call stays
        unfinished in the journal and the next `recover` marks it lost: an
        honest answer, if a pessimistic one.

        Args:
            call_id: An admitted, unfinished call.
            state: Its final state (not QUEUED or RUNNING).
            result_json: Its `ToolResult`, from `model_dump_json()`.
            ended: Wall-clock end time; None means now.
            status: Its result's status (a `CallStatus` value), which
                `list_calls` filters on.
            started: (sandbox id, wall-clock start) of a call whose `running`
                was not recorded: written with its end, in the same statement.

        Raises:
            ValueError: `state` is not final, or no unfinished call has that id.
            JournalError: The write failed.
        """
        if not state.finished:
            raise ValueError(f"{state.value!r} is not a final state")
        when = time.time() if ended is None else ended
        with self._errors(f"recording the end of call {call_id!r}"):
            if started is None:
                params: tuple[object, ...] = (state.value, result_json, when, status, call_id)
                updated = self._db.execute(_FINISHED, params).rowcount
            else:
                params = (state.value, result_json, when, status, *started, call_id)
                updated = self._db.execute(_STARTED_AND_FINISHED, params).rowcount
        if not updated:
            raise ValueError(f"no unfinished call {call_id!r} in the journal")

    # ------------------------------------------------------------------ reads

    def get(self, call_id: str) -> JournalEntry | None:
        """The call with that id, or None when the journal has no such call.

        Raises:
            JournalError: The read failed.
        """
        with self._errors(f"reading call {call_id!r}", write=False):
            row = self._db.execute(_GET, (call_id,)).fetchone()
        return None if row is None else entry_of(row)

    def list_calls(
        self, query: CallQuery, max_bytes: int | None = None
    ) -> tuple[list[JournalEntry], str]:
        """One page of the calls `query` asks for, newest first (by admission),
        and the cursor of the next page ("" when this is the last).

        Cost: one index walk, about `limit` rows plus those the filters not on
        that index skip (~2-5 ms for 50 of 100,000 calls on these VMs). Rows
        are read one at a time: with `max_bytes`, the page ends before the row
        that would take its arguments and results past it (the first row is
        always kept), so a page never holds more than that in memory.

        Raises:
            BadQueryError: A malformed cursor, or a limit out of range.
            JournalError: The read failed.
        """
        sql, params = select(query)
        entries: list[JournalEntry] = []
        last: tuple[float, int] | None = None
        more = False
        size = 0
        with self._errors("listing calls", write=False):
            for row in self._db.execute(sql, params):
                # Characters, not bytes: a bound, not an account (arguments, result).
                size += len(row[11]) + len(row[12] or "")
                if len(entries) == query.limit or (
                    max_bytes is not None and entries and size > max_bytes
                ):
                    more = True
                    break
                entries.append(entry_of(row[:-1]))
                last = (row[4], row[-1])
        cursor = encode_cursor(*last) if more and last is not None else ""
        return entries, cursor

    def cached(
        self,
        *,
        client: str,
        tool: str,
        arguments_sha256: str,
        since: float,
        fingerprint: str = "",
    ) -> JournalEntry | None:
        """The latest success of `tool` with these arguments by `client` that
        ended at or after `since` (wall clock), or None. One index lookup.

        Args:
            fingerprint: Only a call of this fingerprint (`calls.terms.fingerprint`:
                also its session, egress and secrets asked for); "": any.

        Raises:
            JournalError: The read failed.
        """
        if not arguments_sha256:
            return None
        with self._errors("looking up a cached result", write=False):
            params = (arguments_sha256, client, tool, since, fingerprint, fingerprint)
            row = self._db.execute(_CACHED, params).fetchone()
        return None if row is None else entry_of(row)

    # ------------------------------------------------------------------ maintenance

    def recover(self, now: float | None = None) -> list[JournalEntry]:
        """Mark every unfinished call lost: the daemon that ran it has died.

        Call it once after `open`, before the daemon takes calls. Queued calls
        are lost with `effect=unknown` too: the request goes down the sandbox's
        pipe before `running` is recorded, so a queued call may have started.

        Args:
            now: Wall-clock time recorded as their end; None means now.

        Returns:
            The calls marked lost, oldest first, as now recorded: for the caller
            to log, and to decide which idempotent calls may run again.

        Raises:
            JournalError: The write failed; nothing was marked.
        """
        when = time.time() if now is None else now
        with self._errors("marking unfinished calls lost"), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(_UNFINISHED).fetchall()
            lost = [mark_lost(entry_of(row), when) for row in rows]
            self._db.executemany(
                _FINISHED,
                [(e.state.value, e.result_json, e.ended, e.status, e.call_id) for e in lost],
            )
        return lost

    def prune(self, now: float | None = None, *, at_most: int = -1) -> int:
        """Remove finished calls past `max_age_s`, then the oldest past `max_rows`;
        ended sessions past `max_age_s`, then the oldest past `max_session_rows`.

        Unfinished calls are never removed (the daemon's queue bounds them).
        Cost, on the calling thread: ~2 ms per 100,000 calls (an index scan)
        plus ~5 µs per removed call. Call it after `recover`, every 1,000 ends
        and hourly (`tooljaild.app.journal`).

        Args:
            now: Wall-clock time the age is measured from; None means now.
            at_most: Remove at most this many calls per bound (-1: all).

        Returns:
            How many calls were removed.

        Raises:
            JournalError: The write failed; nothing was removed.
        """
        cutoff = (time.time() if now is None else now) - self.max_age_s
        with self._errors("removing old calls"), self._db:
            self._db.execute("BEGIN IMMEDIATE")
            removed = self._db.execute(_PRUNE_AGE, (cutoff, at_most)).rowcount
            self._prune_sessions(cutoff)
            (finished,) = self._db.execute(_COUNT_FINISHED).fetchone()
            excess = finished - self.max_rows
            if at_most >= 0:
                excess = min(excess, at_most)
            if excess > 0:
                removed += self._db.execute(_PRUNE_OLDEST, (excess,)).rowcount
        return int(removed)

    @contextlib.contextmanager
    def _errors(self, doing: str, *, write: bool = True) -> Iterator[None]:
        """Turn SQLite's errors into a `JournalError`; misuse stays an error of ours.

        A write (one statement or transaction, committed) tells `on_write`
        (the metrics) its seconds.
        """
        began = time.perf_counter()
        try:
            yield
        except sqlite3.ProgrammingError:
            raise
        except sqlite3.Error as exc:
            raise journal_error(exc, self.path, doing) from exc
        if write and self._sync is not None:
            self._sync.written()
        if write and self.on_write is not None:
            self.on_write(time.perf_counter() - began)
