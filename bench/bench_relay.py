"""What the Unix socket's uid relay (`tooljaild.app.relay`) adds to a call.

A server process runs, on one event loop as the daemon does, a grpc.aio health
servicer on a private socket and the `PeerRelay` in front of it on a public
one. This process makes N unary calls (grpc.health Check, the cheapest RPC)
over each socket, in turns, and prints per call: the p50 latency, and the
server process's CPU time (read from /proc), direct vs relayed, and their
ratios. Run: `PYTHONPATH=client:daemon python bench/bench_relay.py [N]`.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def serve(directory: Path) -> None:
    import socket

    import grpc.aio
    from grpc_health.v1 import health, health_pb2_grpc

    from tooljaild.app.relay import PeerRelay

    async def main() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        server.add_insecure_port(f"unix://{directory / 'direct'}")
        await server.start()
        relay = PeerRelay(directory / "direct", max_connections=64, max_per_uid=64)
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listening.bind(str(directory / "relayed"))
        listening.listen(64)
        await relay.start(listening)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await relay.close()
        await server.stop(None)

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(target: str, pid: int, n: int) -> tuple[float, float]:
    """p50 latency (s) and the server's CPU per call (s) over `n` calls on one channel."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for _ in range(50):  # warm: the connection, the relay's link
            stub.Check(health_pb2.HealthCheckRequest())
        times = []
        before = cpu_s(pid)
        for _ in range(n):
            began = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest())
            times.append(time.perf_counter() - began)
        return statistics.median(times), (cpu_s(pid) - before) / n


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        serve(Path(sys.argv[2]))
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    with tempfile.TemporaryDirectory() as d:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve", d],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdin is not None
        assert server.stdout.readline().strip() == "ready"
        results: dict[str, list[tuple[float, float]]] = {"direct": [], "relayed": []}
        for _ in range(3):  # in turns: drift on a shared VM hits both alike
            for kind in results:
                results[kind].append(measure(f"unix://{d}/{kind}", server.pid, n // 3))
        server.stdin.close()
        server.wait(30)
        server.stdout.close()
    p50 = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
    cpu = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
    for kind in results:
        print(f"{kind:8} p50 {p50[kind] * 1e3:.3f} ms   server CPU {cpu[kind] * 1e3:.3f} ms/call")
    print(
        f"relayed/direct: latency {p50['relayed'] / p50['direct']:.2f}x "
        f"(+{(p50['relayed'] - p50['direct']) * 1e3:.3f} ms), server CPU "
        f"{cpu['relayed'] / cpu['direct']:.2f}x (+{(cpu['relayed'] - cpu['direct']) * 1e3:.3f} ms)"
    )


if __name__ == "__main__":
    main()
