"""bench/bench_commands.py: its --quick run prints its table and its target's verdict."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_commands.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """The bench as a module (it puts bench/ on sys.path: undone after these tests)."""
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("bench_commands", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        sys.modules.pop("bench_calls", None)
        sys.path[:] = path


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_quick_run_prints_its_table_and_target() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--calls", "12", "--settle", "0.05", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, out = proc.stderr, json.loads(proc.stdout)
    assert "run_command argv [true], warm session" in report
    assert out["p50_ms"]["s"] > 0 and out["p50_ms"]["h"] > 0
    (target,) = out["targets"]
    assert target["verdict"] in ({"SKIPPED"} if "e" in out["skipped"] else {"PASS", "MISS"})
    assert target["verdict"] in report


def test_the_target_is_judged_on_the_run(bench: ModuleType) -> None:
    (passed,) = bench.targets({"s": 0.006, "e": 0.090}, {})
    assert (passed["measured"], passed["verdict"]) == (0.067, "PASS")
    (missed,) = bench.targets({"s": 0.030, "e": 0.090}, {})
    assert missed["verdict"] == "MISS"
    (skipped,) = bench.targets({"s": 0.006}, {"e": "no docker CLI"})
    assert (skipped["verdict"], skipped["why_skipped"]) == ("SKIPPED", "no docker CLI")
