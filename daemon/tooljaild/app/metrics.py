"""Prometheus metrics: what the daemon did and holds, at http://HOST:PORT/metrics.

Served on `metrics_listen` (`tooljail serve --metrics-listen HOST:PORT`) by
prometheus_client's own HTTP server, on its thread: a scrape never waits for
the event loop, and a stuck loop still answers (the watchdog is what notices
that). Every name is documented in docs/metrics.md.

Two kinds of numbers, read two ways:

- events (a call ended, a call refused, a journal write) are counted when they
  happen, through the hooks `attach` sets on the call manager and the journal;
  the call manager reports a call's end after its caller has the answer, so
  counting is never on the call's path;
- levels (calls running and queued, pools, sessions, artifacts) are read from
  the daemon's objects at each scrape (`_Levels`), so they cannot drift from
  what the daemon holds.

Each daemon has its own registry (not prometheus_client's global one): daemons
served side by side in one process (tests) do not add up.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tooljail.types import CallState, CallStatus, ToolResult

if TYPE_CHECKING:
    from tooljaild.app.pools import PoolSet
    from tooljaild.artifacts.store import ArtifactStore
    from tooljaild.calls.call import Call
    from tooljaild.calls.manager import CallManager
    from tooljaild.egress.service import EgressService
    from tooljaild.journal.store import Journal
    from tooljaild.sessions.manager import SessionManager

log = logging.getLogger(__name__)

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
"""Seconds: from a fresh sandbox's few milliseconds to a long tool's minutes."""
JOURNAL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1)
"""Seconds: a commit into the WAL is tens of microseconds; a checkpoint, milliseconds."""
MEMORY_BUCKETS = tuple(float(2**n * 1024**2) for n in range(2, 14))
"""Bytes: 4 MiB to 8 GiB, doubling."""

ENDING_BY_ERROR = {
    "OutOfMemory": "oom",
    "CpuLimit": "cpu",
    "OutputLimit": "output",
    "Signal": "signal",
    "FileSizeLimit": "file_size",
}
"""A failed call's error type -> the reason its sandbox ended, for
`tooljail_sandbox_endings_total` (timeouts are told by the status)."""


def ending_of(result: ToolResult) -> str | None:
    """Why the call's sandbox ended early, or None when the tool ended by itself.

    One of "timeout", "oom", "cpu", "output", "signal", "file_size".
    """
    if result.status is CallStatus.TIMEOUT:
        return "timeout"
    if result.status is CallStatus.ERROR and result.error is not None:
        return ENDING_BY_ERROR.get(result.error.type)
    return None


@dataclass
class Sources:
    """The daemon's objects that the levels are read from; None: not there (yet)."""

    manager: CallManager | None = None
    pools: PoolSet | None = None
    sessions: SessionManager | None = None
    artifacts: ArtifactStore | None = None
    egress: EgressService | None = None


class Metrics:
    """The daemon's metrics in a registry of their own, and the hooks that feed them.

    Attributes:
        registry: What `/metrics` exposes.
        sources: Where the levels are read from at each scrape.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sources = Sources()
        r = self.registry
        self.calls = Counter(
            "tooljail_calls", "Calls ended, by tool and status.", ["tool", "status"], registry=r
        )
        self.call_duration = Histogram(
            "tooljail_call_duration_seconds",
            "Seconds from a call's start in its sandbox to its end.",
            ["tool"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "tooljail_call_queue_wait_seconds",
            "Seconds from a call's admission to its start (the wait for a slot and a sandbox).",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            "tooljail_refusals", "Calls refused at admission, by reason.", ["reason"], registry=r
        )
        self.endings = Counter(
            "tooljail_sandbox_endings",
            "Sandboxes ended early, by reason: timeout, oom, cpu, output, signal, file_size.",
            ["reason"],
            registry=r,
        )
        self.cpu = Counter(
            "tooljail_call_cpu_seconds", "CPU seconds calls used, by tool.", ["tool"], registry=r
        )
        self.memory_peak = Histogram(
            "tooljail_call_memory_peak_bytes",
            "Each call's peak memory, by tool.",
            ["tool"],
            buckets=MEMORY_BUCKETS,
            registry=r,
        )
        self.output = Counter(
            "tooljail_call_output_bytes",
            "Bytes calls wrote to stdout and stderr, by tool.",
            ["tool"],
            registry=r,
        )
        self.journal_write = Histogram(
            "tooljail_journal_write_seconds",
            "Seconds each journal write (one committed transaction) took.",
            buckets=JOURNAL_BUCKETS,
            registry=r,
        )
        self.egress_denials = Counter(
            "tooljail_egress_denials",
            "Connections or requests the egress proxy refused, by reason (not_allowed, "
            "deny_rule, port_not_allowed, ip_literal, private_address, ...).",
            ["reason"],
            registry=r,
        )
        self.cache_hits = Counter(
            "tooljail_cache_hits",
            "Calls answered from their tool's cache (`cache_s`) without running, by tool.",
            ["tool"],
            registry=r,
        )
        r.register(_Levels(self.sources))
        self._server: Any = None
        self.port: int | None = None
        """The port `/metrics` is served on, once `serve` has run."""

    # ------------------------------------------------------------------ hooks

    def attach(self, manager: CallManager, journal: Journal | None) -> None:
        """Count `manager`'s ends and refusals, and `journal`'s write times."""
        self.sources.manager = manager
        manager.on_end = self.call_ended
        manager.on_refused = self.refused
        if journal is not None:
            journal.on_write = self.journal_write.observe

    def call_ended(self, call: Call, result: ToolResult) -> None:
        """Count one call's end: its status, times, usage and how its sandbox ended."""
        tool = result.tool
        self.calls.labels(tool, result.status.value).inc()
        if result.cached:  # it ran nothing: no duration, no usage to tell
            self.cache_hits.labels(tool).inc()
            return
        self.call_duration.labels(tool).observe(result.duration_s)
        if call.started_at is not None:
            self.queue_wait.observe(max(0.0, call.started_at - call.created))
        ending = ending_of(result)
        if ending is not None:
            self.endings.labels(ending).inc()
        usage = result.usage
        if usage is not None:
            self.cpu.labels(tool).inc(usage.cpu_s)
            self.output.labels(tool).inc(usage.output_bytes)
            if usage.memory_peak_bytes:
                self.memory_peak.labels(tool).observe(usage.memory_peak_bytes)

    def egress_denied(self, reason: str) -> None:
        """Count one refusal of the egress proxy (called on the proxy's thread;
        prometheus_client's counters are thread-safe)."""
        self.egress_denials.labels(reason).inc()

    def refused(self, reason: str) -> None:
        """Count a call refused at admission; `reason` is the error's wire code."""
        self.refusals.labels(reason).inc()

    # ------------------------------------------------------------------ serving

    def serve(self, listen: str) -> int:
        """Serve `/metrics` on `listen` ("HOST:PORT"; port 0: any free one).

        Returns:
            The port it listens on.

        Raises:
            ValueError: `listen` is not HOST:PORT.
            OSError: The address cannot be bound.
        """
        host, port = split_listen(listen)
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = int(self._server.server_port)
        log.info("serving metrics", extra={"metrics_listen": f"{host}:{self.port}"})
        return self.port

    def close(self) -> None:
        """Stop serving `/metrics` (nothing when not served)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def split_listen(listen: str) -> tuple[str, int]:
    """("HOST", PORT) of "HOST:PORT" ("[::1]:9464" for IPv6).

    Raises:
        ValueError: Not HOST:PORT with a port in 0..65535.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics_listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


class _Levels(Collector):
    """What the daemon holds now, read at each scrape (see the module docstring)."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        s = self._sources
        states = Tally[CallState]() if s.manager is None else s.manager.states()
        for state, name in ((CallState.RUNNING, "running"), (CallState.QUEUED, "queued")):
            yield GaugeMetricFamily(
                f"tooljail_calls_{name}", f"Calls {name} now.", value=states[state]
            )
        sessions = 0 if s.sessions is None else len(s.sessions)
        yield GaugeMetricFamily("tooljail_sessions_open", "Sessions open now.", value=sessions)
        stored = 0 if s.artifacts is None else s.artifacts.live_bytes
        yield GaugeMetricFamily(
            "tooljail_artifacts_stored_bytes", "Bytes of the artifacts kept now.", value=stored
        )
        if s.egress is not None:
            yield GaugeMetricFamily(
                "tooljail_egress_connections",
                "Connections open through the egress proxy now, every sandbox's.",
                value=s.egress.open_connections(),
            )
        yield from _pool_metrics(s.pools)


def _pool_metrics(pools: PoolSet | None) -> Iterator[Metric]:
    """Per profile (its `describe()`): ready sandboxes, hits, misses, hit rate, starts."""
    size = GaugeMetricFamily(
        "tooljail_pool_ready", "Sandboxes ready in the pool now, by profile.", labels=["profile"]
    )
    hits = CounterMetricFamily(
        "tooljail_pool_hits", "Sandboxes handed out ready, by profile.", labels=["profile"]
    )
    misses = CounterMetricFamily(
        "tooljail_pool_misses",
        "Sandboxes a call had to wait for (none was ready), by profile.",
        labels=["profile"],
    )
    rate = GaugeMetricFamily(
        "tooljail_pool_hit_ratio",
        "Hits over hits and misses since the start, by profile (0 before any).",
        labels=["profile"],
    )
    starts = CounterMetricFamily(
        "tooljail_sandbox_starts", "Sandboxes started, by profile.", labels=["profile"]
    )
    start_s = CounterMetricFamily(
        "tooljail_sandbox_start_seconds",
        "Seconds spent starting sandboxes, by profile (over tooljail_sandbox_starts_total: "
        "the mean start time).",
        labels=["profile"],
    )
    totals: dict[str, list[float]] = {}
    for profile, pool in ({} if pools is None else pools.pools).items():
        t = totals.setdefault(profile.describe(), [0, 0, 0, 0, 0.0])
        for i, value in enumerate(
            (pool.ready_count, pool.hits, pool.misses, pool.started_total, pool.start_seconds)
        ):
            t[i] += value
    for label, (ready, hit, miss, started, seconds) in totals.items():
        size.add_metric([label], ready)
        hits.add_metric([label], hit)
        misses.add_metric([label], miss)
        rate.add_metric([label], hit / (hit + miss) if hit + miss else 0.0)
        starts.add_metric([label], started)
        start_s.add_metric([label], seconds)
    yield from (size, hits, misses, rate, starts, start_s)
