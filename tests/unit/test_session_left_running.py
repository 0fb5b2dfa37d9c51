"""What a session call left running: read safely from the supervisor's frame, told in words."""

from __future__ import annotations

from tooljaild.calls.results import left_running_note
from tooljaild.sandbox.session_channel import LeftRunning


def test_a_malformed_left_reads_as_nothing() -> None:
    assert not LeftRunning.of({})
    assert not LeftRunning.of({"left": "x"})
    left = LeftRunning.of(
        {"left": {"threads": True, "processes": -3, "earlier_threads": "2", "kept": 1}}
    )
    assert left == LeftRunning()
    assert LeftRunning.of({"left": {"threads": 2, "kept": True}}) == LeftRunning(
        threads=2, kept=True
    )


def test_the_note_names_each_thing_left() -> None:
    note = left_running_note(LeftRunning(threads=2, processes=1, kept=True))
    assert "leaves 2 threads running" in note
    assert "1 process this call started is still running (the session keeps" in note
    note = left_running_note(LeftRunning(processes=3, earlier_threads=1, dropped_bytes=10))
    assert "3 processes this call started were still running at its end" in note
    assert "1 thread started by earlier calls was running" in note
    assert "10 bytes of output" in note
