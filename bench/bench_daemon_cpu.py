"""The daemon process's own CPU per call (sandboxes excluded), beside a gRPC echo's.

    .venv/bin/python bench/bench_daemon_cpu.py                   # this tree's daemon
    .venv/bin/python bench/bench_daemon_cpu.py --compare /tmp/base  # A/B: another tree

Issue 26, item 4: "the daemon's own CPU per call (its process alone, sandboxes
excluded)". A daemon (`python -m tooljaild serve`, process backend, default
isolation, log level INFO as `serve` defaults to, private Unix socket) gets
`--calls` warm-session calls of `print(1)` back to back, then `--fresh`
fresh-sandbox calls, per round; the daemon's user + system CPU (psutil
`cpu_times` of its pid: its threads, not its children) over each block,
divided by the calls, is the figure. The floor beside it: the CPU of the
grpc.aio echo server of bench_sessions.py per call, measured the same way.

`--compare DIR` starts a second daemon from another source tree (a directory
holding `client/` and `daemon/`, e.g. `git archive <commit> client daemon | tar
-x -C DIR`) and alternates the rounds between the two (A B, B A, ...): a change
is kept only when B's median beats A's by more than the spread of an A/A run
(on these shared 2-core VMs, about +-5 % of the median over 8 rounds).
Exits 0 unless a call answers something other than `1`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import Daemon  # the same harness as the other benchmarks
from bench_sessions import EchoChannel, EchoServer

from tooljail import Client

TOOL = "execute_python_code"
CODE = {"code": "print(1)"}
HERE = Path(__file__).resolve().parent.parent


def cpu_ms_per_call(process: psutil.Process, calls: int, call: Callable[[], None]) -> float:
    """The process's CPU (user + system, ms) per call over `calls` calls of `call`."""
    before = process.cpu_times()
    for _ in range(calls):
        call()
    after = process.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return used / calls * 1e3


class Side:
    """One daemon, its client and a warm session in it."""

    def __init__(self, name: str, tree: Path, log_level: str) -> None:
        self.name = name
        env = {"PYTHONPATH": f"{tree}/client:{tree}/daemon"}
        self.daemon = Daemon(2, "--log-level", log_level, env=env)
        self.client = Client(self.daemon.target)
        self.session = self.client.session().__enter__()
        self.process = psutil.Process(self.daemon.process.pid)
        self.session_ms: list[float] = []
        self.fresh_ms: list[float] = []
        for _ in range(30):  # warm: imports, caches, the pool's first refills
            self.session_call()
        for _ in range(5):
            self.fresh_call()

    def session_call(self) -> None:
        checked(self.session.call(TOOL, CODE).data)

    def fresh_call(self) -> None:
        checked(self.client.call(TOOL, CODE).data)

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.daemon.stop()


def checked(data: object) -> None:
    if "1" not in str(data):
        raise RuntimeError(f"a call answered {data!r}, not 1")


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="session calls per round")
    ap.add_argument("--fresh", type=int, default=60, help="fresh calls per round (0: none)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--compare", type=Path, help="another source tree, run as side A")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args()

    echo = EchoServer()
    sides: list[Side] = []
    try:
        if args.compare is not None:
            sides.append(Side("A", args.compare.resolve(), args.log_level))
        sides.append(Side("B" if args.compare else "daemon", HERE, args.log_level))
        channel = EchoChannel(echo.target, b"x" * 120)
        echo_process = psutil.Process(echo.process.pid)
        echo_ms: list[float] = []
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                ms = cpu_ms_per_call(side.process, args.calls, side.session_call)
                side.session_ms.append(ms)
                if args.fresh:
                    ms = cpu_ms_per_call(side.process, args.fresh, side.fresh_call)
                    side.fresh_ms.append(ms)
            echo_ms.append(cpu_ms_per_call(echo_process, args.calls, channel.call))
        channel.close()
        print(f"daemon CPU per call, ms (median of {args.rounds} rounds; each round's in [])")
        for side in sides:
            print(
                f"  {side.name:7} session {med(side.session_ms)} "
                f"{[round(x, 3) for x in side.session_ms]}"
                f"  fresh {med(side.fresh_ms)} {[round(x, 2) for x in side.fresh_ms]}"
            )
        print(f"  gRPC echo server (floor) {med(echo_ms)} {[round(x, 3) for x in echo_ms]}")
    finally:
        for side in sides:
            side.close()
        echo.stop()


if __name__ == "__main__":
    main()
