"""Patterns a client gives `search_artifact`, compiled with RE2: linear in time,
bounded in memory, never cached.

Python's `re` backtracks: `(a+)+$` over a line of 27 characters held the GIL
(so every RPC of the daemon) for 17 s, doubling per character, and no timeout
can stop a match in progress. RE2 runs in time linear in the text (an automaton,
no backtracking), bounds the memory of each pattern (`max_mem`), and releases
the GIL while it matches (checked by `tests/unit/test_artifact_pattern.py`), so
a search on a worker thread never stalls the event loop and stops at its next
line when the call is stopped. The price: no backreferences and no lookaround,
which RE2 refuses, and this module says so in words a model can act on.

The low-level `re2._re2.RE2` is used, not `re2.compile`: the latter keeps the
last 128 patterns in an LRU cache (up to 8 MiB of automaton each), which is
memory a client could fill and nobody would free.
"""

from __future__ import annotations

import re
from typing import Any

import re2  # type: ignore[import-untyped]

from tooljail.errors import TooljailError

__all__ = ["MAX_PATTERN_MEMORY", "BadPattern", "Pattern"]

MAX_PATTERN_MEMORY = 8 * 1024**2
"""Bytes RE2 may use for one pattern's program and automata (its default); a
pattern that needs more to compile is refused, one that needs more to match
falls back to a slower, still linear, engine."""

_UNSUPPORTED = re.compile(r"invalid perl operator: \(\?<?[=!]|invalid escape sequence: \\[1-9]")
"""RE2's error for a pattern that Python's `re` reads but RE2 cannot: lookaround or a
backreference."""


class BadPattern(TooljailError, ValueError):
    """A pattern that cannot be searched with; `str()` says why, for a model.

    Args:
        message: What is wrong and what to do instead.
        unsupported: RE2 cannot run it at all (a backreference, lookaround),
            as opposed to a pattern that is not valid anywhere.
    """

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


class Pattern:
    """A compiled pattern; `search` tells whether a line holds a match.

    Compiling costs time in the pattern's size: do it off the event loop, after
    checking the size (`max_bytes`).

    Args:
        pattern: The pattern (RE2 syntax, which is Python's for what both read).
        max_bytes: The longest pattern accepted, in UTF-8 bytes.

    Raises:
        BadPattern: It is longer than `max_bytes`, invalid, uses what RE2 does
            not support, or needs more than `MAX_PATTERN_MEMORY` to compile.
    """

    def __init__(self, pattern: str, max_bytes: int) -> None:
        encoded = pattern.encode("utf-8", "surrogatepass")
        if len(encoded) > max_bytes:
            raise BadPattern(too_long(len(encoded), max_bytes))
        options = re2.Options()
        options.max_mem = MAX_PATTERN_MEMORY
        options.log_errors = False  # our answer says it; RE2 would write to stderr
        self._regexp: Any = re2._re2.RE2(encoded, options)
        if not self._regexp.ok():
            message, unsupported = _explain(
                pattern, self._regexp.error().decode("utf-8", "replace")
            )
            raise BadPattern(message, unsupported=unsupported)
        self._anchor = re2._re2.RE2.Anchor.UNANCHORED

    def search(self, line: bytes) -> bool:
        """Whether `line` (UTF-8) holds a match; linear in its length, the GIL released."""
        spans = self._regexp.Match(self._anchor, line, 0, len(line))
        return bool(spans[0][0] != -1)


def too_long(size: int, max_bytes: int) -> str:
    """Why a pattern of `size` bytes is refused."""
    return (
        f"The pattern is {size} bytes long; search_artifact takes patterns of at most "
        f"{max_bytes} bytes (the daemon's [artifacts] max_search_pattern_bytes). Search for "
        "a shorter, more specific pattern, and read around each match with read_artifact."
    )


def _explain(pattern: str, error: str) -> tuple[str, bool]:
    """A model's sentence for RE2's `error` about `pattern`, and whether it is unsupported."""
    shown = repr(pattern[:200]) + ("..." if len(pattern) > 200 else "")
    if _UNSUPPORTED.search(error) or "(?P=" in pattern:
        return (
            f"{shown} uses a backreference or lookaround ({error}), which search_artifact "
            "does not support: it matches with RE2, in time linear in the text. Rewrite the "
            "pattern without them (e.g. match the wider text and check it when reading).",
            True,
        )
    if "pattern too large" in error or "invalid repetition size" in error:
        return (
            f"{shown} is too complex to search with ({error}): simplify it (fewer or smaller "
            "repetitions such as {1000}).",
            False,
        )
    return (
        f"{shown} is not a valid regular expression ({error}). Escape special characters "
        "(a backslash before each of .^$*+?()[]{}|\\) to search for the text itself.",
        False,
    )
