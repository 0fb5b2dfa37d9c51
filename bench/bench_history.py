"""ListCalls of 50 from a journal of 100,000 calls, against a gRPC echo floor; the
journal's write cost per call with schema 4's indexes and without them.

    .venv/bin/python bench/bench_history.py            # full: 100,000 calls, 200 samples per row
    .venv/bin/python bench/bench_history.py --quick    # smoke: 3,000 calls, 20 samples
    .venv/bin/python bench/bench_history.py --json     # the JSON summary alone on stdout

Issue 25's target: a page of 50 (`ListCalls`, `limit=50`) from a journal of
100,000 calls in <= 20 ms p50, for each filter (an index per filter).

1. A journal is seeded through `Journal` itself (admitted, running, finished:
   the daemon's three writes per call), with realistic rows: 8 clients, 12
   tools, 400 sessions (a third of the calls), statuses weighted as a busy host
   sees them (mostly success; error, timeout, partial, cancelled, lost), Python
   code of 100-600 bytes as arguments, a result of a few hundred bytes, times
   spread over the last 6 days (inside the default retention).
2. A real daemon (`python -m tooljaild serve --pool-size 0`, a private Unix
   socket) opens it; each row below is `ListCalls` through a sync gRPC channel,
   measured in alternating blocks with the floor (g): `GetDaemonInfo`, the
   cheapest RPC of the same daemon, the same channel. "loop ms" is what a page
   costs the daemon's event loop, measured in this process before the daemon
   starts: the journal's read and the conversion of each call to its message.
3. Write cost: the three writes of a call timed on two fresh journals, one of
   schema 4 and one with the history indexes dropped (what schema 3 had: the
   primary key and `calls_by_end`), in alternating blocks of 1,000 calls.

The script exits 0 whether or not the target is met (it prints PASS or MISS);
non-zero only if a page is not what it should be (the wrong count, the wrong
filter) or the daemon dies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from tooljail.types import CallState
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljail.wire import call_info_to_proto
from tooljaild.edge.history import query_of
from tooljaild.journal.file import HISTORY_INDEXES
from tooljaild.journal.store import Journal

TARGET_P50_MS = 20.0
CLIENTS = [f"agent-{i}" for i in range(8)]
TOOLS = ["execute_python_code", "read_file", "write_file", "grep", "ls", "run_command"] + [
    f"user_tool_{i}" for i in range(6)
]
STATUSES = [  # (status, final state, weight)
    ("success", CallState.SUCCEEDED, 80),
    ("error", CallState.FAILED, 9),
    ("timeout", CallState.TIMED_OUT, 4),
    ("partial", CallState.SUCCEEDED, 3),
    ("cancelled", CallState.CANCELLED, 3),
    ("lost", CallState.LOST, 1),
]
SPAN_S = 6 * 86400.0


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


def seed(
    journal: Journal, count: int, now: float, rng: random.Random, offset: int = 0
) -> list[float]:
    """`count` realistic calls written through `journal`'s three writes (ids from
    `offset` on); each call's write time (s): admitted + running + finished."""
    costs: list[float] = []
    sessions = [f"ses-{i:04d}" for i in range(max(1, min(400, count // 250)))]
    statuses, weights = list(range(len(STATUSES))), [w for _, _, w in STATUSES]
    for n in range(count):
        created = now - SPAN_S + SPAN_S * n / count
        tool = rng.choice(TOOLS)
        code = "import json\n" + f"x = sum(range({n}))\n" * rng.randint(4, 24)
        arguments = json.dumps({"code": code})
        status, state, _ = STATUSES[rng.choices(statuses, weights)[0]]
        call_id = f"call-{offset + n:07d}"
        result = json.dumps(
            {
                "call_id": call_id,
                "status": status,
                "data": {"stdout": "ok\n" * rng.randint(1, 60), "stderr": "", "exit_code": 0},
                "message": "" if status == "success" else f"the call ended: {status}",
                "effect": "applied",
                "duration_s": 0.012,
                "tool": tool,
            }
        )
        session = rng.choice(sessions) if rng.random() < 0.33 else ""
        start = time.perf_counter()
        journal.admitted(
            call_id,
            tool=tool,
            fingerprint=f"{n:064x}",
            arguments_json=arguments,
            timeout_s=180.0,
            idempotent=False,
            client=rng.choice(CLIENTS),
            session_id=session,
            arguments_sha256=f"{n:064x}",
            created=created,
        )
        journal.running(call_id, "sbx-1", created + 0.001)
        journal.finished(call_id, state, result, created + 0.02, status=status)
        costs.append(time.perf_counter() - start)
    return costs


def write_cost(tmp: Path, calls: int, block: int = 1000) -> dict[str, list[float]]:
    """Per-call write cost, schema 4 vs. without its history indexes, alternating blocks."""
    rng = random.Random(7)
    journals = {
        "schema 4": Journal.open(tmp / "w4.sqlite3"),
        "no history indexes": Journal.open(tmp / "w3.sqlite3"),
    }
    db = journals["no history indexes"]._db  # the bench's own fresh file
    for statement in HISTORY_INDEXES:
        db.execute("DROP INDEX " + statement.split()[2])
    costs: dict[str, list[float]] = {name: [] for name in journals}
    now = time.time()
    done = 0
    order = list(journals)
    try:
        while done < calls:
            for name in order:
                costs[name] += seed(journals[name], block, now, rng, offset=len(costs[name]))
            order.reverse()
            done += block
    finally:
        for j in journals.values():
            j.close()
    return costs


@contextlib.contextmanager
def daemon(state_dir: Path, socket: Path) -> Iterator[str]:
    """`tooljail serve` over `state_dir` (its journal), stopped with SIGTERM at the end."""
    target = f"unix://{socket}"
    log = open(state_dir.parent / "daemon.log", "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "tooljaild", "serve", "--listen", target]
    argv += ["--state-dir", str(state_dir), "--pool-size", "0", "--log-level", "WARNING"]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with grpc.insecure_channel(target) as channel:
            stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None:
                    raise SystemExit(
                        f"the daemon died: {(state_dir.parent / 'daemon.log').read_text()}"
                    )
                try:
                    stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        yield target
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        log.close()


def queries(now: float) -> dict[str, pb.ListCallsRequest]:
    """One ListCalls of 50 per filter (and two that combine or go deep)."""
    hour = now - SPAN_S / 2
    return {
        "no filter": pb.ListCallsRequest(limit=50),
        "client": pb.ListCallsRequest(limit=50, client_name="agent-3"),
        "tool": pb.ListCallsRequest(limit=50, tool="grep"),
        "session": pb.ListCallsRequest(limit=50, session_id="ses-0007"),
        "status (error)": pb.ListCallsRequest(limit=50, status=pb.STATUS_ERROR),
        "status (lost, rare)": pb.ListCallsRequest(limit=50, status=pb.STATUS_LOST),
        "time range (1 h)": pb.ListCallsRequest(limit=50, since_unix=hour, until_unix=hour + 3600),
        "ended": pb.ListCallsRequest(limit=50, running=pb.RUNNING_FILTER_ENDED),
        "running (none)": pb.ListCallsRequest(limit=50, running=pb.RUNNING_FILTER_RUNNING),
        "client + tool": pb.ListCallsRequest(limit=50, client_name="agent-3", tool="grep"),
    }


def measure(target: str, samples: int, now: float) -> dict[str, list[float]]:
    """Each query's latency (s), and the echo floor's, in alternating blocks."""
    asked = queries(now)
    times: dict[str, list[float]] = {name: [] for name in ["echo (GetDaemonInfo)", *asked]}
    with grpc.insecure_channel(target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        calls: dict[str, Callable[[], Any]] = {
            "echo (GetDaemonInfo)": lambda: stub.GetDaemonInfo(pb.GetDaemonInfoRequest()),
            **{name: (lambda r=r: stub.ListCalls(r)) for name, r in asked.items()},
        }
        # Deep: the 20th page of the unfiltered list (a cursor 950 calls in).
        cursor = ""
        for _ in range(19):
            cursor = stub.ListCalls(pb.ListCallsRequest(limit=50, cursor=cursor)).next_cursor
        deep = pb.ListCallsRequest(limit=50, cursor=cursor)
        calls["page 20 (cursor)"] = lambda: stub.ListCalls(deep)
        times["page 20 (cursor)"] = []
        check(stub, asked)
        for fn in calls.values():
            fn()  # warm
        names = list(calls)
        block = 10
        for round_ in range(max(1, samples // block)):
            for name in names if round_ % 2 == 0 else reversed(names):
                for _ in range(block):
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append(time.perf_counter() - start)
    return times


def check(stub: Any, asked: dict[str, pb.ListCallsRequest]) -> None:
    """Each page holds what its filter asks, or the bench measures nothing."""
    for name, request in asked.items():
        page = stub.ListCalls(request)
        if name.startswith("running"):
            assert not page.calls, name
            continue
        # Rare ones (a session's, an hour's, lost calls) may hold fewer in a small journal.
        assert 0 < len(page.calls) <= 50, (name, len(page.calls))
        for c in page.calls:
            assert not request.client_name or c.client_name == request.client_name, name
            assert not request.tool or c.tool == request.tool, name
            assert not request.session_id or c.session_id == request.session_id, name
            assert not request.status or c.result.status == request.status, name
            # CallInfo's times are whole microseconds (a datetime): within 1 us of the row's.
            assert not request.since_unix or c.received_at_unix >= request.since_unix - 1e-6, name


def loop_cost(path: Path, now: float, samples: int) -> dict[str, list[float]]:
    """What a page costs the daemon's event loop, in this process: the journal's
    read and each call's conversion to its wire message (no gRPC), per filter."""
    costs: dict[str, list[float]] = {}
    with Journal.open(path, max_rows=10**9) as journal:
        for name, request in queries(now).items():
            query = query_of(request)
            costs[name] = []
            for _ in range(samples):
                start = time.perf_counter()
                entries, _ = journal.list_calls(query, 4 * 1024 * 1024)
                for entry in entries:
                    call_info_to_proto(entry.info())
                costs[name].append(time.perf_counter() - start)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="calls in the journal")
    parser.add_argument("--samples", type=int, default=200, help="pages per row")
    parser.add_argument("--write-calls", type=int, default=20_000, help="calls per write-cost side")
    parser.add_argument("--quick", action="store_true", help="3,000 calls, 20 samples")
    parser.add_argument("--json", action="store_true", help="the JSON summary alone on stdout")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.samples, args.write_calls = 3000, 20, 2000
    out = sys.stderr if args.json else sys.stdout
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-history-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o711)
        state = base / "state"
        state.mkdir()
        print(f"seeding a journal of {args.calls:,} calls ...", file=out, flush=True)
        started = time.perf_counter()
        with Journal.open(state / "journal.sqlite3", max_rows=max(args.calls, 100)) as journal:
            seed(journal, args.calls, now, random.Random(25))
        print(f"  seeded in {time.perf_counter() - started:.1f} s", file=out)
        size = (state / "journal.sqlite3").stat().st_size
        on_loop = loop_cost(state / "journal.sqlite3", now, args.samples)
        with daemon(state, base / "tooljail.sock") as target:
            times = measure(target, args.samples, now)
        writes = write_cost(base, args.write_calls)
    report(times, on_loop, writes, args, size, out)


def report(
    times: dict[str, list[float]],
    on_loop: dict[str, list[float]],
    writes: dict[str, list[float]],
    args: Any,
    size: int,
    out: Any,
) -> None:
    floor = percentile(times["echo (GetDaemonInfo)"], 50)
    print(
        f"\nListCalls of 50 from {args.calls:,} calls ({size / 1e6:.0f} MB journal), "
        f"{len(times['no filter'])} samples per row, alternating blocks:",
        file=out,
    )
    print(
        f"  {'query':26} {'p50 ms':>8} {'p95 ms':>8} {'x echo':>7} {'loop ms':>8}  target",
        file=out,
    )
    summary: dict[str, Any] = {"calls": args.calls, "journal_bytes": size, "rows": {}}
    misses = 0
    for name, samples in times.items():
        p50, p95 = percentile(samples, 50) * 1000, percentile(samples, 95) * 1000
        verdict = ""
        if name != "echo (GetDaemonInfo)":
            ok = p50 <= TARGET_P50_MS
            misses += not ok
            verdict = f"{'PASS' if ok else 'MISS'} (<= {TARGET_P50_MS:g} ms p50)"
        loop = percentile(on_loop[name], 50) * 1000 if name in on_loop else None
        shown = "-" if loop is None else f"{loop:.2f}"
        print(
            f"  {name:26} {p50:8.2f} {p95:8.2f} {p50 / (floor * 1000):7.1f} {shown:>8}  {verdict}",
            file=out,
        )
        summary["rows"][name] = {"p50_ms": p50, "p95_ms": p95, "loop_p50_ms": loop}
    print(f"  target: {'PASS' if not misses else f'MISS ({misses} rows)'}", file=out)
    print(
        "\njournal writes per call (admitted + running + finished), "
        + f"{args.write_calls:,} calls each:",
        file=out,
    )
    base = percentile(writes["no history indexes"], 50)
    summary["writes"] = {}
    for name, costs in writes.items():
        p50, mean = percentile(costs, 50) * 1e6, sum(costs) / len(costs) * 1e6
        print(
            f"  {name:22} p50 {p50:7.1f} us   mean {mean:7.1f} us   {p50 / (base * 1e6):.2f}x",
            file=out,
        )
        summary["writes"][name] = {"p50_us": p50, "mean_us": mean}
    summary["target_met"] = not misses
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
