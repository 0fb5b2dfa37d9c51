"""search_artifact's patterns (`tooljaild.artifacts.pattern`): RE2, linear, bounded,
and matching with the GIL released (so a search on a worker thread stalls nothing)."""

from __future__ import annotations

import threading
import time

import pytest

from tooljaild.artifacts.pattern import BadPattern, Pattern


def test_backtracking_patterns_are_linear() -> None:
    start = time.monotonic()
    assert not Pattern(r"(a+)+$", 4096).search(b"a" * 100_000 + b"!")
    assert Pattern(r"(a|aa)+!", 4096).search(b"a" * 100_000 + b"!")
    assert time.monotonic() - start < 2


def test_the_gil_is_released_while_matching() -> None:
    pattern = Pattern(r"(a|b)*[ab]{20}c", 4096)  # no literal to skip to: a full scan
    text = b"ab" * 20_000_000
    ticks = 0
    done = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.monotonic()
    assert not pattern.search(text)
    elapsed = time.monotonic() - start
    done.set()
    ticker.join()
    # Held, the ticker would not have run at all during the match.
    assert ticks >= elapsed / 0.001 / 4, (ticks, elapsed)


def test_size_is_checked_before_compiling() -> None:
    with pytest.raises(BadPattern, match="at most 16 bytes") as refused:
        Pattern("é" * 9, 16)  # 18 bytes of UTF-8
    assert not refused.value.unsupported


@pytest.mark.parametrize("pattern", [r"(a)\1", r"a(?=b)", r"a(?!b)", r"(?<=a)b", r"(?P<x>a)(?P=x)"])
def test_what_re2_does_not_run_is_named(pattern: str) -> None:
    with pytest.raises(BadPattern, match="backreference or lookaround") as refused:
        Pattern(pattern, 4096)
    assert refused.value.unsupported


def test_too_complex_and_invalid() -> None:
    with pytest.raises(BadPattern, match="too complex"):
        Pattern("((a{999}){999})", 4096)
    with pytest.raises(BadPattern, match="not a valid regular expression"):
        Pattern("[a-", 4096)
