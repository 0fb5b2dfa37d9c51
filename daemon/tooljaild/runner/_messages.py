"""What a session's supervisor takes of its interpreter's messages: tool code's words.

The interpreter writes its frames ({"t": "yield", "v"}, {"t": "artifact", ...},
{"t": "result", "seq", ...}, each with the running call's nonce "n") to a pipe
tool code can write to as well. The supervisor reads them as untrusted: a
line that is no JSON object, or lacks the running call's nonce, is dropped
(`parse`); of a result only the keys a result has are kept, and the counts
it tells are made sane (`result`); an artifact's part is passed on only when
every field has its type (`artifact_fields`). The supervisor keeps the count
of a call's artifacts itself.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import json
from typing import Any

_RESULT_KEYS = ("ok", "kind", "value", "exit_code", "error")
_LEFT_KEYS = ("threads", "earlier_threads", "dropped_bytes", "dropped_frames")
"""What the interpreter's result says the call left (_turn.Turn.close)."""
_ARTIFACT_KEYS = ("name", "mime_type", "source", "data_b64", "part", "last")


def parse(line: bytes, nonce: str) -> dict[str, Any] | None:
    """The message on `line` when it is the running call's; else None (dropped).

    Only the running call's: a message without its nonce is a forgery of code
    from an earlier call (or a stale one).
    """
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("n") != nonce:
        return None
    return message


def result(message: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """A result message as the call's result frame, and what it told the call left."""
    frame = {key: message[key] for key in _RESULT_KEYS if key in message}
    told = {key: _count(message.get(key)) for key in _LEFT_KEYS}
    return {"t": "result", **frame}, told


def artifact_fields(message: dict[str, Any]) -> dict[str, Any] | None:
    """An artifact message's fields, when each has its type; else None (dropped)."""
    fields = {key: message.get(key) for key in _ARTIFACT_KEYS}
    if not (
        isinstance(fields["name"], str)
        and isinstance(fields["mime_type"], str)
        and fields["source"] in ("figure", "display")
        and isinstance(fields["data_b64"], str)
        and type(fields["part"]) is int
        and isinstance(fields["last"], bool)
    ):
        return None
    return fields


def _count(value: Any) -> int:
    """A count the interpreter told: a non-negative int, else 0."""
    return min(value, 1 << 62) if type(value) is int and value > 0 else 0


def failed(error: dict[str, str]) -> dict[str, Any]:
    """A failed call's result frame for `error` ({"type", "message"}), with no traceback."""
    return {"t": "result", "ok": False, "exit_code": 1, "error": {**error, "traceback": ""}}
