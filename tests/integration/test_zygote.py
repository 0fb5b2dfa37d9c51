"""The zygote that forks sandboxes: when it dies, the daemon starts another."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.conftest import RunningDaemon
from tooljail import Client


def _zygotes(daemon: RunningDaemon) -> list[psutil.Process]:
    """The zygote: the interpreter bubblewrap started (its forks share its command line)."""
    found = []
    for p in psutil.Process(daemon.pid).children(recursive=True):
        try:
            if (
                p.name().startswith("python")
                and any(part.endswith("_zygote.py") for part in p.cmdline())
                and p.parent().name() == "bwrap"
            ):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.isolation
def test_calls_go_on_when_the_zygote_dies(daemon: RunningDaemon) -> None:
    zygotes = _zygotes(daemon)
    assert len(zygotes) == 1, "this host should fork sandboxes from a zygote"
    zygotes[0].kill()
    zygotes[0].wait(10)
    with Client(daemon.target) as client:
        for i in range(5):
            result = client.call("execute_python_code", {"code": f"print({i})"}, timeout=30)
            assert result.ok, result
            assert result.data["stdout"] == f"{i}\n"
    deadline = time.monotonic() + 10
    while not _zygotes(daemon) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_zygotes(daemon)) == 1
    assert "restarting the zygote" in daemon.log()
