"""A warm pool of started sandboxes, so that a call never waits for a start.

Each sandbox serves one call and is then destroyed; the pool starts a new one
in the background. When idle sandboxes sit unused longer than `idle_ttl_s`,
the pool lets them go down to `min_idle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from tooljaild.sandbox.base import Sandbox, SandboxError

log = logging.getLogger(__name__)


class SandboxPool:
    """Keeps up to `size` started sandboxes ready.

    Args:
        factory: Makes a new, not yet started sandbox.
        size: How many ready sandboxes to keep; 0 disables the pool (each call
            starts its own sandbox).
        min_idle: The pool never shrinks below this when idle.
        idle_ttl_s: How long a ready sandbox may wait before the pool shrinks.
    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int,
        *,
        min_idle: int = 1,
        idle_ttl_s: float = 300.0,
    ) -> None:
        self._factory = factory
        self._size = size
        self._min_idle = min(min_idle, size)
        self._idle_ttl_s = idle_ttl_s
        self._ready: deque[tuple[float, Sandbox]] = deque()
        self._starting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._changed = asyncio.Event()
        self.started_total = 0
        self.start_failures = 0

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        """Begin filling the pool in the background."""
        self._refill()

    async def wait_ready(self, count: int | None = None, timeout_s: float = 30.0) -> bool:
        """Wait until `count` (default: the pool size) sandboxes are ready.

        Returns:
            False when the timeout passed first.
        """
        want = self._size if count is None else count
        deadline = time.monotonic() + timeout_s
        while len(self._ready) < want:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    async def acquire(self) -> Sandbox:
        """A started sandbox for one call: a ready one, or a new one now.

        Raises:
            SandboxError: When no sandbox can be started.
        """
        while self._ready:
            _, sandbox = self._ready.popleft()
            if sandbox.alive:
                self._refill()
                return sandbox
            self._spawn(sandbox.close())
        self._refill()
        sandbox = self._factory()
        try:
            await sandbox.start()
        except BaseException:
            await sandbox.close()
            raise
        self.started_total += 1
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """Destroy a used sandbox in the background."""
        self._spawn(sandbox.close())

    def _refill(self) -> None:
        if self._closed:
            return
        self._shrink_idle()
        want = self._size - len(self._ready) - self._starting
        for _ in range(max(0, want)):
            self._starting += 1
            self._spawn(self._start_one())

    def _shrink_idle(self) -> None:
        now = time.monotonic()
        while len(self._ready) > self._min_idle and now - self._ready[0][0] > self._idle_ttl_s:
            _, sandbox = self._ready.popleft()
            self._spawn(sandbox.close())

    async def _start_one(self) -> None:
        sandbox = self._factory()
        try:
            await sandbox.start()
        except (SandboxError, OSError) as exc:
            self._starting -= 1
            self.start_failures += 1
            log.error("sandbox start failed: %s", exc)
            await sandbox.close()
            # Back off so that a broken interpreter does not become a fork loop.
            await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.start_failures, 6)))
            self._refill()
            return
        except BaseException:
            self._starting -= 1
            await sandbox.close()
            raise
        self._starting -= 1
        self.started_total += 1
        if self._closed:
            await sandbox.close()
            return
        self.start_failures = 0
        self._ready.append((time.monotonic(), sandbox))
        self._changed.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Destroy every ready sandbox and wait for background work to end."""
        self._closed = True
        while self._ready:
            _, sandbox = self._ready.popleft()
            self._spawn(sandbox.close())
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
