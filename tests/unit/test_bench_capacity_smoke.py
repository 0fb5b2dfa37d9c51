"""bench/bench_capacity.py: a tiny run through real daemons gives every figure
docs/scaling.md and bench/sim_fleet.py read, with sane values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_capacity.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_run_gives_the_figures_the_sim_reads() -> None:
    argv = ["--levels", "1,2", "--calls", "8", "--rounds", "1", "--warmup", "2"]
    argv += ["--pool-extra", "4", "--sessions", "2", "--json"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)  # --json: the figures alone on stdout
    assert "idle session" in proc.stderr  # the table a person reads
    assert got["cpus"] >= 1 and len(got["loadavg_start"]) == 3
    assert [r["concurrency"] for r in got["throughput"]] == [1, 2]
    for row in got["throughput"]:
        assert len(row["samples_ms"]) == 8
        assert row["samples_ms"] == sorted(row["samples_ms"])
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["calls_per_s"] > 0 and row["bare_calls_per_s"] > 0
        # A call costs CPU in the daemon's tree (its sandbox, the refill) and in the client.
        assert row["daemon_cpu_ms_per_call"] > 0 and row["client_cpu_ms_per_call"] > 0
        assert row["bare_cpu_ms_per_call"] > 0
    mem = got["memory"]
    assert mem["warm_sandbox_pss_bytes"] > 0 and mem["session_pss_bytes"] > 0
    assert mem["warm_sandbox_pss_bytes"] < mem["warm_sandbox_rss_bytes"]  # shared pages
    assert mem["sessions_per_gib"] == pytest.approx(2**30 / mem["session_pss_bytes"])
    # More sandboxes in the tree, more processes.
    assert mem["tree_more_pool"]["processes"] > mem["tree_base"]["processes"]
