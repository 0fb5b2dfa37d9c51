"""The metrics' pure parts: how a result's ending is named, the listen address."""

from __future__ import annotations

import pytest

from tooljail._types import CallStatus, ToolError, ToolResult
from tooljaild.app.metrics import Metrics, ending_of, split_listen


def result(status: CallStatus, error_type: str | None = None) -> ToolResult:
    error = None if error_type is None else ToolError(type=error_type, message="")
    return ToolResult(call_id="c", tool="t", status=status, error=error)


@pytest.mark.parametrize(
    ("status", "error_type", "ending"),
    [
        (CallStatus.TIMEOUT, None, "timeout"),
        (CallStatus.ERROR, "OutOfMemory", "oom"),
        (CallStatus.ERROR, "CpuLimit", "cpu"),
        (CallStatus.ERROR, "OutputLimit", "output"),
        (CallStatus.ERROR, "Signal", "signal"),
        (CallStatus.ERROR, "FileSizeLimit", "file_size"),
        (CallStatus.ERROR, "ValueError", None),  # the tool raised: it ended by itself
        (CallStatus.CANCELLED, "Cancelled", None),
        (CallStatus.SUCCESS, None, None),
    ],
)
def test_a_sandbox_ending_is_named_by_the_result(
    status: CallStatus, error_type: str | None, ending: str | None
) -> None:
    assert ending_of(result(status, error_type)) == ending


@pytest.mark.parametrize(
    ("listen", "parts"),
    [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:0", ("::1", 0)), ("host:1", ("host", 1))],
)
def test_the_listen_address_is_host_and_port(listen: str, parts: tuple[str, int]) -> None:
    assert split_listen(listen) == parts


@pytest.mark.parametrize("listen", ["9464", ":9464", "host:", "host:http", "host:70000"])
def test_a_listen_address_without_host_and_port_is_refused(listen: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_listen(listen)


def test_without_a_daemon_the_levels_are_zero() -> None:
    metrics = Metrics()
    for name in ("tooljail_calls_running", "tooljail_calls_queued", "tooljail_sessions_open"):
        assert metrics.registry.get_sample_value(name) == 0
