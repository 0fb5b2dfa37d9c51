"""bench/bench_history.py: a tiny run seeds a journal, serves it, and prints a row
per filter beside the echo floor, and the journal's write cost with and without
the history indexes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_history.py"


@pytest.mark.timeout(300)
def test_a_tiny_run_prints_every_row_and_the_write_cost() -> None:
    argv = ["--calls", "2500", "--samples", "10", "--write-calls", "1000", "--json"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)  # --json: the summary alone on stdout
    assert "ListCalls of 50 from 2,500 calls" in proc.stderr  # the table a person reads
    rows = got["rows"]
    assert {"echo (GetDaemonInfo)", "client", "tool", "session", "status (error)"} <= set(rows)
    assert {"time range (1 h)", "ended", "running (none)", "page 20 (cursor)"} <= set(rows)
    for row in rows.values():
        assert 0 < row["p50_ms"] <= row["p95_ms"]
    assert set(got["writes"]) == {"schema 4", "no history indexes"}
    assert all(w["p50_us"] > 0 for w in got["writes"].values())
    assert got["calls"] == 2500 and got["journal_bytes"] > 0
