"""What the SDK and the daemon share that does no I/O, public so the daemon imports nothing private.

- `default_socket_path()`: where a daemon listens, and a client dials, by default.
- `bounded()`: text cut to a byte budget, for errors that echo a caller's input.
- `json_type_name()`: a Python value's JSON Schema type name, as argument errors say it.
- `canonical_json()`, `arguments_sha256()`: a call's arguments as the one text
  (and hash) every client and the daemon agree on.
- `utc_from_unix()`: a time in seconds since the epoch as the UTC datetime a
  `CallInfo` carries.
- `TOOLDEF_SOURCE`: the file of the `@tool` module, which the runner loads
  inside a sandbox to read tool files (the daemon copies it there).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tooljail import _tooldef
from tooljail._tooldef import json_type_name

__all__ = [
    "MAX_ERROR_MESSAGE_BYTES",
    "TOOLDEF_SOURCE",
    "arguments_sha256",
    "bounded",
    "canonical_json",
    "default_socket_path",
    "json_type_name",
    "utc_from_unix",
]

MAX_ERROR_MESSAGE_BYTES = 1024
"""Bound of an error's message on the wire, in UTF-8 bytes (status text and detail)."""

TOOLDEF_SOURCE = Path(_tooldef.__file__)
"""The `@tool` module's source file: stdlib only, so a sandbox's runner can load it."""


def default_socket_path() -> Path:
    """The Unix socket a daemon listens on, and a client dials, by default.

    Returns:
        `$XDG_RUNTIME_DIR/tooljail/tooljail.sock` when XDG_RUNTIME_DIR is set;
        otherwise `/run/tooljail/tooljail.sock` for root (the systemd
        RuntimeDirectory) and `/tmp/tooljail-<uid>/tooljail.sock` for anyone else.
    """
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return Path(runtime_dir) / "tooljail" / "tooljail.sock"
    uid = os.getuid()
    if uid == 0:
        return Path("/run/tooljail/tooljail.sock")
    return Path(f"/tmp/tooljail-{uid}/tooljail.sock")


def bounded(text: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, saying how long it was.

    For text that may echo a caller's input into a reply: a 10,000-character
    tool name echoed whole would pass gRPC's 16 KiB metadata limit, and the
    caller would see RESOURCE_EXHAUSTED instead of the error. Characters UTF-8
    cannot encode (lone surrogates, which JSON's `\\ud800` escapes can make)
    are written as backslash escapes, so the result always encodes.

    Args:
        text: Any text.
        limit: The most UTF-8 bytes the result may have; at least 64.

    Returns:
        `text` itself when it fits; else its start, cut at a character
        boundary, and " [... N characters in all]".
    """
    encoded = text.encode("utf-8", "backslashreplace")
    if len(encoded) <= limit:
        return encoded.decode()
    tail = f" [... {len(text):,} characters in all]"
    head = encoded[: max(0, limit - len(tail.encode()))].decode("utf-8", "ignore")
    return head + tail


def canonical_json(value: Any) -> str:
    """`value` as canonical JSON: keys sorted, no whitespace, non-ASCII kept as is.

    Raises:
        TypeError: A value JSON cannot hold.
        ValueError: NaN or an infinity (not JSON).
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def arguments_sha256(arguments: dict[str, Any]) -> str:
    """SHA-256 (hex) of a call's arguments as canonical JSON in UTF-8: what
    `ToolResult.arguments_sha256` and `CallInfo.arguments_sha256` carry, so that a
    host can tell two calls with the same arguments apart from any others.

    Raises:
        TypeError, ValueError: As `canonical_json`.
    """
    return hashlib.sha256(canonical_json(arguments).encode("utf-8", "surrogatepass")).hexdigest()


def utc_from_unix(seconds: float | None) -> datetime.datetime | None:
    """Seconds since the epoch (0 or None: unset, as on the wire) as a UTC datetime, or None."""
    if not seconds:
        return None
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
