"""`tooljail sessions` and `tooljail call --session` against a real daemon.

One daemon for the whole story (open, call twice, files both ways, ls, close,
a call after the close), as an operator would type it; the other tests need no
daemon. Exit codes as in test_cli.py: 2 for bad usage or a refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon
from tooljail import SessionInfo, SessionState, ToolResult
from tooljaild.cli.sessions import _size


def _cli(
    *args: str, target: str | None = None, stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """Runs `tooljail ARGS` with bytes in and out (downloads are binary)."""
    env = {**os.environ}
    if target is not None:
        env["TOOLJAIL_TARGET"] = target
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=env,
    )


def _ok(proc: subprocess.CompletedProcess[bytes]) -> str:
    """The stdout of a run that must have succeeded, as text."""
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr.decode())
    return proc.stdout.decode()


def test_a_session_from_the_command_line(daemon: RunningDaemon, tmp_path: Path) -> None:
    t = daemon.target
    opened = _cli("sessions", "open", "--idle-ttl", "600", "--memory", "512M", target=t)
    session_id = _ok(opened).strip()
    assert len(session_id) == 32, opened  # the id alone, so S=$(tooljail sessions open) works
    assert "lives until" in opened.stderr.decode()
    assert "idle TTL" in opened.stderr.decode()

    # A variable survives from one `tooljail call` process to the next.
    code = "x = 41"
    _ok(
        _cli(
            "call",
            "--session",
            session_id,
            "execute_python_code",
            json.dumps({"code": code}),
            target=t,
        )
    )
    second = _cli(
        "call", "--session", session_id, "--json", "execute_python_code",
        json.dumps({"code": "print(x + 1)"}), target=t,
    )  # fmt: skip
    streamed, _, final = _ok(second).partition("\n")  # the output, then the result
    assert streamed == "42"
    result = ToolResult.model_validate_json(final)
    assert result.data["stdout"] == "42\n"
    assert result.session_reset is False

    # Binary data both ways: from a file and from stdin; to stdout and to a file.
    blob = bytes(range(256)) * 64 + b"\x00\r\n\xff"
    local = tmp_path / "blob.bin"
    local.write_bytes(blob)
    up = _cli("sessions", "upload", session_id, "data/blob.bin", str(local), target=t)
    _ok(up)
    assert f"wrote {len(blob)} bytes" in up.stderr.decode()
    _ok(_cli("sessions", "upload", session_id, "piped.bin", target=t, stdin=blob[::-1]))
    down = _cli("sessions", "download", session_id, "data/blob.bin", target=t)
    assert down.returncode == 0, down.stderr
    assert down.stdout == blob
    out = tmp_path / "piped.out"
    _ok(_cli("sessions", "download", session_id, "piped.bin", "-o", str(out), target=t))
    assert out.read_bytes() == blob[::-1]
    # The session's own code sees the uploaded file.
    size = "import os; print(os.path.getsize('data/blob.bin'))"
    sized = _cli(
        "call", "--session", session_id, "execute_python_code", json.dumps({"code": size}), target=t
    )
    assert _ok(sized) == f"{len(blob)}\n"

    # ls: every client's sessions (this process owns none), as a table and as JSON.
    table = _ok(_cli("sessions", "ls", target=t)).splitlines()
    assert table[0].split()[:6] == ["SESSION", "AGE", "IDLE", "CALLS", "QUEUED", "RESETS"]
    row = next(line for line in table if line.startswith(session_id))
    assert row.split()[3] == "3"  # calls
    assert "mem=512M" in row and "ttl=10m" in row
    listed = [
        SessionInfo.model_validate(s)
        for s in json.loads(_ok(_cli("sessions", "ls", "--json", target=t)))
    ]
    (info,) = [s for s in listed if s.session_id == session_id]
    assert info.calls == 3 and info.memory_bytes == 512 * 1024**2 and info.idle_ttl_s == 600

    # A path outside the workspace, or a missing file: refused, exit 2, named.
    escape = _cli("sessions", "download", session_id, "../etc/passwd", target=t)
    assert escape.returncode == 2 and escape.stdout == b""
    assert "../etc/passwd" in escape.stderr.decode()
    missing = _cli("sessions", "download", session_id, "nope.txt", target=t)
    assert missing.returncode == 2 and "nope.txt" in missing.stderr.decode()

    closed = _cli("sessions", "close", session_id, target=t)
    assert _ok(closed) == "closed\n"
    again = SessionInfo.model_validate_json(
        _ok(_cli("sessions", "close", session_id, "--json", target=t))
    )
    assert again.state is SessionState.CLOSED and again.end_reason == "closed"
    assert session_id not in _ok(_cli("sessions", "ls", target=t))

    # A call naming it is refused, with the reason, and nothing runs.
    after = _cli(
        "call", "--session", session_id, "execute_python_code",
        json.dumps({"code": "print('ran')"}), target=t,
    )  # fmt: skip
    assert after.returncode == 2
    assert after.stdout == b""
    assert "has ended" in after.stderr.decode()
    assert "[reason: closed]" in after.stderr.decode()
    unknown = _cli("sessions", "upload", "f" * 32, "a.txt", target=t, stdin=b"a")
    assert unknown.returncode == 2 and "no session" in unknown.stderr.decode()
    daemon.assert_serving()


def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    # No daemon needed: each is refused before any request is sent.
    nowhere = f"unix://{tmp_path}/none.sock"
    bad_size = _cli("sessions", "open", "--memory", "12Q", target=nowhere)
    assert bad_size.returncode == 2 and "not a size: '12Q'" in bad_size.stderr.decode()
    negative = _cli("sessions", "open", "--pids", "-1", target=nowhere)
    assert negative.returncode == 2 and "0 or more" in negative.stderr.decode()
    no_file = _cli(
        "sessions", "upload", "f" * 32, "a.txt", str(tmp_path / "absent"), target=nowhere
    )
    assert no_file.returncode == 2 and "cannot read" in no_file.stderr.decode()
    no_id = _cli("sessions", "close", target=nowhere)
    assert no_id.returncode == 2 and "ID" in no_id.stderr.decode()
    # And no daemon at all is exit 3, as for every client command.
    assert _cli("sessions", "ls", target=nowhere).returncode == 3


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1048576), ("512M", 512 * 1024**2), ("2g", 2 * 1024**3), ("64KiB", 65536),
     ("1.5G", 3 * 1024**3 // 2), ("100B", 100), ("0", 0)],
)  # fmt: skip
def test_sizes_take_binary_units(text: str, size: int) -> None:
    assert _size(text) == size
