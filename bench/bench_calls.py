"""tooljail vs. a fresh `python -c` per call, and vs. the ways to isolate without a pool.

    .venv/bin/python bench/bench_calls.py            # full run (N=200, M=500, ~2-3 min)
    .venv/bin/python bench/bench_calls.py --quick    # smoke test (N=40, M=80)
    .venv/bin/python bench/bench_calls.py --sweep-pool-sizes 2,4,8   # + throughput per pool size

Four sides, all measured in the same run (issue 3, section 7):

tooljail (t): `execute_python_code("print(1)")` through a daemon this script
starts (`python -m tooljaild serve` on a private Unix socket, default isolation
best-effort, warm pool) and stops (SIGTERM).
no pool (a): the same through a second daemon started with `--pool-size 0`:
every call starts its sandbox on the call path.
baseline (b): `subprocess.run([python, "-c", "print(1)"])`, python being the real
interpreter binary (symlinks and pyenv shims resolved).
bare bwrap (c): `bwrap --unshare-all ... -- /usr/bin/python3 -c "print(1)"` per
call: the floor of isolating each call with bubblewrap and a fresh interpreter.

All sides are measured in alternating blocks (b t a c, c a t b, ...) with a pause
until the CPUs are quiet between blocks, so that machine noise falls on all of
them and no side's background work (the pool refilling, zombies being reaped)
is billed to another. Ratios are side / baseline (b). See bench/README.md.

Only the standard library, the tooljail SDK and grpc's health service are used.
"""

from __future__ import annotations

import argparse
import json
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
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tooljail import Client, Output, ToolResult

DEFAULT_POOL_SIZE = 4  # best of 2/4/8 for concurrency-8 throughput on the 2-core VMs
CODE = "print(1)"
STREAM_CODE = "print('hi', flush=True); import time; time.sleep(0.2)"
REAL_PYTHON = os.path.realpath(sys.executable)  # --baseline-python changes it
BWRAP_PYTHON = "/usr/bin/python3"
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


# --------------------------------------------------------------------------- the sides


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


def bwrap_argv() -> tuple[list[str] | None, str]:
    """The bare-bubblewrap prefix for side (c), or None and why it is skipped."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bwrap is not on PATH (Debian package bubblewrap)"
    if not os.path.exists(BWRAP_PYTHON):
        return None, f"{BWRAP_PYTHON} does not exist"
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "bin"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--"]
    probe = subprocess.run([*argv, BWRAP_PYTHON, "-c", CODE], capture_output=True)
    if probe.returncode != 0 or probe.stdout != b"1\n":
        err = probe.stderr.decode(errors="replace").strip().splitlines()
        return None, f"a probe call failed ({probe.returncode}): {err[-1] if err else ''}"
    return argv, ""


def bwrap_call(prefix: list[str]) -> None:
    proc = subprocess.run([*prefix, BWRAP_PYTHON, "-c", CODE], capture_output=True)
    if proc.returncode != 0 or proc.stdout != b"1\n":
        raise RuntimeError(f"bwrap call failed: {proc.returncode} {proc.stdout!r} {proc.stderr!r}")


def popen_first_output(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    first = time.perf_counter() - t0
    proc.stdout.read()
    proc.stdout.close()
    if proc.wait() != 0 or line != b"hi\n":
        raise RuntimeError(f"stream of {argv[0]} failed: {line!r}")
    return first


def baseline_first_output() -> float:
    return popen_first_output([REAL_PYTHON, "-c", STREAM_CODE])


def bwrap_first_output(prefix: list[str]) -> float:
    return popen_first_output([*prefix, BWRAP_PYTHON, "-c", STREAM_CODE])


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
    sides: dict[str, tuple[Callable[[int], object], int]], rounds: int
) -> dict[str, list[Any]]:
    """Run each side's total in `rounds` blocks, order b t a c, c a t b, ...

    Settles before each block. `sides` maps a name to (run k units, total units);
    a side with a smaller total gets proportionally smaller blocks in the same rounds.
    """
    results: dict[str, list[Any]] = {name: [] for name in sides}
    names = list(sides)
    for rnd in range(rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            run, total = sides[name]
            size = total // rounds + (1 if rnd < total % rounds else 0)
            if size > 0:
                settle()
                results[name].append(run(size))
    return results


def repeat(fn: Callable[[], float], k: int) -> list[float]:
    return [fn() for _ in range(k)]


def flat(blocks: list[list[float]]) -> list[float]:
    return [x for blk in blocks for x in blk]


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """`tooljail serve` on a private Unix socket in a temp dir, waited for until it serves.

    Args:
        pool_size: `--pool-size`.
        extra: More `serve` arguments (e.g. "--backend", "docker").
        env: Extra environment variables for the daemon.
        wait_s: How long it may take to serve.
    """

    def __init__(
        self,
        pool_size: int,
        *extra: str,
        env: dict[str, str] | None = None,
        wait_s: float = 60.0,
    ) -> None:
        self.pool_size = pool_size
        self.tmp = Path(tempfile.mkdtemp(prefix="tjbench-"))
        # mkdtemp makes it 0700; the daemon refuses a state dir the sandbox uid
        # (nobody) cannot walk through. 0711: passable, not listable.
        os.chmod(self.tmp, 0o711)
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
            *extra,
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        try:
            self.startup_s = self._wait_serving(wait_s)
        except BaseException:
            self.stop()  # and remove the temp dir: the error carries the log tail
            raise

    def log_lines(self, contains: str) -> list[str]:
        return [
            ln for ln in self.log_path.read_text(errors="replace").splitlines() if contains in ln
        ]

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

SIDES = {  # name: (column header, description)
    "t": ("tooljail", "tooljail, warm pool"),
    "a": ("no pool", "tooljail, --pool-size 0"),
    "b": ("python -c", "subprocess.run([python, '-c', code])"),
    "c": ("bare bwrap", "bwrap --unshare-all ... python3 -c, per call"),
}
TARGETS = (  # issue 3, section 7: (row key, label, <= or >=, bound)
    ("p50", "p50 round trip, {n} back-to-back calls", "<=", 0.10),
    ("tput", "throughput, {m} calls at concurrency {c}", ">=", 3.0),
    ("first", "first streamed line, p50 of {f}", "<=", 0.10),
)


def fmt_ms(s: float) -> str:
    return f"{s * 1000:8.1f}"


def doctor_report() -> list[str]:
    """`tooljail doctor --json`, run once: what isolation the daemons get on this host."""
    proc = subprocess.run(
        [sys.executable, "-m", "tooljaild", "doctor", "--json"], capture_output=True, text=True
    )
    try:
        features = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return [f"  (tooljail doctor --json failed, rc {proc.returncode}: {proc.stderr[-300:]})"]
    out = []
    for feat in features:
        detail = str(feat.get("detail", ""))
        if len(detail) > 80:
            detail = detail[:77] + "..."
        out.append(f"  {feat.get('name', '?'):25} {feat.get('status', '?'):14} {detail}")
    return out


def throughput_pair(target: str, m: int, concurrency: int, rounds: int) -> tuple[float, float]:
    """Calls/s of (baseline, tooljail), M calls each, in alternating blocks."""
    res = alternating(
        {
            "b": (lambda k: concurrent_run(baseline_caller, k, concurrency), m),
            "t": (lambda k: concurrent_run(tooljail_caller(target), k, concurrency), m),
        },
        rounds,
    )
    return m / sum(res["b"]), m / sum(res["t"])


def rounds_for(total: int, block: int) -> int:
    return max(1, math.ceil(total / block))


def main(argv: list[str] | None = None) -> int:
    global REAL_PYTHON
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, help="N: serial calls per side (default 200; quick 40)")
    ap.add_argument(
        "--concurrent-calls",
        type=int,
        help="M: calls per side at concurrency 8 (default 500; quick 80)",
    )
    ap.add_argument(
        "--no-pool-calls",
        type=int,
        help="serial calls for side (a), --pool-size 0 (default N; fewer if it is too slow)",
    )
    ap.add_argument(
        "--no-pool-concurrent-calls",
        type=int,
        help="concurrent calls for side (a) (default M)",
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stream-samples", type=int, help="first-output samples (default 20; quick 6)")
    ap.add_argument("--warmup", type=int, default=10, help="serial warm-up calls per side")
    ap.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    ap.add_argument(
        "--baseline-python",
        help="interpreter of side (b) (default: the real binary of this venv's python)",
    )
    ap.add_argument(
        "--sweep-pool-sizes",
        default="",
        help="also measure concurrency-8 throughput per pool size, e.g. 2,4,8",
    )
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    args = ap.parse_args(argv)
    if args.baseline_python:
        REAL_PYTHON = os.path.realpath(args.baseline_python)
    n = args.calls or (40 if args.quick else 200)
    m = args.concurrent_calls or (80 if args.quick else 500)
    f = args.stream_samples or (6 if args.quick else 20)
    c = args.concurrency
    n_a = args.no_pool_calls or n
    m_a = args.no_pool_concurrent_calls or m
    serial_rounds = rounds_for(n, max(10, n // 4))
    conc_rounds = rounds_for(m, max(c * 2, m // 4))

    print(
        f"machine: nproc={os.cpu_count()} python={platform.python_version()} "
        f"({platform.machine()}, {platform.system()} {platform.release()}) "
        f"loadavg={os.getloadavg()[0]:.2f}"
    )
    print(
        f"N={n} serial calls, M={m} calls at concurrency {c}, {f} stream samples, "
        f"warm-up {args.warmup}, pool size {args.pool_size}; "
        f"side (a) on {n_a} serial and {m_a} concurrent calls",
        flush=True,
    )
    print("isolation (tooljail doctor --json, best-effort, run once):")
    for line in doctor_report():
        print(line)
    bw_prefix, bw_skip = bwrap_argv()
    if bw_prefix is None:
        print(f"side (c) skipped: {bw_skip}")

    t_start = time.monotonic()
    daemons: dict[str, Daemon] = {}
    try:
        daemons["t"] = Daemon(args.pool_size)
        daemons["a"] = Daemon(0)
        for name, d in daemons.items():
            print(
                f"daemon ({name}) pool size {d.pool_size}: serving after "
                f"{d.startup_s * 1000:.0f} ms (pid {d.process.pid})",
                flush=True,
            )
        sandbox_py = "see 'sandbox python' above"
        for ln in daemons["t"].log_lines("sandboxes use "):  # the daemon fell back
            sandbox_py = ln.split("sandboxes use ", 1)[1].split('"', 1)[0]
        print(
            f"interpreters: (b) {REAL_PYTHON}; (c) {BWRAP_PYTHON}; (t)/(a) sandboxes: {sandbox_py}",
            flush=True,
        )
        with Client(daemons["t"].target) as ct, Client(daemons["a"].target) as ca:
            names = ["b", "t", "a"] + (["c"] if bw_prefix is not None else [])
            prefix = bw_prefix or []
            serial: dict[str, Callable[[], None]] = {
                "b": baseline_call,
                "t": lambda: tooljail_call(ct),
                "a": lambda: tooljail_call(ca),
                "c": lambda: bwrap_call(prefix),
            }
            callers = {
                "b": baseline_caller,
                "t": tooljail_caller(daemons["t"].target),
                "a": tooljail_caller(daemons["a"].target),
                "c": lambda: ((lambda: bwrap_call(prefix)), lambda: None),
            }
            streams: dict[str, Callable[[], float]] = {
                "b": baseline_first_output,
                "t": lambda: tooljail_first_output(ct),
                "a": lambda: tooljail_first_output(ca),
                "c": lambda: bwrap_first_output(prefix),
            }
            n_of = {"b": n, "t": n, "a": n_a, "c": n}
            m_of = {"b": m, "t": m, "a": m_a, "c": m}

            phase = time.monotonic()
            for name in names:
                for _ in range(args.warmup):
                    serial[name]()
                concurrent_run(callers[name], 2 * c, c)
            print(f"warm-up: {time.monotonic() - phase:.0f} s", flush=True)

            phase = time.monotonic()
            lat = alternating(
                {k: (partial(serial_latencies, serial[k]), n_of[k]) for k in names},
                serial_rounds,
            )
            lat_of = {k: flat(v) for k, v in lat.items()}
            print(f"latency, c=1: {time.monotonic() - phase:.0f} s", flush=True)

            phase = time.monotonic()
            conc = alternating(
                {k: (partial(concurrent_run, callers[k], concurrency=c), m_of[k]) for k in names},
                conc_rounds,
            )
            tput_of = {k: m_of[k] / sum(v) for k, v in conc.items()}
            print(f"throughput, c={c}: {time.monotonic() - phase:.0f} s", flush=True)

            phase = time.monotonic()
            first = alternating(
                {k: (partial(repeat, streams[k]), f) for k in names},
                f,
            )
            first_of = {k: flat(v) for k, v in first.items()}
            print(f"first output: {time.monotonic() - phase:.0f} s", flush=True)
    except BaseException:
        for name, d in daemons.items():
            print(f"--- daemon ({name}) log (tail) ---\n{d.log_tail()}", file=sys.stderr)
            d.stop()
        raise
    rcs = {name: d.stop() for name, d in daemons.items()}

    metrics: list[tuple[str, str, Callable[[str], float], bool]] = [
        ("p50", "latency p50, c=1 (ms)", lambda k: percentile(lat_of[k], 50), True),
        ("p99", "latency p99, c=1 (ms)", lambda k: percentile(lat_of[k], 99), True),
        ("tput", f"throughput, c={c} (calls/s)", lambda k: tput_of[k], False),
        ("first", "first output p50 (ms)", lambda k: percentile(first_of[k], 50), True),
        ("firstmax", "first output max (ms)", lambda k: max(first_of[k]), True),
    ]
    cols = ["t", "a", "b", "c"]
    ratio_cols = ["t", "a", "c"]
    print()
    print(
        f"{'':28}"
        + "".join(f" {'(' + k + ')':>10}" for k in cols)
        + "".join(f" {k + '/b':>6}" for k in ratio_cols)
    )
    print(f"{'metric':28}" + "".join(f" {SIDES[k][0]:>10}" for k in cols))
    ratios: dict[str, float] = {}
    for key, label, value, is_ms in metrics:
        cells, rcells = [], []
        for k in cols:
            if k in lat_of:
                v = value(k)
                cells.append(fmt_ms(v) if is_ms else f"{v:8.1f}")
            else:
                cells.append("-")
        for k in ratio_cols:
            if k in lat_of:
                r = value(k) / value("b")
                rcells.append(f"{r:6.2f}")
                if k == "t":
                    ratios[key] = r
            else:
                rcells.append("-")
        print(
            f"{label:28}"
            + "".join(f" {x:>10}" for x in cells)
            + "".join(f" {x:>6}" for x in rcells)
        )
    print(
        "ratios are side / (b): latency < 1 means faster than python -c; "
        "throughput > 1 means faster"
    )
    for k in cols:
        print(f"  ({k}) {SIDES[k][1]}", end="")
        if k == "a" and (n_a, m_a) != (n, m):
            print(f"; fewer calls: {n_a} serial, {m_a} at c={c} (a sandbox start per call)", end="")
        if k == "c" and k not in lat_of:
            print(f"; skipped: {bw_skip}", end="")
        print()

    print("\ntargets (issue 3: ratio (t) tooljail / (b) python -c, in this run):")
    for key, label, op, bound in TARGETS:
        r = ratios[key]
        met = r <= bound if op == "<=" else r >= bound
        text = label.format(n=n, m=m, c=c, f=f)
        print(f"  {text:42} {op} {bound:4.2f}  measured {r:5.2f}  {'MET' if met else 'MISSED'}")
    if (n, m, c) != (200, 500, 8):
        print("  (the issue's counts are 200 and 500 at concurrency 8; this run's differ)")

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
                    for _ in range(args.warmup):
                        baseline_call()
                        tooljail_call(client)
                    lat = alternating(
                        {
                            "b": (lambda k: serial_latencies(baseline_call, k), n),
                            "t": (partial(serial_latencies, partial(tooljail_call, client)), n),
                        },
                        serial_rounds,
                    )
                sb, st = flat(lat["b"]), flat(lat["t"])
                tb, tt = throughput_pair(d.target, m, c, conc_rounds)
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
        f"\ndaemon exit codes: (t) {rcs['t']}, (a) {rcs['a']}; "
        f"total {time.monotonic() - t_start:.0f} s "
        f"({SETTLED[0]:.0f} s of it waiting for quiet CPUs between blocks)"
    )
    if any(rc != 0 for rc in rcs.values()):
        print("warning: a daemon did not exit 0 on SIGTERM", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
