"""A warm pool of started sandboxes, so that a call never waits for a start.

Each sandbox serves one call and is then destroyed; the pool starts a new one
in the background. When its ready sandboxes sit unused longer than
`idle_ttl_s`, the pool lets them go down to `min_idle`, and fills up again at
the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from tooljaild.sandbox.base import Sandbox, SandboxError

log = logging.getLogger(__name__)

AFTER_CALL_S = 0.005
"""How long after a call ends its sandbox is destroyed and replaced: long
enough for the call's result to leave the daemon before the work starts."""
REFILL_LATER_S = 0.05
"""While half the pool or more is still ready, a sandbox taken is replaced when
its call ends, or after this long, whichever comes first."""


class SandboxPool:
    """Keeps up to `size` started sandboxes ready.

    Args:
        factory: Makes a new, not yet started sandbox.
        size: How many ready sandboxes to keep; 0 disables the pool (each call
            starts its own sandbox).
        min_idle: The pool never shrinks below this when idle.
        idle_ttl_s: How long ready sandboxes may go unused before the pool shrinks.
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
        self._target = size
        self._min_idle = min(min_idle, size)
        self._idle_ttl_s = idle_ttl_s
        self._ready: deque[tuple[float, Sandbox]] = deque()
        self._last_used = time.monotonic()
        self._starting = 0
        # Interpreters started in parallel beyond the CPU count only slow each other.
        self._max_starting = max(1, os.cpu_count() or 1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._watcher: asyncio.Future[None] | None = None
        self._closed = False
        self._changed = asyncio.Event()
        self._last_error = ""
        self._backing_off = 0
        self.started_total = 0
        self.start_failures = 0
        # For the metrics: each sandbox handed out was ready (a hit) or waited for
        # (a miss); and the seconds the started ones took to start.
        self.hits = 0
        self.misses = 0
        self.start_seconds = 0.0

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        """Begin filling the pool, and watching it for idleness, in the background."""
        self._refill()
        if self._size and self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch_idle())

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
        """A started sandbox for one call: a ready one, the next one ready, or a new one.

        Raises:
            SandboxError: When no sandbox can be started, or the pool is closed.
        """
        waited = False
        while True:
            if self._closed:
                raise SandboxError("the sandbox pool is closed: the daemon is stopping")
            ready = self.try_acquire()
            if ready is not None:
                if waited:  # try_acquire counted a hit; it was waited for: a miss
                    self.hits -= 1
                    self.misses += 1
                return ready
            waited = True
            self._refill()
            if self._starting == 0:
                break
            # Sandboxes are on their way: take the first one ready rather than
            # start another that would compete with them for the same CPUs.
            failures = self.start_failures
            self._changed.clear()
            await self._changed.wait()
            if self.start_failures > failures and not self._ready:
                raise SandboxError(f"no sandbox could be started: {self._last_error}")
        sandbox = self._factory()
        began = time.monotonic()
        try:
            await sandbox.start()
        except BaseException:
            await sandbox.close()
            raise
        self.started_total += 1
        self.start_seconds += time.monotonic() - began
        self.misses += 1
        return sandbox

    def try_acquire(self) -> Sandbox | None:
        """A ready sandbox at once, without waiting; None when none is ready."""
        self._last_used = time.monotonic()
        self._target = self._size
        while self._ready and not self._closed:
            _, sandbox = self._ready.popleft()
            if sandbox.alive:
                if len(self._ready) < max(1, self._size // 2):
                    self._refill()  # running low: at once
                else:
                    # Otherwise after the call (see release), or after a while
                    # if it runs long: starting a sandbox competes with the call
                    # for the CPUs while its caller waits.
                    asyncio.get_running_loop().call_later(REFILL_LATER_S, self._refill)
                self.hits += 1
                return sandbox
            self._spawn(sandbox.close())
        return None

    def release(self, sandbox: Sandbox) -> None:
        """Destroy a used sandbox in the background, and start its replacement."""
        # A moment later: the call's result goes out first. (A task at once, so
        # that close() waits for it.)
        self._spawn(self._close_later(sandbox))
        asyncio.get_running_loop().call_later(AFTER_CALL_S, self._refill)

    async def _close_later(self, sandbox: Sandbox) -> None:
        if not self._closed:
            await asyncio.sleep(AFTER_CALL_S)
        await sandbox.close()

    def _refill(self) -> None:
        if self._closed:
            return
        want = self._target - len(self._ready) - self._starting
        want = min(want, self._max_starting - self._starting)
        for _ in range(max(0, want)):
            self._starting += 1
            self._spawn(self._start_one())

    async def _watch_idle(self) -> None:
        period = max(0.01, min(self._idle_ttl_s / 2, 30.0))
        while not self._closed:
            await asyncio.sleep(period)
            if time.monotonic() - self._last_used > self._idle_ttl_s:
                self._target = self._min_idle
                while len(self._ready) > self._min_idle:
                    _, sandbox = self._ready.popleft()
                    self._spawn(sandbox.close())

    async def _start_one(self) -> None:
        sandbox = self._factory()
        began = time.monotonic()
        try:
            await sandbox.start()
        except (SandboxError, OSError) as exc:
            self._starting -= 1
            self.start_failures += 1
            self._last_error = str(exc)
            self._changed.set()  # waiters in acquire() learn that it failed
            log.error("sandbox start failed: %s", exc)
            await sandbox.close()
            # Back off so that a broken interpreter does not become a fork loop.
            # Only the last failed start to wake refills: if each did, every
            # round of failures would start more retries than the one before.
            self._backing_off += 1
            try:
                await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.start_failures, 6)))
            finally:
                self._backing_off -= 1
            if self._backing_off == 0:
                self._refill()
            return
        except BaseException:
            self._starting -= 1
            await sandbox.close()
            raise
        self._starting -= 1
        self.started_total += 1
        self.start_seconds += time.monotonic() - began
        if self._closed:
            await sandbox.close()
            return
        self.start_failures = 0
        self._ready.append((time.monotonic(), sandbox))
        self._changed.set()
        self._refill()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Destroy every ready sandbox and wait for background work to end."""
        self._closed = True
        self._changed.set()
        while self._ready:
            _, sandbox = self._ready.popleft()
            self._spawn(sandbox.close())
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
