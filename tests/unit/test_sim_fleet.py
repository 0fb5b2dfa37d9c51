"""bench/sim_fleet.py: the fleet model keeps the invariants docs/scaling.md rests on.

On a tiny fleet: one node with one server behaves as queueing theory says
(M/D/1: Poisson arrivals, one fixed service time), refusals happen only at the
admission bound, every call is accounted for, a seed gives the same run, and
the model's admission bound is still the daemon's default.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tooljaild.settings.config import Settings

SIM_PATH = Path(__file__).resolve().parents[2] / "bench" / "sim_fleet.py"


@pytest.fixture(scope="module")
def sim() -> Iterator[ModuleType]:
    """The model as a module (registered while these tests run: its dataclasses
    look their module up by name)."""
    spec = importlib.util.spec_from_file_location("sim_fleet", SIM_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def one_server(sim: ModuleType, rate: float, service_s: float, bound: int, **load: object):  # type: ignore[no-untyped-def]
    fleet = sim.Fleet(nodes=1, servers=1, bound=bound)
    options = {"duration_s": 1000.0, "burst": 1.0, "interval_s": 100.0} | load
    return sim.simulate(
        fleet, sim.Load(base_rate=rate, **options), sim.constant(service_s), service_s, seed=7
    )


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_one_server_matches_md1(sim: ModuleType, rho: float) -> None:
    """Mean queue wait of M/D/1: rho * D / (2 (1 - rho)); a call waits with probability rho."""
    service = 0.01
    out = one_server(sim, rho / service, service, bound=10**9)
    mean_wait = sum(out.waits) / len(out.waits)
    theory = rho * service / (2 * (1 - rho))
    assert mean_wait == pytest.approx(theory, rel=0.1)
    waited = sum(1 for w in out.waits if w > 0) / len(out.waits)
    assert waited == pytest.approx(rho, abs=0.02)
    assert out.refused == 0


def test_even_arrivals_below_capacity_never_wait(sim: ModuleType) -> None:
    """D/D/1 with a gap longer than the service time: no call waits."""
    out = one_server(sim, 90.0, 0.01, bound=1, poisson=False, duration_s=100.0)
    assert out.refused == 0
    assert max(out.waits) == pytest.approx(0.0, abs=1e-9)


def test_refusals_only_at_the_bound(sim: ModuleType) -> None:
    """Overloaded 2x: calls are refused, and only by a node holding `bound` calls."""
    out = one_server(sim, 200.0, 0.01, bound=5, duration_s=100.0)
    assert out.refused > 0
    assert out.min_held_at_refusal == 5
    assert out.max_held == 5
    # The same load with room for every call: none refused, queues grow instead.
    roomy = one_server(sim, 200.0, 0.01, bound=10**9, duration_s=50.0)
    assert roomy.refused == 0
    assert roomy.min_held_at_refusal is None


@pytest.mark.parametrize("retry", [None, 1.0])
def test_every_call_is_accounted_for(sim: ModuleType, retry: float | None) -> None:
    """arrived = done + refused + in flight, on a small fleet through a burst."""
    fleet = sim.Fleet(nodes=3, servers=2, bound=8)  # 150 calls/s at most
    load = sim.Load(
        base_rate=30.0,
        duration_s=30.0,
        burst=10.0,
        burst_at_s=10.0,
        burst_s=5.0,
        interval_s=5.0,
        retry_after_s=retry,
        retries=2,
    )
    out = sim.simulate(fleet, load, sim.empirical([0.01, 0.02, 0.09]), 0.04, seed=3)
    assert out.refused > 0
    assert out.arrived == out.done + out.refused + out.in_flight
    assert sum(r.arrived for r in out.intervals) == out.arrived
    assert sum(r.refused for r in out.intervals) == out.refused
    assert len(out.waits) == out.arrived - out.refused
    # Refusals fall in the burst (and the queues it leaves), not before it.
    assert sum(r.refused for r in out.intervals if r.start < 10.0) == 0
    if retry is None:
        assert out.gave_up == 0
    else:  # each refused call comes back at most twice; some are refused all three times
        assert 0 < out.gave_up * 3 <= out.refused


def test_same_seed_same_run(sim: ModuleType) -> None:
    fleet = sim.Fleet(nodes=4, servers=2, bound=6)
    load = sim.Load(base_rate=150.0, duration_s=20.0, burst_at_s=5.0, burst_s=5.0, interval_s=5.0)
    draw = sim.empirical([0.005, 0.01, 0.05])
    runs = [sim.summary(sim.simulate(fleet, load, draw, 0.0217, seed=s), 0.7) for s in (9, 9, 10)]
    assert json.dumps(runs[0]) == json.dumps(runs[1])
    assert json.dumps(runs[0]) != json.dumps(runs[2])


def test_utilization_and_sizing_rule(sim: ModuleType) -> None:
    """Busy share of the servers tracks the offered load; the rule sizes for it."""
    fleet = sim.Fleet(nodes=5, servers=4, bound=10**6)
    load = sim.Load(base_rate=1000.0, duration_s=60.0, burst=1.0, interval_s=60.0)
    s = sim.summary(sim.simulate(fleet, load, sim.constant(0.01), 0.01, seed=1), 0.5)
    assert s["intervals"][0]["utilization"] == pytest.approx(0.5, abs=0.03)
    assert s["sizing"]["nodes_for_base"] == 5  # 1000/s x 10 ms / (4 x 0.5)


def test_bound_is_the_daemons_default(sim: ModuleType) -> None:
    """The model refuses where a daemon with default settings does."""
    settings = Settings()
    assert settings.max_concurrent == sim.MAX_CONCURRENT
    assert settings.max_queue == sim.MAX_QUEUE
    assert settings.max_concurrent + settings.max_queue == sim.Fleet().bound
