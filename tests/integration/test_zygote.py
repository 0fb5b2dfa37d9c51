"""The zygote that forks sandboxes: when it dies, the daemon starts another."""

from __future__ import annotations

import psutil
import pytest

from tests.conftest import RunningDaemon
from tooljail import Client
from tooljail.testing import wait_for


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
    """Its sandboxes (the warm ones, each a pid 1 and a worker) die with it, and
    the daemon starts another zygote."""
    zygotes = _zygotes(daemon)
    assert len(zygotes) == 1, "this host should fork sandboxes from a zygote"
    below = zygotes[0].children(recursive=True)
    assert len(below) >= 3, f"the zygote and its warm sandboxes: {below}"
    zygotes[0].kill()
    zygotes[0].wait(10)
    _, alive = psutil.wait_procs(below, timeout=10)
    assert alive == [], f"sandbox processes outlived their zygote: {alive}"
    with Client(daemon.target) as client:
        for i in range(5):
            result = client.call("execute_python_code", {"code": f"print({i})"}, tool_timeout_s=30)
            assert result.ok, result
            assert result.data["stdout"] == f"{i}\n"
    wait_for(lambda: _zygotes(daemon), 10, interval=0.05, what="a new zygote")
    assert len(_zygotes(daemon)) == 1
    assert "restarting the zygote" in daemon.log()


@pytest.mark.isolation
def test_the_zygote_starts_with_tool_and_files_directories(start_daemon, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tools = tmp_path / "tools"
    files = tmp_path / "files"
    tools.mkdir()
    files.mkdir()
    (tools / "hello.py").write_text(
        "from tooljail import tool\n\n@tool\ndef hello(name: str) -> str:\n"
        '    """Greets."""\n    return "hi " + name\n'
    )
    (files / "job.py").write_text("print('from a file')\n")
    for d in (tmp_path, tools, files):
        d.chmod(0o755)
    daemon = start_daemon("--tools-dir", str(tools), "--files-dir", str(files))
    assert len(_zygotes(daemon)) == 1, daemon.log()
    assert "no zygote" not in daemon.log()
    with Client(daemon.target) as client:
        assert client.call("hello", {"name": "z"}).data == "hi z"
        result = client.call("execute_python_file", {"path": "job.py"})
        assert result.data["stdout"] == "from a file\n"
