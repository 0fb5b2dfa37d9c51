"""CI must not pass by skipping what it is there to check."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"
SKIPPING = """
import pytest

@pytest.mark.docker
def test_needs_docker():
    pytest.skip("no Docker engine answers")

@pytest.mark.isolation
@pytest.mark.skipif(True, reason="no bubblewrap")
def test_needs_bwrap():
    pass

def test_plain_skip():
    pytest.skip("not relevant here")
"""


# A skip in the test body fails the test; a skip at setup (skipif) errors it.
@pytest.mark.parametrize(("ci", "failed", "errors", "skipped"), [("true", 1, 1, 1), ("", 0, 0, 3)])
def test_skipped_docker_and_isolation_tests_fail_only_in_ci(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ci: str,
    failed: int,
    errors: int,
    skipped: int,
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    docker: d\n    isolation: i\n")
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=failed, errors=errors, skipped=skipped)
    if failed:
        result.stdout.fnmatch_lines(["*skipped in CI, which must provide*no Docker engine*"])
