"""What the image build and the base share: the errors, the log callback, two engine helpers.

Apart so that `base` (getting Debian) and `build` (the images) each import it,
and neither imports the other's module for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from docker.errors import ImageNotFound

from tooljail.errors import TooljailError

if TYPE_CHECKING:
    from docker import DockerClient

__all__ = [
    "LOG_TAIL_LINES",
    "EngineUnavailableError",
    "ImageBuildError",
    "ImageError",
    "Log",
    "first_line",
    "get_image",
]

Log = Callable[[str], None]
"""Receives each line of progress (`print` by default)."""

LOG_TAIL_LINES = 25
"""How many of the last log lines a build error shows."""


class ImageError(TooljailError):
    """A sandbox image could not be checked or built; the message says what to do."""


class EngineUnavailableError(ImageError, ConnectionError):
    """No Docker engine answers at DOCKER_HOST (or the default socket)."""


class ImageBuildError(ImageError):
    """debootstrap or `docker build` failed.

    Attributes:
        log_tail: The last lines of its log, also at the end of the message.
    """

    def __init__(self, what: str, log_tail: Iterable[str]) -> None:
        self.log_tail = list(log_tail)
        tail = "\n".join(f"    {line}" for line in self.log_tail)
        super().__init__(f"{what}; the last lines of its log:\n{tail}" if tail else what)


def get_image(client: DockerClient, reference: str) -> Any:
    """The image called `reference`, or None."""
    try:
        return client.images.get(reference)
    except ImageNotFound:
        return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
