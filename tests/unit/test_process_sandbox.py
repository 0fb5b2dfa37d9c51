"""The process backend with real runner processes (no daemon, no network).

The tree-killing tests run twice: with a per-sandbox cgroup where this host
allows one, and with the runner's subreaper sweep alone, both without
namespaces (the markers they watch for must be writable on the host). The
others also run under bubblewrap; tests/security attacks the namespaced sandbox.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tooljail import StreamKind
from tooljaild.sandbox.base import RunOutcome, RunRequest, Termination
from tooljaild.sandbox.isolation import Isolation, install_runner, resolve, sandbox_python
from tooljaild.sandbox.process import ProcessSandbox, SandboxContext, build_process_sandbox
from tooljaild.settings.sandbox import Limits, ProcessSandboxConfig

NO_NAMESPACES = resolve("none")
NAMESPACES = resolve("best-effort", use_cgroups=False)


def build(tmp_path: Path, iso: Isolation, python: str | None = None) -> ProcessSandbox:
    config = ProcessSandboxConfig()
    config = config.model_copy(update={"python": python or sandbox_python(config.python, iso)})
    root = tmp_path / "state"
    root.mkdir(exist_ok=True)
    root.chmod(0o711)
    context = SandboxContext(
        workspace_root=root / "ws", runner_dir=install_runner(root), isolation=iso
    )
    return build_process_sandbox(config, context, Limits())


async def started(tmp_path: Path, iso: Isolation) -> ProcessSandbox:
    box = build(tmp_path, iso)
    await box.start()
    return box


@pytest.fixture(params=["cgroup", "subreaper"])
async def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ProcessSandbox]:
    """A sandbox without namespaces, killed through its cgroup or by its keeper."""
    if request.param == "cgroup" and NO_NAMESPACES.tracker is None:
        pytest.skip("this host gives no writable cgroup tree")
    iso = NO_NAMESPACES if request.param == "cgroup" else resolve("none", use_cgroups=False)
    box = await started(tmp_path, iso)
    yield box
    await box.close()


@pytest.fixture(params=["cgroup", "subreaper", "bwrap"])
async def any_sandbox(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[ProcessSandbox]:
    """Every kind of process sandbox this host can make."""
    if request.param == "bwrap":
        if not NAMESPACES.namespaces:
            pytest.skip("bubblewrap cannot make namespaces here")
        iso = NAMESPACES
    elif request.param == "cgroup":
        iso = NO_NAMESPACES
    else:
        iso = resolve("none", use_cgroups=False)
    box = await started(tmp_path, iso)
    yield box
    await box.close()


async def run(
    box: ProcessSandbox, code: str, kill_after: float | None = None
) -> tuple[RunOutcome, dict[StreamKind, bytes]]:
    out: dict[StreamKind, bytes] = {}

    def sink(kind: StreamKind, data: bytes) -> None:
        out[kind] = out.get(kind, b"") + data

    task = asyncio.create_task(box.run(RunRequest("code", {"code": code}), sink))
    if kill_after is not None:
        done, _ = await asyncio.wait({task}, timeout=kill_after)
        if not done:
            await box.kill()
    return await asyncio.wait_for(task, 30), out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


LEAVE_DAEMON = """
import os, sys, time
open(os.path.join(os.path.dirname({marker!r}), "writable"), "w").write("x")
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(3)
        open({marker!r}, "w").write("escaped")
        os._exit(0)
    os._exit(0)
print(os.read(r, 32).decode(), flush=True)
"""


async def test_output_and_result(any_sandbox: ProcessSandbox) -> None:
    outcome, out = await run(any_sandbox, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert outcome.termination is Termination.RETURNED
    assert out == {StreamKind.STDOUT: b"out\n", StreamKind.STDERR: b"err\n"}


async def test_a_finished_call_leaves_no_daemonized_grandchild(
    sandbox: ProcessSandbox, host_dir: Path
) -> None:
    marker = host_dir / "marker"
    outcome, out = await run(sandbox, LEAVE_DAEMON.format(marker=str(marker)))
    assert (host_dir / "writable").exists()  # the marker could have been written
    assert outcome.termination is Termination.RETURNED
    grandchild = int(out[StreamKind.STDOUT])
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not alive(grandchild)
    await asyncio.sleep(3.5)
    assert not marker.exists()


async def test_kill_takes_the_whole_tree(sandbox: ProcessSandbox, host_dir: Path) -> None:
    marker = host_dir / "marker"
    code = LEAVE_DAEMON.format(marker=str(marker)) + "\nwhile True: pass\n"
    outcome, out = await run(sandbox, code, kill_after=1.0)
    assert (host_dir / "writable").exists()  # the marker could have been written
    assert outcome.termination is Termination.KILLED
    grandchild = int(out[StreamKind.STDOUT])
    keeper, worker = sandbox.pids
    assert keeper is not None and worker is not None
    await asyncio.sleep(0.2)
    assert not any(alive(p) for p in (grandchild, worker))
    await asyncio.sleep(3.5)
    assert not marker.exists()


async def test_a_tool_that_kills_its_keeper_is_reported_and_cleaned_up(
    sandbox: ProcessSandbox,
) -> None:
    code = "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)"
    started = time.monotonic()
    outcome, _ = await run(sandbox, code)
    assert time.monotonic() - started < 10
    assert outcome.termination is Termination.RUNNER_LOST
    assert outcome.error is not None and "runner" in outcome.error.message
    _, worker = sandbox.pids
    assert worker is not None
    deadline = time.monotonic() + 3
    while alive(worker) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # a killed process takes a moment to finish exiting
    assert not alive(worker)


async def test_junk_on_the_frame_pipe_does_not_confuse_the_result(
    any_sandbox: ProcessSandbox,
) -> None:
    sandbox = any_sandbox
    code = (
        "import os\n"
        "for fd in range(64, 80):\n"
        '    try: os.write(fd, b\'not json\\n{"t": "exit"\')\n'
        "    except OSError: pass\n"
        "print('ok')"
    )
    outcome, out = await run(sandbox, code)
    assert outcome.termination is Termination.RETURNED
    assert out[StreamKind.STDOUT] == b"ok\n"


async def test_sandbox_serves_one_request_only(any_sandbox: ProcessSandbox) -> None:
    sandbox = any_sandbox
    await run(sandbox, "pass")
    with pytest.raises(Exception, match="not ready"):
        await run(sandbox, "pass")


async def test_environment_is_scrubbed(any_sandbox: ProcessSandbox) -> None:
    sandbox = any_sandbox
    outcome, out = await run(sandbox, "import os; print(sorted(os.environ))")
    assert outcome.ok
    names = eval(out[StreamKind.STDOUT])
    assert set(names) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "LC_CTYPE",
    }
    assert os.environ.get("PATH") is not None


async def test_workspace_is_removed_on_close(tmp_path: Path) -> None:
    box = await started(tmp_path, resolve("none", use_cgroups=False))
    await run(box, "open('f.txt', 'w').write('x')")
    assert (box.workspace / "f.txt").exists()
    await box.close()
    assert not box.workspace.exists()


async def test_a_broken_interpreter_is_a_clear_start_error(tmp_path: Path) -> None:
    from tooljaild.sandbox.base import SandboxError

    box = build(tmp_path, resolve("none", use_cgroups=False), python="/nonexistent/python3")
    with pytest.raises(SandboxError, match="/nonexistent/python3"):
        await box.start()
    await box.close()
