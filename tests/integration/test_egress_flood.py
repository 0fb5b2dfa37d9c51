"""A sandbox opening 10,000 connections at once, through a real daemon: bounded, refused, healthy.

`tooljail serve` (a subprocess, so psutil measures the daemon alone) with the
egress world's config and `[limits] max_egress_connections = 16`. Code in a
sandbox holds 16 connections to its relay open, then opens 10,000 more, as
fast as it can (closing each, as its own 256 open files would not hold them
all). Past the limit, the proxy closes each at once; the result lists one
`connection_limit` denial with its count; the daemon's RSS grows by little;
another client's GetDaemonInfo answers throughout; the sandbox's next call
reaches an allowed host.

Needs the daemon's egress wiring and the egress world (other helpers' parts
of issue 23): skipped where they are absent.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

pytest.importorskip("tests.egress_world")
pytest.importorskip("tooljaild.app.egress")

from tests.conftest import spawn_daemon, wait_serving
from tests.egress_world import World
from tooljail import Client
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

LIMIT = 16
FLOOD = 10_000

FLOOD_CODE = f"""
import socket, time
held = [socket.create_connection(("127.0.0.1", 3128), timeout=10) for _ in range({LIMIT})]
time.sleep(0.3)  # the proxy has taken all {LIMIT}: every next one is past the limit
opened = refused = 0
started = time.monotonic()
for _ in range({FLOOD}):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    except OSError:
        continue
    opened += 1
    s.close()
print("opened", opened, "in", round(time.monotonic() - started, 2), "s")
time.sleep(0.5)  # the relay passes the last ones before the call ends
"""


@pytest.fixture(scope="module")
def flood_daemon(
    egress_world: World, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int, Path]]:
    base = tmp_path_factory.mktemp("egress-flood")
    config = egress_world.write_config(
        base / "tooljail.toml",
        allow=["data.example.org"],
        index_url=None,
        limits={"max_egress_connections": LIMIT},
    )
    process, target, base = spawn_daemon(base, "--config", str(config))
    try:
        wait_serving(target, process, base / "daemon.log")
        yield target, process.pid, base
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except Exception:
                process.kill()
                process.wait(10)


def test_ten_thousand_connections_from_one_sandbox_are_bounded(
    flood_daemon: tuple[str, int, Path], egress_world: World
) -> None:
    target, pid, _ = flood_daemon
    daemon = psutil.Process(pid)
    with Client(target) as client:
        # Warm: the proxy's thread and one gate have run once.
        warm = client.call(
            "execute_python_code",
            {
                "code": "import urllib.request as u; print(u.urlopen('http://data.example.org/hello').status)"
            },
            egress=["data.example.org"],
        )
        assert warm.ok and "200" in str(warm.data), warm
        rss_before = daemon.memory_info().rss
        fds_before = daemon.num_fds()
        lags: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            with grpc.insecure_channel(target) as channel:
                stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
                while not stop.is_set():
                    started = time.monotonic()
                    stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
                    lags.append(time.monotonic() - started)
                    time.sleep(0.01)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            result = client.call(
                "execute_python_code",
                {"code": FLOOD_CODE},
                egress=["data.example.org"],
                tool_timeout_s=120,
            )
        finally:
            stop.set()
            prober.join(30)
        assert result.ok, result
        print("\n", str(result.data)[:200])
        limited = [d for d in result.egress_denied if d.reason == "connection_limit"]
        assert len(limited) == 1, result.egress_denied
        assert limited[0].count >= FLOOD * 0.9, limited
        assert limited[0].rule == f"limits.max_egress_connections = {LIMIT}"
        assert len(result.egress_denied) <= 64
        rss_growth = daemon.memory_info().rss - rss_before
        print(
            f"daemon RSS +{rss_growth >> 10} KiB, slowest GetDaemonInfo "
            f"{max(lags) * 1000:.1f} ms over {len(lags)} probes"
        )
        assert rss_growth < 30 * 1024 * 1024, rss_growth
        assert lags and max(lags) < 0.5, max(lags)
        # Every refused descriptor was closed.
        deadline = time.monotonic() + 10
        while daemon.num_fds() > fds_before + 8:
            assert time.monotonic() < deadline, (daemon.num_fds(), fds_before)
            time.sleep(0.05)
        # The sandbox's next call reaches what it may.
        after = client.call(
            "execute_python_code",
            {
                "code": "import urllib.request as u; print(u.urlopen('http://data.example.org/hello').status)"
            },
            egress=["data.example.org"],
        )
        assert after.ok and "200" in str(after.data), after
