"""run_command("true") in a warm session vs. `docker exec` and a host subprocess.

    .venv/bin/python bench/bench_commands.py            # N=200 calls per side
    .venv/bin/python bench/bench_commands.py --quick    # smoke test (N=30)
    .venv/bin/python bench/bench_commands.py --json     # the JSON summary alone on stdout

Issue 24's performance target, measured in one run against baselines of the
same run:

session (s): `Session.call("run_command", {"argv": ["true"]})` through the
sync `Client`, in a session opened once (and warmed up), to a daemon this
script starts (`python -m tooljaild serve`: process backend, default
isolation, private Unix socket) and stops (SIGTERM).
session, shell (b): the same with `{"command": "true"}` (`bash -lc true`: the
login shell's start-up on top).
docker exec (e): `docker exec CID true` into one running container of the
sandbox image (`--image`, default tooljail/python:latest), started once with
`--network none`; skipped, with the reason printed, when no engine answers or
the image is missing.
host (h): `subprocess.run(["true"])` on the host: the floor of starting a
program at all.

Target: p50 of (s) <= 0.2x p50 of (e). Printed: p50 and p90 of each side, the
ratios to (e) and (h), and PASS, MISS or SKIPPED. Sides alternate in blocks
with a pause until the CPUs are quiet before each (bench_calls.py's harness).
Exits 0 whether or not the target is met; non-zero when a call fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tooljail import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import Daemon, alternating, flat, percentile  # the shared harness

TARGET = 0.2
"""run_command("true") in a warm session, p50, at most this times docker exec's."""
NAMES = {
    "s": "run_command argv [true], warm session",
    "b": "run_command 'true' (bash -lc), warm session",
    "e": "docker exec CID true",
    "h": "subprocess.run(['true']) on the host",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per side")
    parser.add_argument("--rounds", type=int, default=4, help="alternating blocks per side")
    parser.add_argument("--quick", action="store_true", help="N=30: a smoke test")
    parser.add_argument("--image", default="tooljail/python:latest")
    parser.add_argument("--settle", type=float, default=2.0, help="max seconds to settle")
    parser.add_argument("--json", action="store_true", help="the summary alone on stdout")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls = min(args.calls, 30)
    return args


def timer(fn: Callable[[], object]) -> Callable[[int], list[float]]:
    def run(k: int) -> list[float]:
        out = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    return run


def docker_container(image: str) -> tuple[str | None, str]:
    """A running container of `image` (its id), or None and why not."""
    docker = shutil.which("docker")
    if docker is None:
        return None, "no docker CLI"
    started = subprocess.run(
        [docker, "run", "-d", "--rm", "--network", "none", image, "sleep", "86400"],
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        return None, f"cannot start a container of {image}: {started.stderr.strip()[:200]}"
    return started.stdout.strip(), ""


def targets(p50: dict[str, float], skipped: dict[str, str]) -> list[dict[str, Any]]:
    """The target's verdict from the sides' p50s (seconds)."""
    name = "run_command('true') p50 / docker exec p50"
    if "e" in skipped or "s" in skipped:
        why = skipped.get("e") or skipped.get("s", "")
        return [{"target": name, "verdict": "SKIPPED", "why_skipped": why}]
    ratio = p50["s"] / p50["e"]
    verdict = "PASS" if ratio <= TARGET else "MISS"
    return [{"target": name, "limit": TARGET, "measured": round(ratio, 3), "verdict": verdict}]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    skipped: dict[str, str] = {}
    cid, why = docker_container(args.image)
    if cid is None:
        skipped["e"] = why
    daemon = Daemon(2)
    try:
        with Client(daemon.target) as client, client.session() as session:

            def checked(arguments: dict[str, Any]) -> None:
                result = session.call("run_command", arguments)
                if not result.ok or result.data["exit_code"] != 0:
                    raise SystemExit(f"run_command failed: {result}")

            for _ in range(5):  # warm: the first calls load what the rest reuse
                checked({"argv": ["true"]})
                checked({"command": "true"})
            sides: dict[str, tuple[Callable[[int], list[float]], int]] = {
                "s": (timer(lambda: checked({"argv": ["true"]})), args.calls),
                "b": (timer(lambda: checked({"command": "true"})), args.calls),
                "h": (timer(lambda: subprocess.run(["true"], check=True)), args.calls),
            }
            if cid is not None:
                docker = shutil.which("docker") or "docker"
                exec_argv = [docker, "exec", cid, "true"]
                sides["e"] = (
                    timer(lambda: subprocess.run(exec_argv, check=True, capture_output=True)),
                    max(args.calls // 4, 10),  # ~100 ms each: fewer, same rounds
                )
            runs = alternating(sides, args.rounds, settle_s=args.settle)
    finally:
        daemon.stop()
        if cid is not None:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    samples = {side: flat(blocks) for side, blocks in runs.items()}
    p50 = {side: percentile(s, 50) for side, s in samples.items()}
    p90 = {side: percentile(s, 90) for side, s in samples.items()}
    print(f"run_command: {args.calls} calls per side, {args.rounds} alternating blocks", file=out)
    print(f"{'side':48} {'p50 ms':>8} {'p90 ms':>8} {'/ (e)':>7} {'/ (h)':>7}", file=out)
    for side, label in NAMES.items():
        if side not in p50:
            print(f"({side}) {label:44} skipped: {skipped.get(side, '')}", file=out)
            continue
        to_e = f"{p50[side] / p50['e']:.3f}" if "e" in p50 else "-"
        to_h = f"{p50[side] / p50['h']:.1f}"
        row = f"({side}) {label:44} {p50[side] * 1e3:8.2f} {p90[side] * 1e3:8.2f}"
        print(f"{row} {to_e:>7} {to_h:>7}", file=out)
    judged = targets(p50, skipped)
    for t in judged:
        measured = f"measured {t['measured']:.3f}x" if "measured" in t else t["why_skipped"]
        print(f"{t['target']:46} <= {TARGET}x  {measured}  {t['verdict']}", file=out)
    if args.json:
        summary = {
            "p50_ms": {k: v * 1e3 for k, v in p50.items()},
            "targets": judged,
            "skipped": skipped,
        }
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
