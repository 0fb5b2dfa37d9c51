"""The backup docs/operations.md prescribes works: stop, copy, start elsewhere.

The journal is locked while the daemon runs (decision 25), so the documented
backup is of a stopped daemon: its journal and artifacts copied into another
state directory give a daemon that answers for the calls made before, results
and artifacts included.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon
from tooljail import CallState, Client

BACKED_UP = ("journal.sqlite3", "journal.sqlite3-wal", "artifacts")
"""What docs/operations.md says to copy (the WAL file may be gone after a clean stop)."""


def _copy_backup(state: Path, to: Path) -> None:
    to.mkdir()
    for name in BACKED_UP:
        source = state / name
        if source.is_dir():
            shutil.copytree(source, to / name)
        elif source.exists():
            shutil.copy2(source, to / name)


def test_a_stopped_daemons_journal_and_artifacts_restore_its_calls(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    # Output past a 1 KiB cap is kept whole as an artifact of the call.
    small_cap = {"TOOLJAIL_LIMITS__OUTPUT_BYTES": "1024"}
    first = start_daemon(env=small_cap)
    with Client(first.target, client_name="backup-test") as client:
        result = client.call(
            "execute_python_code", {"code": "print('x' * 20000)"}, call_id="before-backup"
        )
        assert result.ok, result
        assert result.artifacts, "the capped output should have made an artifact"
        artifact_id = result.artifacts[0].artifact_id
        # While it runs, no other process can read the journal: copy a stopped one.
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite3.connect(first.state_dir / "journal.sqlite3", timeout=0.2).execute(
                "SELECT count(*) FROM calls"
            ).fetchone()
    assert first.stop() == 0

    restored = tmp_path / "restored-state"
    _copy_backup(first.state_dir, restored)
    second = start_daemon("--state-dir", str(restored), env=small_cap)
    with Client(second.target, client_name="backup-test") as client:
        info = client.get_call("before-backup")
        assert info.state is CallState.SUCCEEDED
        assert info.result is not None and info.result.data["stdout"].startswith("xxx")
        assert [a.artifact_id for a in client.list_artifacts()] == [artifact_id]
        assert client.get_artifact(artifact_id).startswith(b"x" * 1000)
