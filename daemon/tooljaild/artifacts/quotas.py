"""The artifact store's bounds: what each owner and the daemon hold, and how room is made.

Bounds (`[artifacts]`), per owner and daemon-wide, in bytes and in count:
an owner's bytes (`max_owner_bytes`) and artifacts (`max_owner_count`), and
the daemon's (`max_bytes`, `max_count`). Bytes are counted as they are
written (reserved by `ArtifactWriter.write`, before they reach the disk), not
at commit: a call still writing is held to the bounds. Making room evicts the
writing owner's own oldest artifacts and nobody else's: past what they free,
a write is cut and a new artifact refused (`ArtifactQuotaError`).

Tombstones (rows of artifacts gone) are bounded by count too: per owner
`max_owner_count`, in all `max_count` (`tombstones_past_bounds`).

This module counts; the store evicts (the `evict_oldest` it hands in) and
keeps the index and files in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tooljail.errors import TooljailError
from tooljaild.settings.artifacts import ArtifactSettings

__all__ = ["ArtifactQuotaError", "Quotas", "Usage"]


class ArtifactQuotaError(TooljailError):
    """A new artifact or its bytes do not fit the bounds even after evicting the
    owner's own oldest artifacts; `str()` says which bound, for the call's result."""


@dataclass
class Usage:
    """What one owner (or the whole store) holds now."""

    bytes: int = 0
    """Of committed, live artifacts."""
    count: int = 0
    """Committed, live artifacts."""
    reserved: int = 0
    """Bytes written by writers not committed yet."""
    writing: int = 0
    """Writers open (each will be one more artifact)."""
    tombstones: int = 0

    @property
    def empty(self) -> bool:
        return not (self.bytes or self.count or self.reserved or self.writing or self.tombstones)


class Quotas:
    """The counts of each owner's and the store's artifacts, held to `settings`.

    Args:
        settings: The bounds.
        evict_oldest: Evicts an owner's oldest kept artifact (and reports it
            through `removed`); False when the owner keeps none. Only ever the
            owner's own: one client's writes never make room with another's
            artifacts (a quota is per owner; the daemon-wide ceiling is met by
            refusing, not by evicting others).
    """

    def __init__(self, settings: ArtifactSettings, evict_oldest: Callable[[str], bool]) -> None:
        self.settings = settings
        self.total = Usage()
        self._evict_oldest = evict_oldest
        self._owners: dict[str, Usage] = {}
        """Per owner with anything in the store; an owner left with nothing is dropped."""

    def of(self, owner: str) -> Usage:
        """`owner`'s counts (made empty if it has none: `forget_if_empty` drops them)."""
        return self._owners.setdefault(owner, Usage())

    def usage(self, owner: str) -> tuple[int, int]:
        """(bytes, artifacts) `owner` keeps now, those being written included."""
        usage = self._owners.get(owner)
        return (
            (0, 0) if usage is None else (usage.bytes + usage.reserved, usage.count + usage.writing)
        )

    def forget_if_empty(self, owner: str) -> None:
        usage = self._owners.get(owner)
        if usage is not None and usage.empty:
            del self._owners[owner]

    def loaded(self, owner: str, live: bool, count: int, size: int) -> None:
        """Count what the index holds at open: `count` kept artifacts of `size`
        bytes in all (`live`), or `count` tombstones."""
        for usage in (self.of(owner), self.total):
            if live:
                usage.count += count
                usage.bytes += size
            else:
                usage.tombstones += count

    # ------------------------------------------------------------------ writers

    def make_room_for_one(self, owner: str) -> None:
        """Evict `owner`'s oldest until one more of its artifacts fits both counts.

        Raises:
            ArtifactQuotaError: The store holds `max_count` artifacts and none
                of them is the owner's to evict, or every one of the owner's
                `max_owner_count` is still being written.
        """
        s, usage = self.settings, self.of(owner)
        while usage.count + usage.writing >= s.max_owner_count:
            if not self._evict_oldest(owner):
                raise ArtifactQuotaError(
                    f"its owner has {s.max_owner_count} artifacts being written "
                    "([artifacts] max_owner_count)"
                )
        while self.total.count + self.total.writing >= s.max_count:
            if not self._evict_oldest(owner):
                raise ArtifactQuotaError(
                    f"the daemon keeps {s.max_count} artifacts, the most it "
                    "keeps in all ([artifacts] max_count), none of them this owner's: "
                    "delete some, or wait for them to expire"
                )

    def started(self, owner: str) -> None:
        """A writer of `owner`'s was opened (after `make_room_for_one`)."""
        for u in (self.of(owner), self.total):
            u.writing += 1

    def reserve(self, owner: str, want: int) -> tuple[int, str]:
        """Room for `want` more bytes of a writer of `owner`'s, evicting the owner's
        oldest artifacts as needed (and nobody else's).

        Returns:
            The bytes granted (reserved now: `released` or `committed` gives
            them back), and when fewer than `want`, which bound cut them.
        """
        s = self.settings
        usage = self.of(owner)
        while usage.bytes + usage.reserved + want > s.max_owner_bytes:
            if not self._evict_oldest(owner):
                break
        while self.total.bytes + self.total.reserved + want > s.max_bytes:
            if not self._evict_oldest(owner):
                break
        room = min(
            s.max_owner_bytes - usage.bytes - usage.reserved,
            s.max_bytes - self.total.bytes - self.total.reserved,
        )
        granted = max(0, min(want, room))
        usage.reserved += granted
        self.total.reserved += granted
        if granted == want:
            return granted, ""
        if s.max_owner_bytes - usage.bytes - usage.reserved <= 0:
            return (
                granted,
                f"its owner's bound of {s.max_owner_bytes} bytes ([artifacts] max_owner_bytes)",
            )
        return granted, (
            f"the daemon's bound of {s.max_bytes} bytes of artifacts in all ([artifacts] "
            "max_bytes), held by other owners' artifacts"
        )

    def unreserve(self, owner: str, size: int) -> None:
        """Give back `size` reserved bytes that were not written after all."""
        for u in (self.of(owner), self.total):
            u.reserved -= size

    def released(self, owner: str, reserved: int) -> None:
        """A writer of `owner`'s that reserved `reserved` bytes ended without a commit."""
        for u in (self.of(owner), self.total):
            u.reserved -= reserved
            u.writing -= 1
        self.forget_if_empty(owner)

    def committed(self, owner: str, size: int) -> None:
        """A writer of `owner`'s that reserved `size` bytes is a kept artifact now."""
        for u in (self.of(owner), self.total):
            u.reserved -= size
            u.writing -= 1
            u.bytes += size
            u.count += 1

    # ------------------------------------------------------------------ gone

    def removed(self, owner: str, size: int) -> None:
        """A kept artifact of `owner`'s of `size` bytes is gone (a tombstone now)."""
        for u in (self.of(owner), self.total):
            u.bytes -= size
            u.count -= 1
            u.tombstones += 1

    def forgotten(self, owner: str, count: int) -> None:
        """`count` tombstones of `owner`'s were deleted from the index."""
        for u in (self.of(owner), self.total):
            u.tombstones -= count
        self.forget_if_empty(owner)

    def tombstones_past_bounds(self, owner: str | None = None) -> int:
        """How many of the oldest tombstones to forget: of `owner`'s past
        `max_owner_count`, or (None) of all past `max_count`; 0 when within.

        A tenth of the bound more than needed, so the deletes come in batches.
        """
        if owner is None:
            held, limit = self.total.tombstones, self.settings.max_count
        else:
            held, limit = self.of(owner).tombstones, self.settings.max_owner_count
        return held - limit + limit // 10 if held > limit else 0
