"""The `[artifacts]` table: how much the artifact store keeps, and for how long."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ArtifactSettings(BaseModel):
    """Bounds of the artifact store (`[artifacts]` in the config file)."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(default=2 * 1024**3, ge=1024**2)
    """Bytes of artifacts kept in all; past it the oldest are evicted (and logged)."""
    max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """An artifact older than this is removed."""
    max_artifact_bytes: int = Field(default=1024**3, ge=1024)
    """The largest artifact kept; what a call makes past it is cut (and said)."""
    offload_bytes: int = Field(default=64 * 1024, ge=0)
    """A result whose data, as JSON, is larger than this is stored as an artifact:
    the caller gets a preview and its id. 0: never offloaded."""
