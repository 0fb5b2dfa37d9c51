"""The cost of `[journal] durability = "power"` against "crash", in one run.

    .venv/bin/python bench/bench_journal.py            # full run (~1 min)
    .venv/bin/python bench/bench_journal.py --quick    # smoke test (a few seconds)
    .venv/bin/python bench/bench_journal.py --json     # the JSON summary alone on stdout

Two daemons (`python -m tooljaild serve`, as bench_calls.py starts them, pool
of 4, state directory in a temp dir on the same disk), one with each
durability, take `Client.call("execute_python_code", {"code": "print(1)"})`
in alternating blocks (crash, power, power, crash, ...): at concurrency 1
(p50 latency, calls/s) and at concurrency C (each thread its own Client: p50
latency, calls/s). Then the bare journal, in this process, on the same disk:
per call `admitted` + `running` + `finished` (what a call writes), with
"power" also awaiting `durable()` after each admission (c=1) or after each
batch of C admissions (what group commit shares), p50 per call. Every figure
is printed with its power/crash ratio: the price of surviving a power cut.

The script exits 0 whatever the ratios, non-zero when a call fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tooljail import CallState, Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import (  # the same harness as the other benchmarks
    CODE,
    DEFAULT_POOL_SIZE,
    Daemon,
    percentile,
    settle,
)

from tooljaild.journal.store import Journal
from tooljaild.settings.journal import Durability

MODES: tuple[Durability, ...] = ("crash", "power")


@dataclass
class Measured:
    """Per durability: latencies (s) at c=1 and c=C, calls/s at each, journal µs per call."""

    latency_1: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    latency_c: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    rate_1: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    rate_c: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})
    journal_1: dict[str, list[float]] = field(default_factory=dict)
    journal_c: dict[str, list[float]] = field(default_factory=dict)


def call_once(client: Client) -> None:
    result = client.call("execute_python_code", {"code": CODE})
    if not result.ok or result.data["stdout"] != "1\n":
        raise RuntimeError(f"unexpected result: {result}")


def block(target: str, calls: int, concurrency: int) -> tuple[list[float], float]:
    """`calls` calls over `concurrency` threads (a Client each): latencies, calls/s."""
    latencies: list[float] = []
    lock = threading.Lock()
    remaining = [calls]
    errors: list[BaseException] = []
    clients = [Client(target) for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)

    def worker(client: Client) -> None:
        barrier.wait()
        while True:
            with lock:
                if remaining[0] <= 0 or errors:
                    return
                remaining[0] -= 1
            began = time.perf_counter()
            try:
                call_once(client)
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    return latencies, calls / elapsed


def journal_cost(mode: Durability, calls: int, batch: int) -> list[float]:
    """Seconds per call of the journal's writes for a call (admitted, running,
    finished), "power" awaiting `durable()` after every `batch` admissions."""

    async def run() -> list[float]:
        per_call: list[float] = []
        with tempfile.TemporaryDirectory(prefix="tjbench-journal-") as tmp:
            journal = Journal.open(Path(tmp) / "journal.sqlite3", durability=mode)
            try:
                for first in range(0, calls, batch):
                    ids = [f"c{i}" for i in range(first, min(first + batch, calls))]
                    began = time.perf_counter()
                    for call_id in ids:
                        journal.admitted(
                            call_id,
                            tool="echo",
                            fingerprint=call_id,
                            arguments_json='{"code": "print(1)"}',
                            timeout_s=30.0,
                            idempotent=False,
                        )
                    await journal.durable()
                    for call_id in ids:
                        journal.running(call_id, "sandbox")
                        journal.finished(call_id, CallState.SUCCEEDED, '{"status": "success"}')
                    per_call.append((time.perf_counter() - began) / len(ids))
            finally:
                journal.close()
        return per_call

    return asyncio.run(run())


def measure(args: argparse.Namespace) -> Measured:
    got = Measured()
    daemons = {
        mode: Daemon(args.pool_size, env={"TOOLJAIL_JOURNAL__DURABILITY": mode}) for mode in MODES
    }
    try:
        for daemon in daemons.values():
            block(daemon.target, args.warmup, 1)
        for round_ in range(args.rounds):
            order = MODES if round_ % 2 == 0 else MODES[::-1]
            for mode in order:
                settle()
                latencies, rate = block(daemons[mode].target, args.calls, 1)
                got.latency_1[mode] += latencies
                got.rate_1[mode].append(rate)
            for mode in order:
                settle()
                latencies, rate = block(daemons[mode].target, args.calls, args.concurrency)
                got.latency_c[mode] += latencies
                got.rate_c[mode].append(rate)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    for mode in MODES:
        got.journal_1[mode] = journal_cost(mode, args.journal_calls, 1)
        got.journal_c[mode] = journal_cost(mode, args.journal_calls, args.concurrency)
    return got


def summary(got: Measured, args: argparse.Namespace) -> dict[str, Any]:
    c = args.concurrency

    def rows() -> list[tuple[str, Callable[[str], float], str]]:
        return [
            ("p50 latency, c=1 (ms)", lambda m: percentile(got.latency_1[m], 50) * 1e3, "ms"),
            (f"p50 latency, c={c} (ms)", lambda m: percentile(got.latency_c[m], 50) * 1e3, "ms"),
            ("throughput, c=1 (calls/s)", lambda m: statistics.median(got.rate_1[m]), "/s"),
            (f"throughput, c={c} (calls/s)", lambda m: statistics.median(got.rate_c[m]), "/s"),
            (
                "journal writes per call, c=1 (µs)",
                lambda m: percentile(got.journal_1[m], 50) * 1e6,
                "µs",
            ),
            (
                f"journal writes per call, batches of {c} (µs)",
                lambda m: percentile(got.journal_c[m], 50) * 1e6,
                "µs",
            ),
        ]

    out: dict[str, Any] = {"concurrency": c, "rows": []}
    for label, value, unit in rows():
        crash, power = value("crash"), value("power")
        out["rows"].append(
            {"metric": label, "crash": crash, "power": power, "ratio": power / crash, "unit": unit}
        )
    return out


def print_report(report: dict[str, Any], file: Any) -> None:
    print(f"{'metric':46} {'crash':>10} {'power':>10} {'power/crash':>12}", file=file)
    for row in report["rows"]:
        print(
            f"{row['metric']:46} {row['crash']:10.2f} {row['power']:10.2f} {row['ratio']:11.2f}x",
            file=file,
        )
    print(
        '\nThe cost of durability "power": each call waits for an fdatasync of the journal\'s '
        "WAL (shared by the calls admitted together) before it starts.",
        file=file,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts: a smoke test")
    p.add_argument("--calls", type=int, default=0, help="calls per block (default 100; quick 10)")
    p.add_argument("--rounds", type=int, default=0, help="blocks per mode (default 4; quick 1)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    p.add_argument(
        "--journal-calls", type=int, default=0, help="bare journal calls (default 2000; quick 80)"
    )
    p.add_argument("--json", action="store_true", help="the summary alone on stdout, as JSON")
    args = p.parse_args(argv)
    args.calls = args.calls or (10 if args.quick else 100)
    args.rounds = args.rounds or (1 if args.quick else 4)
    args.journal_calls = args.journal_calls or (80 if args.quick else 2000)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    got = measure(args)
    report = summary(got, args)
    print_report(report, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
