"""A fleet of tooljail daemons on paper: queueing and refusals under a burst.

(Over 500 lines because the model, its inputs and its report stay one file: a
script that runs with the standard library alone, from any checkout, as
docs/scaling.md asks its readers to run it.)

    .venv/bin/python bench/sim_fleet.py                       # 100 nodes, measured service times
    .venv/bin/python bench/sim_fleet.py --base-util 0.08      # a fleet sized for the burst
    .venv/bin/python bench/sim_fleet.py --json                # the figures as JSON on stdout

A discrete-event model (standard library only, deterministic with `--seed`) of
N nodes, each one daemon:

- **servers**: the calls a node serves at once. Fed by `bench_capacity.py`'s
  JSON, a node has the concurrency at which that bench measured its best rate,
  and a call's service time is drawn from the latencies measured at that
  concurrency. By Little's law (concurrency = rate x latency) such a node
  serves exactly the measured rate when it is saturated, so the CPU limit of
  the measured host is in the model without modelling the CPU. `--cores`
  scales the servers for nodes with more cores than the measured one
  (assuming the rate grows with the cores: an assumption, not a measurement).
- **admission**: as `tooljaild.calls.admission.Admission` bounds it, a call
  finds room while the node holds fewer than `max_concurrent + max_queue`
  running and queued calls (32 + 256 by default); past it the call is refused
  (RESOURCE_EXHAUSTED with `retry_after_s` 1.0). The SDK does not retry on its
  own; `--retry` models callers that do, after the hint, under the same call
  id, which rendezvous hashing sends to the same node. The per-client share is
  not modelled: with many agent hosts no one of them holds half a node.
- **routing**: the SDK's rendezvous hashing of call ids spreads calls
  uniformly over the nodes, modelled as a uniform random choice per call.
- **arrivals**: Poisson at the base rate, times `--burst` for `--burst-s`
  seconds from `--burst-at`.

Queued calls start in arrival order (FIFO). The daemon hands free slots to the
waiting clients in turn, which changes who waits, not how many calls wait or
how busy the node is. FIFO makes each call's start time known when it arrives
(the earliest free server, the Kiefer-Wolfowitz recursion), so a node is two
heaps (its servers' free times and its admitted calls' end times) and the events
are the arrivals, taken in time order from the Poisson stream and the heap of
retries: a million calls take seconds.

Output: per interval, the offered rate, utilization of the fleet's servers,
queue wait p50/p99 of the calls that arrived in it, and refusals; then what the
sizing rule `nodes = peak rate x mean service time / (servers x target
utilization)` predicts for the base and the burst. See docs/scaling.md.
"""

from __future__ import annotations

import argparse
import glob
import heapq
import json
import math
import os
import random
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# The daemon's defaults (tooljaild.settings.config.Settings; tests/unit/test_sim_fleet.py
# checks that they still are): calls running at once, calls waiting, the hint.
MAX_CONCURRENT = 32
MAX_QUEUE = 256
RETRY_AFTER_S = 1.0

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


@dataclass(frozen=True)
class Fleet:
    """The nodes and what each one admits.

    Attributes:
        nodes: Daemons in the fleet.
        servers: Calls one node serves at once.
        bound: Calls one node holds at most, running and queued; a call that
            finds it full is refused.
    """

    nodes: int = 100
    servers: int = 8
    bound: int = MAX_CONCURRENT + MAX_QUEUE


@dataclass(frozen=True)
class Load:
    """What arrives, and for how long the model runs.

    Attributes:
        base_rate: Calls per second offered to the whole fleet.
        duration_s: Arrivals stop here; calls still queued or running are "in flight".
        burst: The rate's factor during the burst (1: no burst).
        burst_at_s: When the burst starts.
        burst_s: How long it lasts.
        interval_s: The width of one row of the report.
        poisson: Poisson arrivals; False: evenly spaced (for tests).
        retry_after_s: A refused call comes back this much later to the same
            node (its call id hashes there); None: it is not retried.
        retries: How many times a refused call comes back at most.
    """

    base_rate: float
    duration_s: float = 180.0
    burst: float = 10.0
    burst_at_s: float = 60.0
    burst_s: float = 30.0
    interval_s: float = 10.0
    poisson: bool = True
    retry_after_s: float | None = None
    retries: int = 3

    def rate(self, t: float) -> float:
        """The offered rate at time `t`."""
        in_burst = self.burst_at_s <= t < self.burst_at_s + self.burst_s
        return self.base_rate * (self.burst if in_burst else 1.0)

    def next_change(self, t: float) -> float:
        """The first time after `t` when the rate changes (inf: never)."""
        for edge in (self.burst_at_s, self.burst_at_s + self.burst_s):
            if edge > t:
                return edge
        return math.inf


@dataclass
class Interval:
    """One row of the report: the calls that arrived in [start, start + width)."""

    start: float
    rate: float
    arrived: int = 0
    refused: int = 0
    busy_s: float = 0.0
    waits: list[float] = field(default_factory=list)


@dataclass
class Outcome:
    """What the model saw. Counts are of attempts: a retried call counts once per try.

    `arrived == done + refused + in_flight` always holds: every admitted call
    has either ended by `duration_s` or is still queued or running then.
    """

    fleet: Fleet
    load: Load
    mean_service_s: float
    arrived: int = 0
    refused: int = 0
    done: int = 0
    in_flight: int = 0
    retries_pending: int = 0
    gave_up: int = 0
    """Calls refused on their last allowed try."""
    min_held_at_refusal: int | None = None
    """The fewest calls a node held when it refused one (the bound, if admission is right)."""
    max_held: int = 0
    intervals: list[Interval] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of `samples` (0.0 for none)."""
    if not samples:
        return 0.0
    s = sorted(samples)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


Draw = Callable[[random.Random], float]
"""A service time in seconds, drawn with the model's random generator."""


def empirical(samples_s: Sequence[float]) -> Draw:
    """Service times drawn uniformly from measured samples (seconds)."""
    pool = list(samples_s)
    if not pool or min(pool) <= 0:
        raise ValueError("service-time samples must be a non-empty list of positive seconds")
    return lambda rng: pool[int(rng.random() * len(pool))]


def constant(service_s: float) -> Draw:
    """The same service time for every call."""
    return lambda rng: service_s


def simulate(fleet: Fleet, load: Load, draw: Draw, mean_service_s: float, seed: int) -> Outcome:
    """Run the model once.

    Args:
        fleet: Nodes, servers per node, admission bound.
        load: Arrivals, burst, report interval, retries.
        draw: Service times.
        mean_service_s: The mean of `draw` (for utilization and the sizing rule).
        seed: The random generator's seed: the same seed, the same outcome.

    Returns:
        The counts, per-interval rows and every admitted call's queue wait.
    """
    rng = random.Random(seed)
    out = Outcome(fleet, load, mean_service_s)
    width = load.interval_s
    rows = max(1, math.ceil(load.duration_s / width))
    out.intervals = [Interval(i * width, load.rate(i * width)) for i in range(rows)]
    free = [[0.0] * fleet.servers for _ in range(fleet.nodes)]  # heaps: when each server frees
    held: list[list[float]] = [[] for _ in range(fleet.nodes)]  # heaps: end times, admitted calls
    retries: list[tuple[float, int, int, int]] = []  # (time, sequence, node, tries so far)
    seq = 0

    def next_fresh(t: float) -> float:
        while True:
            rate, change = load.rate(t), load.next_change(t)
            step = rng.expovariate(rate) if load.poisson else 1.0 / rate
            if t + step < change:
                return t + step
            t = change  # memoryless: start over at the edge with the new rate

    fresh = next_fresh(0.0)
    while True:
        if retries and retries[0][0] <= fresh:
            t, _, node, tries = heapq.heappop(retries)
        else:
            t, node, tries = fresh, int(rng.random() * fleet.nodes), 0
            fresh = next_fresh(t)
        if t >= load.duration_s:
            break
        row = out.intervals[min(rows - 1, int(t / width))]
        out.arrived += 1
        row.arrived += 1
        calls = held[node]
        while calls and calls[0] <= t:
            heapq.heappop(calls)
            out.done += 1
        if len(calls) >= fleet.bound:
            out.refused += 1
            row.refused += 1
            low = out.min_held_at_refusal
            out.min_held_at_refusal = len(calls) if low is None else min(low, len(calls))
            if load.retry_after_s is not None and tries < load.retries:
                seq += 1
                heapq.heappush(retries, (t + load.retry_after_s, seq, node, tries + 1))
            elif tries:
                out.gave_up += 1
            continue
        start = max(t, heapq.heappop(free[node]))
        end = start + draw(rng)
        heapq.heappush(free[node], end)
        heapq.heappush(calls, end)
        out.max_held = max(out.max_held, len(calls))
        row.waits.append(start - t)
        _add_busy(out.intervals, width, start, min(end, load.duration_s))
    for calls in held:
        ended = sum(1 for e in calls if e <= load.duration_s)
        out.done += ended
        out.in_flight += len(calls) - ended
    out.retries_pending = len(retries)
    out.waits = [w for row in out.intervals for w in row.waits]
    return out


def _add_busy(rows: list[Interval], width: float, start: float, end: float) -> None:
    """Credit a server's busy time [start, end) to the rows it spans."""
    i = int(start / width)
    while start < end and i < len(rows):
        edge = min(end, (i + 1) * width)
        rows[i].busy_s += edge - start
        start, i = edge, i + 1


# --------------------------------------------------------------------------- sizing


def nodes_needed(rate: float, mean_service_s: float, servers: int, target_util: float) -> int:
    """The sizing rule: nodes = rate x mean service time / (servers x target utilization)."""
    return max(1, math.ceil(rate * mean_service_s / (servers * target_util)))


def sizing_table(
    call_core_s: float,
    cores: Sequence[int],
    per_minute: Sequence[int] = (1_000, 10_000, 100_000),
    tool_cpu_s: Sequence[float] = (0.0, 0.1, 1.0, 10.0),
    target_util: float = 0.7,
    loop_s: float | None = None,
) -> str:
    """Nodes for each rate (calls per minute) and tool CPU time, as a Markdown table.

    A node of `n` cores serves `n / (call_core_s + tool_cpu_s)` calls per second
    when busy: each call costs the measured CPU of a `print(1)` call (sandbox,
    daemon, gRPC: `call_core_s` core-seconds) plus the tool's own CPU time, and
    the cores work in parallel. Tools that mostly wait (network, sleep) are
    bound by the daemon's slots instead: `max_concurrent / wall time` per node.

    Args:
        call_core_s: Core-seconds one `print(1)` call costs (cores / measured rate).
        cores: Node sizes, one cell each ("2 cores / 16 cores").
        per_minute: The rows.
        tool_cpu_s: The columns: seconds of CPU the tool itself uses.
        target_util: The utilization a node is sized for.
        loop_s: The daemon's event loop's CPU seconds per call (bench_stages.py
            --projection): one loop runs on one core, so a node serves at most
            1 / loop_s calls per second whatever its cores. None: no such cap
            (the rate grows with the cores).
    """

    def nodes(per_s: float, call_s: float, n: int) -> int:
        if loop_s is None or n / call_s <= 1 / loop_s:
            return nodes_needed(per_s, call_s, n, target_util)
        return nodes_needed(per_s, loop_s, 1, target_util)  # the loop's one core sets the rate

    head = ["calls/min"] + ["print(1)" if s == 0 else f"tool of {s:g} s CPU" for s in tool_cpu_s]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rate in per_minute:
        cells = [f"{rate:,}"]
        for s in tool_cpu_s:
            per_s = rate / 60
            cells.append(" / ".join(str(nodes(per_s, call_core_s + s, n)) for n in cores))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(out: Outcome, target_util: float) -> dict[str, Any]:
    """Every figure of one run, as plain data (the `--json` output)."""
    fleet, load = out.fleet, out.load
    capacity = fleet.nodes * fleet.servers / out.mean_service_s
    rows = []
    for row in out.intervals:
        span = min(load.interval_s, load.duration_s - row.start)
        rows.append(
            {
                "start_s": row.start,
                "offered_per_s": row.rate,
                "arrived": row.arrived,
                "utilization": row.busy_s / (fleet.nodes * fleet.servers * span),
                "wait_p50_ms": percentile(row.waits, 50) * 1000,
                "wait_p99_ms": percentile(row.waits, 99) * 1000,
                "refused": row.refused,
                "refused_pct": 100 * row.refused / row.arrived if row.arrived else 0.0,
            }
        )
    peak = load.base_rate * max(1.0, load.burst)
    return {
        "fleet": asdict(fleet),
        "load": asdict(load),
        "mean_service_ms": out.mean_service_s * 1000,
        "capacity_per_s": capacity,
        "base_utilization": load.base_rate / capacity,
        "arrived": out.arrived,
        "refused": out.refused,
        "refused_pct": 100 * out.refused / out.arrived if out.arrived else 0.0,
        "done": out.done,
        "in_flight": out.in_flight,
        "retries_pending": out.retries_pending,
        "gave_up": out.gave_up,
        "max_held_per_node": out.max_held,
        "wait_p50_ms": percentile(out.waits, 50) * 1000,
        "wait_p99_ms": percentile(out.waits, 99) * 1000,
        "intervals": rows,
        "sizing": {
            "target_utilization": target_util,
            "nodes_for_base": nodes_needed(
                load.base_rate, out.mean_service_s, fleet.servers, target_util
            ),
            "nodes_for_peak": nodes_needed(peak, out.mean_service_s, fleet.servers, target_util),
        },
    }


def print_report(s: dict[str, Any], source: str) -> None:
    fleet, load = s["fleet"], s["load"]
    print(
        f"fleet: {fleet['nodes']} nodes x {fleet['servers']} servers, bound "
        f"{fleet['bound']} running+queued calls per node; service time mean "
        f"{s['mean_service_ms']:.1f} ms ({source})"
    )
    retry = load["retry_after_s"]
    retry_text = f"after {retry:g} s, same node, {load['retries']} at most" if retry else "none"
    print(
        f"capacity {s['capacity_per_s']:,.0f} calls/s; base {load['base_rate']:,.0f} calls/s "
        f"({s['base_utilization']:.0%} of it); burst x{load['burst']:g} for "
        f"{load['burst_s']:g} s from t={load['burst_at_s']:g} s; retries: "
        f"{retry_text}"
    )
    print()
    print("    t s | offered/s |  arrived |  util | wait p50 ms | wait p99 ms | refused | refused")
    for r in s["intervals"]:
        print(
            f"{r['start_s']:7.0f} | {r['offered_per_s']:9,.0f} | {r['arrived']:8,d} | "
            f"{r['utilization']:5.0%} | {r['wait_p50_ms']:11.1f} | {r['wait_p99_ms']:11.1f} | "
            f"{r['refused']:7,d} | {r['refused_pct']:6.1f}%"
        )
    print()
    print(
        f"total: {s['arrived']:,} arrived = {s['done']:,} done + {s['refused']:,} refused "
        f"({s['refused_pct']:.1f}%) + {s['in_flight']:,} in flight; {s['gave_up']:,} calls "
        f"refused on their last try; queue wait p50 "
        f"{s['wait_p50_ms']:.1f} ms, p99 {s['wait_p99_ms']:.1f} ms; most calls one node "
        f"held: {s['max_held_per_node']}"
    )
    z = s["sizing"]
    print(
        f"sizing rule at {z['target_utilization']:.0%} target utilization: "
        f"{z['nodes_for_base']} nodes for the base rate, {z['nodes_for_peak']} for the burst's "
        f"peak (this fleet: {fleet['nodes']})"
    )


# --------------------------------------------------------------------------- inputs


def newest_measurement() -> str | None:
    """This host's bench_capacity JSON, else the newest one in bench/results."""
    own = os.path.join(RESULTS_DIR, f"capacity-{socket.gethostname()}.json")
    if os.path.exists(own):
        return own
    found = sorted(glob.glob(os.path.join(RESULTS_DIR, "capacity-*.json")), key=os.path.getmtime)
    return found[-1] if found else None


def measured_service(
    path: str, concurrency: int | None
) -> tuple[list[float], int, int, float | None]:
    """From bench_capacity's JSON: (service-time samples in s, their concurrency,
    cores of the measured host, CPU seconds one call cost there or None).

    Args:
        path: The JSON `bench_capacity.py` wrote.
        concurrency: Which measured concurrency to take; None: the one with the
            best rate.
    """
    with open(path) as f:
        data = json.load(f)
    rows = data["throughput"]
    if concurrency is None:
        row = max(rows, key=lambda r: r["calls_per_s"])
    else:
        matching = [r for r in rows if r["concurrency"] == concurrency]
        if not matching:
            raise SystemExit(f"{path} has no measurement at concurrency {concurrency}")
        row = matching[0]
    cpu_ms = row.get("cpu_ms_per_call")
    return (
        [ms / 1000 for ms in row["samples_ms"]],
        int(row["concurrency"]),
        int(data["cpus"]),
        None if cpu_ms is None else cpu_ms / 1000,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--measured", help="bench_capacity.py's JSON (default: bench/results)")
    ap.add_argument(
        "--concurrency", type=int, help="the measured concurrency to model (default: best rate)"
    )
    ap.add_argument("--service-ms", type=float, help="a constant service time instead")
    ap.add_argument(
        "--node-rate",
        type=float,
        help="scale the service times so that a busy node serves this many calls/s "
        "(e.g. its CPU-bound rate, when the measured one was taken on a loaded host)",
    )
    ap.add_argument("--servers", type=int, help="servers per node (default: the concurrency)")
    ap.add_argument(
        "--cores", type=int, help="cores per node; scales the servers from the measured host's"
    )
    ap.add_argument("--bound", type=int, default=MAX_CONCURRENT + MAX_QUEUE)
    ap.add_argument("--base-rate", type=float, help="calls/s for the whole fleet")
    ap.add_argument(
        "--base-util",
        type=float,
        default=0.5,
        help="base rate as a share of the fleet's capacity, when --base-rate is not given",
    )
    ap.add_argument("--burst", type=float, default=10.0)
    ap.add_argument("--burst-at", type=float, default=60.0)
    ap.add_argument("--burst-s", type=float, default=30.0)
    ap.add_argument("--duration", type=float, default=180.0)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument(
        "--retry",
        type=int,
        default=0,
        metavar="N",
        help=f"a refused call comes back after {RETRY_AFTER_S:g} s, at most N times",
    )
    ap.add_argument("--target-util", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    ap.add_argument(
        "--sizing-table",
        default="",
        help="print only the sizing table (Markdown) for these node core counts, e.g. 2,16",
    )
    ap.add_argument(
        "--loop-ms",
        type=float,
        default=None,
        help="the daemon's event loop CPU per call (bench_stages.py --projection): caps a "
        "node's rate at 1000 / LOOP_MS calls/s in --sizing-table",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.service_ms is not None:
        # A constant service time: one server per core, each call busy for it.
        samples, concurrency, cpus = [args.service_ms / 1000], 8, 8
        call_cpu_s: float | None = None
        source = f"constant {args.service_ms:g} ms"
    else:
        path = args.measured or newest_measurement()
        if path is None:
            print("no measurement: run bench/bench_capacity.py, or give --service-ms")
            return 2
        samples, concurrency, cpus, call_cpu_s = measured_service(path, args.concurrency)
        source = f"{len(samples)} samples at concurrency {concurrency}, {os.path.basename(path)}"
    mean = sum(samples) / len(samples)
    if args.node_rate:
        # The measured shape at another scale: concurrency / mean = the rate asked for.
        scale = concurrency / args.node_rate / mean
        samples, mean = [x * scale for x in samples], mean * scale
        source += f", scaled x{scale:.3f} to {args.node_rate:g} calls/s per node"
    if args.sizing_table:
        # The CPU one call cost, as measured; else from the rate: concurrency / mean
        # service time is the rate of a node of `cpus` cores (Little's law), so
        # one call costs cpus / rate core-seconds.
        call_core_s = call_cpu_s or mean * cpus / concurrency
        cores = [int(c) for c in args.sizing_table.split(",")]
        loop_s = None if args.loop_ms is None else args.loop_ms / 1000
        print(sizing_table(call_core_s, cores, target_util=args.target_util, loop_s=loop_s))
        return 0
    servers = args.servers or max(1, round(concurrency * (args.cores or cpus) / cpus))
    fleet = Fleet(args.nodes, servers, args.bound)
    capacity = fleet.nodes * fleet.servers / mean
    load = Load(
        base_rate=args.base_rate or args.base_util * capacity,
        duration_s=args.duration,
        burst=args.burst,
        burst_at_s=args.burst_at,
        burst_s=args.burst_s,
        interval_s=args.interval,
        retry_after_s=RETRY_AFTER_S if args.retry else None,
        retries=args.retry,
    )
    s = summary(simulate(fleet, load, empirical(samples), mean, args.seed), args.target_util)
    if args.json:
        print(json.dumps(s | {"source": source, "seed": args.seed}, indent=1))
    else:
        print_report(s, source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
