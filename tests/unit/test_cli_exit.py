"""The CLI's exit status tells a script whether to try again later."""

from __future__ import annotations

from tooljail.errors import (
    DaemonUnavailableError,
    JournalUnavailableError,
    ToolNotFoundError,
)
from tooljaild.cli.common import EXIT_UNAVAILABLE, EXIT_USAGE, refused


def test_a_daemon_that_cannot_record_calls_is_unavailable_not_a_usage_error() -> None:
    journal = JournalUnavailableError("the journal /x is full", reason="full")
    assert refused(journal) == EXIT_UNAVAILABLE
    assert refused(DaemonUnavailableError("no daemon")) == EXIT_UNAVAILABLE
    assert refused(ToolNotFoundError("no tool 'x'")) == EXIT_USAGE
