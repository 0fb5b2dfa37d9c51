"""Which of an extra's requirements are not installed: the daemon's commands ask first.

`pip install tooljail` gives the SDK and the command line's client commands
(grpcio, protobuf, pydantic); the daemon needs `pip install 'tooljail[daemon]'`.
A daemon command run without it would otherwise die on an ImportError deep in
its imports, naming a module (`pydantic_settings`) rather than what to install.

The requirements are read from the installed distribution's metadata, so this
list never repeats pyproject.toml's. It imports only the standard library and
the SDK's error tree: it runs where nothing but the SDK is installed.
"""

from __future__ import annotations

import re
from importlib import metadata

from tooljail.errors import TooljailError

__all__ = [
    "DISTRIBUTION",
    "MissingExtraError",
    "missing_requirements",
    "require_extra",
    "requirement_names",
]

DISTRIBUTION = "tooljail"
"""The distribution whose extras are checked."""

# A Requires-Dist line: `psutil>=5.9; extra == "daemon"`. The name is the leading
# run of name characters (PEP 508); extras in brackets and versions follow it.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


class MissingExtraError(TooljailError, ModuleNotFoundError):
    """An extra's requirements are not installed; the message says what to install.

    Raised before any module of the daemon is imported (they would fail on the
    first missing package, naming a module rather than what to install); only
    the command line catches it. Never sent over the wire: no code of its own.

    Attributes:
        extra: The extra to install, e.g. "daemon".
        missing: The names of its requirements that are not installed.
    """

    def __init__(self, extra: str, missing: list[str]) -> None:
        self.extra: str = extra
        self.missing: list[str] = missing
        super().__init__(
            f"the daemon needs packages that are not installed ({', '.join(missing)}): "
            f"pip install '{DISTRIBUTION}[{extra}]'"
        )


def requirement_names(extra: str, distribution: str = DISTRIBUTION) -> list[str]:
    """The names of the packages `extra` adds, as the installed metadata declares them.

    Args:
        extra: The extra's name, e.g. "daemon".
        distribution: The distribution that declares it.

    Returns:
        The names in declaration order; empty when `distribution` has no metadata
        (run from a source tree that was never installed: nothing to go by).
    """
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    for line in requires:
        requirement, _, markers = line.partition(";")
        extra_match = _EXTRA.search(markers)
        name_match = _NAME.match(requirement.strip())
        if extra_match is not None and extra_match.group(1) == extra and name_match is not None:
            names.append(name_match.group(0))
    return names


def missing_requirements(extra: str, distribution: str = DISTRIBUTION) -> list[str]:
    """The names of `extra`'s requirements with no installed distribution.

    Versions are not compared: a present but older package is left to pip's own
    resolver, which installed it. Requirements whose other markers (e.g.
    `python_version`) do not hold here are still counted: the daemon's extra
    has none, and parsing markers would need `packaging`, which a bare install
    does not have.

    Args:
        extra: The extra's name, e.g. "daemon".
        distribution: The distribution that declares it.

    Returns:
        The missing ones in declaration order; empty when all are installed, and
        when `distribution` has no metadata (imports will tell).
    """
    missing: list[str] = []
    for name in requirement_names(extra, distribution):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def require_extra(extra: str) -> None:
    """Return when `extra`'s requirements are installed.

    Raises:
        MissingExtraError: Naming the missing packages and the pip command.
    """
    missing = missing_requirements(extra)
    if missing:
        raise MissingExtraError(extra, missing)
