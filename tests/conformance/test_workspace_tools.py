"""The workspace file tools: the same answers whichever backend runs them."""

from __future__ import annotations

import pytest

from tests.security.conftest import SecurityDaemon
from tests.security.test_workspace_paths import symlink_attack
from tooljail import Client

pytestmark = pytest.mark.timeout(120)


def test_the_tools_act_on_a_fresh_workspace_in_the_sandbox(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        written = client.call("write_file", {"path": "d/f.txt", "content": "a\nb\n"})
        assert written.ok and written.data["size_bytes"] == 4, written
        listed = client.call("ls", {})
        assert listed.ok and listed.data["entries"] == [], listed  # nothing persists
        refused = client.call("read_file", {"path": "../../etc/passwd"})
        assert refused.error is not None and refused.error.type == "InvalidPathError", refused
        assert "'../../etc/passwd'" in refused.error.message


def test_symlinks_to_host_files_are_refused(daemon: SecurityDaemon) -> None:
    symlink_attack(daemon)
