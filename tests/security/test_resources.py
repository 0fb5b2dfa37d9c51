"""Model-written code tries to exhaust memory, disk, RAM-backed file systems and
output. Each attempt ends as a typed result within its timeout, nothing of it
stays on the host, and the daemon keeps serving.

The module's daemon runs with a per-process memory limit (RLIMIT_AS) of 512 MiB
so that six children "each under the per-process limit" cost the host little
even where nothing bounds the sandbox as a whole; the sandbox's own memory
(the cgroup, 1 GiB by default) is left at its default.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

from tests.security.conftest import (
    GiB,
    MiB,
    SecurityDaemon,
    output_of,
    report,
    run_code,
    wait_until,
)
from tooljail import CallStatus, Client

pytestmark = pytest.mark.isolation

PER_PROCESS_MEMORY = 512 * MiB
DISK_LIMIT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@pytest.fixture(scope="module")
def daemon_env() -> dict[str, str]:
    return {"TOOLJAIL_LIMITS__MEMORY_BYTES": str(PER_PROCESS_MEMORY)}


def out_of_memory(result: object) -> bool:
    error = getattr(result, "error", None)
    return error is not None and error.type in ("MemoryError", "OutOfMemory")


def test_allocating_8_gib_ends_as_a_memory_error_not_a_hang(daemon: SecurityDaemon) -> None:
    """Attack: allocate 8 GiB, 100 MiB at a time (bytearray zero-fills: every page touched)."""
    code = """
chunks = []
for i in range(82):
    chunks.append(bytearray(100 * 1024 * 1024))
    print('allocated', (i + 1) * 100, 'MiB', flush=True)
print('allocated everything')
"""
    start = time.monotonic()
    result = run_code(daemon, code, timeout=60)
    elapsed = time.monotonic() - start
    assert elapsed < 60, elapsed
    assert result.status is CallStatus.ERROR, result
    assert out_of_memory(result), f"not reported as out of memory: {result.error!r}"
    assert "allocated everything" not in output_of(result)
    daemon.assert_serving()


def test_six_children_under_the_per_process_limit_do_not_add_up_past_the_sandbox(
    daemon: SecurityDaemon,
) -> None:
    """Attack: six forked children each allocate (and touch) just under the per-process
    limit and hold it at the same time: 6 x 400 MiB against a sandbox of 1 GiB."""
    per_child = 400 * MiB
    code = f"""
import json, os, time

def solo():
    # Calibration: one child alone may hold this much (it is under the per-process limit).
    pid = os.fork()
    if pid == 0:
        try:
            block = bytearray({per_child})
            os._exit(0)
        except MemoryError:
            os._exit(3)
    return os.waitpid(pid, 0)[1]

solo_status = solo()
pipes = []
for i in range(6):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            block = bytearray({per_child})
            os.write(w, b'held')
            time.sleep(4)
            os._exit(0)
        except MemoryError:
            os._exit(3)
    os.close(w)
    pipes.append((pid, r))
held, statuses = 0, []
for pid, r in pipes:
    if os.read(r, 4) == b'held':
        held += 1
    _, status = os.waitpid(pid, 0)
    statuses.append(status)
out = {{'solo': solo_status, 'held': held, 'statuses': statuses}}
print('REPORT ' + json.dumps(out), flush=True)
"""
    start = time.monotonic()
    result = run_code(daemon, code, timeout=60)
    assert time.monotonic() - start < 60
    daemon.assert_serving()
    if result.status is CallStatus.ERROR and out_of_memory(result):
        return  # the kernel killed the tool for the sandbox's memory: contained
    assert result.ok, result
    got = report(result)
    assert got["solo"] == 0, f"one child alone could not hold {per_child // MiB} MiB: {got}"
    failed = [s for s in got["statuses"] if s != 0]
    assert failed and got["held"] < 6, (
        f"six children held {6 * per_child // MiB} MiB together, past the sandbox's memory: {got}"
    )


def test_filling_the_disk_from_the_workspace_is_stopped(daemon: SecurityDaemon) -> None:
    """Attack: write 5 GiB into the workspace (20 files of 256 MiB, each under the
    per-file limit): a disk quota must stop it, and the host disk keeps its space."""
    free_before = shutil.disk_usage(daemon.state_dir).free
    code = """
import json, os
chunk = b'\\0' * (16 * 1024 * 1024)
written, error = 0, None
try:
    for i in range(20):
        with open('fill-%02d.bin' % i, 'wb') as f:
            for _ in range(16):
                f.write(chunk)
                f.flush()
                written += len(chunk)
except OSError as e:
    error = e.errno
print('REPORT ' + json.dumps({'written': written, 'errno': error}), flush=True)
"""
    result = run_code(daemon, code, timeout=120)
    daemon.assert_serving()
    # The workspace goes with its call: the host disk gets its space back.
    assert wait_until(
        lambda: free_before - shutil.disk_usage(daemon.state_dir).free < 512 * MiB, 15, 0.5
    ), "the host disk did not get its space back"
    assert result.status in (CallStatus.SUCCESS, CallStatus.ERROR), result
    got = report(result)
    assert got["written"] < 5 * GiB, f"5 GiB written to the workspace: no quota ({got})"
    assert got["errno"] in DISK_LIMIT_ERRNOS, f"stopped by something else: {got}"


@pytest.mark.parametrize("directory", ["/dev/shm", "/tmp"])
def test_filling_ram_backed_tmp_and_shm_is_capped(daemon: SecurityDaemon, directory: str) -> None:
    """Attack: write 2 GiB (32 files of 64 MiB) into /dev/shm or /tmp: both are the
    sandbox's own, size-capped and counted; nothing lands on the host's."""
    marker = f"tooljail-sec-{os.urandom(6).hex()}"
    code = f"""
import json, os
chunk = b'x' * (4 * 1024 * 1024)
written, error = 0, None
try:
    for i in range(32):
        with open('{directory}/{marker}-%02d' % i, 'wb') as f:
            for _ in range(16):
                f.write(chunk)
                f.flush()
                written += len(chunk)
except OSError as e:
    error = e.errno
print('REPORT ' + json.dumps({{'written': written, 'errno': error}}), flush=True)
"""
    try:
        result = run_code(daemon, code, timeout=60)
        on_host = list(Path(directory).glob(f"{marker}*"))
    finally:
        for leftover in Path(directory).glob(f"{marker}*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
    daemon.assert_serving()
    assert on_host == [], f"{len(on_host)} files landed in the host's {directory}"
    if result.status is CallStatus.ERROR and out_of_memory(result):
        return  # the sandbox's memory (which counts its tmpfs) stopped it
    got = report(result)
    assert got["written"] < 2 * GiB, f"2 GiB written to {directory}: not capped ({got})"
    assert got["errno"] in DISK_LIMIT_ERRNOS, f"stopped by something else: {got}"


def test_200_mb_of_output_is_truncated_and_the_daemon_stays_flat(daemon: SecurityDaemon) -> None:
    """Attack: print 200 MB to flood the daemon's memory and the caller's context."""
    code = "import sys\nchunk = 'x' * 2**20\nfor _ in range(200):\n    sys.stdout.write(chunk)\n"
    with Client(daemon.target) as client:
        warm = client.call("execute_python_code", {"code": "print('w' * 3 * 2**20)"})
        assert warm.ok and warm.truncated, warm
        before = psutil.Process(daemon.pid).memory_info().rss
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=120)
        after = psutil.Process(daemon.pid).memory_info().rss
    assert result.status is CallStatus.SUCCESS, result.message
    assert result.truncated
    assert result.output_bytes >= 200 * MiB
    assert len(result.data["stdout"]) <= 1.1 * MiB
    assert after - before < 100 * MiB, f"the daemon grew by {(after - before) / MiB:.0f} MiB"
    daemon.assert_serving()
