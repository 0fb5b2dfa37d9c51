"""What the egress proxy adds to one HTTPS GET: proxied (pass-through, intercepted) vs direct.

    PYTHONPATH=client:daemon .venv/bin/python bench/bench_egress.py            # N=300, C=8
    PYTHONPATH=client:daemon .venv/bin/python bench/bench_egress.py --quick    # N=60
    ... --backend docker    # the sandbox side in a docker sandbox (network_mode none + proxy)

The world is tests/egress_world.py's: an HTTPS server on 127.0.0.1 (threads, a
test CA) answering GET /file with 1 KiB, named api.example.com through the
daemon's `[egress.hosts]`. The script starts it, and a daemon
(`python -m tooljaild serve`, log level WARNING) allowed to reach it and
holding one secret for it.

The same client function runs on every side: open a NEW TCP connection, TLS
to api.example.com (verified), `GET /file` with `Connection: close`, read to
the end; one connection per GET, timed from connect() to the last byte. The
sides differ only in the first hop:

  direct        the function on the HOST interpreter, connecting straight to
                the server: the sandbox given a direct network. (A docker
                sandbox with network=True cannot reach the host's loopback,
                where the world is, so the host stands in for it; the host
                interpreter is printed beside the sandbox's.)
  pass-through  in a sandbox (execute_python_code, egress=["api.example.com"],
                no secret): CONNECT through 127.0.0.1:3128 as every client
                with HTTPS_PROXY does; the relay passes the socket to the
                daemon's proxy, which checks the SNI and pipes bytes.
  intercepted   the same with secrets=["BENCH_KEY"]: the proxy terminates TLS
                with its own CA, swaps the placeholder sent in a header for the
                value (the direct side sends the value itself), verifies the
                server upstream.

Each side runs back to back (one GET after another) and concurrently (C
threads, N GETs in all), in alternating blocks (sandbox sides and the host side
take turns, 3 rounds) so drift on a shared machine falls on all of them. It
prints p50 and p90 per GET, the ratio to direct and the milliseconds added.
Targets (issue 23): pass-through adds <= 1 ms at p50, interception <= 3 ms;
printed, not asserted. Exits non-zero only if a GET fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.egress_world: the world the tests use

from tests.egress_world import World, start_world, trust_prelude  # noqa: E402
from tooljail import Client  # noqa: E402

SECRET = "bench-" + "0123456789abcdef" * 2

CLIENT = r"""
import json, socket, ssl, statistics, sys, threading, time

def get_once(first_hop, header):
    began = time.perf_counter()
    raw = socket.create_connection(first_hop, timeout=15)
    if first_hop == ("127.0.0.1", 3128):
        raw.sendall(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = raw.recv(4096)
            if not chunk:
                raise OSError("proxy closed the connection")
            head += chunk
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise OSError(head[:300].decode("latin-1"))
    tls = CONTEXT.wrap_socket(raw, server_hostname="api.example.com")
    tls.sendall(b"GET /file HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n"
                + header + b"\r\n")
    data = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            break
        data += chunk
    tls.close()
    took = time.perf_counter() - began
    if not data.startswith(b"HTTP/1.1 200") or len(data.partition(b"\r\n\r\n")[2]) != 1024:
        raise OSError(data[:300].decode("latin-1"))
    return took

def run(first_hop, header, n, concurrency):
    for _ in range(5):
        get_once(first_hop, header)  # warm: imports, the proxy's gate, TLS session caches
    serial = [get_once(first_hop, header) for _ in range(n)]
    together, errors = [], []
    def worker(count):
        try:
            for _ in range(count):
                together.append(get_once(first_hop, header))
        except Exception as exc:
            errors.append(repr(exc))
    share = n // concurrency
    threads = [threading.Thread(target=worker, args=(share,)) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise OSError(errors[0])
    return {"serial": serial, "concurrent": together, "python": sys.executable}
"""


def host_side(world: World, n: int, concurrency: int) -> dict[str, Any]:
    """The client function on this interpreter, straight to the server."""
    scope: dict[str, Any] = {}
    exec(CLIENT, scope)  # the very code the sandbox runs
    import ssl

    scope["CONTEXT"] = ssl.create_default_context(cafile=str(world.ca_file))
    header = f"X-Api-Key: {SECRET}\r\n".encode()
    result: dict[str, Any] = scope["run"](("127.0.0.1", world.https.port), header, n, concurrency)
    return result


def sandbox_side(
    client: Client, world: World, n: int, concurrency: int, *, intercept: bool
) -> dict[str, Any]:
    """The client function in a sandbox, through the proxy."""
    code = (
        trust_prelude(world)
        + CLIENT
        + "import os\n"
        + "CONTEXT = ssl.create_default_context(cafile=os.environ['SSL_CERT_FILE'])\n"
        + "key = os.environ.get('BENCH_KEY', '')\n"
        + "header = ('X-Api-Key: ' + key + '\\r\\n').encode() if key else b''\n"
        + f"print(json.dumps(run(('127.0.0.1', 3128), header, {n}, {concurrency})))\n"
    )
    result = client.call(
        "execute_python_code",
        {"code": code},
        egress=["api.example.com"],
        secrets=["BENCH_KEY"] if intercept else None,
        tool_timeout_s=600,
    )
    if not result.ok:
        raise SystemExit(f"the sandbox side failed: {result.message}\n{result.data}")
    out: dict[str, Any] = json.loads(result.data["stdout"].strip().splitlines()[-1])
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="GETs per side per mode (N)")
    parser.add_argument("--concurrency", type=int, default=8, help="threads when concurrent (C)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--quick", action="store_true", help="N=60, 2 rounds")
    args = parser.parse_args()
    n, rounds = (60, 2) if args.quick else (args.requests, args.rounds)
    per_round = max(args.concurrency, n // rounds)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o711)  # the sandbox uid walks through to the state dir
        world = start_world(base / "world")
        config = world.write_config(
            base / "tooljail.toml",
            allow=["api.example.com"],
            index_url=None,
            secrets={"BENCH_KEY": (SECRET, ["api.example.com"])},
            secrets_file=base / "secrets.toml",
            log_level="WARNING",
        )
        target = f"unix://{base}/tooljail.sock"
        log = open(base / "daemon.log", "wb")  # noqa: SIM115 - closed below
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tooljaild", "serve", "--config", str(config),
             "--listen", target, "--state-dir", str(base / "state"),
             "--backend", args.backend, "--pool-size", "2"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            samples: dict[str, dict[str, list[float]]] = {
                side: {"serial": [], "concurrent": []}
                for side in ("direct", "pass-through", "intercepted")
            }
            pythons: dict[str, str] = {}
            with Client(target) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.call("execute_python_code", {"code": "pass"})
                        break
                    except Exception:
                        if daemon.poll() is not None or time.monotonic() > deadline:
                            raise SystemExit((base / "daemon.log").read_text()) from None
                        time.sleep(0.2)
                for r in range(rounds):
                    order = ["direct", "pass-through", "intercepted"]
                    for side in order if r % 2 == 0 else order[::-1]:
                        if side == "direct":
                            got = host_side(world, per_round, args.concurrency)
                        else:
                            got = sandbox_side(
                                client,
                                world,
                                per_round,
                                args.concurrency,
                                intercept=side == "intercepted",
                            )
                        pythons[side] = got["python"]
                        for mode in ("serial", "concurrent"):
                            samples[side][mode] += got[mode]
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
            log.close()
            world.close()

    print(
        f"egress bench: GET of a 1 KiB file over HTTPS, one new connection per GET; "
        f"N={per_round * rounds} per side and mode, C={args.concurrency} when concurrent; "
        f"backend {args.backend}"
    )
    print(f"  direct runs on the host ({pythons['direct']}), proxied in the sandbox "
          f"({pythons['pass-through']})")  # fmt: skip
    print(f"{'side':14} {'mode':11} {'p50 ms':>8} {'p90 ms':>8} {'x direct':>9} {'+ms p50':>8}")
    for mode in ("serial", "concurrent"):
        direct50 = statistics.median(samples["direct"][mode])
        for side in samples:
            values = samples[side][mode]
            p50, p90 = statistics.median(values), pct(values, 0.9)
            print(
                f"{side:14} {mode:11} {p50 * 1e3:8.3f} {p90 * 1e3:8.3f} "
                f"{p50 / direct50:9.2f} {(p50 - direct50) * 1e3:+8.3f}"
            )
    direct = statistics.median(samples["direct"]["serial"])
    added = {
        side: (statistics.median(samples[side]["serial"]) - direct) * 1e3
        for side in ("pass-through", "intercepted")
    }
    print(
        f"added at p50, back to back: pass-through {added['pass-through']:+.3f} ms (target <= 1), "
        f"intercepted {added['intercepted']:+.3f} ms (target <= 3)"
    )


if __name__ == "__main__":
    main()
