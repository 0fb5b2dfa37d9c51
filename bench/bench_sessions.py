"""A call in a warm session vs. a bare gRPC echo and a Jupyter kernel; session creation.

    .venv/bin/python bench/bench_sessions.py            # full run (N=1000 warm calls, ~1-2 min)
    .venv/bin/python bench/bench_sessions.py --quick    # smoke test (N=100, a few seconds)
    .venv/bin/python bench/bench_sessions.py --json     # the JSON summary alone on stdout

Issue 11's performance targets, measured in one run against baselines of the
same run:

warm session (s): `Session.call("execute_python_code", {"code": "x = x + 1"})`
through the sync `Client`, in a session opened once (and warmed up), to a daemon
this script starts (`python -m tooljaild serve`: process backend, default
isolation, private Unix socket) and stops (SIGTERM).
session by id (i): the same call as `Client.call(..., session_id=s.id)`, as
another process reaches a session.
gRPC echo (g): a unary call whose handler returns its request, served by a
minimal `grpc.aio` server (generic handler, raw bytes) in a subprocess on a Unix
socket in a temp dir, called from a sync channel as the SDK calls (same channel
options and metadata, `wait_for_ready=False`) with the bytes of the CallRequest
the session call sends: the floor any gRPC daemon pays per call.
Jupyter (j): `BlockingKernelClient.execute("x = x + 1")` to an ipykernel kernel
started once, timed until its `execute_reply` and its `idle` status are both in
(`jupyter_client` over ZeroMQ, the model E2B's code interpreter runs, without
E2B's HTTP server in front: the fastest way to talk to a kernel).

Targets: p50 of (s) <= 2x p50 of (g) and <= 0.3x p50 of (j); creating a
session (`client.session()` until the `with` block is entered) <= one
fresh-sandbox call (`client.call("execute_python_code", {"code": "x = 1"})`,
no session) + 2 ms, at p50, measured back to back. Each target prints PASS or
MISS with the measured figure. Also: each side at concurrency C (C sessions,
kernels or channels, one per thread), in calls per second.

Measured as bench_calls.py does: alternating blocks (s i g j, j g i s, ...) with
a pause until the CPUs are quiet before each block. The sessions' rows are
skipped, with the reason printed, when the SDK has no `Client.session` or the
daemon answers UNIMPLEMENTED; the Jupyter rows when `jupyter_client` or
`ipykernel` is missing (`pip install -e '.[bench]'`). The script exits 0
whether or not targets are met, and non-zero when a call returns something
other than what it should (e.g. a session that forgot `x`). See bench/README.md.

Longer than 500 lines: the four sides, the two measurements and the report of
one run are read together, as in bench_calls.py, whose harness this reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from tooljail import Client, TooljailError, ToolResult
from tooljail._client_base import CLIENT_KEY  # the metadata key the SDK sends on every call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calls import (  # the same harness and helpers as the other benchmarks
    DEFAULT_POOL_SIZE,
    SETTLED,
    Caller,
    Daemon,
    alternating,
    concurrent_run,
    doctor_report,
    flat,
    percentile,
    rounds_for,
    serial_latencies,
    timed,
)

TOOL = "execute_python_code"
INIT_CODE = "x = 0"
WARM_CODE = "x = x + 1"  # needs the state of the calls before it: a forgetful session fails
FIRST_CODE = "x = 1"  # the first call of a new session, and the fresh-sandbox call
ECHO_METHOD = "/tooljail.bench.Echo/Echo"
TARGET_ECHO = 2.0  # (s) p50 <= 2x (g) p50
TARGET_JUPYTER = 0.3  # (s) p50 <= 0.3x (j) p50
TARGET_CREATE_MS = 2.0  # session create p50 <= fresh call p50 + 2 ms
WARM_SIDES = {  # key: (column header, description), in the order they are measured
    "s": ("session", "Session.call, warm session, sync Client, daemon on a Unix socket"),
    "i": ("by id", "Client.call(..., session_id=s.id) into the same kind of session"),
    "g": ("gRPC echo", "grpc.aio echo server in a subprocess, Unix socket, raw bytes"),
    "j": ("Jupyter", "jupyter_client execute -> execute_reply + idle, ipykernel"),
}


class Unavailable(Exception):
    """A side cannot run here; its message says why (printed, and the side skipped)."""


# --------------------------------------------------------------------------- gRPC echo


def serve_echo(socket_path: str) -> None:
    """Serve the echo method on `socket_path` until SIGTERM; print "ready" once bound."""

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # as the daemon
        handler = grpc.method_handlers_generic_handler(
            ECHO_METHOD.split("/")[1], {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{socket_path}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())


class EchoServer:
    """`serve_echo` in a subprocess (this script, `--serve-echo`), on a socket in a temp dir."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="tjbench-echo-"))
        self.target = f"unix://{self.tmp}/echo.sock"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-echo", str(self.tmp / "echo.sock")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        # Printed once the port is bound; a server that died reads "" (end of file).
        if self.process.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"the echo server did not start (exit {self.process.poll()})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


class EchoChannel:
    """A sync channel to the echo server, opened and called as the SDK opens and calls."""

    def __init__(self, target: str, payload: bytes) -> None:
        self._channel = grpc.insecure_channel(target, options=Client._channel_options())
        self._echo = self._channel.unary_unary(ECHO_METHOD)  # no serializers: raw bytes
        self._payload = payload
        self._metadata = ((CLIENT_KEY, f"bench/{os.getpid()}"),)

    def call(self) -> None:
        reply = self._echo(self._payload, wait_for_ready=False, metadata=self._metadata)
        if reply != self._payload:
            raise RuntimeError(f"echo returned {len(reply)} bytes, not its request")

    def verify(self) -> None:
        """Nothing to check past each reply: an echo keeps no state."""

    def close(self) -> None:
        self._channel.close()


# --------------------------------------------------------------------------- Jupyter


class Kernel:
    """An ipykernel kernel with a BlockingKernelClient, `x` counted as the session's is.

    Raises:
        Unavailable: When jupyter_client or ipykernel cannot be imported.
    """

    def __init__(self) -> None:
        try:
            import ipykernel  # noqa: F401  (the kernel runs this interpreter's ipykernel)
            from jupyter_client.manager import start_new_kernel
        except ImportError as e:
            raise Unavailable(
                f"{e.name} is not installed: pip install -e '.[bench]' (scripts/test does)"
            ) from e
        # The "python3" kernel of the interpreter that has ipykernel: this one.
        # Its own output would land in --json's stdout (a file descriptor the
        # redirect of sys.stdout does not reach), and its start-up warnings in the table.
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.manager, self.client = start_new_kernel(
            kernel_name="python3", startup_timeout=120, **quiet
        )
        self.count = 0
        self.execute(INIT_CODE)

    def execute(self, code: str) -> str:
        """Run `code`; wait for its execute_reply and its idle status; return its stdout."""
        # No history: IPython's history store is work a notebook does and a session
        # does not; without it the baseline is faster, the comparison harder.
        msg_id = self.client.execute(code, store_history=False)
        replied = idle = False
        stdout: list[str] = []
        # The channels' own get_msg (a zmq poll), not the client's get_shell_msg,
        # which wraps it in a coroutine run to completion: the fastest way to read.
        while not (replied and idle):
            if not replied:
                reply = self.client.shell_channel.get_msg(timeout=30)
                if reply["parent_header"].get("msg_id") == msg_id:
                    if reply["content"]["status"] != "ok":
                        raise RuntimeError(f"jupyter execute failed: {reply['content']}")
                    replied = True
            if not idle:
                msg = self.client.iopub_channel.get_msg(timeout=30)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    stdout.append(msg["content"]["text"])
                elif msg["msg_type"] == "status":
                    idle = msg["content"]["execution_state"] == "idle"
        return "".join(stdout)

    def call(self) -> None:
        self.execute(WARM_CODE)
        self.count += 1

    def verify(self) -> None:
        """Raise unless `x` counts every call (the kernel kept its state)."""
        got = self.execute("print(x)").strip()
        if got != str(self.count):
            raise RuntimeError(f"jupyter kernel: x is {got!r}, expected {self.count}")

    def python(self) -> str:
        return self.execute("import os, sys; print(os.path.realpath(sys.executable))").strip()

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


# --------------------------------------------------------------------------- sessions


def checked(result: ToolResult, what: str) -> None:
    if not result.ok:
        raise RuntimeError(f"{what} failed: {result!r}")


def open_session(client: Client) -> Any:
    """A session of `client`, entered, with `x = 0` run in it.

    Raises:
        Unavailable: When the SDK has no `Client.session` or the daemon does not
            serve sessions: it answers UNIMPLEMENTED, or INTERNAL for the
            NotImplementedError of the generated servicer's base method (what a
            daemon from before issue 11's servicer says, through its error edge).
    """
    make = getattr(client, "session", None)
    if make is None:
        raise Unavailable("this SDK has no Client.session")
    try:
        session = make().__enter__()
    except TooljailError as e:
        if getattr(e, "status", "") == "UNIMPLEMENTED":
            raise Unavailable("the daemon does not serve sessions (UNIMPLEMENTED)") from e
        if "NotImplementedError" in str(e):
            raise Unavailable(
                "the daemon does not serve sessions (CreateSession: NotImplementedError)"
            ) from e
        raise
    try:
        checked(session.call(TOOL, {"code": INIT_CODE}), "the session's first call")
    except BaseException:
        session.close()
        raise
    return session


class WarmSession:
    """One session with its own `Client`; `x` counts the calls made (see `verify`)."""

    def __init__(self, target: str) -> None:
        self.client = Client(target)
        try:
            self.session = open_session(self.client)
        except BaseException:
            self.client.close()
            raise
        self.count = 0

    def call(self) -> None:
        checked(self.session.call(TOOL, {"code": WARM_CODE}), "a warm session call")
        self.count += 1

    def call_by_id(self) -> None:
        """The same call as `Client.call(..., session_id=)`, as another process makes it."""
        result = self.client.call(TOOL, {"code": WARM_CODE}, session_id=self.session.id)
        checked(result, "a warm call by session id")
        self.count += 1

    def verify(self) -> None:
        """Raise unless `x` counts every call (the session kept its interpreter)."""
        result = self.session.call(TOOL, {"code": "print(x)"})
        checked(result, "print(x) in the session")
        got = str(result.data.get("stdout", "")).strip()
        if got != str(self.count) or result.session_reset:
            raise RuntimeError(f"session: x is {got!r}, expected {self.count}: {result!r}")

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.client.close()


def fresh_call(client: Client) -> None:
    checked(client.call(TOOL, {"code": FIRST_CODE}), "a fresh-sandbox call")


def create_sample(client: Client) -> tuple[float, float, float]:
    """Seconds to (create a session, create it and make its first call, close it)."""
    t0 = time.perf_counter()
    with client.session() as s:
        t1 = time.perf_counter()
        checked(s.call(TOOL, {"code": FIRST_CODE}), "a new session's first call")
        t2 = time.perf_counter()
    return t1 - t0, t2 - t0, time.perf_counter() - t2


def create_samples(client: Client, k: int) -> list[tuple[float, float, float]]:
    return [create_sample(client) for _ in range(k)]


# --------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    """Every sample of one run."""

    warm: dict[str, list[float]] = field(default_factory=dict)
    throughput: dict[str, float] = field(default_factory=dict)
    fresh: list[float] = field(default_factory=list)
    create: list[float] = field(default_factory=list)
    create_first: list[float] = field(default_factory=list)
    close: list[float] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Warm:
    """One side of the warm-call comparison: a serial instance and C concurrent ones."""

    serial: Any  # has call(), verify(), close()
    concurrent: list[Any]

    def all(self) -> list[Any]:
        return [self.serial, *self.concurrent]


def handed_out(instances: list[Any]) -> Caller:
    """A caller giving each thread of `concurrent_run` the next instance's `call`."""
    turn: Iterator[Any] = itertools.cycle(instances)
    return lambda: (next(turn).call, lambda: None)


def open_side(key: str, make: Callable[[], Any], c: int, got: Measured) -> Warm | None:
    """C+1 instances of one side, or None (and the reason in `got.skipped`)."""
    made: list[Any] = []
    try:
        for _ in range(c + 1):
            made.append(make())
    except BaseException as e:
        for inst in made:  # no kernel or session outlives a failed start
            inst.close()
        if not isinstance(e, Unavailable):
            raise
        got.skipped[key] = str(e)
        print(f"({key}) skipped: {e}", flush=True)
        return None
    return Warm(made[0], made[1:])


@dataclass
class ById:
    """Side (i): the sessions of side (s), called by id (they share `x` and its count)."""

    of: WarmSession

    def call(self) -> None:
        self.of.call_by_id()

    def verify(self) -> None:
        self.of.verify()

    def close(self) -> None:
        """Nothing: side (s) closes the session."""


def by_id_side(sessions: Warm, got: Measured) -> Warm | None:
    """Side (i) on the sessions of (s), or None when `Client.call` takes no session_id."""
    side = Warm(ById(sessions.serial), [ById(inst) for inst in sessions.concurrent])
    try:
        side.serial.call()
    except TypeError as e:
        got.skipped["i"] = f"Client.call takes no session_id ({e})"
        print(f"(i) skipped: {got.skipped['i']}", flush=True)
        return None
    return side


def request_bytes(target: str, session_id: str) -> bytes:
    """The CallRequest a warm session call sends, serialized: what the echo carries."""
    with Client(target) as client:
        request = client._build_call_request(
            TOOL, {"code": WARM_CODE}, tool_timeout_s=None, call_id=None
        )
    request.session_id = session_id
    return bytes(request.SerializeToString())


def measure(args: argparse.Namespace, target: str, echo_target: str) -> Measured:
    """Open every side, warm it up, then run each metric in alternating blocks."""
    got = Measured()
    c = args.concurrency
    payload = b""  # set below, once a session's id is known; read when (g) is opened
    makers: dict[str, Callable[[], Any]] = {
        "s": partial(WarmSession, target),
        "g": lambda: EchoChannel(echo_target, payload),
        "j": Kernel,
    }
    sides: dict[str, Warm] = {}
    with contextlib.ExitStack() as stack:
        for key, make in makers.items():
            if key == "g":  # a real session's id where there is one, else one as long
                sid = sides["s"].serial.session.id if "s" in sides else uuid.uuid4().hex
                payload = request_bytes(target, sid)
                got.info["echo_request_bytes"] = len(payload)
            side = timed(f"open ({key}) x{c + 1}", partial(open_side, key, make, c, got))
            if side is not None:
                sides[key] = side
                for inst in side.all():
                    stack.callback(inst.close)
        if "s" in sides:  # C+1 sessions in all: a daemon bounds the sessions of one client
            by_id = by_id_side(sides["s"], got)
            if by_id is not None:
                sides = {"s": sides["s"], "i": by_id, **sides}
        elif "s" in got.skipped:
            got.skipped["i"] = "as (s)"
        if "j" in sides:
            got.info["jupyter_python"] = sides["j"].serial.python()

        def warm_up() -> None:
            for side in sides.values():
                for inst in side.all():
                    for _ in range(args.warmup):
                        inst.call()

        timed("warm-up", warm_up)
        serial = {k: (partial(serial_latencies, w.serial.call), args.n) for k, w in sides.items()}
        blocks = alternating(serial, args.serial_rounds, args.settle)
        got.warm = {k: flat(v) for k, v in blocks.items()}
        print(f"warm calls, c=1: done ({args.n} per side)", flush=True)
        conc = {
            k: (partial(concurrent_run, handed_out(w.concurrent), concurrency=c), args.m)
            for k, w in sides.items()
        }
        runs = timed(f"warm calls, c={c}", lambda: alternating(conc, args.conc_rounds, args.settle))
        got.throughput = {k: args.m / sum(v) for k, v in runs.items()}
        for side in sides.values():  # every call changed x: the state was kept throughout
            for inst in side.all():
                inst.verify()

    measure_creation(args, target, got)
    return got


def measure_creation(args: argparse.Namespace, target: str, got: Measured) -> None:
    """Session creation against a fresh-sandbox call, back to back, alternating."""
    with Client(target) as client:
        sides: dict[str, tuple[Callable[[int], object], int]] = {
            "f": (lambda k: serial_latencies(partial(fresh_call, client), k), args.k)
        }
        if "s" not in got.skipped:
            sides["c"] = (partial(create_samples, client), args.k)
        for key in sides:  # warm-up
            sides[key][0](args.warmup)
        res = timed("creation", lambda: alternating(sides, args.create_rounds, args.settle))
    got.fresh = flat(res["f"])
    if "c" in res:
        samples = [x for blk in res["c"] for x in blk]
        got.create = [a for a, _, _ in samples]
        got.create_first = [b for _, b, _ in samples]
        got.close = [z for _, _, z in samples]


# --------------------------------------------------------------------------- report


def pct_ms(samples: list[float]) -> dict[str, float]:
    return {f"p{p}_ms": round(percentile(samples, p) * 1000, 3) for p in (50, 90, 99)}


def targets(got: Measured) -> list[dict[str, Any]]:
    """Issue 11's three targets: measured value, bound, and PASS, MISS or SKIPPED (why)."""
    out: list[dict[str, Any]] = []

    def p50(samples: list[float]) -> float:
        return percentile(samples, 50)

    def add(name: str, bound: float, measured: float | None, why: str, unit: str) -> None:
        verdict = "SKIPPED" if measured is None else "PASS" if measured <= bound else "MISS"
        out.append(
            {
                "target": name,
                "bound": bound,
                "measured": None if measured is None else round(measured, 3),
                "unit": unit,
                "verdict": verdict,
                "why_skipped": why if measured is None else "",
            }
        )

    s = got.warm.get("s")
    for key, bound, name in (
        ("g", TARGET_ECHO, "warm session call p50 / gRPC echo p50"),
        ("j", TARGET_JUPYTER, "warm session call p50 / Jupyter execute p50"),
    ):
        base = got.warm.get(key)
        why = got.skipped.get("s") or got.skipped.get(key, "")
        value = p50(s) / p50(base) if s and base else None
        add(name, bound, value, why, "x")
    excess = (p50(got.create) - p50(got.fresh)) * 1000 if got.create else None
    add(
        "session create p50 - fresh-sandbox call p50",
        TARGET_CREATE_MS,
        excess,
        got.skipped.get("s", ""),
        "ms",
    )
    return out


def summary(got: Measured, args: argparse.Namespace) -> dict[str, Any]:
    """Every number of the run, for comparing runs."""
    creation = {
        "fresh_call": got.fresh,
        "session_create": got.create,
        "session_create_first_call": got.create_first,
        "session_close": got.close,
    }
    return {
        "warm": {k: pct_ms(v) for k, v in got.warm.items()},
        "throughput": {k: round(v, 1) for k, v in got.throughput.items()},
        "creation": {k: pct_ms(v) for k, v in creation.items() if v},
        "targets": targets(got),
        "skipped": got.skipped,
        "counts": {"n": args.n, "m": args.m, "k": args.k, "concurrency": args.concurrency},
        **got.info,
    }


def row(label: str, cells: list[str]) -> str:
    return f"{label:34}" + "".join(f" {x:>10}" for x in cells)


def print_report(got: Measured, args: argparse.Namespace) -> None:
    """The tables a person reads: warm calls, creation, the targets."""
    keys = list(WARM_SIDES)
    print()
    print(row("warm call (x = x + 1)", [f"({k})" for k in keys] + ["s/g", "s/j"]))
    print(row("", [WARM_SIDES[k][0] for k in keys]))
    for p in (50, 90, 99):
        vals = {k: percentile(v, p) for k, v in got.warm.items()}
        cells = [f"{vals[k] * 1000:.3f}" if k in vals else "-" for k in keys]
        ratios = [
            f"{vals['s'] / vals[b]:.2f}" if "s" in vals and b in vals else "-" for b in ("g", "j")
        ]
        print(row(f"latency p{p}, c=1 (ms)", cells + ratios))
    tp = got.throughput
    cells = [f"{tp[k]:.0f}" if k in tp else "-" for k in keys]
    ratios = [f"{tp['s'] / tp[b]:.2f}" if "s" in tp and b in tp else "-" for b in ("g", "j")]
    print(row(f"throughput, c={args.concurrency} (calls/s)", cells + ratios))
    print("latency ratios < 1: the session is faster; throughput ratios > 1: it is faster")
    for k in keys:
        print(
            f"  ({k}) {WARM_SIDES[k][1]}"
            + (f"; skipped: {got.skipped[k]}" if k in got.skipped else "")
        )
    if "echo_request_bytes" in got.info:
        print(f"  (g) echoes {got.info['echo_request_bytes']} bytes: the CallRequest (s) sends")
    if "jupyter_python" in got.info:
        print(f"  (j) kernel interpreter: {got.info['jupyter_python']}")

    print()
    print(row(f"creation, back to back ({args.k} each)", ["p50 ms", "p90 ms", "p99 ms"]))
    for label, samples in (
        ("(f) fresh-sandbox call, no session", got.fresh),
        ("(c) session create", got.create),
        ("    create + first call", got.create_first),
        ("    close", got.close),
    ):
        cells = [f"{percentile(samples, p) * 1000:.2f}" if samples else "-" for p in (50, 90, 99)]
        print(row(label, cells))
    if "s" in got.skipped:
        print(f"  sessions are not available: {got.skipped['s']}; their rows are skipped")

    print("\ntargets (issue 11, in this run):")
    for t in targets(got):
        bound = f"<= {t['bound']:.2f}{t['unit']}"
        if t["verdict"] == "SKIPPED":
            print(f"  {t['target']:46} {bound:10} SKIPPED ({t['why_skipped']})")
        else:
            print(
                f"  {t['target']:46} {bound:10} measured {t['measured']:.3f}{t['unit']}"
                f"  {t['verdict']}"
            )
    if args.n < 1000 or args.k < 100:
        print("  (fewer calls than the full run's 1000 and 100: the verdicts are indicative)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, help="N: warm calls per side, c=1 (1000; quick 100)")
    ap.add_argument("--concurrent-calls", type=int, help="M: warm calls per side at c (2000; 200)")
    ap.add_argument("--creations", type=int, help="K: sessions created, fresh calls (100; 16)")
    ap.add_argument("--concurrency", type=int, default=4, help="C: threads (each its own session)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up calls per instance")
    ap.add_argument("--pool-size", type=int, default=DEFAULT_POOL_SIZE)
    ap.add_argument("--settle", type=float, help="max seconds to wait for quiet CPUs (3; 0.3)")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--json", action="store_true", help="stdout: the JSON summary alone")
    ap.add_argument("--serve-echo", metavar="SOCKET", help=argparse.SUPPRESS)  # the echo server
    args = ap.parse_args(argv)
    args.n = args.calls or (100 if args.quick else 1000)
    args.m = args.concurrent_calls or (200 if args.quick else 2000)
    args.k = args.creations or (16 if args.quick else 100)
    args.settle = args.settle if args.settle is not None else (0.3 if args.quick else 3.0)
    args.serial_rounds = rounds_for(args.n, max(50, args.n // 4))
    args.conc_rounds = rounds_for(args.m, max(100, args.m // 4))
    args.create_rounds = rounds_for(args.k, max(8, args.k // 4))
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the daemon and the echo server, measure, print the report; the summary."""
    print(
        f"machine: nproc={os.cpu_count()} python={platform.python_version()} "
        f"({platform.machine()}, {platform.system()} {platform.release()}) "
        f"loadavg={os.getloadavg()[0]:.2f}"
    )
    print(
        f"N={args.n} warm calls per side, M={args.m} at concurrency {args.concurrency}, "
        f"K={args.k} creations, warm-up {args.warmup}, pool size {args.pool_size}",
        flush=True,
    )
    print("isolation (tooljail doctor --json, run once):")
    for line in doctor_report():
        print(line)
    t_start = time.monotonic()
    daemon = Daemon(args.pool_size)
    try:
        print(f"daemon: serving after {daemon.startup_s * 1000:.0f} ms", flush=True)
        echo = EchoServer()
        try:
            got = measure(args, daemon.target, echo.target)
        finally:
            echo.stop()
    except BaseException:
        print(f"--- daemon log (tail) ---\n{daemon.log_tail()}", file=sys.stderr)
        daemon.stop()
        raise
    rc = daemon.stop()
    print_report(got, args)
    print(
        f"daemon exit code {rc}; total {time.monotonic() - t_start:.0f} s "
        f"({SETTLED[0]:.0f} s of it waiting for quiet CPUs between blocks)"
    )
    return summary(got, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return 0
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            out = run(args)
        print(json.dumps(out))
    else:
        out = run(args)
        print(f"\njson: {json.dumps(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
