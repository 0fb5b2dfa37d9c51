"""The committed protobuf/gRPC code is what the .proto files generate today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_generated_code_is_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, (
        f"generated code is stale; run: python scripts/gen_proto.py\n{proc.stdout}{proc.stderr}"
    )


def test_stale_code_is_detected(tmp_path: Path) -> None:
    """The check is not vacuous: a changed .proto makes it fail."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "proto", copy / "proto")
    shutil.copytree(ROOT / "client" / "tooljail" / "v1", copy / "client" / "tooljail" / "v1")
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    proto = copy / "proto" / "tooljail" / "v1" / "tooljail.proto"
    proto.write_text(proto.read_text() + "\nmessage Extra { string x = 1; }\n")
    proc = subprocess.run(
        [sys.executable, str(copy / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "stale generated code" in proc.stdout
