"""Where each millisecond and each CPU millisecond of one `print(1)` call goes.

    .venv/bin/python bench/bench_stages.py                # full: 200 calls per side
    .venv/bin/python bench/bench_stages.py --quick        # smoke test: 30 calls per side
    .venv/bin/python bench/bench_stages.py --projection   # + calls/s pinned to 1 and 2 cores

One daemon (`python -m tooljaild serve`, pool 4, on a Unix socket, as
bench_calls.py starts it) with `--metrics-listen` on a free local port: the
stages come from the daemon's own clocks, read back from its Prometheus
counters before and after each block (nothing is added to the call path):

- **e2e**: the caller's wall time of `Client.call("execute_python_code", ...)`.
- **run** (`ToolResult.duration_s`, per call): from the request sent into the
  sandbox's pipe (`Call.started_at`) to the result built: the worker's run, its
  output and the result read back.
- **outside the run** (e2e - run, per call): gRPC in and out, admission, the
  answer, the client's SDK; of which **queue wait** (admission to start,
  `tooljail_call_queue_wait_seconds`, a mean) and the journal's writes
  (`tooljail_journal_write_seconds`, a mean per call; the ones after the answer
  are off its path but on the loop's).
- **worker CPU** (`usage.cpu_s`, per call, from the sandbox's cgroup).
- **refill** (`tooljail_sandbox_start_seconds` over `_starts`): the zygote's
  clone and namespace set-up of the sandbox that replaces a used one, off the
  call's path. The teardown has no clock of its own: it is in the sandboxes' CPU.

CPU per call, over each block: the daemon's own process (psutil `cpu_times` of
its pid: every thread, no child), the sandboxes (the rest of its process tree:
zygote, sandboxes, reaped children) and the client (this process). Beside them
the floors, in alternating blocks of the same run: a bare `python3 -c`, a fork
of a warm interpreter running the same code (its CPU too), a gRPC echo over a
Unix socket (bench_sessions.py's). `--projection` measures calls/s at
concurrency 8 with the daemon's threads pinned to one core and to two (the
zygote and sandboxes free), and projects what one daemon drives on 16 and 64
cores: min(1 / daemon CPU per call, cores / CPU per call of daemon + sandboxes).
The last line is a JSON summary. Exits 0 whether or not anything is fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from tooljail import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import (  # the same harness and helpers as the other benchmarks
    CODE,
    Daemon,
    command_call,
    concurrent_run,
    percentile,
    sandbox_python,
    settle,
    tooljail_caller,
)
from bench_sessions import EchoChannel, EchoServer, open_session

TOOL = "execute_python_code"
FORK_SERVER = r"""
import os, sys
code = compile(sys.argv[1], "<call>", "exec")
out = sys.stdout.buffer
for _ in sys.stdin.buffer:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        exec(code)
        sys.stdout.flush()
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out.write(data)
    out.flush()
"""
METRICS = {
    "run": "tooljail_call_duration_seconds",
    "queue": "tooljail_call_queue_wait_seconds",
    "journal": "tooljail_journal_write_seconds",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The daemon's counters, summed over labels: `<name>_sum`, `_count`, `_total`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    got: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        key = name.split("{", 1)[0]
        got[key] = got.get(key, 0.0) + float(value)
    return got


def own_cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def loop_cpu(pid: int) -> float:
    """CPU seconds of `pid`'s main thread: the daemon's event loop (grpc-core's
    threads and the executor's run beside it, in parallel)."""
    for thread in psutil.Process(pid).threads():
        if thread.id == pid:
            return float(thread.user_time + thread.system_time)
    return 0.0


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid`, every process under it and the children they reaped."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class ForkServer:
    """A warm interpreter that forks a child per request to run CODE (the floor)."""

    def __init__(self, python: str) -> None:
        self.process = subprocess.Popen(
            [python, "-c", FORK_SERVER, CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def call(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()
        if self.process.stdout.readline() != b"1\n":
            raise RuntimeError("the fork server did not print 1")

    def cpu(self) -> float:
        return tree_cpu(self.process.pid)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


class Block:
    """N timed calls back to back, with the CPU of this process and of `cpu_of`."""

    def __init__(self, call: Callable[[], Any], cpu_of: Callable[[], float] | None) -> None:
        self.call, self.cpu_of = call, cpu_of
        self.e2e: list[float] = []
        self.results: list[Any] = []
        self.cpu = self.client_cpu = 0.0
        self.settle_after = False

    def run(self, n: int) -> None:
        settle()
        c0, p0 = self.cpu_of() if self.cpu_of else 0.0, time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            out = self.call()
            self.e2e.append(time.perf_counter() - t0)
            self.results.append(out)
        self.client_cpu += time.process_time() - p0
        if self.settle_after:  # the refill of the last calls' sandboxes is this block's
            settle()
        self.cpu += (self.cpu_of() if self.cpu_of else 0.0) - c0


class TooljailBlock(Block):
    """Calls through the daemon; also its own CPU and its counters' deltas."""

    def __init__(self, call: Callable[[], Any], pid: int, port: int) -> None:
        super().__init__(call, lambda: tree_cpu(pid))
        self.pid, self.port = pid, port
        self.daemon_cpu = self.loop_cpu = 0.0
        self.metrics: dict[str, float] = {}
        self.settle_after = True

    def run(self, n: int) -> None:
        d0, l0, m0 = own_cpu(self.pid), loop_cpu(self.pid), scrape(self.port)
        super().run(n)
        self.daemon_cpu += own_cpu(self.pid) - d0
        self.loop_cpu += loop_cpu(self.pid) - l0
        for key, value in scrape(self.port).items():
            self.metrics[key] = self.metrics.get(key, 0.0) + value - m0.get(key, 0.0)


def ms(s: float) -> float:
    return round(s * 1000, 3)


def p50(xs: list[float]) -> float:
    return percentile(xs, 50) if xs else 0.0


def stages(block: TooljailBlock) -> dict[str, float]:
    """The per-stage figures of a tooljail block, in ms (per call)."""
    n = len(block.e2e)
    m = block.metrics
    runs = [r.duration_s for r in block.results]
    cpu = [r.usage.cpu_s for r in block.results if r.usage is not None]

    def mean(key: str) -> float:
        count = m.get(f"{METRICS[key]}_count", 0.0)
        return m.get(f"{METRICS[key]}_sum", 0.0) / count if count else 0.0

    starts = m.get("tooljail_sandbox_starts_total", 0.0)
    return {
        "e2e_p50_ms": ms(p50(block.e2e)),
        "outside_run_p50_ms": ms(p50([e - r for e, r in zip(block.e2e, runs, strict=True)])),
        "queue_wait_mean_ms": ms(mean("queue")),
        "journal_ms_per_call": ms(m.get(f"{METRICS['journal']}_sum", 0.0) / n),
        "journal_writes_per_call": round(m.get(f"{METRICS['journal']}_count", 0.0) / n, 2),
        "run_p50_ms": ms(p50(runs)),
        "worker_cpu_p50_ms": ms(p50(cpu)),
        "refill_mean_ms": ms(m.get("tooljail_sandbox_start_seconds_total", 0.0) / starts)
        if starts
        else 0.0,
        "refills_per_call": round(starts / n, 2),
        "daemon_cpu_ms_per_call": ms(block.daemon_cpu / n),
        "loop_cpu_ms_per_call": ms(block.loop_cpu / n),
        "sandboxes_cpu_ms_per_call": ms((block.cpu - block.daemon_cpu) / n),
        "client_cpu_ms_per_call": ms(block.client_cpu / n),
    }


@contextlib.contextmanager
def daemon_with_metrics(log_level: str) -> Iterator[tuple[Daemon, int]]:
    port = free_port()
    # The last --log-level wins: Daemon passes WARNING, as the other benches run.
    d = Daemon(4, "--metrics-listen", f"127.0.0.1:{port}", "--log-level", log_level)
    try:
        yield d, port
    finally:
        d.stop()


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of `pid` (not its children) to `cpus`."""
    for thread in psutil.Process(pid).threads():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(thread.id, cpus)


def projection(d: Daemon, port: int, m: int, rounds: int) -> dict[str, Any]:
    """Calls/s at concurrency 8 with the daemon pinned to 1 core, then 2, alternated."""
    pid = d.process.pid
    cores = sorted(os.sched_getaffinity(0))
    got: dict[str, Any] = {}
    for _ in range(rounds):
        for k in (1, 2):
            use = set(cores[:k])
            pin(pid, use)
            settle()
            d0, l0, t0 = own_cpu(pid), loop_cpu(pid), tree_cpu(pid)
            w0 = time.perf_counter()
            concurrent_run(tooljail_caller(d.target), m, 8)
            wall = time.perf_counter() - w0
            settle()
            row = got.setdefault(
                f"{k}_core", {"calls": 0, "wall": 0.0, "own": 0.0, "loop": 0.0, "tree": 0.0}
            )
            row["calls"] += m
            row["wall"] += wall
            row["own"] += own_cpu(pid) - d0
            row["loop"] += loop_cpu(pid) - l0
            row["tree"] += tree_cpu(pid) - t0
    pin(pid, set(cores))
    out: dict[str, Any] = {}
    for key, row in got.items():
        own, rest = row["own"] / row["calls"], (row["tree"] - row["own"]) / row["calls"]
        out[key] = {
            "calls_per_s": round(row["calls"] / row["wall"], 1),
            "daemon_cpu_ms_per_call": ms(own),
            "loop_cpu_ms_per_call": ms(row["loop"] / row["calls"]),
            "sandboxes_cpu_ms_per_call": ms(rest),
            # How busy the loop's core was: near 1, the loop set the rate; far below,
            # the sandboxes' cores (or the machine's other work) did.
            "loop_core_busy": round(row["loop"] / row["wall"], 2),
        }
    # The projection uses the 2-core run's CPU per call (the less starved one).
    # One event loop runs on one core at a time: its thread's CPU per call is the
    # ceiling (grpc-core's threads run beside it); every core pays daemon + sandboxes.
    own = out["2_core"]["daemon_cpu_ms_per_call"] / 1000
    loop = out["2_core"]["loop_cpu_ms_per_call"] / 1000
    rest = out["2_core"]["sandboxes_cpu_ms_per_call"] / 1000
    loop_ceiling = 1 / loop if loop else float("inf")
    for n_cores in (16, 64):
        by_cores = n_cores / (own + rest)
        out[f"{n_cores}_cores"] = {
            "loop_ceiling_calls_per_s": round(loop_ceiling),
            "cores_ceiling_calls_per_s": round(by_cores),
            "projected_calls_per_s": round(min(loop_ceiling, by_cores)),
            "bound_by": "the daemon's event loop" if loop_ceiling < by_cores else "the cores",
        }
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    n, rounds = args.calls, args.rounds
    block_n = max(1, n // rounds)
    got: dict[str, Any] = {"calls": block_n * rounds, "loadavg_start": os.getloadavg()}
    got["log_level"] = args.log_level
    with daemon_with_metrics(args.log_level) as (d, port), Client(d.target) as client:
        python = sandbox_python(client)
        got["python"] = python
        pid = d.process.pid
        session = open_session(client)
        echo_server = EchoServer()
        echo = EchoChannel(echo_server.target, b"x" * 64)
        fork = ForkServer(python)
        try:
            fresh = TooljailBlock(lambda: client.call(TOOL, {"code": CODE}), pid, port)
            warm = TooljailBlock(lambda: session.call(TOOL, {"code": CODE}), pid, port)
            bare = Block(lambda: command_call([python]), reaped_cpu)
            forked = Block(fork.call, fork.cpu)
            grpc_echo = Block(echo.call, None)
            sides = [fresh, warm, bare, forked, grpc_echo]
            for side in sides:  # warm-up, not counted
                for _ in range(args.warmup):
                    side.call()
            for r in range(rounds):
                for side in sides if r % 2 == 0 else sides[::-1]:
                    side.run(block_n)
            got["fresh"], got["session"] = stages(fresh), stages(warm)
            got["floors"] = {
                "bare_python_p50_ms": ms(p50(bare.e2e)),
                "bare_python_cpu_ms_per_call": ms(bare.cpu / len(bare.e2e)),
                "fork_p50_ms": ms(p50(forked.e2e)),
                "fork_cpu_ms_per_call": ms(forked.cpu / len(forked.e2e)),
                "grpc_echo_p50_ms": ms(p50(grpc_echo.e2e)),
            }
            if args.projection:
                got["projection"] = projection(d, port, args.concurrent_calls, rounds)
        finally:
            fork.close()
            echo.close()
            echo_server.stop()
            session.close()
    got["loadavg_end"] = os.getloadavg()
    return got


def reaped_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def report(got: dict[str, Any]) -> None:
    f, s, fl = got["fresh"], got["session"], got["floors"]
    print(f"{got['calls']} calls per side; sandbox python {got['python']}; log {got['log_level']}")
    print(f"load average {got['loadavg_start']} -> {got['loadavg_end']}")
    print()
    print(f"{'stage (ms, per call)':<58} {'fresh':>9} {'session':>9}")
    rows = [
        ("outside the run, p50 (gRPC, admission, answer, SDK)", "outside_run_p50_ms"),
        ("  of which queue wait, mean (admission to start)", "queue_wait_mean_ms"),
        ("  journal writes, mean ms per call", "journal_ms_per_call"),
        ("  journal writes per call", "journal_writes_per_call"),
        ("run, p50 (request in, worker, result out)", "run_p50_ms"),
        ("  of which worker CPU, p50 (cgroup)", "worker_cpu_p50_ms"),
        ("refill, mean (clone + namespaces, off the path)", "refill_mean_ms"),
        ("  refills per call", "refills_per_call"),
    ]
    for label, key in rows:
        print(f"{label:<58} {f[key]:>9} {s[key]:>9}")
    for side in (f, s):
        side["sum_p50_ms"] = round(side["outside_run_p50_ms"] + side["run_p50_ms"], 3)
    print(f"{'sum: outside + run (p50s)':<58} {f['sum_p50_ms']:>9} {s['sum_p50_ms']:>9}")
    print(f"{'end to end, p50':<58} {f['e2e_p50_ms']:>9} {s['e2e_p50_ms']:>9}")
    print()
    print(f"{'CPU (ms per call)':<58} {'fresh':>9} {'session':>9}")
    for label, key in [
        ("daemon process (its pid alone)", "daemon_cpu_ms_per_call"),
        ("  of which its event loop (main thread)", "loop_cpu_ms_per_call"),
        ("sandboxes (zygote tree, refill, teardown)", "sandboxes_cpu_ms_per_call"),
        ("client (this process)", "client_cpu_ms_per_call"),
    ]:
        print(f"{label:<58} {f[key]:>9} {s[key]:>9}")
    total = [
        round(
            x["daemon_cpu_ms_per_call"]
            + x["sandboxes_cpu_ms_per_call"]
            + x["client_cpu_ms_per_call"],
            3,
        )
        for x in (f, s)
    ]
    print(f"{'total':<58} {total[0]:>9} {total[1]:>9}")
    print()
    print("floors, same run:")
    print(
        f"  bare python3 -c: p50 {fl['bare_python_p50_ms']} ms, "
        f"CPU {fl['bare_python_cpu_ms_per_call']} ms"
    )
    print(
        f"  fork of a warm interpreter: p50 {fl['fork_p50_ms']} ms, "
        f"CPU {fl['fork_cpu_ms_per_call']} ms (fresh total / fork: "
        f"{total[0] / max(fl['fork_cpu_ms_per_call'], 1e-9):.1f}x)"
    )
    print(
        f"  gRPC echo (Unix socket): p50 {fl['grpc_echo_p50_ms']} ms "
        f"(session e2e / echo: {s['e2e_p50_ms'] / max(fl['grpc_echo_p50_ms'], 1e-9):.1f}x)"
    )
    proj = got.get("projection")
    if proj:
        print()
        print("projection (fresh calls, concurrency 8, daemon's threads pinned):")
        for k in ("1_core", "2_core"):
            r = proj[k]
            print(
                f"  daemon on {k[0]} core(s): {r['calls_per_s']} calls/s, daemon CPU "
                f"{r['daemon_cpu_ms_per_call']} ms/call (loop {r['loop_cpu_ms_per_call']}), "
                f"sandboxes {r['sandboxes_cpu_ms_per_call']} ms/call; "
                f"loop's core {100 * r['loop_core_busy']:.0f} % busy"
            )
        for k in ("16_cores", "64_cores"):
            r = proj[k]
            print(
                f"  {k.replace('_', ' ')}: {r['projected_calls_per_s']} calls/s "
                f"(loop ceiling {r['loop_ceiling_calls_per_s']}, cores "
                f"{r['cores_ceiling_calls_per_s']}; bound by {r['bound_by']})"
            )
    print()
    print(json.dumps(got, sort_keys=True))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="30 calls per side, 2 rounds")
    p.add_argument("--calls", type=int, help="calls per side (200; --quick 30)")
    p.add_argument("--concurrent-calls", type=int, help="per projection block (200; 40)")
    p.add_argument("--rounds", type=int, help="alternating rounds (4; 2)")
    p.add_argument("--warmup", type=int, help="calls per side before measuring (10; 3)")
    p.add_argument("--projection", action="store_true", help="calls/s pinned to 1 and 2 cores")
    p.add_argument(
        "--log-level",
        default="WARNING",
        help="the daemon's (WARNING, as the other benches; INFO is the daemon's default)",
    )
    args = p.parse_args(argv)
    # --quick changes the defaults; a count given explicitly wins over both.
    defaults = (30, 40, 2, 3) if args.quick else (200, 200, 4, 10)
    for name, value in zip(
        ("calls", "concurrent_calls", "rounds", "warmup"), defaults, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    report(measure(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
