"""Without tokens, on the Unix socket, each uid is its own identity (issue 21, finding 5).

The daemon runs in this process as root (an operator); other users are played
by `uid_client.py` run with `setpriv` as two uids that are not operators: the
system interpreter, with the test venv's site-packages and the SDK on its path
(the venv itself may sit where those uids cannot reach). The attacks: one uid
lists, reads, writes and closes another's sessions, calls and artifacts by id,
while claiming the same client name; one uid rotates client names to take
every session; one uid opens connection after connection.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ServedDaemon
from tooljail import Client

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("uid_client.py")
SYSTEM_PYTHON = "/usr/bin/python3"
UID_A, UID_B = 51234, 51235
"""Two users that are not the daemon's (root): no passwd entry is needed."""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("setpriv") is None
    or not Path(SYSTEM_PYTHON).exists()
    or subprocess.run(
        [
            SYSTEM_PYTHON,
            "-c",
            f"import sys; sys.exit(sys.version_info[:2] != {sys.version_info[:2]})",
        ],
        check=False,
    ).returncode
    != 0,
    reason="needs root, setpriv and a system python3 of the test's version",
)


def _argv(uid: int, target: str, action: str, arg: str) -> list[str]:
    path = os.pathsep.join(
        [sysconfig.get_paths()["purelib"], str(ROOT / "client"), str(HELPER.parent)]
    )
    return [
        "setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
        "env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent", f"PYTHONPATH={path}",
        SYSTEM_PYTHON, str(HELPER), target, action, arg,
    ]  # fmt: skip


def as_uid(uid: int, target: str, action: str, arg: str = "") -> dict[str, Any]:
    """Run `uid_client.py ACTION ARG` as `uid`; its JSON answer."""
    done = subprocess.run(
        _argv(uid, target, action, arg), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.fixture(autouse=True)
def _reachable_helper() -> None:
    """The other uids read the SDK and the helper from this tree."""
    for path in (ROOT, ROOT / "client", ROOT / "tests", HELPER.parent):
        assert path.stat().st_mode & 0o005 == 0o005, f"{path} must be readable by others"


def test_another_uid_cannot_see_read_write_or_close_a_uids_work(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(socket_mode="0666")
    theirs = as_uid(UID_A, served.target, "own")
    # The owner sees its own work, whatever it asks for.
    assert theirs["session_id"] in theirs["sessions_seen"]
    assert theirs["artifact_id"] in theirs["artifacts_seen"]

    # Another uid, claiming the owner's very client name, reaches none of it.
    probe = as_uid(UID_B, served.target, "probe", json.dumps(theirs))
    assert theirs["session_id"] not in probe["sessions_seen"]
    assert probe["artifacts_seen"] == []
    for attempt in ("session_call", "download", "upload", "close_session"):
        assert probe[attempt].startswith("SessionNotFoundError"), (attempt, probe[attempt])
    for attempt in ("get_call", "attach", "cancel"):
        assert probe[attempt].startswith("CallNotFoundError"), (attempt, probe[attempt])
    assert probe["get_artifact"].startswith("ArtifactNotFoundError"), probe["get_artifact"]
    assert probe["delete_artifact"].startswith("ok: False") or probe["delete_artifact"].startswith(
        "ArtifactNotFoundError"
    ), probe["delete_artifact"]
    assert "secret-of-this-uid" not in json.dumps(probe)

    # The owner's session is untouched; the operator (root, the daemon's uid) sees all.
    with Client(served.target) as operator:
        assert theirs["session_id"] in {
            s.session_id for s in operator.list_sessions(all_clients=True)
        }
        still = operator.call(
            "execute_python_code", {"code": "print(x)"}, session_id=theirs["session_id"]
        )
        assert still.ok and still.data["stdout"] == "secret-of-this-uid\n", still
        assert operator.get_call(theirs["call_id"]).state.finished
        assert operator.download_file(theirs["session_id"], "secret.txt") == b"secret-of-this-uid"


def test_a_uid_lists_its_own_calls_only_and_the_operator_lists_all(
    serve: Callable[..., ServedDaemon],
) -> None:
    """ListCalls (issue 25): a uid lists its own calls whatever name it claims, and
    naming another uid is refused; the operator (root) lists all and names either."""
    served = serve(socket_mode="0666")
    a = as_uid(UID_A, served.target, "history", f"uid:{UID_B}")
    b = as_uid(UID_B, served.target, "history", f"uid:{UID_A}")
    assert set(a["seen"]) == set(a["made"]) and set(b["seen"]) == set(b["made"])
    for answer in (a, b):
        assert answer["named_other"].startswith("PermissionDeniedError"), answer
        assert "only an approver or the operator" in answer["named_other"]
    with Client(served.target) as operator:
        everyone = {c.call_id for c in operator.list_calls(limit=1000).calls}
        assert set(a["made"]) | set(b["made"]) <= everyone
        named = operator.list_calls(client_name=f"uid:{UID_A}").calls
        assert {c.call_id for c in named} == set(a["made"])


def test_rotating_client_names_from_one_uid_cannot_take_every_session(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(socket_mode="0666", sessions={"max_sessions": 6, "max_sessions_per_client": 2})
    greedy = as_uid(UID_B, served.target, "sessions", "6")
    # Two sessions for the uid in all, whatever names its processes send.
    assert len(greedy["opened"]) == 2, greedy
    assert greedy["refused"].startswith("OverloadedError"), greedy
    # Another uid, and the operator, still open theirs.
    other = as_uid(UID_A, served.target, "sessions", "1")
    assert len(other["opened"]) == 1, other
    with Client(served.target) as operator, operator.session() as mine:
        assert mine.call("execute_python_code", {"code": "print(1)"}).ok


def test_one_uid_cannot_take_every_connection_and_the_daemon_holds(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(socket_mode="0666", socket_max_connections_per_uid=4)
    me = psutil.Process()
    rss_before = me.memory_info().rss
    with subprocess.Popen(
        _argv(UID_B, served.target, "connections", "40"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as hog:
        assert hog.stdout is not None and hog.stdin is not None
        counted = json.loads(hog.stdout.readline())
        # The uid got its four; the rest were closed at once, not left hanging.
        assert counted == {"served": 4, "closed": 36}, counted
        # Meanwhile another uid, and the operator, are served at once.
        began = time.monotonic()
        other = as_uid(UID_A, served.target, "sessions", "1")
        assert len(other["opened"]) == 1, other
        with Client(served.target) as operator:
            for _ in range(20):
                asked = time.monotonic()
                operator.list_tools()
                assert time.monotonic() - asked < 0.5
        assert time.monotonic() - began < 30
        hog.stdin.close()  # the hog lets go of its connections
        assert hog.wait(30) == 0
    # The daemon runs in this process: its memory did not grow with the attack.
    assert me.memory_info().rss - rss_before < 64 * 1024 * 1024
