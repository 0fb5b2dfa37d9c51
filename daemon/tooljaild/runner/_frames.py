"""The runner's side of the frame protocol: writing frames, and what goes in them.

A frame is one JSON object on a line of its own, written to the frame pipe (a
descriptor the daemon gave the sandbox; in a session's interpreter, the pipe
to its supervisor). What each frame holds and what the daemon accepts of them
(it treats the sandbox as hostile) is described once, in the daemon's
tooljaild/sandbox/runner_channel.py. Here: the writer (`write_frame`, which
keeps every frame within `MAX_FRAME_BYTES`), the values a result carries
(`encode_value`, `jsonable`), a tool's exception as its author should see it
(`error`), the result of a ``sys.exit()`` (`system_exit_frame`), and the
splitter of a byte stream into bounded lines (`Lines`) that a session's two
processes read each other with.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The largest frame written; the daemon refuses longer lines (runner_channel)."""

OWN_FILES = {__file__}
"""The runner's own source files (each of its modules adds its own): their
frames are left out of the tracebacks a tool's author reads (`error`)."""

_fd = -1
"""Where frames go: set by the runner at start (`set_fd`), and by a session's
interpreter to its pipe to the supervisor."""


def set_fd(fd: int) -> None:
    """Write frames to `fd` from now on."""
    global _fd
    _fd = fd


def get_fd() -> int:
    """The descriptor frames are written to (-1 before `set_fd`)."""
    return _fd


def write_frame(frame: dict[str, Any]) -> None:
    """Write `frame` as one line; a result too large is replaced by an error result.

    Never raises for a closed pipe: then nobody is left to tell.
    """
    # The leading newline ends any partial line that tool code wrote into the pipe.
    data = ("\n" + json.dumps(frame, default=str, ensure_ascii=False) + "\n").encode(
        "utf-8", "replace"
    )
    if len(data) > MAX_FRAME_BYTES:
        data = (
            json.dumps(
                {
                    "t": "result",
                    "ok": False,
                    "exit_code": 1,
                    "error": {
                        "type": "ResultTooLarge",
                        "message": f"the tool's value is {len(data)} bytes of JSON; "
                        f"at most {MAX_FRAME_BYTES} are accepted",
                        "traceback": "",
                    },
                    # Whose result it is (a session's call, its nonce), as the frame said.
                    **{key: frame[key] for key in ("seq", "n", "tag") if key in frame},
                }
            )
            + "\n"
        ).encode()
    view = memoryview(data)
    while view:
        try:
            n = os.write(_fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the daemon is gone or the tool closed the pipe: nobody to tell
        view = view[n:]


def error(exc: BaseException) -> dict[str, Any]:
    """The exception as the tool's author should see it: without the runner's frames."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in OWN_FILES:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


def exit_code_of(exc: SystemExit) -> int:
    """The process exit code `exc` stands for, as the interpreter would exit
    with it (a message is printed on stderr and counts as 1)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def system_exit_frame(exc: SystemExit) -> dict[str, Any]:
    """The result of a tool (not a script) that called sys.exit()."""
    return {
        "t": "result",
        "ok": False,
        "exit_code": exit_code_of(exc),
        "error": {
            "type": "SystemExit",
            "message": f"the tool called sys.exit({exc.code!r})",
            "traceback": "",
        },
    }


def jsonable(value: Any, depth: int = 0) -> Any:
    """The value as strict JSON data: what JSON cannot carry becomes text.

    NaN and the infinities become "NaN", "Infinity", "-Infinity" (strict JSON,
    which the wire uses, has no such numbers); tuples and sets become lists;
    other objects their str().
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if depth > 100:
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, depth + 1) for v in value]
    return str(value)


def encode_value(value: Any) -> dict[str, Any]:
    """A user tool's return value for its result frame.

    None is "none" (the daemon says the tool had no output); JSON's own values
    (dicts, lists, tuples, numbers, bools) are "json" and reach the caller as
    that JSON; anything else is "text", its str().
    """
    if value is None:
        return {"kind": "none", "value": None}
    if isinstance(value, (dict, list, tuple, bool, int, float)):
        return {"kind": "json", "value": jsonable(value)}
    return {"kind": "text", "value": str(value)}


class Lines:
    """Splits a byte stream into lines, dropping any longer than `limit`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes]:
        parts = data.split(b"\n")
        rest = parts.pop()
        lines = []
        for i, part in enumerate(parts):
            if i == 0:
                if self._skipping:
                    self._skipping = False
                    continue
                part, self._held = bytes(self._held) + part, bytearray()
            if part.strip() and len(part) <= self._limit:
                lines.append(part)
        if not self._skipping:
            self._held += rest
            if len(self._held) > self._limit:
                self._held, self._skipping = bytearray(), True
        return lines
