"""tooljail vs. a fresh `python -c` per call, measured side by side in one run.

    .venv/bin/python bench/bench_calls.py            # full run (N=200, M=400)
    .venv/bin/python bench/bench_calls.py --quick    # smoke test (N=40, M=80)
    .venv/bin/python bench/bench_calls.py --sweep-pool-sizes 2,4,8   # + throughput per pool size

Baseline (b): `subprocess.run([python, "-c", "print(1)"])`, python being the real
interpreter binary (symlinks and pyenv shims resolved).
tooljail (t): `execute_python_code("print(1)")` through a daemon this script
starts (`python -m tooljaild serve` on a private Unix socket) and stops (SIGTERM).

Both sides are measured in alternating blocks (b t t b b t ...) with a pause
until the CPUs are quiet between blocks, so that machine noise falls on both
and neither side's background work (the pool refilling, zombies being reaped)
is billed to the other. Ratios are tooljail / baseline. See bench/README.md.

Only the standard library, the tooljail SDK and grpc's health service are used.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tooljail import Client, Output, ToolResult

DEFAULT_POOL_SIZE = 4  # best of 2/4/8 for concurrency-8 throughput on the 2-core VMs
CODE = "print(1)"
STREAM_CODE = "print('hi', flush=True); import time; time.sleep(0.2)"
REAL_PYTHON = os.path.realpath(sys.executable)
SETTLED = [0.0]  # seconds spent waiting for quiet CPUs between blocks


# --------------------------------------------------------------------------- helpers


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (p99 of 40 samples is the maximum)."""
    s = sorted(samples)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields), idle


def settle(max_wait: float = 3.0, window: float = 0.1, busy_below: float = 0.2) -> float:
    """Wait until the CPUs are quiet (e.g. the pool has refilled); returns seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        total0, idle0 = _cpu_times()
        time.sleep(window)
        total1, idle1 = _cpu_times()
        dt = total1 - total0
        if dt <= 0 or 1 - (idle1 - idle0) / dt < busy_below:
            break
    waited = time.monotonic() - start
    SETTLED[0] += waited
    return waited


# --------------------------------------------------------------------------- the two sides


def baseline_call() -> None:
    proc = subprocess.run([REAL_PYTHON, "-c", CODE], capture_output=True)
    if proc.returncode != 0 or proc.stdout != b"1\n":
        raise RuntimeError(
            f"baseline call failed: {proc.returncode} {proc.stdout!r} {proc.stderr!r}"
        )


def tooljail_call(client: Client) -> None:
    result = client.call("execute_python_code", {"code": CODE})
    if not result.ok or result.data.get("stdout") != "1\n":
        raise RuntimeError(f"tooljail call failed: {result!r}")


def baseline_first_output() -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen([REAL_PYTHON, "-c", STREAM_CODE], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    first = time.perf_counter() - t0
    proc.stdout.read()
    proc.stdout.close()
    if proc.wait() != 0 or line != b"hi\n":
        raise RuntimeError(f"baseline stream failed: {line!r}")
    return first


def tooljail_first_output(client: Client) -> float:
    t0 = time.perf_counter()
    first: float | None = None
    result: ToolResult | None = None
    for item in client.stream("execute_python_code_stream", {"code": STREAM_CODE}):
        if isinstance(item, Output):
            if first is None:
                first = time.perf_counter() - t0
                if item.data != "hi\n":
                    raise RuntimeError(f"tooljail stream: unexpected first chunk {item!r}")
        else:
            result = item
    if first is None or result is None or not result.ok:
        raise RuntimeError(f"tooljail stream failed: {result!r}")
    return first


# --------------------------------------------------------------------------- measurements


def serial_latencies(call: Callable[[], None], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def concurrent_run(
    make_call: Callable[[], tuple[Callable[[], None], Callable[[], None]]], m: int, concurrency: int
) -> float:
    """Seconds for `m` calls over `concurrency` threads; each thread gets its own caller."""
    remaining = [m]
    lock = threading.Lock()
    errors: list[BaseException] = []
    callers = [make_call() for _ in range(concurrency)]  # (call, close) per thread
    barrier = threading.Barrier(concurrency + 1)

    def worker(call: Callable[[], None]) -> None:
        barrier.wait()
        while True:
            with lock:
                if remaining[0] <= 0 or errors:
                    return
                remaining[0] -= 1
            try:
                call()
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker, args=(c,)) for c, _ in callers]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for _, close in callers:
        close()
    if errors:
        raise errors[0]
    return elapsed


def baseline_caller() -> tuple[Callable[[], None], Callable[[], None]]:
    return baseline_call, lambda: None


def tooljail_caller(target: str) -> Callable[[], tuple[Callable[[], None], Callable[[], None]]]:
    def make() -> tuple[Callable[[], None], Callable[[], None]]:
        client = Client(target)
        return (lambda: tooljail_call(client)), client.close

    return make


def alternating(
    sides: dict[str, Callable[[int], object]], total: int, block: int
) -> dict[str, list]:
    """Run `total` units per side in blocks, order b t t b b t ..., settling between blocks."""
    results: dict[str, list] = {name: [] for name in sides}
    names = list(sides)
    done = 0
    rnd = 0
    while done < total:
        size = min(block, total - done)
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            settle()
            results[name].append(sides[name](size))
        done += size
        rnd += 1
    return results


# --------------------------------------------------------------------------- the daemon


class Daemon:
    def __init__(self, pool_size: int) -> None:
        self.pool_size = pool_size
        self.tmp = Path(tempfile.mkdtemp(prefix="tjbench-"))
        self.target = f"unix://{self.tmp}/s.sock"
        self.log_path = self.tmp / "daemon.log"
        argv = [
            sys.executable,
            "-m",
            "tooljaild",
            "serve",
            "--listen",
            self.target,
            "--state-dir",
            str(self.tmp / "state"),
            "--pool-size",
            str(pool_size),
            "--log-level",
            "WARNING",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.startup_s = self._wait_serving()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _wait_serving(self, timeout: float = 60.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with grpc.insecure_channel(self.target) as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1.0
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - t0
                except grpc.RpcError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"daemon not serving after {timeout}s:\n{self.log_tail()}")

    def stop(self) -> int | None:
        rc: int | None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            rc = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            rc = None
        shutil.rmtree(self.tmp, ignore_errors=True)
        return rc


# --------------------------------------------------------------------------- main


def fmt_ms(s: float) -> str:
    return f"{s * 1000:8.1f}"


def throughput_pair(target: str, m: int, concurrency: int, block: int) -> tuple[float, float]:
    """Calls/s of (baseline, tooljail), M calls each, in alternating blocks."""
    res = alternating(
        {
            "b": lambda k: concurrent_run(baseline_caller, k, concurrency),
            "t": lambda k: concurrent_run(tooljail_caller(target), k, concurrency),
        },
        m,
        block,
    )
    return m / sum(res["b"]), m / sum(res["t"])


def warm_up(client: Client, target: str, n: int, concurrency: int) -> None:
    for _ in range(n):
        baseline_call()
        tooljail_call(client)
    concurrent_run(baseline_caller, 2 * concurrency, concurrency)
    concurrent_run(tooljail_caller(target), 2 * concurrency, concurrency)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, help="N: serial calls per side (default 200; quick 40)")
    ap.add_argument(
        "--concurrent-calls",
        type=int,
        help="M: calls per side at concurrency 8 (default 400; quick 80)",
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stream-samples", type=int, help="first-output samples (default 20; quick 6)")
    ap.add_argument("--warmup", type=int, default=10, help="serial warm-up calls per side")
    ap.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    ap.add_argument(
        "--sweep-pool-sizes",
        default="",
        help="also measure concurrency-8 throughput per pool size, e.g. 2,4,8",
    )
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    args = ap.parse_args(argv)
    n = args.calls or (40 if args.quick else 200)
    m = args.concurrent_calls or (80 if args.quick else 400)
    f = args.stream_samples or (6 if args.quick else 20)
    c = args.concurrency
    serial_block = max(10, n // 4)
    conc_block = max(c * 2, m // 4)

    print(
        f"machine: nproc={os.cpu_count()} python={platform.python_version()} "
        f"({platform.machine()}, {platform.system()} {platform.release()}) "
        f"loadavg={os.getloadavg()[0]:.2f}"
    )
    print(f"baseline interpreter: {REAL_PYTHON}")
    print(
        f"N={n} serial calls, M={m} calls at concurrency {c}, {f} stream samples, "
        f"warm-up {args.warmup}, pool size {args.pool_size}",
        flush=True,
    )

    t_start = time.monotonic()
    daemon = Daemon(args.pool_size)
    print(
        f"daemon serving after {daemon.startup_s * 1000:.0f} ms (pid {daemon.process.pid})",
        flush=True,
    )
    try:
        with Client(daemon.target) as client:
            warm_up(client, daemon.target, args.warmup, c)

            lat = alternating(
                {
                    "b": lambda k: serial_latencies(baseline_call, k),
                    "t": lambda k: serial_latencies(lambda: tooljail_call(client), k),
                },
                n,
                serial_block,
            )
            lat_b = [x for blk in lat["b"] for x in blk]
            lat_t = [x for blk in lat["t"] for x in blk]

            tput_b, tput_t = throughput_pair(daemon.target, m, c, conc_block)

            first = alternating(
                {
                    "b": lambda k: [baseline_first_output() for _ in range(k)],
                    "t": lambda k: [tooljail_first_output(client) for _ in range(k)],
                },
                f,
                1,
            )
            first_b = [x for blk in first["b"] for x in blk]
            first_t = [x for blk in first["t"] for x in blk]
    except BaseException:
        print(f"--- daemon log (tail) ---\n{daemon.log_tail()}", file=sys.stderr)
        daemon.stop()
        raise
    rc = daemon.stop()

    rows = [
        (
            "latency p50, c=1 (ms)",
            fmt_ms(percentile(lat_b, 50)),
            fmt_ms(percentile(lat_t, 50)),
            percentile(lat_t, 50) / percentile(lat_b, 50),
        ),
        (
            "latency p99, c=1 (ms)",
            fmt_ms(percentile(lat_b, 99)),
            fmt_ms(percentile(lat_t, 99)),
            percentile(lat_t, 99) / percentile(lat_b, 99),
        ),
        (f"throughput, c={c} (calls/s)", f"{tput_b:8.1f}", f"{tput_t:8.1f}", tput_t / tput_b),
        (
            "first output p50 (ms)",
            fmt_ms(percentile(first_b, 50)),
            fmt_ms(percentile(first_t, 50)),
            percentile(first_t, 50) / percentile(first_b, 50),
        ),
        (
            "first output max (ms)",
            fmt_ms(max(first_b)),
            fmt_ms(max(first_t)),
            max(first_t) / max(first_b),
        ),
    ]
    print()
    print(f"{'metric':30} {'baseline':>9} {'tooljail':>9} {'t/b':>7}")
    for name, b, t, ratio in rows:
        print(f"{name:30} {b:>9} {t:>9} {ratio:7.2f}")
    print("(latency ratio < 1: tooljail faster; throughput ratio > 1: tooljail faster)")

    if args.sweep_pool_sizes:
        sizes = [int(s) for s in args.sweep_pool_sizes.split(",") if s.strip()]
        print(
            f"\npool-size sweep (a fresh daemon per row; N={n} at c=1, M={m} at c={c}, "
            "per side; t/b ratios)"
        )
        print(
            f"{'pool':>4} {'t p50 ms':>9} {'p50 t/b':>8} {'t p99 ms':>9} {'p99 t/b':>8} "
            f"{'t calls/s':>10} {'b calls/s':>10} {'tput t/b':>9}"
        )
        for size in sizes:
            d = Daemon(size)
            try:
                with Client(d.target) as client:
                    warm_up(client, d.target, args.warmup, c)
                    lat = alternating(
                        {
                            "b": lambda k: serial_latencies(baseline_call, k),
                            "t": lambda k, cl=client: serial_latencies(
                                lambda: tooljail_call(cl), k
                            ),
                        },
                        n,
                        serial_block,
                    )
                sb = [x for blk in lat["b"] for x in blk]
                st = [x for blk in lat["t"] for x in blk]
                tb, tt = throughput_pair(d.target, m, c, conc_block)
            finally:
                d.stop()
            print(
                f"{size:>4} {fmt_ms(percentile(st, 50)):>9} "
                f"{percentile(st, 50) / percentile(sb, 50):8.2f} "
                f"{fmt_ms(percentile(st, 99)):>9} {percentile(st, 99) / percentile(sb, 99):8.2f} "
                f"{tt:10.1f} {tb:10.1f} {tt / tb:9.2f}",
                flush=True,
            )

    print(
        f"\ndaemon exit code {rc}; total {time.monotonic() - t_start:.0f} s "
        f"({SETTLED[0]:.0f} s of it waiting for quiet CPUs between blocks)"
    )
    if rc != 0:
        print("warning: the daemon did not exit 0 on SIGTERM", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
