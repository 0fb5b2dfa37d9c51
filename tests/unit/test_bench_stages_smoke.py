"""bench/bench_stages.py: a tiny run through a real daemon prints its stage table,
its floors and its projection, and a JSON summary with sane values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_stages.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_tiny_run_prints_stages_floors_and_projection() -> None:
    argv = ["--quick", "--projection", "--calls", "6", "--rounds", "2", "--warmup", "1"]
    argv += ["--concurrent-calls", "8"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=220
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "end to end, p50" in proc.stdout and "fork of a warm interpreter" in proc.stdout
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["calls"] == 6
    for side in ("fresh", "session"):
        s = got[side]
        assert 0 < s["run_p50_ms"] < s["e2e_p50_ms"]
        assert s["outside_run_p50_ms"] > 0
        # Every call is journaled; the daemon's own process works for each.
        assert s["journal_writes_per_call"] > 0
        assert s["daemon_cpu_ms_per_call"] > 0 and s["client_cpu_ms_per_call"] > 0
    # A fresh call uses up its sandbox: the zygote starts another.
    assert got["fresh"]["refills_per_call"] > 0 and got["fresh"]["refill_mean_ms"] > 0
    assert got["session"]["refills_per_call"] == 0
    floors = got["floors"]
    assert floors["bare_python_p50_ms"] > 0 and floors["fork_cpu_ms_per_call"] >= 0
    assert floors["fork_p50_ms"] > 0 and floors["grpc_echo_p50_ms"] > 0
    proj = got["projection"]
    assert proj["1_core"]["calls_per_s"] > 0 and proj["2_core"]["calls_per_s"] > 0
    for cores in ("16_cores", "64_cores"):
        row = proj[cores]
        assert row["projected_calls_per_s"] == min(
            row["loop_ceiling_calls_per_s"], row["cores_ceiling_calls_per_s"]
        )
