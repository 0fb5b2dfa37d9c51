"""`tooljail tools --check` reports tools as a daemon of the same settings would serve them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TOOL = '''
from tooljail import tool


@tool
def plain(x: int) -> int:
    """No timeout of its own: the daemon's default_timeout_s applies."""
    return x


@tool(timeout_s=30)
def own(x: int) -> int:
    """Its own timeout."""
    return x
'''


def test_check_reports_the_timeouts_in_force(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "timed.py").write_text(TOOL)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooljaild",
            "tools",
            "--check",
            "--json",
            "--tools-dir",
            str(tools),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TOOLJAIL_DEFAULT_TIMEOUT_S": "7"},
    )
    assert proc.returncode == 0, proc
    by_name = {t["name"]: t for t in json.loads(proc.stdout)["tools"]}
    assert by_name["plain"]["timeout_s"] == 7
    assert by_name["own"]["timeout_s"] == 30
