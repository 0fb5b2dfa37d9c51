"""search_artifact played as a hostile client would, against `tooljail serve`
in a subprocess (its own GIL, its own RSS): a backtracking pattern, a 4 MiB
pattern, many distinct patterns, and patterns RE2 does not run. Meanwhile
another client's cheap RPC (GetDaemonInfo) keeps answering within a bound, and
the daemon's RSS stays bounded.

With Python's `re` in the daemon, `(a+)+$` over a line of 40 a's holds the GIL
for hours (it doubles per character), and a 4 MiB pattern is compiled on the
event loop and cached (~90 MiB): both fail here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import pytest

from tests.conftest import RunningDaemon
from tests.holds import MiB, Probe
from tooljail import CallStatus, Client

pytestmark = pytest.mark.timeout(120)

LINE = "a" * 40 + "!"
"""`(a+)+$` backtracks 2**40 times over it in Python's `re`."""


def _rss(daemon: RunningDaemon) -> int:
    return int(psutil.Process(daemon.pid).memory_info().rss)


@pytest.fixture
def daemon_and_artifact(
    start_daemon: Callable[..., RunningDaemon],
) -> tuple[RunningDaemon, Client, str]:
    """A daemon, a client, and an artifact of that client's holding `LINE`."""
    daemon = start_daemon(pool_size=1)
    client = Client(daemon.target, client_name="searcher", rpc_timeout_s=60)
    code = (
        "import os\nos.makedirs('outputs', exist_ok=True)\n"
        f"open('outputs/line.txt', 'w').write({LINE!r} * 1 + '\\n' + 'b' * 30 + '\\n')\n"
    )
    made = client.call("execute_python_code", {"code": code})
    assert made.ok, made
    (ref,) = made.artifacts
    return daemon, client, ref.artifact_id


def test_a_backtracking_pattern_is_linear_and_freezes_nothing(
    daemon_and_artifact: tuple[RunningDaemon, Client, str],
) -> None:
    daemon, client, artifact_id = daemon_and_artifact
    with client, Probe(daemon.target).running() as probe:
        start = time.monotonic()
        for pattern in (r"(a+)+$", r"(a|aa)+$", r"(a*)*b", r"^(a|a?)+$"):
            found = client.call(
                "search_artifact",
                {"artifact_id": artifact_id, "pattern": pattern},
                tool_timeout_s=2,
            )
            assert found.status == CallStatus.SUCCESS, found
            assert found.data["match_count"] == (1 if pattern == r"(a*)*b" else 0), found.data
        elapsed = time.monotonic() - start
    probe.assert_responsive()
    assert elapsed < 10, f"four searches of two lines took {elapsed:.1f}s"


def test_a_huge_pattern_is_refused_before_it_is_compiled(
    daemon_and_artifact: tuple[RunningDaemon, Client, str],
) -> None:
    daemon, client, artifact_id = daemon_and_artifact
    before = _rss(daemon)
    with client, Probe(daemon.target).running() as probe:
        for args in (
            {"artifact_id": artifact_id, "pattern": "(a+)+" * (MiB // 5) + "$"},
            # No valid id needed to try it: refused all the same, by the size first.
            {"artifact_id": "0" * 32, "pattern": "a" * (4 * MiB)},
        ):
            refused = client.call("search_artifact", args, tool_timeout_s=5)
            assert refused.status == CallStatus.ERROR, refused
            assert refused.error is not None and refused.error.type == "PatternTooLong"
            assert "max_search_pattern_bytes" in refused.message
            assert "4096 bytes" in refused.message
    probe.assert_responsive()
    assert _rss(daemon) - before < 48 * MiB, (before, _rss(daemon))


def test_many_distinct_patterns_are_not_kept(
    daemon_and_artifact: tuple[RunningDaemon, Client, str],
) -> None:
    daemon, client, artifact_id = daemon_and_artifact
    with client:
        # Warm up the daemon's own allocations (thread pool, buffers) first.
        client.call("search_artifact", {"artifact_id": artifact_id, "pattern": "b{30}"})
        before = _rss(daemon)
        for n in range(40):
            # ~4 KiB each, with big automata: a cache of them would grow by MiBs each.
            pattern = f"(x{n}|" + "|".join(f"[a-z]{{{k}}}q{n}" for k in range(1, 60)) + ")"
            found = client.call("search_artifact", {"artifact_id": artifact_id, "pattern": pattern})
            assert found.status == CallStatus.SUCCESS, found
    assert _rss(daemon) - before < 48 * MiB, (before, _rss(daemon))


def test_patterns_re2_does_not_run_say_so(
    daemon_and_artifact: tuple[RunningDaemon, Client, str],
) -> None:
    _, client, artifact_id = daemon_and_artifact
    with client:
        for pattern in (r"(a)\1", r"a(?=!)", r"(?<!b)a", r"(?P<x>a)(?P=x)"):
            refused = client.call(
                "search_artifact", {"artifact_id": artifact_id, "pattern": pattern}
            )
            assert refused.status == CallStatus.ERROR, refused
            assert refused.error is not None and refused.error.type == "UnsupportedPattern"
            assert "backreference or lookaround" in refused.message
        invalid = client.call("search_artifact", {"artifact_id": artifact_id, "pattern": "[a-"})
        assert invalid.error is not None and invalid.error.type == "InvalidPattern"
