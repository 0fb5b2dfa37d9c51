"""What calls make becomes artifacts, through a real daemon over a real gRPC
channel: output past the per-call cap is kept whole, a result too large for a
model's context is offloaded to a preview, and the artifact frames a sandbox
sends land in the store, in a fresh sandbox and in a session.

The artifacts are read back from the daemon's store on disk (its state
directory): the SDK's `get_artifact` is not part of this change.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client, ToolResult
from tooljaild.artifacts.index import ArtifactIndex
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.settings.artifacts import ArtifactSettings

MiB = 2**20

PRINT_50_MB = """
import sys
for i in range(50 * 2**20 // 64):
    sys.stdout.write("%063d\\n" % i)
sys.stderr.write("done\\n")
"""
"""50 MiB of numbered lines: every line differs, so a lost or moved chunk shows."""

BIG_VALUES = '''
from tooljail import tool


@tool
def five_megabytes() -> list[str]:
    """A 5 MB list."""
    return [f"item {i:07d}" + "." * 40 for i in range(100_000)]
'''

FRAME_FD = 64
SEND_ARTIFACT = f"""
import base64, json, os

def frame(**fields):
    line = b"\\n" + json.dumps({{"t": "artifact", **fields}}).encode() + b"\\n"
    view = memoryview(line)
    while view:
        view = view[os.write({FRAME_FD}, view):]

def send(name, mime, data, part_bytes):
    parts = [data[i:i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]
    for n, part in enumerate(parts):
        frame(name=name, mime_type=mime, source="outputs", part=n, last=n == len(parts) - 1,
              data_b64=base64.b64encode(part).decode())
"""
"""Tool code writing artifact frames where the runner writes them (as R's runner
will): the daemon side takes them as it would the runner's."""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def served(serve: Callable[..., ServedDaemon], tmp_path: Path, state: Path) -> ServedDaemon:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "values.py").write_text(BIG_VALUES)
    return serve(tools_dirs=[tools], state_dir=state)


def stored(state: Path, artifact_id: str) -> tuple[dict[str, str], bytes]:
    """An artifact's index row and bytes, as the daemon's store holds them."""
    root = state / "artifacts"
    db = sqlite3.connect(root / "index.sqlite3")
    db.row_factory = sqlite3.Row
    try:
        row = dict(
            db.execute("SELECT * FROM artifacts WHERE artifact_id = ?", (artifact_id,)).fetchone()
        )
        data = ArtifactStore(root, ArtifactSettings(), ArtifactIndex(db)).read(
            artifact_id, row["owner"]
        )
    finally:
        db.close()
    return row, data


def expected_50_mb() -> bytes:
    return b"".join(b"%063d\n" % i for i in range(50 * MiB // 64))


def assert_spilled(result: ToolResult, state: Path) -> dict[str, str]:
    """50 MB of stdout: a small result that says so, and the whole in an artifact."""
    assert result.status is CallStatus.SUCCESS, result.message
    assert result.truncated and result.output_bytes == 50 * MiB + 5
    assert len(result.data["stdout"]) <= 1.1 * MiB
    assert result.data["stderr"] == "done\n"
    (ref,) = result.artifacts  # stderr stayed small: no artifact of its own
    assert (ref.name, ref.mime_type, ref.size_bytes) == ("stdout.txt", "text/plain", 50 * MiB)
    assert "truncated" in result.message and ref.artifact_id in result.message
    row, data = stored(state, ref.artifact_id)
    want = expected_50_mb()
    assert hashlib.sha256(data).digest() == hashlib.sha256(want).digest()  # byte for byte
    assert (row["call_id"], row["source"]) == (result.call_id, "output")
    return row


def test_printing_50_mb_keeps_it_all_in_an_artifact(served: ServedDaemon, state: Path) -> None:
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": PRINT_50_MB}, tool_timeout_s=120)
    row = assert_spilled(result, state)
    assert row["session_id"] == "" and row["tool"] == "execute_python_code"
    served.assert_serving()


def test_in_a_session_the_artifact_carries_the_session(served: ServedDaemon, state: Path) -> None:
    with Client(served.target) as client, client.session() as session:
        result = session.call("execute_python_code", {"code": PRINT_50_MB}, tool_timeout_s=120)
        row = assert_spilled(result, state)
        assert row["session_id"] == session.id == result.session_id


def test_a_5_mb_result_becomes_a_preview_and_an_artifact(served: ServedDaemon, state: Path) -> None:
    with Client(served.target) as client:
        result = client.call("five_megabytes", {}, tool_timeout_s=60)
    assert result.status is CallStatus.SUCCESS, result.message
    (ref,) = result.artifacts
    assert (ref.name, ref.mime_type) == ("result.json", "application/json")
    assert isinstance(result.data, str) and len(result.data) <= 4096
    assert '"item 0000000' in result.data
    assert ref.artifact_id in result.message and "read_artifact" in result.message
    row, data = stored(state, ref.artifact_id)
    assert json.loads(data) == [f"item {i:07d}" + "." * 40 for i in range(100_000)]
    assert data.decode().startswith(result.data)
    assert (row["source"], row["tool"]) == ("result", "five_megabytes")


def test_artifact_frames_from_the_sandbox_are_stored_in_order(
    served: ServedDaemon, state: Path
) -> None:
    big = bytes(range(256)) * (9 * MiB // 256)  # three parts of at most 4 MiB
    code = (
        SEND_ARTIFACT
        + "send('report.csv', 'text/csv', b'a,b\\n1,2\\n', 4 << 20)\n"
        + "send('blob.bin', 'application/octet-stream', bytes(range(256)) * (9 * 2**20 // 256),"
        + " 4 << 20)\n"
        + "print('sent')\n"
    )
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=60)
    assert result.status is CallStatus.SUCCESS, result
    assert result.data["stdout"] == "sent\n"
    assert [(r.name, r.size_bytes) for r in result.artifacts] == [
        ("report.csv", 8),
        ("blob.bin", len(big)),
    ]
    row, data = stored(state, result.artifacts[0].artifact_id)
    assert data == b"a,b\n1,2\n" and (row["source"], row["mime_type"]) == ("outputs", "text/csv")
    assert stored(state, result.artifacts[1].artifact_id)[1] == big


def test_a_malformed_artifact_frame_ends_the_call_with_a_protocol_error(
    served: ServedDaemon,
) -> None:
    code = SEND_ARTIFACT + "frame(name='x', mime_type='a/b', source='outputs', part=3, last=True,"
    code += " data_b64='')\nimport time; time.sleep(30)\n"
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=60)
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None and result.error.type == "ProtocolError", result
    assert "out of order" in result.error.message
    assert result.artifacts == ()
    served.assert_serving()
