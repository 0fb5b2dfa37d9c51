"""What a sandbox backend is to the daemon: the `Backend` contract and what it trades in.

An entry of the backend table (`sandbox.backends.BACKENDS`) is a `Backend`
subclass in two halves:

- class methods, pure, on the settings alone: the backend's settings table
  (`config`) and the `Profile` a tool's choices give (`profile`);
- an instance per daemon (`backends.Sandboxes` makes one of each): `prepare`
  decides once what this host gives the backend (isolation, an engine),
  `factory` makes a profile's sandboxes, `unusable` says which profiles cannot
  run now, `warm` starts what makes sandboxes cheap (the zygote), `promises`
  says what holds inside (for the built-ins' descriptions), `close` gives
  everything back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tooljaild.egress.dirs import egress_root
from tooljaild.sandbox.base import Sandbox
from tooljaild.settings.sandbox import Limits

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings
    from tooljaild.settings.sandbox import SandboxProfile

__all__ = ["Backend", "Host", "Profile", "Promises", "Unusable", "memory_in_words"]


@dataclass(frozen=True)
class Profile:
    """What a sandbox is built with. Equal profiles share one pool."""

    backend: str
    """The kind of the backend (a key of the table)."""
    image: str | None = None
    """The full image reference (backends that run images)."""
    network: bool = False
    """Whether the sandbox has a network (backends that can give one)."""
    limits: tuple[tuple[str, Any], ...] = ()
    """The sandbox-wide limits (`pools.SANDBOX_LIMITS`), as (name, value) pairs."""

    def sandbox_limits(self, base: Limits) -> Limits:
        """`base` with this profile's sandbox-wide limits."""
        return base.model_copy(update=dict(self.limits))

    def describe(self) -> str:
        """For logs: "docker tooljail/python:latest, no network" or "process"."""
        if self.image is None:
            return self.backend
        return f"{self.backend} {self.image}, {'network' if self.network else 'no network'}"


@dataclass(frozen=True)
class Host:
    """What the daemon decided once, that every backend shares."""

    state_dir: Path
    """Absolute; the backends keep their own state below it."""
    workspace_root: Path
    runner_dir: Path
    """Holds the runner (`_runner.py` and the modules beside it) and `_tooldef.py`
    (see `isolation.install_runner`, `isolation.RUNNER_MODULES`)."""
    shared_dirs: tuple[Path, ...] = ()
    """Tool and files directories, absolute: visible read-only, at the same paths, inside."""
    daemon_id: str = ""
    """Labels what this daemon makes (containers), to tell it from leftovers."""

    def egress_root(self, settings: Settings) -> Path | None:
        """Where the sandboxes' egress directories live (egress/dirs.py); None
        when the daemon has no egress (no `[egress]` section): then no sandbox
        gets one, and nothing changes."""
        # getattr: `Settings.egress` is the egress settings' (None: no section).
        if getattr(settings, "egress", None) is None:
            return None
        return egress_root(self.state_dir)


@dataclass(frozen=True)
class Unusable:
    """Why a profile's sandboxes cannot be made now."""

    why: str
    unavailable: bool = False
    """Something the backend needs does not answer (the Docker engine), rather
    than being misconfigured: `serve` then exits 3, not 2."""


@dataclass(frozen=True)
class Promises:
    """What holds for code in a profile's sandboxes on this daemon (for descriptions)."""

    isolated: bool
    """Its own processes, filesystem view and /tmp (namespaces or a container)."""
    network: bool
    """The code can reach a network."""
    memory: str | None
    """The memory bound in force, in words ("1 GiB for the whole sandbox"); None: none."""


class Backend:
    """One backend's entry in the table. See the module docstring for the contract.

    Args:
        settings: The daemon's settings.
        host: What every backend shares.
    """

    kind: ClassVar[str]

    def __init__(self, settings: Settings, host: Host) -> None:
        self.settings = settings
        self.host = host

    @classmethod
    def config(cls, settings: Settings) -> Any:
        """This backend's settings table (the pydantic model with `kind` and `build()`)."""
        raise NotImplementedError

    @classmethod
    def profile(
        cls, settings: Settings, chosen: SandboxProfile | None, limits: tuple[tuple[str, Any], ...]
    ) -> Profile:
        """The profile of a tool that chose `chosen` (None: the built-ins), with `limits`."""
        return Profile(cls.kind, limits=limits)

    async def prepare(self) -> None:
        """Decide once what this host gives the backend. Cheap when it is not used.

        Raises:
            IsolationError: The backend cannot be used as configured (strict
                isolation on a host that lacks a feature, an unreachable directory).
        """

    def factory(self, profile: Profile) -> Callable[[], Sandbox]:
        """What makes one new, not yet started sandbox of `profile` (for its pool)."""
        raise NotImplementedError

    async def unusable(self, profiles: Iterable[Profile]) -> dict[Profile, Unusable]:
        """Which of this backend's `profiles` cannot run now, and why; {}: all can."""
        return {}

    async def warm(self) -> None:
        """Start what makes this backend's sandboxes cheaper; failing that, log why."""

    def promises(self, profile: Profile) -> Promises:
        """What holds inside this profile's sandboxes."""
        raise NotImplementedError

    def log_fields(self) -> dict[str, Any]:
        """What the startup log says about this backend (the "isolation" line)."""
        return {}

    async def close(self) -> None:
        """Release what `prepare` and `warm` made. Idempotent."""


def memory_in_words(limits: Limits, *, whole_sandbox: bool) -> str | None:
    """The memory bound of `limits` that holds, for a description; None: none holds.

    Args:
        whole_sandbox: Whether `sandbox_memory_bytes` is enforced here (a cgroup
            with the memory controller, a container).
    """
    if whole_sandbox and limits.sandbox_memory_bytes:
        return f"{_size(limits.sandbox_memory_bytes)} for the whole sandbox"
    if limits.memory_bytes:
        return f"{_size(limits.memory_bytes)} of address space per process"
    return None


def _size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"
