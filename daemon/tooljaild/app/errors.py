"""The app floor's failure: the daemon cannot start (apart, so every start step can raise it)."""

from __future__ import annotations

from tooljail.errors import TooljailError

__all__ = ["DaemonError"]


class DaemonError(TooljailError):
    """The daemon cannot start; the message says why and what to do.

    Args:
        message: Why, and what to do.
        unavailable: Something it needs does not answer (the Docker engine),
            rather than being misconfigured: `serve` then exits 3, not 2.
    """

    def __init__(self, message: str, *, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable
