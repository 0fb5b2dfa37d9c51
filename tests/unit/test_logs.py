"""Structured logs: one JSON object per line."""

from __future__ import annotations

import json
import logging

from tooljaild.app.logs import JsonFormatter


def test_log_lines_are_json_and_extras_never_hide_the_level() -> None:
    record = logging.LogRecord("tooljaild.x", logging.WARNING, __file__, 1, "hi %s", ("you",), None)
    record.level = "best-effort"
    record.call_id = "c1"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "warning"
    assert entry["msg"] == "hi you"
    assert entry["extra_level"] == "best-effort"
    assert entry["call_id"] == "c1"
