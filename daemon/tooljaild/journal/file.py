"""The journal's SQLite file: its schema, opening and checking it, and its errors.

`tooljaild.journal.store.Journal` reads and writes calls; this module is what it
needs to get a connection it can trust: the file checked through a read-only
connection first (application id, schema version, columns, `quick_check`), the
writing connection set up (exclusive lock, WAL), and every SQLite error turned
into a `JournalError` whose message names the file and says what to do.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Literal

from tooljail.errors import JournalUnavailableError

APPLICATION_ID = 0x746A6A31
"""`PRAGMA application_id` of a tooljail journal ("tjj1"): marks the file as ours."""
SCHEMA_VERSION = 4
"""`PRAGMA user_version` of the schema below; a journal of a newer version is refused,
one of an older version is brought up to date (`MIGRATIONS`) when it is opened."""
WAL_SIZE_LIMIT = 8 * 1024 * 1024
"""Bytes the WAL file is truncated back to after a checkpoint."""
BUSY_TIMEOUT_S = 1.0
"""How long `open` waits for another process's lock before it reports "busy"."""

Reason = Literal["corrupt", "incompatible", "unwritable", "full", "busy", "io"]

SESSIONS_SCHEMA = (
    """CREATE TABLE sessions (
        session_id TEXT NOT NULL PRIMARY KEY,
        client TEXT NOT NULL,
        created REAL NOT NULL,
        ended REAL,
        end_reason TEXT NOT NULL DEFAULT '',
        sandbox_id TEXT NOT NULL DEFAULT '',
        options TEXT NOT NULL
    )""",
    "CREATE INDEX sessions_by_end ON sessions (ended) WHERE ended IS NOT NULL",
)
"""Schema version 2: sessions, so that a call naming one that died with the daemon
learns why (decision 43)."""

CLIENT_COLUMN = "ALTER TABLE calls ADD COLUMN client TEXT NOT NULL DEFAULT ''"
"""Schema version 3: who made each call, so that a call answered from the journal is
its owner's only, as a live one is (docs/decisions.md, "A journaled call keeps its
owner"). Rows from before it get '': nobody's."""

HISTORY_INDEXES = (
    # One per ListCalls filter, each in `created` order with the rowid (which
    # every index holds) as its tie-break: a page walks one index, no sort.
    "CREATE INDEX calls_by_created ON calls (created)",
    "CREATE INDEX calls_by_client ON calls (client, created)",
    "CREATE INDEX calls_by_tool ON calls (tool, created)",
    "CREATE INDEX calls_by_session ON calls (session_id, created) WHERE session_id != ''",
    "CREATE INDEX calls_by_status ON calls (status, created) WHERE status != ''",
    "CREATE INDEX calls_unfinished ON calls (created) WHERE ended IS NULL",
    # A cached tool's earlier successes (`Journal.cached`): one lookup per call.
    "CREATE INDEX calls_by_arguments ON calls (arguments_sha256, client, tool, ended) "
    "WHERE status = 'success'",
)
HISTORY_COLUMNS = (
    "ALTER TABLE calls ADD COLUMN session_id TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE calls ADD COLUMN status TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE calls ADD COLUMN arguments_sha256 TEXT NOT NULL DEFAULT ''",
    *HISTORY_INDEXES,
)
"""Schema version 4: what ListCalls filters on (the session, the result's status)
and the arguments' hash (ToolResult.arguments_sha256, the tool cache), with an
index per filter (issue 25). Rows from before keep '' in these columns (their
result still says its status and session): filling them would rewrite every
row, and a migration must cost no more than opening does."""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: SESSIONS_SCHEMA,
    2: (CLIENT_COLUMN,),
    3: HISTORY_COLUMNS,
}
"""From each older schema version, what brings it to the next one. `prepare` runs
them all, and sets the new version, in the one transaction that proves a write
works: a migration is done whole or not at all, and no row is lost."""

# Small columns first: a scan that reads `ended` never walks the overflow pages
# of large arguments or results stored after it. `client` and the columns of
# version 4 come last all the same: where ALTER TABLE puts them in a migrated
# journal, so every journal of one version has the same columns in the same
# order (`_check_columns`).
SCHEMA = (
    """CREATE TABLE calls (
        call_id TEXT NOT NULL PRIMARY KEY,
        tool TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        created REAL NOT NULL,
        started REAL,
        ended REAL,
        timeout_s REAL NOT NULL,
        idempotent INTEGER NOT NULL,
        sandbox_id TEXT NOT NULL DEFAULT '',
        arguments_bytes INTEGER NOT NULL,
        arguments TEXT NOT NULL,
        result TEXT,
        client TEXT NOT NULL DEFAULT '',
        session_id TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL DEFAULT '',
        arguments_sha256 TEXT NOT NULL DEFAULT ''
    )""",
    # Finished calls in the order they ended: what `prune` removes first.
    "CREATE INDEX calls_by_end ON calls (ended) WHERE ended IS NOT NULL",
    *HISTORY_INDEXES,
    *SESSIONS_SCHEMA,
    f"PRAGMA application_id = {APPLICATION_ID}",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
COLUMNS = (
    "call_id, tool, fingerprint, state, created, started, ended, timeout_s, idempotent, "
    "sandbox_id, arguments_bytes, arguments, result, client, session_id, status, "
    "arguments_sha256"
)
"""The calls table's columns, in order, at `SCHEMA_VERSION`."""
_COLUMNS_3 = COLUMNS.removesuffix(", session_id, status, arguments_sha256")
"""The calls table's columns in schema version 3."""
_COLUMNS_BEFORE_3 = _COLUMNS_3.removesuffix(", client")
"""The calls table's columns in schema versions 1 and 2 (before `client`)."""

_REASON_BY_CODE: dict[int, Reason] = {
    sqlite3.SQLITE_CORRUPT: "corrupt",
    sqlite3.SQLITE_NOTADB: "corrupt",
    sqlite3.SQLITE_FULL: "full",
    sqlite3.SQLITE_READONLY: "unwritable",
    sqlite3.SQLITE_CANTOPEN: "unwritable",
    sqlite3.SQLITE_PERM: "unwritable",
    sqlite3.SQLITE_AUTH: "unwritable",
    sqlite3.SQLITE_BUSY: "busy",
    sqlite3.SQLITE_LOCKED: "busy",
}


class JournalError(JournalUnavailableError):
    """The journal cannot be opened, read or written; the message says what to do.

    The daemon refuses to start on one raised by `Journal.open`, and refuses new
    calls on one raised by a write rather than run them unjournaled: the client
    gets the `JournalUnavailableError` it is (UNAVAILABLE, "journal_unavailable").

    Attributes:
        reason: What is wrong: "corrupt" (damaged, or not a database),
            "incompatible" (another program's database, or another schema version),
            "unwritable" (read-only disk, file or directory; permissions),
            "full" (no space left), "busy" (another process holds the journal),
            "io" (any other I/O error).
        path: The journal file.
    """

    def __init__(self, reason: Reason, path: Path, message: str) -> None:
        super().__init__(message, reason=reason)
        self.reason: Reason = reason
        self.path = path


def connect(path: Path, mode: Literal["ro", "rw", "rwc"]) -> sqlite3.Connection:
    """A connection in autocommit mode: each statement outside BEGIN is a transaction."""
    uri = f"file:{urllib.parse.quote(str(path))}?mode={mode}"
    try:
        return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise journal_error(exc, path, "opening") from exc


def check_writable(path: Path) -> None:
    """Report a read-only disk, directory or file with the OS's view, which SQLite blurs.

    Raises:
        JournalError: The directory is missing, or it or the file is not writable.
    """
    if not path.parent.is_dir():
        raise JournalError(
            "unwritable",
            path,
            f"The call journal {path} cannot be created: {path.parent} is not a directory "
            "(create the state directory first).",
        )
    for target in (path.parent, path):
        if target.exists() and not os.access(target, os.W_OK):
            raise JournalError(
                "unwritable",
                path,
                f"The call journal {path} cannot be written: {target} is read-only to the "
                "daemon (a read-only disk, its permissions, or an immutable flag). The "
                f"daemon runs no call it cannot record: make {target} writable, or give "
                "the daemon another --state-dir.",
            )


FILE_MODE = 0o600
"""The journal's mode: it holds every client's code and arguments, for the daemon alone.
SQLite gives the `-wal` and `-shm` files it creates the database file's mode."""
SIDE_FILES = ("-wal", "-shm", "-journal")
"""Suffixes of the files SQLite keeps next to a database."""


def create_private(path: Path) -> bool:
    """Create the journal file, empty and `FILE_MODE`, unless it exists.

    Before SQLite opens it: SQLite's own files then follow its mode, whatever
    the umask (`make_private` narrows one that exists).

    Returns:
        Whether it was created.

    Raises:
        JournalError: It cannot be created ("unwritable").
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return False
    except OSError as exc:
        raise JournalError(
            "unwritable",
            path,
            f"The call journal {path} cannot be created ({exc.strerror or exc}): make "
            f"{path.parent} writable by the daemon's user, or give it another --state-dir.",
        ) from exc
    os.close(fd)
    return True


def make_private(path: Path) -> None:
    """Give the journal file and its side files (`-wal`, `-shm`) `FILE_MODE`.

    A journal of an older tooljail (0644, as SQLite makes files), and a
    `-wal` it left behind, are made private here, at start. Call it once the
    file is known to be a journal: one that is not is left as it was.

    Raises:
        JournalError: A mode cannot be set ("unwritable": not the daemon's file).
    """
    for target in (path, *(path.with_name(path.name + s) for s in SIDE_FILES)):
        try:
            if os.stat(target).st_mode & 0o7777 != FILE_MODE:
                os.chmod(target, FILE_MODE)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise JournalError(
                "unwritable",
                path,
                f"The call journal's file {target} cannot be made private to the daemon "
                f"({exc.strerror or exc}): it holds every client's code and arguments. "
                "Make the daemon's user its owner (chown), or move it aside.",
            ) from exc


def check_existing(path: Path) -> bool:
    """Check an existing file through a read-only connection, which never changes it.

    Returns:
        True when it is an empty database (e.g. a first start killed before its
        first write), which `open` may initialize: there is nothing to lose.

    Raises:
        JournalError: It is not a usable journal.
    """
    db = connect(path, "ro")
    try:
        with contextlib.closing(db):
            (app_id,) = db.execute("PRAGMA application_id").fetchone()
            (version,) = db.execute("PRAGMA user_version").fetchone()
            (objects,) = db.execute("SELECT count(*) FROM sqlite_schema").fetchone()
            if app_id == 0 and version == 0 and objects == 0:
                return True
            _check_identity(path, app_id, version)
            _check_pages(path, db)
            _check_columns(path, db, version)
            return False
    except sqlite3.Error as exc:
        raise journal_error(exc, path, "checking") from exc


def _check_identity(path: Path, app_id: int, version: int) -> None:
    if app_id != APPLICATION_ID:
        raise JournalError(
            "incompatible",
            path,
            f"{path} is an SQLite database but not a tooljail call journal (its "
            f"application id is {app_id:#x}). tooljail does not overwrite it: move it "
            "aside, or point the daemon at another state directory.",
        )
    if version != SCHEMA_VERSION and version not in MIGRATIONS:
        raise JournalError(
            "incompatible",
            path,
            f"The call journal {path} has schema version {version}; this tooljail reads "
            f"version {SCHEMA_VERSION}. Run the tooljail version that wrote it, or move "
            "the file aside (a new journal is then created; its calls are no longer "
            "answered).",
        )


def _check_pages(path: Path, db: sqlite3.Connection) -> None:
    problems = [str(row[0]) for row in db.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        raise _corrupt(path, "; ".join(problems))


def _check_columns(path: Path, db: sqlite3.Connection, version: int) -> None:
    # What the calls table has at `version`: the migrations start from exactly that.
    columns = COLUMNS if version >= 4 else _COLUMNS_3 if version == 3 else _COLUMNS_BEFORE_3
    expected = [c.strip() for c in columns.split(",")]
    found = [str(row[1]) for row in db.execute("PRAGMA table_info(calls)")]
    if found != expected:
        raise _corrupt(path, f"table 'calls' has columns {found}, expected {expected}")


def prepare(db: sqlite3.Connection, path: Path, *, create: bool) -> int | None:
    """Set up the writing connection, create the schema if asked, and prove a write works.

    An existing journal of an older schema version is migrated (`MIGRATIONS`) in
    the same transaction as that write.

    Returns:
        The schema version the journal was migrated from; None when it was
        created, or already of `SCHEMA_VERSION`.

    Raises:
        JournalError: The file cannot be written or locked.
    """
    try:
        # Before the first access, so the lock is held from here on and the
        # WAL index lives in this process's memory (no -shm file).
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        (mode,) = db.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode != "wal":
            raise JournalError(
                "unwritable",
                path,
                f"The call journal {path} cannot be switched to WAL mode (it stays in "
                f"{mode!r} mode): is its disk read-only?",
            )
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        found: int | None = None
        with db:
            db.execute("BEGIN IMMEDIATE")
            if create:
                for statement in SCHEMA:
                    db.execute(statement)
            else:
                (version,) = db.execute("PRAGMA user_version").fetchone()
                found = version if version != SCHEMA_VERSION else None
                while version in MIGRATIONS:
                    for statement in MIGRATIONS[version]:
                        db.execute(statement)
                    version += 1
                # A real write (also when nothing changed): a read-only file or
                # disk fails here.
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except sqlite3.Error as exc:
        raise journal_error(exc, path, "opening") from exc
    return found


def _corrupt(path: Path, detail: str) -> JournalError:
    return JournalError(
        "corrupt",
        path,
        f"The call journal {path} is damaged ({detail}). tooljail does not replace it: "
        f"stop the daemon, move the file aside (with any {path.name}-wal next to it), "
        f"e.g. `mv {path} {path}.damaged`, and start again; a new journal is then "
        "created, and the calls recorded in the old one are no longer answered.",
    )


def journal_error(exc: sqlite3.Error, path: Path, doing: str) -> JournalError:
    """A `JournalError` for an SQLite error met while `doing`, with what to do about it."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    reason = _REASON_BY_CODE.get(code, "io")
    detail = f"{doing}: {exc}"
    if reason == "corrupt":
        return _corrupt(path, detail)
    if reason == "full":
        message = (
            f"The disk holding the call journal {path} is full ({detail}). New calls are "
            "refused until space is freed there; what the journal already holds is intact."
        )
    elif reason == "unwritable":
        message = (
            f"The call journal {path} cannot be created or written ({detail}). The daemon "
            f"runs no call it cannot record: make {path.parent} and the file writable by "
            "the daemon's user (is the disk mounted read-only?)."
        )
    elif reason == "busy":
        message = (
            f"The call journal {path} is locked by another process ({detail}). Is another "
            "tooljail daemon running with the same state directory? Stop it, or give this "
            "one its own --state-dir."
        )
    else:
        message = (
            f"I/O error on the call journal {path} ({detail}). Check the disk and the kernel log."
        )
    return JournalError(reason, path, message)
