"""Soak: many short calls at a steady concurrency; the daemon's memory must stay flat.

    .venv/bin/python bench/bench_soak.py                 # 20,000 calls at concurrency 8
    .venv/bin/python bench/bench_soak.py --calls 4000    # a shorter run

It starts one daemon (`python -m tooljaild serve`, default settings, a private
Unix socket, its own state directory and journal), warms it up, then runs the
calls from C threads (each with its own `Client`) and samples the daemon's RSS
(from /proc) every second. It prints the throughput, the RSS at start (after
warm-up), at the end and at its peak, and the growth after warm-up against the
target of issue 5 (under 10%). It exits 1 when a call does not return `1\\n`
or the target is missed, so that it can gate a change; 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_calls import Daemon

from tooljail import Client

GROWTH_TARGET = 0.10


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run(target: str, calls: int, concurrency: int) -> tuple[float, int]:
    """Run `calls` calls from `concurrency` threads; returns (seconds, failures)."""
    left = [calls]
    lock = threading.Lock()
    failures = [0]

    def worker() -> None:
        with Client(target) as client:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                result = client.call("execute_python_code", {"code": "print(1)"})
                if not result.ok or result.data["stdout"] != "1\n":
                    with lock:
                        failures[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - start, failures[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--pool-size", type=int, default=4)
    args = parser.parse_args(argv)

    daemon = Daemon(args.pool_size)
    try:
        pid = daemon.process.pid
        print(f"daemon pid {pid}, RSS at start {rss_bytes(pid) / 2**20:.1f} MiB")
        run(daemon.target, args.warmup, args.concurrency)
        time.sleep(1.0)
        base = rss_bytes(pid)
        samples = [base]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                samples.append(rss_bytes(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        seconds, failures = run(daemon.target, args.calls, args.concurrency)
        done.set()
        sampler.join()
        time.sleep(1.0)
        end = rss_bytes(pid)
        growth = (end - base) / base
        print(
            f"{args.calls} calls at concurrency {args.concurrency}: {seconds:.1f} s, "
            f"{args.calls / seconds:.0f} calls/s, {failures} failed"
        )
        print(
            f"daemon RSS after {args.warmup} warm-up calls {base / 2**20:.1f} MiB, "
            f"at the end {end / 2**20:.1f} MiB, peak {max(samples) / 2**20:.1f} MiB: "
            f"growth {growth:+.1%} (target < {GROWTH_TARGET:.0%}: "
            f"{'MET' if growth < GROWTH_TARGET else 'MISSED'})"
        )
        return 0 if failures == 0 and growth < GROWTH_TARGET else 1
    finally:
        code = daemon.stop()
        print(f"daemon exit code {code}")


if __name__ == "__main__":
    sys.exit(main())
