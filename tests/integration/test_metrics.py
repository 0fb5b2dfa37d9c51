"""Prometheus metrics and per-call usage, through a real `tooljail serve`.

The daemon serves /metrics on `--metrics-listen`; these tests make real calls
over gRPC, then scrape it over HTTP and read it with prometheus_client's own
parser: the counts must add up to the calls made, and each result's usage must
say what the call used.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningDaemon
from tooljail import CallStatus, Client
from tooljail.errors import ToolNotFoundError

BURN_CPU = (
    "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass"
)
HOLD_110_MB = "data = b'x' * (110 * 2**20)\nprint(len(data))"
# Past the 256 MiB sandbox limit set below: the kernel kills it (an OOM ending).
HOLD_TOO_MUCH = "chunks = []\nfor _ in range(40):\n    chunks.append(b'x' * (16 * 2**20))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


@pytest.fixture
def metered(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> tuple[RunningDaemon, int]:
    config = tmp_path / "tooljail.toml"
    config.write_text("[limits]\nsandbox_memory_bytes = 268435456\n")
    port = free_port()
    daemon = start_daemon("--config", str(config), "--metrics-listen", f"127.0.0.1:{port}")
    return daemon, port


@pytest.mark.isolation
@pytest.mark.timeout(180)
def test_the_metrics_add_up_to_the_calls_made_and_count_their_endings(
    metered: tuple[RunningDaemon, int],
) -> None:
    daemon, port = metered
    run = "execute_python_code"

    def pool_ready() -> None:
        """Wait (bounded) for the pool's refill: a loaded machine refills slower than
        calls come back to back, and the hit ratio below is the metric's, not the
        refill's speed (bench/ measures that)."""
        deadline = time.monotonic() + 10
        while total(scrape(port), "tooljail_pool_ready") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)

    with Client(daemon.target) as client:
        for i in range(5):
            pool_ready()
            assert client.call(run, {"code": f"print({i})"}).status is CallStatus.SUCCESS
        pool_ready()
        failed = client.call(run, {"code": "raise ValueError('no')"})
        pool_ready()
        oom = client.call(run, {"code": HOLD_TOO_MUCH}, tool_timeout_s=60)
        pool_ready()
        slow = client.call(run, {"code": "import time\ntime.sleep(30)"}, tool_timeout_s=1)
        with pytest.raises(ToolNotFoundError):
            client.call("no_such_tool", {})
    assert failed.status is CallStatus.ERROR
    assert oom.error is not None and oom.error.type == "OutOfMemory", oom
    assert slow.status is CallStatus.TIMEOUT
    # An OOM ending implies a cgroup: its peak is the call's where it can be
    # started afresh (v1; v2 only for a cgroup made for this sandbox).
    assert oom.usage is not None
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    assert oom.usage.memory_peak_bytes > 200 * 2**20 or unified, oom.usage

    # A call's end is counted a moment after its caller has the answer.
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(port)
        if total(samples, "tooljail_calls_total") >= 8 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert total(samples, "tooljail_calls_total") == 8
    assert total(samples, "tooljail_calls_total", tool=run, status="success") == 5
    assert total(samples, "tooljail_calls_total", status="error") == 2
    assert total(samples, "tooljail_calls_total", status="timeout") == 1
    assert total(samples, "tooljail_call_duration_seconds_count", tool=run) == 8
    assert total(samples, "tooljail_call_queue_wait_seconds_count") == 8
    assert total(samples, "tooljail_sandbox_endings_total", reason="oom") == 1
    assert total(samples, "tooljail_sandbox_endings_total", reason="timeout") == 1
    assert total(samples, "tooljail_refusals_total", reason="tool_not_found") == 1
    assert total(samples, "tooljail_calls_running") == 0
    assert total(samples, "tooljail_calls_queued") == 0
    # Calls that find the pool refilled are counted as hits.
    hits = total(samples, "tooljail_pool_hits_total")
    misses = total(samples, "tooljail_pool_misses_total")
    assert hits + misses == 8
    ratio = total(samples, "tooljail_pool_hit_ratio")
    assert ratio == pytest.approx(hits / 8) and ratio > 0.5
    assert total(samples, "tooljail_pool_ready") >= 1
    starts = total(samples, "tooljail_sandbox_starts_total")
    assert starts >= 8 and 0 < total(samples, "tooljail_sandbox_start_seconds_total") < starts * 5
    assert total(samples, "tooljail_journal_write_seconds_count") >= 16  # admitted, finished
    assert total(samples, "tooljail_sessions_open") == 0
    assert ("tooljail_artifacts_stored_bytes", ()) in samples
    output = total(samples, "tooljail_call_output_bytes_total", tool=run)
    assert output >= 10  # "0\n" .. "4\n", the traceback
    daemon.stop()


@pytest.mark.isolation
@pytest.mark.timeout(120)
def test_each_result_says_what_the_call_used_and_the_metrics_sum_it(
    metered: tuple[RunningDaemon, int],
) -> None:
    daemon, port = metered
    with Client(daemon.target) as client:
        burn = client.call("execute_python_code", {"code": BURN_CPU}, tool_timeout_s=30)
        hold = client.call("execute_python_code", {"code": HOLD_110_MB}, tool_timeout_s=30)
        quiet = client.call("execute_python_code", {"code": "print('hi')"})
    for result in (burn, hold, quiet):
        assert result.status is CallStatus.SUCCESS, result
        assert result.usage is not None, result
        assert result.usage.wall_s == pytest.approx(result.duration_s)
        assert result.usage.output_bytes == result.output_bytes
    assert burn.usage is not None and hold.usage is not None and quiet.usage is not None
    assert 0.45 < burn.usage.cpu_s < burn.usage.wall_s + 0.5
    assert hold.usage.memory_peak_bytes > 110 * 2**20
    assert quiet.usage.memory_peak_bytes < 100 * 2**20
    assert quiet.usage.output_bytes == 3 and quiet.usage.cpu_s < 0.45

    deadline = time.monotonic() + 10
    while total(samples := scrape(port), "tooljail_calls_total") < 3:
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
    cpu = total(samples, "tooljail_call_cpu_seconds_total", tool="execute_python_code")
    assert cpu == pytest.approx(burn.usage.cpu_s + hold.usage.cpu_s + quiet.usage.cpu_s)
    peaks = "tooljail_call_memory_peak_bytes"
    assert total(samples, f"{peaks}_count") == 3
    under_64_mib = [
        v
        for (n, ls), v in samples.items()
        if n == f"{peaks}_bucket" and ("le", "6.7108864e+07") in ls
    ]
    assert under_64_mib == [2]  # all but the 110 MB one
    daemon.stop()


def test_a_bad_metrics_address_stops_the_daemon_with_a_reason(tmp_path: Path) -> None:
    from tests.conftest import spawn_daemon

    process, _, base = spawn_daemon(tmp_path, "--metrics-listen", "nowhere")
    assert process.wait(60) != 0
    log = (base / "daemon.log").read_text()
    assert "metrics_listen must be HOST:PORT" in log, log


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_a_docker_sandbox_reports_usage_and_its_pool_too(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    port = free_port()
    daemon = start_daemon("--backend", "docker", "--metrics-listen", f"127.0.0.1:{port}")
    with Client(daemon.target) as client:
        burn = client.call("execute_python_code", {"code": BURN_CPU}, tool_timeout_s=60)
        hold = client.call("execute_python_code", {"code": HOLD_110_MB}, tool_timeout_s=60)
    assert burn.usage is not None and hold.usage is not None, (burn, hold)
    assert burn.usage.cpu_s > 0.45
    assert hold.usage.memory_peak_bytes > 110 * 2**20
    deadline = time.monotonic() + 10
    while total(samples := scrape(port), "tooljail_calls_total") < 2:
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
    docker = [ls for (n, ls), _ in samples.items() if n == "tooljail_pool_ready"]
    assert any(dict(ls)["profile"].startswith("docker ") for ls in docker), docker
    daemon.stop()
