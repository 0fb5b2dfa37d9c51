"""The daemon's call journal: opened as `[journal]` says, kept in bounds while serving.

`open_journal` opens it at start (marking what a dead predecessor left running
lost, pruning), `configure` applies a reload's `[journal]` table to the open
journal (every key is live), and `prune_periodically` keeps `keep_days` and
`max_rows` true on a daemon that takes no calls for days: the pruning that
follows every 1,000 ended calls (`calls.book`) never comes to an idle one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from tooljaild.app.errors import DaemonError
from tooljaild.journal.store import Journal, JournalError
from tooljaild.settings.config import Settings
from tooljaild.settings.journal import DEPRECATED_KEYS, JournalSettings

__all__ = ["JOURNAL_FILE", "PRUNE_BATCH", "PRUNE_INTERVAL_S", "configure", "open_journal"]

log = logging.getLogger(__name__)

JOURNAL_FILE = "journal.sqlite3"
PRUNE_INTERVAL_S = 3600.0
"""How often a serving daemon prunes its journal, calls or none."""
PRUNE_BATCH = 1000
"""Calls removed per transaction by the periodic prune; the event loop runs
other work between two (a day's worth of old calls is not one long stall)."""


def open_journal(settings: Settings) -> Journal:
    """Open the journal, and mark what a dead predecessor left running as lost.

    Raises:
        DaemonError: The journal is damaged, foreign, unwritable or in use, or
            (durability "power") its files cannot be synced.
    """
    for key in settings.deprecated_keys:
        log.warning(
            "the setting %s is deprecated: use [journal] %s instead (it is read as such)",
            key,
            DEPRECATED_KEYS[key],
        )
    state_dir, s = settings.state_dir, settings.journal
    try:
        journal = Journal.open(
            state_dir / JOURNAL_FILE,
            max_age_s=s.max_age_s,
            max_rows=s.max_rows,
            max_session_rows=s.max_session_rows,
            durability=s.durability,
        )
        lost = journal.recover()
        journal.prune()
    except JournalError as exc:
        raise DaemonError(str(exc)) from exc
    if journal.created and (state_dir / "runner").exists():
        # This state directory served before, and its journal is gone.
        log.warning(
            "no call journal was found in %s, which a daemon used before: a new one "
            "is started, and calls made before are no longer known",
            state_dir,
        )
    if journal.migrated_from is not None:
        log.info(
            "the call journal was migrated in place from schema version %d; its calls "
            "are kept, and those recorded before it have no owner (with identities, "
            "only approvers see them)",
            journal.migrated_from,
        )
    for entry in lost:
        log.warning(
            "call lost: the daemon stopped while it ran",
            extra={"call_id": entry.call_id, "tool": entry.tool, "sandbox": entry.sandbox_id},
        )
    return journal


def configure(journal: Journal, settings: JournalSettings) -> None:
    """Apply a reload's `[journal]` table: the bounds at the next prune, the
    durability to the next call admitted (a call admitted before keeps its own).

    A durability of "power" whose files cannot be synced is logged, and the
    journal stays as it was.
    """
    journal.max_age_s = settings.max_age_s
    journal.max_rows = settings.max_rows
    journal.max_session_rows = settings.max_session_rows
    try:
        journal.durability = settings.durability
    except JournalError as exc:
        log.error("the journal's durability stays %r: %s", journal.durability, exc)


async def prune_periodically(journal: Journal, interval_s: float = PRUNE_INTERVAL_S) -> None:
    """Prune `journal` every `interval_s` seconds until cancelled, `PRUNE_BATCH`
    calls per transaction. A prune that fails is logged and tried at the next tick."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            for _ in itertools.count():
                if journal.prune(at_most=PRUNE_BATCH) < PRUNE_BATCH:
                    break
                await asyncio.sleep(0)  # others' turn between two batches
        except JournalError as exc:
            log.warning("journal pruning failed; trying again later: %s", exc)
