"""The docker backend with its warm pool vs. `docker run --rm` and `docker exec`, per call.

    .venv/bin/python bench/bench_docker.py           # full run (N=60, M=96, ~2 min)
    .venv/bin/python bench/bench_docker.py --quick   # smoke test (N=15, M=24)

Three sides, all measured in the same run (issue 4, section 8), all running
`print(1)` with python3 in the same image, under the same limits:

tooljail (t): `execute_python_code("print(1)")` through a daemon this script
starts with `--backend docker` (`python -m tooljaild serve`, private Unix
socket, warm pool of containers) and stops (SIGTERM).
docker run (r): `docker run --rm <limits> IMAGE python3 -c 'print(1)'` per call:
a fresh container per call, as without a pool.
docker exec (e): `docker exec CID python3 -c 'print(1)'` into one container
started once (same image and limits), as with a warm container but no runner
waiting in it.

The limits and hardening of (r) and (e) are those the daemon gives its
containers: memory (swap included), pids, CPUs, no network, read-only root with
a size-capped tmpfs /tmp, uid 65534, every capability dropped, no-new-privileges
and the daemon's own seccomp profile.

Measured as bench_calls.py does: alternating blocks (t r e, e r t, ...) with a
pause until the CPUs are quiet before each block, so that machine noise falls on
every side and no side's background work (the pool refilling, containers being
removed) is billed to another. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tooljail import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import (  # the same harness and helpers as the process benchmark
    SETTLED,
    Caller,
    Daemon,
    alternating,
    concurrent_run,
    flat,
    fmt_ms,
    percentile,
    rounds_for,
    serial_latencies,
    settle,
    shared_caller,
    timed,
    tooljail_call,
    tooljail_caller,
)

from tooljaild.sandbox.docker_seccomp import profile_json
from tooljaild.settings.sandbox import DEFAULT_IMAGE, Limits

CODE = "print(1)"
DEFAULT_POOL_SIZE = 4
LABEL = "org.tooljail.bench"  # on (r) and (e) containers, so a crashed run can be swept


# --------------------------------------------------------------------------- helpers

# Containers take longer to remove than sandboxes: wait up to 5 s for quiet CPUs.
CONTAINER_SETTLE_S = 5.0


def paced_latencies(call: Callable[[], None], n: int) -> list[float]:
    """One call at a time, the CPUs quiet before each: as an agent calls between turns.

    For tooljail that means a ready container waits for every call (the pool has
    refilled); back-to-back calls (`serial_latencies`) outrun the refill instead.
    """
    out = []
    for _ in range(n):
        settle(max_wait=2.0, window=0.05)
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------- the sides


def hardening(limits: Limits, seccomp_file: Path) -> list[str]:
    """`docker run` flags for what the daemon gives its containers (docker.py)."""
    flags = [
        "--network", "none", "--read-only",
        "--tmpfs", f"/tmp:rw,exec,nosuid,nodev,size={limits.tmp_bytes},mode=1777",
        "--user", "65534:65534", "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--security-opt", f"seccomp={seccomp_file}",
        "--label", f"{LABEL}=1",
    ]  # fmt: skip
    if limits.sandbox_memory_bytes:
        mem = str(limits.sandbox_memory_bytes)
        flags += ["--memory", mem, "--memory-swap", mem]
    if limits.sandbox_pids:
        flags += ["--pids-limit", str(limits.sandbox_pids)]
    if limits.cpus:
        flags += ["--cpus", f"{limits.cpus:g}"]
    return flags


def checked(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True)
    if proc.returncode != 0 or proc.stdout != b"1\n":
        raise RuntimeError(
            f"{what} failed: {proc.returncode} {proc.stdout!r} {proc.stderr[-500:]!r}"
        )


# --------------------------------------------------------------------------- main

SIDES = {  # name: (column header, description)
    "t": ("tooljail", "tooljail --backend docker, warm pool"),
    "r": ("docker run", "docker run --rm IMAGE python3 -c, per call"),
    "e": ("docker exec", "docker exec CID python3 -c, into one warm container"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, help="N: serial calls per side (default 60; quick 15)")
    ap.add_argument(
        "--concurrent-calls", type=int, help="M: calls per side at concurrency C (default 96)"
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3, help="serial warm-up calls per side")
    ap.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    args = ap.parse_args(argv)
    n = args.calls or (15 if args.quick else 60)
    m = args.concurrent_calls or (24 if args.quick else 96)
    c = args.concurrency
    serial_rounds = rounds_for(n, max(5, n // 4))
    conc_rounds = rounds_for(m, max(c * 2, m // 4))
    docker = shutil.which("docker")
    if docker is None:
        print("error: the docker CLI is not on PATH", file=sys.stderr)
        return 2
    version = subprocess.run(
        [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    )
    if version.returncode != 0:
        print(f"error: no Docker engine answers: {version.stderr.strip()}", file=sys.stderr)
        return 3
    limits = Limits()
    print(
        f"machine: nproc={os.cpu_count()} python={platform.python_version()} "
        f"({platform.machine()}, {platform.system()} {platform.release()}) "
        f"loadavg={os.getloadavg()[0]:.2f}; Docker {version.stdout.strip()}"
    )
    print(
        f"N={n} serial calls, M={m} calls at concurrency {c}, warm-up {args.warmup}, "
        f"pool size {args.pool_size}; image {args.image}; every side: memory "
        f"{limits.sandbox_memory_bytes // 2**20} MiB, pids {limits.sandbox_pids}, "
        f"cpus {limits.cpus:g}, no network, read-only root, uid 65534, no capabilities, "
        "the daemon's seccomp profile",
        flush=True,
    )

    t_start = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="tjbench-docker-cli-"))
    seccomp = scratch / "seccomp.json"
    seccomp.write_text(profile_json())
    flags = hardening(limits, seccomp)
    run_argv = [docker, "run", "--rm", *flags, args.image, "python3", "-c", CODE]
    warm = subprocess.run(
        [docker, "run", "-d", "--rm", *flags, args.image, "python3", "-c",
         "import time; time.sleep(86400)"],
        capture_output=True, text=True,
    )  # fmt: skip
    if warm.returncode != 0:
        print(f"error: cannot start the warm container: {warm.stderr}", file=sys.stderr)
        return 1
    cid = warm.stdout.strip()
    exec_argv = [docker, "exec", cid, "python3", "-c", CODE]
    daemon: Daemon | None = None
    try:
        daemon = Daemon(
            args.pool_size,
            "--backend",
            "docker",
            env={"TOOLJAIL_DOCKER__IMAGE": args.image},
            wait_s=120.0,
        )
        print(
            f"daemon: serving after {daemon.startup_s * 1000:.0f} ms (pid {daemon.process.pid})",
            flush=True,
        )
        target = daemon.target
        with Client(target) as client:
            serial: dict[str, Callable[[], None]] = {
                "t": lambda: tooljail_call(client),
                "r": lambda: checked(run_argv, "docker run"),
                "e": lambda: checked(exec_argv, "docker exec"),
            }
            callers: dict[str, Caller] = {
                "t": tooljail_caller(target),
                "r": shared_caller(serial["r"]),
                "e": shared_caller(serial["e"]),
            }
            names = list(SIDES)

            timed("warm-up", lambda: [serial[k]() for k in names for _ in range(args.warmup)])

            def blocks(run: Callable[[str], Callable[[int], Any]], total: int, rounds: int) -> Any:
                sides = {k: (run(k), total) for k in names}
                return alternating(sides, rounds, CONTAINER_SETTLE_S)

            paced = timed(
                "latency, paced",
                lambda: blocks(lambda k: partial(paced_latencies, serial[k]), n, serial_rounds),
            )
            paced_of = {k: flat(v) for k, v in paced.items()}
            lat = timed(
                "latency, back to back",
                lambda: blocks(lambda k: partial(serial_latencies, serial[k]), n, serial_rounds),
            )
            lat_of = {k: flat(v) for k, v in lat.items()}
            conc = timed(
                f"throughput, c={c}",
                lambda: blocks(
                    lambda k: partial(concurrent_run, callers[k], concurrency=c), m, conc_rounds
                ),
            )
            tput_of = {k: m / sum(v) for k, v in conc.items()}
    except BaseException:
        if daemon is not None:
            print(f"--- daemon log (tail) ---\n{daemon.log_tail()}", file=sys.stderr)
        raise
    finally:
        rc = daemon.stop() if daemon is not None else None
        subprocess.run([docker, "rm", "-f", cid], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)

    rows: list[tuple[str, Callable[[str], float], bool]] = [
        ("latency p50, paced (ms)", lambda k: percentile(paced_of[k], 50), True),
        ("latency p99, paced (ms)", lambda k: percentile(paced_of[k], 99), True),
        ("latency p50, back to back (ms)", lambda k: percentile(lat_of[k], 50), True),
        ("latency p99, back to back (ms)", lambda k: percentile(lat_of[k], 99), True),
        (f"throughput, c={c} (calls/s)", lambda k: tput_of[k], False),
    ]
    print()
    print(f"{'':31}" + "".join(f" {'(' + k + ')':>12}" for k in SIDES) + f" {'t/e':>6} {'t/r':>6}")
    print(f"{'metric':31}" + "".join(f" {SIDES[k][0]:>12}" for k in SIDES))
    for label, value, is_ms in rows:
        cells = [fmt_ms(value(k)) if is_ms else f"{value(k):8.1f}" for k in SIDES]
        ratios = [value("t") / value("e"), value("t") / value("r")]
        print(
            f"{label:31}"
            + "".join(f" {x:>12}" for x in cells)
            + "".join(f" {r:6.3f}" for r in ratios)
        )
    for k, (_, description) in SIDES.items():
        print(f"  ({k}) {description}")

    def paced_p50(k: str) -> float:
        return percentile(paced_of[k], 50)

    def b2b_p50(k: str) -> float:
        return percentile(lat_of[k], 50)

    p50_ratio = paced_p50("t") / paced_p50("e")
    b2b_ratio = b2b_p50("t") / b2b_p50("e")
    tput_ratio = tput_of["t"] / tput_of["r"]
    print("\ntargets (issue 4, in this run):")
    checks = (
        ("p50 round trip (paced), (t) / (e) docker exec", "<=", 0.10, p50_ratio),
        (f"sustained rate at c={c}, (t) / (r) docker run", ">=", 1.0, tput_ratio),
    )
    for label, op, bound, measured in checks:
        met = measured <= bound if op == "<=" else measured >= bound
        verdict = "MET" if met else "MISSED"
        print(f"  {label:46} {op} {bound:4.2f}  measured {measured:6.3f}  {verdict}")
    ms = 1000.0
    print(
        "\nheadline (quote the three together; only the first finds a container waiting):\n"
        f"  one call, a warm container waiting (paced)  p50 {paced_p50('t') * ms:6.1f} ms"
        f"  (docker exec {paced_p50('e') * ms:.0f} ms, docker run {paced_p50('r') * ms:.0f} ms)\n"
        f"  back to back at c=1 (outruns the refill)    p50 {b2b_p50('t') * ms:6.1f} ms"
        f"  (p99 {percentile(lat_of['t'], 99) * ms:.0f} ms; (t)/(e) {b2b_ratio:.2f})\n"
        f"  at c={c} (the refill, a container start each) {tput_of['t']:6.1f} calls/s"
        f"  (docker run {tput_of['r']:.1f}/s, docker exec {tput_of['e']:.1f}/s)"
    )
    summary = {
        "paced_p50_ms": {k: round(percentile(paced_of[k], 50) * 1000, 2) for k in SIDES},
        "paced_p99_ms": {k: round(percentile(paced_of[k], 99) * 1000, 2) for k in SIDES},
        "p50_ms": {k: round(percentile(lat_of[k], 50) * 1000, 2) for k in SIDES},
        "p99_ms": {k: round(percentile(lat_of[k], 99) * 1000, 2) for k in SIDES},
        "throughput": {k: round(tput_of[k], 2) for k in SIDES},
    }
    print(f"\njson: {json.dumps(summary)}")
    print(
        f"daemon exit code: {rc}; total {time.monotonic() - t_start:.0f} s "
        f"({SETTLED[0]:.0f} s of it waiting for quiet CPUs between blocks)"
    )
    if rc != 0:
        print("warning: the daemon did not exit 0 on SIGTERM", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
