"""The CLI's exit status tells a script whether to try again later."""

from __future__ import annotations

from tooljail.errors import (
    DaemonUnavailableError,
    JournalUnavailableError,
    ToolNotFoundError,
)
from tooljaild.cli import EXIT_UNAVAILABLE, EXIT_USAGE, _refused


def test_a_daemon_that_cannot_record_calls_is_unavailable_not_a_usage_error() -> None:
    journal = JournalUnavailableError("the journal /x is full", reason="full")
    assert _refused(journal) == EXIT_UNAVAILABLE
    assert _refused(DaemonUnavailableError("no daemon")) == EXIT_UNAVAILABLE
    assert _refused(ToolNotFoundError("no tool 'x'")) == EXIT_USAGE
