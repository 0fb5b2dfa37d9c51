"""The `[artifacts]` table: how much the artifact store keeps, and for how long."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_CALL_ARTIFACTS = 64
"""The most artifacts a sandbox may send in one call (its frames past them are a
protocol error, `sandbox.runner_channel`): `max_call_artifacts` is at most this."""


class ArtifactSettings(BaseModel):
    """Bounds of the artifact store (`[artifacts]` in the config file).

    Quotas are per owner (the identity whose call made an artifact): a write
    past its owner's bytes or count evicts that owner's oldest artifacts, never
    another owner's; past the daemon-wide ceilings (`max_bytes`, `max_count`)
    it may evict only its owner's too, else it is refused. The bounds nest:
    `max_artifact_bytes` <= `max_owner_bytes` <= `max_bytes`, and
    `max_owner_count` <= `max_count`; a bound set past the one above it is a
    config error at start, a bound left unset is lowered to fit.
    """

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(default=2 * 1024**3, ge=1024**2)
    """Bytes of artifacts kept in all, those being written included: the daemon-wide
    ceiling. A write past it evicts its own owner's oldest artifacts, and is cut
    when they are not enough (never another owner's)."""
    max_owner_bytes: int = Field(default=512 * 1024**2, ge=1024)
    """Bytes of artifacts one owner keeps, those being written included; past it
    the owner's oldest are evicted (logged), and a write is cut when even that is
    not enough. Lowered to `max_bytes` when not set."""
    max_count: int = Field(default=100_000, ge=1)
    """Artifacts kept in all (an empty file costs an inode and a row too); also the
    most tombstones (rows that say why an artifact is gone) kept in all, the
    oldest forgotten first."""
    max_owner_count: int = Field(default=10_000, ge=1)
    """Artifacts one owner keeps; past it the owner's oldest are evicted. Also the
    most tombstones kept per owner. Lowered to `max_count` when not set."""
    max_call_artifacts: int = Field(default=32, ge=0, le=MAX_CALL_ARTIFACTS)
    """Artifacts one call may leave (its files, figures and displays; a spilled
    output or an offloaded result is kept whatever this says); the rest are
    dropped and the result names them. 0: none."""
    max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """An artifact older than this is removed."""
    max_artifact_bytes: int = Field(default=1024**3, ge=1024)
    """The largest artifact kept; what a call makes past it is cut (and said).
    Lowered to `max_owner_bytes` when not set."""
    offload_bytes: int = Field(default=64 * 1024, ge=0)
    """A result whose data, as JSON, is larger than this is stored as an artifact:
    the caller gets a preview and its id. 0: never offloaded."""
    max_search_pattern_bytes: int = Field(default=4096, ge=16, le=1024**2)
    """The longest pattern `search_artifact` takes (UTF-8 bytes); a longer one is
    refused before it is compiled. Patterns are RE2's (linear time, no
    backreferences or lookaround)."""

    @model_validator(mode="after")
    def _nested(self) -> Self:
        """Each bound within the one above it: set past it, a clear error; unset, lowered."""
        for small, big in (
            ("max_owner_bytes", "max_bytes"),
            ("max_artifact_bytes", "max_bytes"),
            ("max_artifact_bytes", "max_owner_bytes"),
            ("max_owner_count", "max_count"),
        ):
            value, ceiling = getattr(self, small), getattr(self, big)
            if value <= ceiling:
                continue
            if small in self.model_fields_set:
                raise ValueError(
                    f"[artifacts] {small} = {value} is more than {big} = {ceiling}: "
                    f"lower {small} or raise {big}"
                )
            object.__setattr__(self, small, ceiling)  # a default that does not fit
        return self
