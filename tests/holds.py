"""Does the daemon hold while an attack runs? Its loop answers, and its memory stays put.

`Probe` asks GetDaemonInfo (a cheap RPC that needs the event loop and nothing
else) in a loop on a thread of its own, over a channel of its own, and keeps
the slowest answer: a stalled loop shows as a slow answer. `Footprint` samples
a process's RSS while the attack runs (the daemon's pid for `tooljail serve`,
this process for a daemon served in it) and keeps the peak. Tests of the
issue-21 attacks wrap the attack in both and assert the bounds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import psutil

from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

MiB = 1024**2
PROBE_BOUND_S = 1.0
"""The slowest answer to GetDaemonInfo accepted while an attack runs (it takes
~1 ms; the bound leaves room for a loaded 2-core machine, not for a freeze)."""


class Probe:
    """Asks the daemon's GetDaemonInfo in a loop on a thread; keeps the slowest answer."""

    def __init__(
        self, target: str, bound_s: float = PROBE_BOUND_S, token: str | None = None
    ) -> None:
        self.bound_s = bound_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.insecure_channel(target)
        self._stub: Any = tooljail_pb2_grpc.ToolRunnerStub(self._channel)  # type: ignore[no-untyped-call]
        self._stop = threading.Event()
        self.slowest = 0.0
        self.answers = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                self._stub.GetDaemonInfo(
                    pb.GetDaemonInfoRequest(), timeout=self.bound_s * 5, metadata=self._metadata
                )
            except grpc.RpcError as exc:
                self.failures.append(str(exc.code()))
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.answers += 1
            self._stop.wait(0.02)

    @contextmanager
    def running(self) -> Iterator[Probe]:
        # Connected first.
        self._stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=30, metadata=self._metadata)
        self._thread.start()
        try:
            yield self
            deadline = time.monotonic() + 10
            while self.answers < 3 and time.monotonic() < deadline:
                time.sleep(0.01)  # a few answers after the attack too: it left no stall
        finally:
            self._stop.set()
            self._thread.join(30)
            self._channel.close()

    def assert_responsive(self) -> None:
        assert not self.failures, self.failures
        assert self.answers >= 3, "the probe got too few answers"
        assert self.slowest < self.bound_s, f"GetDaemonInfo took {self.slowest:.2f}s"


class Footprint:
    """The peak RSS of one process while the attack runs, against its RSS before."""

    def __init__(self, pid: int | None = None) -> None:
        self._process = psutil.Process(pid or os.getpid())
        self.before = self._rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._rss())

    @contextmanager
    def running(self) -> Iterator[Footprint]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)
            self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        return self.peak - self.before

    def assert_within(self, bound: int) -> None:
        assert self.growth < bound, (
            f"RSS grew by {self.growth / MiB:.1f} MiB (bound {bound / MiB:.0f} MiB)"
        )


@contextmanager
def daemon_holds(
    target: str,
    pid: int | None = None,
    *,
    rss_bytes: int = 64 * MiB,
    lag_s: float = PROBE_BOUND_S,
    token: str | None = None,
) -> Iterator[None]:
    """Run the attack in the block; then assert the loop answered within `lag_s`
    throughout and the RSS of `pid` (None: this process) grew by less than `rss_bytes`.
    `token`: the probe's, where the daemon has a tokens file."""
    probe = Probe(target, lag_s, token)
    with Footprint(pid).running() as footprint, probe.running():
        yield
    probe.assert_responsive()
    footprint.assert_within(rss_bytes)
