"""Limits that end a call, each with its own typed reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import CallStatus, Client, Effect
from tooljaild.sandbox.cgroups import cgroup_name_for


@pytest.mark.isolation
def test_the_sandbox_memory_limit_ends_in_an_out_of_memory_result(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(limits={"sandbox_memory_bytes": 128 * 1024**2})
    code = (
        "chunks = []\nfor _ in range(40):\n    chunks.append(bytearray(16 * 2**20))\nprint('fit')"
    )
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=60)
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None and result.error.type == "OutOfMemory", result.error
    assert "memory" in result.message
    assert result.data["stdout"] == ""
    served.assert_serving()


def test_endless_output_is_stopped_at_the_output_limit(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(limits={"output_limit_bytes": 20 * 1024**2})
    code = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536 + '\\n')"
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=60)
    assert result.status is CallStatus.ERROR, result
    assert result.effect is Effect.UNKNOWN
    assert result.error is not None and result.error.type == "OutputLimit"
    assert result.truncated
    assert result.output_bytes > 20 * 1024**2
    assert result.duration_s < 30
    served.assert_serving()


def test_a_file_past_the_file_size_limit_cannot_be_written(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(limits={"fsize_bytes": 1024**2})
    code = (
        "with open('big.bin', 'wb') as f:\n"
        "    f.write(b'x' * 1024**2)\n"
        "    print('first MiB written', flush=True)\n"
        "    f.write(b'x')\n"
        "    f.flush()\n"
    )
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=30)
    assert result.status is CallStatus.ERROR, result
    assert result.data["stdout"] == "first MiB written\n"
    assert result.error is not None and "File too large" in result.error.message, result.error
    served.assert_serving()


def _sandbox_cgroup_bases(daemon: RunningDaemon) -> list[Path]:
    """Where the daemon makes its sandboxes' cgroups: under its own cgroup, in the
    pids hierarchy (v1) or the unified one (v2, beside the daemon's leaf)."""
    name = cgroup_name_for(daemon.state_dir)
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    bases = []
    for line in Path(f"/proc/{daemon.pid}/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        if controllers == "pids":
            bases.append(Path("/sys/fs/cgroup/pids") / own.lstrip("/") / name)
        elif controllers == "" and unified:
            parent = own.removesuffix("/daemon")
            bases.append(Path("/sys/fs/cgroup") / parent.lstrip("/") / name)
    return bases


@pytest.mark.isolation
def test_a_clean_stop_leaves_no_cgroup_behind(daemon: RunningDaemon) -> None:
    bases = _sandbox_cgroup_bases(daemon)
    assert bases and all(base.is_dir() for base in bases), bases
    daemon.assert_serving()
    assert daemon.stop() == 0
    assert not any(base.exists() for base in bases), bases
