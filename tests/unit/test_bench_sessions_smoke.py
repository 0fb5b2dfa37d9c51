"""bench/bench_sessions.py: its --quick run prints its table and targets; its verdicts.

The smoke run starts what the bench starts (a daemon, the echo server, ipykernel
kernels) with small counts, so it needs the `bench` extra, which scripts/test
installs; without jupyter_client and ipykernel it is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_sessions.py"
JUPYTER_MISSING = [
    name for name in ("jupyter_client", "ipykernel") if importlib.util.find_spec(name) is None
]
needs_jupyter = pytest.mark.skipif(
    bool(JUPYTER_MISSING),
    reason=f"{', '.join(JUPYTER_MISSING)} not installed: pip install -e '.[bench]' "
    "(scripts/test installs it)",
)


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The bench as a module (it puts bench/ on sys.path: undone after these tests)."""
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("bench_sessions", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        sys.modules.pop("bench_calls", None)
        sys.path[:] = path


@pytest.mark.slow
@needs_jupyter
@pytest.mark.timeout(90)
def test_a_quick_run_prints_its_table_targets_and_summary() -> None:
    # --json: the summary alone on stdout, the table a person reads on stderr.
    counts = ["--calls", "40", "--concurrent-calls", "40", "--creations", "6", "--warmup", "3"]
    fast = ["--concurrency", "2", "--settle", "0.05", "--json"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", *counts, *fast],
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, out = proc.stderr, json.loads(proc.stdout)

    for line in ("warm call (x = x + 1)", "latency p50, c=1 (ms)", "throughput, c=2 (calls/s)"):
        assert line in report
    assert "(f) fresh-sandbox call, no session" in report
    # The baselines ran and are plausible: an echo is faster than a kernel's execute.
    assert set(out["warm"]) >= {"g", "j"}, out
    assert 0 < out["warm"]["g"]["p50_ms"] < out["warm"]["j"]["p50_ms"]
    assert out["throughput"]["g"] > 0 and out["throughput"]["j"] > 0
    assert out["creation"]["fresh_call"]["p50_ms"] > 0
    assert out["jupyter_python"].startswith("/")

    verdicts = [t["verdict"] for t in out["targets"]]
    assert len(verdicts) == 3
    if "s" in out["skipped"]:  # a daemon without sessions: said, never a crash
        assert "sessions are not available" in report
        assert verdicts == ["SKIPPED"] * 3
    else:
        assert set(out["warm"]) == {"s", "i", "g", "j"}
        assert out["creation"]["session_create"]["p50_ms"] > 0
        assert set(verdicts) <= {"PASS", "MISS"}
    for t in out["targets"]:
        assert f"{t['target']:46}" in report and t["verdict"] in report


def test_each_target_is_judged_on_the_run_and_a_miss_is_printed_as_one(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    got = bench.Measured(
        warm={"s": [0.0015] * 5, "g": [0.001] * 5, "j": [0.004] * 5},
        throughput={"s": 500.0, "g": 1000.0, "j": 200.0},
        fresh=[0.006] * 5,
        create=[0.0085] * 5,
        create_first=[0.010] * 5,
        close=[0.001] * 5,
        skipped={"i": "Client.call takes no session_id"},
    )
    judged = {t["target"]: (t["measured"], t["verdict"]) for t in bench.targets(got)}
    assert judged == {
        "warm session call p50 / gRPC echo p50": (1.5, "PASS"),
        "warm session call p50 / Jupyter execute p50": (0.375, "MISS"),
        "session create p50 - fresh-sandbox call p50": (2.5, "MISS"),
    }
    args = bench.parse_args(["--quick"])
    bench.print_report(got, args)
    report = capsys.readouterr().out
    assert "measured 0.375x  MISS" in report and "measured 2.500ms  MISS" in report
    assert "; skipped: Client.call takes no session_id" in report


def test_without_sessions_every_target_says_skipped_and_why(bench: ModuleType) -> None:
    got = bench.Measured(
        warm={"g": [0.001], "j": [0.004]},
        fresh=[0.006],
        skipped={"s": "this SDK has no Client.session", "i": "as (s)"},
    )
    for t in bench.targets(got):
        assert (t["verdict"], t["why_skipped"]) == ("SKIPPED", "this SDK has no Client.session")
