"""The `[journal]` table: how durable the call journal is, and how much of it is kept.

Three of its keys were top-level keys before (`journal_max_age_s`,
`journal_max_rows`, `journal_max_session_rows`); a config that uses them still
starts (`Settings` folds them in here, see `fold_deprecated`), and one that
sets both spellings to different values is refused, naming both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Durability = Literal["crash", "power"]
"""What a call's admission record survives before the call may start."""

SECONDS_PER_DAY = 86_400.0

DEPRECATED_KEYS = {
    "journal_max_age_s": "keep_days",
    "journal_max_rows": "max_rows",
    "journal_max_session_rows": "max_session_rows",
}
"""Old top-level key -> its `[journal]` key (the age is in seconds there, days here)."""


class JournalSettings(BaseModel):
    """The call journal (`[journal]` in the config file): its durability and retention.

    Every key applies on a reload (`systemctl reload`), from the next call on.
    """

    model_config = ConfigDict(extra="forbid")

    durability: Durability = "crash"
    """What a call's admission record survives before the call may start: the
    record that makes a retry with the same call id get the recorded outcome
    instead of a second run. "crash": a kill -9 of the daemon (it is written
    to the OS, not synced; an OS crash or power cut may lose the last ones).
    "power": also an OS crash or power cut (each call waits, off the event
    loop, for an fsync of the journal's log, shared by the calls admitted
    together; see docs/journal.md for the measured cost)."""
    keep_days: float = Field(default=7.0, gt=0)
    """How long the journal keeps a finished call (GetCall, ListCalls, idempotent
    retries, the tool cache), in days; fractions allowed (0.5: 12 hours). Older
    finished calls are removed at the next prune (hourly, and every 1,000
    calls); a call still running is never removed."""
    max_rows: int = Field(default=100_000, ge=100)
    """How many finished calls the journal keeps at most; past it the ones that
    ended first are removed (never a running one). About 1 KiB of disk each,
    plus its arguments (up to 64 KiB) and result."""
    max_session_rows: int = Field(default=10_000, ge=10)
    """How many ended sessions the journal keeps at most (the oldest go first):
    what lets a call naming one that ended be told why."""

    @property
    def max_age_s(self) -> float:
        """`keep_days` in seconds."""
        return self.keep_days * SECONDS_PER_DAY


def fold_deprecated(
    journal: JournalSettings, old: dict[str, float | int | None]
) -> tuple[JournalSettings, list[str]]:
    """`journal` with the values of the old top-level keys folded in.

    Args:
        journal: The `[journal]` table as read.
        old: The old top-level keys (`DEPRECATED_KEYS`) as read; None: not set.

    Returns:
        The table to use, and the old keys that were set (to warn about).

    Raises:
        ValueError: An old key and its `[journal]` key are both set, to
            different values.
    """
    update: dict[str, float | int] = {}
    used = []
    for key, value in old.items():
        if value is None:
            continue
        used.append(key)
        new_key = DEPRECATED_KEYS[key]
        new_value = value / SECONDS_PER_DAY if new_key == "keep_days" else value
        if new_key in journal.model_fields_set and not _same(getattr(journal, new_key), new_value):
            raise ValueError(
                f"{key} (deprecated) and [journal] {new_key} are both set, to different "
                f"values ({value} and {getattr(journal, new_key)}): keep only "
                f"[journal] {new_key}"
            )
        update[new_key] = new_value
    if not update:
        return journal, used
    merged = JournalSettings.model_validate({**journal.model_dump(), **update})
    return merged, used


def _same(a: float, b: float) -> bool:
    # Days from seconds: 604800 s and 7 days are one value, whatever the rounding.
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0)
