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

@pytest.fixture(params=["subreaper", "cgroup"])
def sandbox(request):
    if request.param == "cgroup":
        pytest.skip("this host gives no writable cgroup tree")
    return request.param

def test_each_sandbox(sandbox):
    pass

@pytest.mark.skipif(True, reason="mounting needs root")
def test_root_only():
    pass

@pytest.mark.ci_may_skip("CI cannot be every architecture")
def test_other_architecture():
    pytest.skip("the foreign ABIs checked here are x86_64's")

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False
"""


# In CI every skip fails but the declared one: a skip in the test body fails the
# test; a skip at setup (skipif, a fixture's parameter) errors it.
@pytest.mark.parametrize(("ci", "failed", "errors", "skipped"), [("true", 1, 3, 1), ("", 0, 0, 5)])
def test_skipped_tests_fail_only_in_ci(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    ci: str,
    failed: int,
    errors: int,
    skipped: int,
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(
        "[pytest]\nmarkers =\n    docker: d\n    isolation: i\n    ci_may_skip(why): s\n"
    )
    pytester.makepyfile(SKIPPING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=failed, errors=errors, skipped=skipped, xfailed=1)
    if failed:
        result.stdout.fnmatch_lines(["*skipped in CI, which must provide*no Docker engine*"])
