"""bench/bench_journal.py: a tiny run prints both durabilities, every metric and its ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_journal.py"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tiny_run_prints_each_metric_for_crash_and_power_with_the_ratio() -> None:
    counts = ["--calls", "4", "--rounds", "1", "--warmup", "2", "--journal-calls", "16"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", *counts, "--concurrency", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, out = proc.stderr, json.loads(proc.stdout)
    metrics = [row["metric"] for row in out["rows"]]
    assert metrics == [
        "p50 latency, c=1 (ms)",
        "p50 latency, c=2 (ms)",
        "throughput, c=1 (calls/s)",
        "throughput, c=2 (calls/s)",
        "journal writes per call, c=1 (µs)",
        "journal writes per call, batches of 2 (µs)",
    ]
    for row in out["rows"]:
        assert row["crash"] > 0 and row["power"] > 0, row
        assert row["ratio"] == pytest.approx(row["power"] / row["crash"])
        assert row["metric"] in report
    assert "power/crash" in report and 'durability "power"' in report
