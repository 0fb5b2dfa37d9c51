"""A forwarded port and a terminal's keystroke echo, against baselines of the same run.

    .venv/bin/python bench/bench_terminal.py            # full run (N=300 each, ~30 s)
    .venv/bin/python bench/bench_terminal.py --quick    # smoke test (N=50)
    .venv/bin/python bench/bench_terminal.py --json     # the JSON summary alone on stdout

Issue 24's performance targets, measured in one run:

tunnel (t): an HTTP GET of a 13-byte file with `urllib` (a new TCP connection
each, as urllib makes) to `session.forward(8000).address`, where
`python3 -m http.server 8000` runs in the session (on its terminal): the
local listener, one ForwardPort stream per connection, the daemon, the
session's pipes and the supervisor's connection to the session's loopback.
direct (d): the same GET of the same file to the same `python3 -m
http.server`, run on the host, on loopback: the floor.
Target: p50(t) - p50(d) <= 1 ms.

echo (e): one byte written to a terminal running `cat` (canonical mode: the
PTY's line discipline echoes it) until its echo is read back, through the
SDK's `Terminal` (write, then read). Target: p50 <= 2 ms.

The daemon is `python -m tooljaild serve` (process backend, default
isolation, a private Unix socket), started and stopped (SIGTERM) by this
script. Sides alternate in blocks. The script exits 0 whether or not targets
are met; it prints each target's PASS or MISS with the figure, honestly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tooljail import Client, Terminal

FILE = b"hello, tunnel"


def _start_daemon(base: Path) -> tuple[subprocess.Popen[bytes], str]:
    base.chmod(0o711)
    target = f"unix://{base}/tooljail.sock"
    argv = [sys.executable, "-m", "tooljaild", "serve", "--listen", target]
    argv += ["--state-dir", str(base / "state"), "--pool-size", "1", "--log-level", "WARNING"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(target, rpc_timeout_s=2) as client:
                client.list_tools()
            return process, target
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start") from None
            time.sleep(0.1)


def _get(address: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{address}/f.txt", timeout=10) as reply:
        body = reply.read()
    elapsed = time.perf_counter() - started
    if body != FILE:
        raise AssertionError(f"GET answered {body!r}")
    return elapsed


def _read_until(term: Terminal, marker: bytes, timeout: float = 30) -> None:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        seen += term.read(timeout=max(0.01, deadline - time.monotonic()))


def _echo(term: Terminal) -> float:
    started = time.perf_counter()
    term.write(b"a")
    got = b""
    while b"a" not in got:
        got += term.read(timeout=5)
    return time.perf_counter() - started


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": statistics.median(ordered) * 1e3,
        "p90_ms": ordered[int(len(ordered) * 0.9)] * 1e3,
        "n": len(ordered),
    }


def measure(args: argparse.Namespace, target: str, root: Path) -> dict[str, Any]:
    tunnel: list[float] = []
    direct: list[float] = []
    echo: list[float] = []
    (root / "www").mkdir()
    (root / "www" / "f.txt").write_bytes(FILE)
    host_server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=root / "www",
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert host_server.stdout is not None
        line = host_server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N ..."
        direct_address = f"127.0.0.1:{line.split(' port ')[1].split()[0]}"
        with Client(target) as client, client.session() as session:
            session.upload("f.txt", FILE)
            server = session.terminal(
                argv=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
            )
            _read_until(server, b"Serving HTTP")
            # The access log is read so the server never blocks on its terminal.
            drain = _Drain(server)
            with session.forward(8000) as forward, session.terminal(argv=["cat"]) as cat:
                for _ in range(args.warmup):
                    _get(forward.address), _get(direct_address), _echo(cat)
                block = max(1, args.n // 10)
                for round_ in range(0, args.n, block):
                    sides = [("t", forward.address), ("d", direct_address)]
                    for name, address in sides if round_ % 2 == 0 else sides[::-1]:
                        (tunnel if name == "t" else direct).extend(
                            _get(address) for _ in range(block)
                        )
                    echo.extend(_echo(cat) for _ in range(block))
            drain.stop()
            server.close()
    finally:
        host_server.send_signal(signal.SIGTERM)
        host_server.wait(10)
        if host_server.stdout is not None:
            host_server.stdout.close()
    t, d, e = _ms(tunnel), _ms(direct), _ms(echo)
    overhead = t["p50_ms"] - d["p50_ms"]
    return {
        "tunnel": t,
        "direct": d,
        "echo": e,
        "tunnel_overhead_p50_ms": overhead,
        "targets": {
            "tunnel_overhead_p50_ms<=1": overhead <= 1.0,
            "echo_p50_ms<=2": e["p50_ms"] <= 2.0,
        },
    }


class _Drain:
    """Reads a terminal in a thread (a server's log), so its writes never block."""

    def __init__(self, term: Terminal) -> None:
        import threading

        self._term = term
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._term.read(timeout=0.2):
                    return
            except TimeoutError:
                continue
            except Exception:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def print_report(got: dict[str, Any]) -> None:
    t, d, e = got["tunnel"], got["direct"], got["echo"]
    print(f"{'side':<44} {'p50 ms':>8} {'p90 ms':>8} {'n':>5}")
    for name, row in (
        ("(t) GET through session.forward(8000)", t),
        ("(d) GET to the same server on the host", d),
        ("(e) terminal keystroke echo (write, read)", e),
    ):
        print(f"{name:<44} {row['p50_ms']:>8.2f} {row['p90_ms']:>8.2f} {row['n']:>5}")
    overhead = got["tunnel_overhead_p50_ms"]
    verdict = "PASS" if overhead <= 1.0 else "MISS"
    print(f"tunnel overhead p50(t) - p50(d) = {overhead:.2f} ms (target <= 1 ms): {verdict}")
    verdict = "PASS" if e["p50_ms"] <= 2.0 else "MISS"
    print(f"keystroke echo p50 = {e['p50_ms']:.2f} ms (target <= 2 ms): {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N=50: a smoke test")
    ap.add_argument("-n", type=int, default=300, help="samples per side")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print the JSON summary alone")
    args = ap.parse_args(argv)
    if args.quick:
        args.n = 50
    with tempfile.TemporaryDirectory(prefix="bench-terminal-") as tmp:
        root = Path(tmp)
        daemon, target = _start_daemon(root)
        try:
            got = measure(args, target, root)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    if args.json:
        print(json.dumps(got, indent=2))
    else:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        print_report(got)
    return 0


if __name__ == "__main__":
    sys.exit(main())
