"""What one node carries: calls per second, sandbox and session memory, the daemon's own.

    .venv/bin/python bench/bench_capacity.py            # full: 400 calls per level (~3 min idle)
    .venv/bin/python bench/bench_capacity.py --quick    # smoke test: 60 calls per level
    .venv/bin/python bench/bench_capacity.py --json     # the JSON on stdout, the table on stderr

Measured through real daemons (`python -m tooljaild serve` on a private Unix
socket, started and stopped as bench_calls.py does, with its helpers):

- **rate**: `execute_python_code` `print(1)` from C threads (a `Client` each)
  at C = 1, 2, 4, 8, with the warm pool (default size 4): calls per second of
  wall time and each call's latency (its service time as a caller sees it:
  p50/p90/p99). The baseline, in alternating blocks of the same run: a fresh
  bare interpreter per call (`subprocess.run([python, "-c", "print(1)"])`, the
  interpreter the sandboxes run) at the same C.
- **CPU per call**: CPU time of the daemon's whole process tree over each
  level (the pool's refills included) plus the clients' (this process, in
  tooljail's blocks), per call; the same for the baseline (the interpreters it
  reaped). On a loaded host wall-time rates fall with the CPU share the bench
  gets; CPU per call, and so calls per core-second, moves much less.
- **memory**: PSS (proportional set size: each shared page divided among the
  processes that map it; psutil's `memory_full_info`, from /proc/PID/smaps) of
  the daemon's whole process tree (daemon, zygote, sandboxes), with USS and RSS
  beside it. An idle warm sandbox costs the difference between two idle daemons
  whose pools differ by `--pool-extra` sandboxes, divided by that; an idle
  session the difference made by opening `--sessions` sessions (each `x = 0`,
  then idle, the pool refilled), divided by their number. PSS is the honest
  sum: RSS counts the zygote's shared pages once per sandbox.
- **the daemon's own**: its RSS and PSS idle, and after the rate runs.

The load average is recorded at the start, before each level and at the end:
on a shared machine it says how much of the CPUs the figures had. The table
goes to stdout (stderr with --json); the JSON goes to
bench/results/capacity-<host>.json (or stdout with --json), where
bench/sim_fleet.py reads it. See bench/README.md and docs/scaling.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from tooljail import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import (  # the same harness and helpers as the other benchmarks
    DEFAULT_POOL_SIZE,
    Caller,
    Daemon,
    alternating,
    command_call,
    concurrent_run,
    doctor_report,
    percentile,
    sandbox_python,
    settle,
    shared_caller,
    tooljail_call,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MIB = 2**20
GIB = 2**30


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------- rate


def timed_tooljail_caller(target: str, sink: list[float]) -> Caller:
    """Each thread gets a `Client` of its own; every call's seconds go to `sink`."""

    def make() -> tuple[Callable[[], None], Callable[[], None]]:
        client = Client(target)

        def call() -> None:
            t0 = time.perf_counter()
            tooljail_call(client)
            sink.append(time.perf_counter() - t0)  # list.append is atomic under the GIL

        return call, client.close

    return make


def tree_cpu(pid: int) -> float:
    """CPU seconds used by `pid` and every process under it, and by the children
    they reaped (a used sandbox's time is in its reaper's once it is gone)."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def reaped_cpu() -> float:
    """CPU seconds of this process's reaped children (the bare interpreters)."""
    t = os.times()
    return t.children_user + t.children_system


def metered(run: Callable[[int], float], sink: list[float], extra: Callable[[], float]) -> Any:
    """`run`, adding the CPU seconds this process (and `extra`) used in it to `sink`."""

    def go(k: int) -> float:
        c0 = time.process_time() + extra()
        out = run(k)
        sink[0] += time.process_time() + extra() - c0
        return out

    return go


def measure_level(d: Daemon, bare: list[str], c: int, m: int, rounds: int) -> dict[str, Any]:
    """M calls at concurrency C through tooljail and through a bare interpreter, alternated.

    Beside the wall-time rates, the CPU each call costs: for tooljail the
    daemon's process tree (daemon, zygote, sandboxes, the pool's refills) over
    the whole level plus this process (the clients) in tooljail's blocks; for
    the baseline the interpreters it reaped plus this process in its blocks.
    CPU per call hardly moves with the machine's load, where wall time does.
    """
    load = loadavg()
    latencies: list[float] = []
    client_cpu, bare_cpu = [0.0], [0.0]
    daemon_cpu = tree_cpu(d.process.pid)
    res = alternating(
        {
            "t": (
                metered(
                    lambda k: concurrent_run(timed_tooljail_caller(d.target, latencies), k, c),
                    client_cpu,
                    lambda: 0.0,
                ),
                m,
            ),
            "b": (
                metered(
                    lambda k: concurrent_run(shared_caller(partial(command_call, bare)), k, c),
                    bare_cpu,
                    reaped_cpu,
                ),
                m,
            ),
        },
        rounds,
    )
    settle()  # the pool's last refills are tooljail's CPU too
    daemon_cpu = tree_cpu(d.process.pid) - daemon_cpu
    rate, bare_rate = m / sum(res["t"]), m / sum(res["b"])
    ms = sorted(x * 1000 for x in latencies)
    cpu_ms = (daemon_cpu + client_cpu[0]) / m * 1000
    return {
        "concurrency": c,
        "calls": m,
        "calls_per_s": rate,
        "bare_calls_per_s": bare_rate,
        "ratio_to_bare": rate / bare_rate,
        "cpu_ms_per_call": cpu_ms,
        "daemon_cpu_ms_per_call": daemon_cpu / m * 1000,
        "client_cpu_ms_per_call": client_cpu[0] / m * 1000,
        "bare_cpu_ms_per_call": bare_cpu[0] / m * 1000,
        "calls_per_core_s": 1000 / cpu_ms,
        "bare_calls_per_core_s": m / bare_cpu[0],
        "mean_ms": sum(ms) / len(ms),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "loadavg_before": load,
        "samples_ms": [round(x, 3) for x in ms],
    }


# --------------------------------------------------------------------------- memory


def tree_memory(pid: int) -> dict[str, int]:
    """PSS, USS and RSS summed over `pid` and every process under it, and their count."""
    total = {"pss": 0, "uss": 0, "rss": 0, "processes": 0}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            info = proc.memory_full_info()
            total["pss"] += info.pss
            total["uss"] += info.uss
            total["rss"] += info.rss
            total["processes"] += 1
    return total


def quiet_tree(pid: int, steady_s: float = 2.0, timeout_s: float = 60.0) -> dict[str, int]:
    """The tree's memory once its processes stopped coming and going for `steady_s`
    (the pool has refilled, used sandboxes are gone) and the CPUs are quiet."""
    deadline = time.monotonic() + timeout_s
    last: set[int] = set()
    since = time.monotonic()
    while time.monotonic() < deadline:
        root = psutil.Process(pid)
        now = {root.pid, *(p.pid for p in root.children(recursive=True))}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= steady_s:
            break
        time.sleep(0.2)
    settle()
    return tree_memory(pid)


def own_memory(pid: int) -> dict[str, int]:
    info = psutil.Process(pid).memory_full_info()
    return {"rss": info.rss, "pss": info.pss, "uss": info.uss}


@contextlib.contextmanager
def daemon(pool_size: int) -> Iterator[Daemon]:
    d = Daemon(pool_size)
    try:
        yield d
    finally:
        d.stop()


def measure_memory(pool_size: int, extra: int, sessions: int) -> dict[str, Any]:
    """Idle warm sandbox and idle session, as differences between quiet process trees."""
    with daemon(pool_size + extra) as big:
        with Client(big.target) as client:
            tooljail_call(client)  # the zygote and the pool are up and used once
        more = quiet_tree(big.process.pid)
    with daemon(pool_size) as small:
        with Client(small.target) as client:
            tooljail_call(client)
        base = quiet_tree(small.process.pid)
        daemon_idle = own_memory(small.process.pid)
        with Client(small.target) as client:
            opened = []
            for _ in range(sessions):
                s = client.session()
                result = s.call("execute_python_code", {"code": "x = 0"})
                if not result.ok:
                    raise RuntimeError(f"session call failed: {result!r}")
                opened.append(s)
            with_sessions = quiet_tree(small.process.pid)
            for s in opened:
                s.close()
    sandbox = (more["pss"] - base["pss"]) / extra
    session = (with_sessions["pss"] - base["pss"]) / sessions
    return {
        "method": "PSS (psutil memory_full_info, /proc/PID/smaps) summed over the daemon's "
        "process tree; per item = difference between quiet trees / count",
        "pool_size": pool_size,
        "pool_extra": extra,
        "sessions": sessions,
        "tree_base": base,
        "tree_more_pool": more,
        "tree_with_sessions": with_sessions,
        "warm_sandbox_pss_bytes": sandbox,
        "warm_sandbox_rss_bytes": (more["rss"] - base["rss"]) / extra,
        "warm_sandbox_uss_bytes": (more["uss"] - base["uss"]) / extra,
        "session_pss_bytes": session,
        "session_rss_bytes": (with_sessions["rss"] - base["rss"]) / sessions,
        "session_uss_bytes": (with_sessions["uss"] - base["uss"]) / sessions,
        "warm_sandboxes_per_gib": GIB / sandbox,
        "sessions_per_gib": GIB / session,
        "daemon_idle": daemon_idle,
    }


# --------------------------------------------------------------------------- report


def host_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_total_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def print_report(got: dict[str, Any], out: Any) -> None:
    def say(line: str = "") -> None:
        print(line, file=out)

    say(
        f"host {got['host']}: {got['cpus']} CPUs ({got['cpu_model']}), "
        f"{got['mem_total_bytes'] / GIB:.1f} GiB, kernel {got['kernel']}; load average "
        f"{got['loadavg_start']} at the start, {got['loadavg_end']} at the end"
    )
    say(f"pool size {got['pool_size']}; baseline: {got['bare_python']} -c print(1) per call")
    say()
    say(
        "  C | tooljail/s | p50 ms | p90 ms | p99 ms | bare py/s | ratio | CPU ms/call "
        "| per core-s | bare per core-s | load 1m"
    )
    for r in got["throughput"]:
        say(
            f"{r['concurrency']:3d} | {r['calls_per_s']:10.0f} | {r['p50_ms']:6.1f} | "
            f"{r['p90_ms']:6.1f} | {r['p99_ms']:6.1f} | {r['bare_calls_per_s']:9.0f} | "
            f"{r['ratio_to_bare']:5.2f} | {r['cpu_ms_per_call']:11.2f} | "
            f"{r['calls_per_core_s']:10.0f} | {r['bare_calls_per_core_s']:15.0f} | "
            f"{r['loadavg_before'][0]:7.2f}"
        )
    say(
        "(CPU ms/call: daemon, zygote, sandboxes and the clients; per core-s: calls one "
        "core carries when the CPU is the limit)"
    )
    mem = got["memory"]
    say()
    say(
        f"idle warm sandbox: {mem['warm_sandbox_pss_bytes'] / MIB:.2f} MiB PSS "
        f"(USS {mem['warm_sandbox_uss_bytes'] / MIB:.2f}, RSS "
        f"{mem['warm_sandbox_rss_bytes'] / MIB:.2f}) -> "
        f"{mem['warm_sandboxes_per_gib']:.0f} per GiB"
    )
    say(
        f"idle session:      {mem['session_pss_bytes'] / MIB:.2f} MiB PSS "
        f"(USS {mem['session_uss_bytes'] / MIB:.2f}, RSS {mem['session_rss_bytes'] / MIB:.2f}) "
        f"-> {mem['sessions_per_gib']:.0f} per GiB"
    )
    idle, busy = mem["daemon_idle"], got["daemon_after_load"]
    say(
        f"daemon itself:     {idle['rss'] / MIB:.1f} MiB RSS idle ({idle['pss'] / MIB:.1f} PSS), "
        f"{busy['rss'] / MIB:.1f} MiB RSS after the rate runs"
    )
    say(f"({mem['method']})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,2,4,8", help="concurrencies to measure")
    ap.add_argument("--calls", type=int, help="calls per level and side (default 400; quick 60)")
    ap.add_argument("--rounds", type=int, help="alternating blocks per level (default 4; quick 2)")
    ap.add_argument("--warmup", type=int, default=20, help="serial warm-up calls")
    ap.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    ap.add_argument("--pool-extra", type=int, default=16, help="sandboxes the bigger pool adds")
    ap.add_argument("--sessions", type=int, default=8, help="idle sessions to open")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--json", action="store_true", help="the JSON on stdout (no file)")
    ap.add_argument("--out", help="the JSON's path (default bench/results/capacity-HOST.json)")
    args = ap.parse_args(argv)
    args.m = args.calls or (60 if args.quick else 400)
    args.r = args.rounds or (2 if args.quick else 4)
    args.levels = [int(x) for x in args.levels.split(",")]
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    report = sys.stderr if args.json else sys.stdout
    got: dict[str, Any] = host_info() | {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": loadavg(),
        "pool_size": args.pool_size,
        "doctor": doctor_report(),
    }
    print("\n".join(got["doctor"]), file=report, flush=True)
    with daemon(args.pool_size) as d:
        with Client(d.target) as client:
            bare = sandbox_python(client)
            for _ in range(args.warmup):
                tooljail_call(client)
        got["bare_python"] = bare
        concurrent_run(timed_tooljail_caller(d.target, []), 16, 8)
        got["throughput"] = []
        for c in args.levels:
            row = measure_level(d, [bare], c, args.m, args.r)
            got["throughput"].append(row)
            print(
                f"C={c}: {row['calls_per_s']:.0f} calls/s, p50 {row['p50_ms']:.1f} ms",
                file=report,
                flush=True,
            )
        settle()
        got["daemon_after_load"] = own_memory(d.process.pid)
    got["memory"] = measure_memory(args.pool_size, args.pool_extra, args.sessions)
    got["loadavg_end"] = loadavg()
    print_report(got, report)
    return got


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    got = run(args)
    if args.json:
        print(json.dumps(got, indent=1))
        return 0
    path = Path(args.out) if args.out else RESULTS_DIR / f"capacity-{got['host']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(got, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
