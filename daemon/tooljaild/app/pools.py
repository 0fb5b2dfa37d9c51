"""One warm pool per sandbox profile: which backend, image, network and limits a call gets.

A tool's profile is its `@tool(sandbox=...)` choices over the daemon's defaults
(`backend`, `docker.image`, `docker.network`), as its backend's entry in the
table reads them (`sandbox.backends`), plus the sandbox-wide part of its
limits (memory, processes and CPUs of the whole sandbox, /tmp and workspace
sizes: what a sandbox is built with). Per-call limits (rlimits, output) travel
with each request instead, so tools that differ only in those share a pool.

The default profile's pool (the built-ins') is started with the daemon and
never shrinks below one ready sandbox. Other pools are made on demand (the
daemon makes those of its served tools at start) and may shrink to none when
idle. Each is a plain `SandboxPool`: never reused, refilled in the background,
bounded, with the pool's own back-off when sandboxes cannot be started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from tooljaild.sandbox.backends import BACKENDS, Backend, Profile
from tooljaild.sandbox.base import Sandbox
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.registry import Tool

__all__ = ["SANDBOX_LIMITS", "PoolSet", "Profile", "limits_for"]

log = logging.getLogger(__name__)

SANDBOX_LIMITS = ("sandbox_memory_bytes", "sandbox_pids", "cpus", "tmp_bytes", "workspace_bytes")
"""The limits a sandbox is built with (cgroup, container, tmpfs sizes), so part of a profile."""


def limits_for(settings: Settings, tool: Tool) -> Limits:
    """The daemon's limits with the tool's overrides (`@tool(limits=...)`)."""
    limits = settings.limits
    if tool.options.limits:
        limits = Limits.model_validate({**limits.model_dump(), **tool.options.limits})
    return limits


class PoolSet:
    """The daemon's pools, one per profile in use.

    Args:
        settings: The daemon's settings (defaults, pool size, idle TTL).
        factory: For a profile, what makes one new, not yet started sandbox of it.
        table: The backends by kind, which decide a tool's profile from its choices.
    """

    def __init__(
        self,
        settings: Settings,
        factory: Callable[[Profile], Callable[[], Sandbox]],
        table: Mapping[str, type[Backend]] = BACKENDS,
    ) -> None:
        self._settings = settings
        self._factory = factory
        self._table = table
        self._pools: dict[Profile, SandboxPool] = {}
        self._by_tool: dict[str, tuple[Tool, Profile]] = {}
        self._closed = False
        self.default = self._profile(None, settings.limits)
        """The profile of the built-ins and of tools that choose nothing."""

    def _profile(self, tool: Tool | None, limits: Limits) -> Profile:
        s = self._settings
        chosen = tool.options.sandbox if tool is not None else None
        kind = (chosen.backend if chosen else None) or s.backend
        sandbox_limits = tuple((name, getattr(limits, name)) for name in SANDBOX_LIMITS)
        return self._table[kind].profile(s, chosen, sandbox_limits)

    def profile_for(self, tool: Tool) -> Profile:
        """The profile the tool's calls run in."""
        return self._profile(tool, limits_for(self._settings, tool))

    def profiles(self, tools: Iterable[Tool]) -> list[Profile]:
        """The distinct profiles of `tools` and the default one, default first."""
        found = [self.default]
        for tool in tools:
            profile = self.profile_for(tool)
            if profile not in found:
                found.append(profile)
        return found

    @property
    def pools(self) -> dict[Profile, SandboxPool]:
        """The pools made so far."""
        return dict(self._pools)

    def pool(self, profile: Profile) -> SandboxPool:
        """The profile's pool, made and started (filling in the background) on first use."""
        pool = self._pools.get(profile)
        if pool is None:
            s = self._settings
            pool = SandboxPool(
                self._factory(profile),
                s.pool_size,
                # The default pool keeps one sandbox ready for good; a tool's own
                # profile may go to none when nobody calls it.
                min_idle=1 if profile == self.default else 0,
                idle_ttl_s=s.pool_idle_ttl_s,
            )
            self._pools[profile] = pool
            if not self._closed:
                pool.start()
                log.info(
                    "sandbox pool started",
                    extra={"profile": profile.describe(), "pool_size": s.pool_size},
                )
        return pool

    def pool_for(self, tool: Tool) -> SandboxPool:
        """The pool the tool's calls take their sandboxes from."""
        # On every call's path: remember each tool's profile (tools never change).
        cached = self._by_tool.get(tool.name)
        if cached is None or cached[0] is not tool:
            cached = self._by_tool[tool.name] = (tool, self.profile_for(tool))
        return self.pool(cached[1])

    async def session_sandbox(self, limits: Limits) -> Sandbox:
        """A started, unused sandbox of the default profile with `limits` for a session:
        from the warm pool when its sandbox-wide limits are the pool's, else started
        now (a session that asked for less memory, fewer processes, fewer CPUs or a
        smaller workspace).

        Raises:
            SandboxError: It cannot be started.
        """
        profile = self._profile(None, limits)
        if profile == self.default:
            return await self.pool(profile).acquire()
        sandbox = self._factory(profile)()
        try:
            await sandbox.start()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def session_misfit(self, tool: Tool) -> str | None:
        """Why `tool` cannot run in a session (sessions are sandboxes of the default
        profile), or None. Sandbox-wide limits aside: the session's own hold."""
        mine, default = self.profile_for(tool), self.default
        if (mine.backend, mine.image, mine.network) == (
            default.backend,
            default.image,
            default.network,
        ):
            return None
        return f"it runs in {mine.describe()} sandboxes, and sessions here are {default.describe()}"

    async def wait_ready(self, profiles: Iterable[Profile], timeout_s: float) -> list[Profile]:
        """Wait until these profiles' pools are full, all within one `timeout_s`.

        Returns:
            The profiles whose pool was not full in time.
        """
        deadline = time.monotonic() + timeout_s
        late: list[Profile] = []
        for profile in profiles:
            remaining = max(0.0, deadline - time.monotonic())
            if not await self.pool(profile).wait_ready(timeout_s=remaining):
                late.append(profile)
        return late

    async def close(self) -> None:
        """Close every pool: their ready sandboxes are destroyed. Idempotent."""
        self._closed = True
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))
