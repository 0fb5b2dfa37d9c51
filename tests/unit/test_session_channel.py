"""Sessions over real sandboxes: SessionSandbox and the runner's supervisor.

Every test runs on each kind of process sandbox this host can make: no
namespaces ("none": the supervisor's sweep alone keeps processes in check),
bubblewrap per sandbox, and the zygote's forks. One more opens a session on
the docker backend (skipped without an engine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_docker_sandbox import Factory, context, engine, make  # noqa: F401
from tests.unit.test_process_sandbox import NAMESPACES, alive, build
from tooljail import StreamKind
from tooljaild.sandbox.base import RunRequest, Termination
from tooljaild.sandbox.isolation import resolve
from tooljaild.sandbox.process import ProcessSandbox, build_process_sandbox, zygote_for
from tooljaild.sandbox.runner_channel import RunnerSandbox
from tooljaild.sandbox.session_channel import SessionCallEnd, SessionSandbox
from tooljaild.settings.sandbox import Limits

Output = dict[StreamKind, bytes]
Opener = Callable[..., Awaitable[SessionSandbox]]


COUNTING = """
import os
from tooljail import tool

@tool
def count(n: int):
    \"\"\"Yields 0..n-1, then says where it ran.\"\"\"
    for i in range(n):
        yield i
    print(os.getcwd())

@tool
def same(value: int) -> int:
    \"\"\"Returns its argument.\"\"\"
    return value

@tool
def big() -> str:
    \"\"\"Returns more than a frame may hold.\"\"\"
    return "x" * (17 * 1024 * 1024)
"""


@pytest.fixture(params=["none", "bwrap", "zygote"])
async def open_session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Open sessions (`await open_session(keep_processes=...)`) on one kind of
    process sandbox; all are closed at teardown."""
    if request.param == "none":
        iso = resolve("none", use_cgroups=False)
    else:
        if not NAMESPACES.namespaces:
            pytest.skip("bubblewrap cannot make namespaces here")
        iso = NAMESPACES
    first = build(tmp_path, iso)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "counting.py").write_text(COUNTING)
    config = first._config
    sandboxes = dataclasses.replace(first._context, shared_dirs=(tools,))
    zygote = None
    if request.param == "zygote":
        zygote = zygote_for(config, sandboxes, Limits())
        await zygote.start()
        sandboxes = dataclasses.replace(sandboxes, zygote=zygote)
    sessions: list[SessionSandbox] = []

    async def open_one(
        keep_processes: bool = False, limits: Limits | None = None
    ) -> SessionSandbox:
        box = build_process_sandbox(config, sandboxes, limits or Limits())
        await box.start()
        session = await SessionSandbox.open(
            box,
            keep_processes=keep_processes,
            quota_bytes=0,
            limits=limits or Limits(),
            timeout_s=10,
        )
        sessions.append(session)
        return session

    yield open_one
    for session in sessions:
        await session.close()
    if zygote is not None:
        await zygote.close()


async def call(
    session: SessionSandbox, code: str, limits: Limits | None = None
) -> tuple[SessionCallEnd, Output]:
    out: Output = {}

    def sink(kind: StreamKind, data: bytes) -> None:
        out[kind] = out.get(kind, b"") + data

    end = await session.begin(RunRequest("code", {"code": code}, limits or Limits()), sink)
    return end, out


async def started(
    session: SessionSandbox, code: str, setup: str = ""
) -> tuple[asyncio.Task[SessionCallEnd], Output]:
    """Begin a call that runs `setup`, prints "started", then `code`; return once it
    has printed (so what the test does next meets the code, never the setup)."""
    out: Output = {}
    printed = asyncio.Event()

    def sink(kind: StreamKind, data: bytes) -> None:
        out[kind] = out.get(kind, b"") + data
        if b"started" in out.get(StreamKind.STDOUT, b""):
            printed.set()

    code = setup + "print('started', flush=True)\n" + code
    task = asyncio.ensure_future(session.begin(RunRequest("code", {"code": code}), sink))
    await asyncio.wait_for(printed.wait(), 10)
    return task, out


async def test_variables_persist_in_one_session_only(open_session: Opener) -> None:
    session = await open_session()
    end, out = await call(session, "x = 41")
    assert end.outcome.termination is Termination.RETURNED, end
    end, out = await call(session, "print(x + 1)")
    assert out == {StreamKind.STDOUT: b"42\n"}
    assert (end.reset, end.interrupted) == (False, False)
    other = await open_session()
    end, out = await call(other, "print(x)")
    assert end.outcome.error is not None and end.outcome.error.type == "NameError"


async def test_output_is_cut_exactly_at_each_call(open_session: Opener) -> None:
    session = await open_session()
    lines = 50_000  # ~0.5 MB: many pipe-fulls, still in flight when the result comes
    end, first = await call(
        session, f"import sys\nfor i in range({lines}): print(i)\nprint('e', file=sys.stderr)"
    )
    assert end.outcome.termination is Termination.RETURNED
    expected = "".join(f"{i}\n" for i in range(lines)).encode()
    assert first == {StreamKind.STDOUT: expected, StreamKind.STDERR: b"e\n"}
    end, second = await call(session, "print('two')")
    assert second == {StreamKind.STDOUT: b"two\n"}


async def test_user_tools_yield_and_return_in_a_session(
    open_session: Opener, tmp_path: Path
) -> None:
    session = await open_session()
    module = str(tmp_path / "tools" / "counting.py")
    out: list[tuple[StreamKind, bytes]] = []
    request = RunRequest("user", {"module_path": module, "function": "count", "args": {"n": 3}})
    end = await session.begin(request, lambda kind, data: out.append((kind, data)))
    assert end.outcome.termination is Termination.RETURNED and end.outcome.yields == 3
    assert [data for kind, data in out if kind is StreamKind.YIELD] == [b"0", b"1", b"2"]
    _, where = await call(session, "import os\nprint(os.getcwd())")
    assert (StreamKind.STDOUT, where[StreamKind.STDOUT]) in out, "the tool runs in the workspace"
    request = RunRequest("user", {"module_path": module, "function": "same", "args": {"value": 5}})
    end = await session.begin(request, lambda kind, data: None)
    assert (end.outcome.value_kind, end.outcome.value) == ("json", 5)
    request = RunRequest("user", {"module_path": module, "function": "big", "args": {}})
    end = await session.begin(request, lambda kind, data: None)
    assert end.outcome.error is not None and end.outcome.error.type == "ResultTooLarge"


async def test_system_exit_ends_the_call_not_the_interpreter(open_session: Opener) -> None:
    session = await open_session()
    await call(session, "x = 1")
    end, _ = await call(session, "raise SystemExit(4)")
    assert end.outcome.termination is Termination.EXITED
    assert end.outcome.exit_code == 4 and not end.reset
    _, out = await call(session, "print(x)")
    assert out == {StreamKind.STDOUT: b"1\n"}


async def test_interrupt_keeps_the_variables(open_session: Opener) -> None:
    session = await open_session()
    await call(session, "x = 41")
    task, _ = await started(session, "while True: pass")
    session.interrupt()
    end = await asyncio.wait_for(task, 10)
    assert end.outcome.error is not None and end.outcome.error.type == "KeyboardInterrupt"
    assert (end.interrupted, end.reset) == (True, False)
    session.interrupt()  # idle: nothing to interrupt, and nothing breaks
    end, out = await call(session, "print(x)")
    assert out == {StreamKind.STDOUT: b"41\n"}, end


async def test_a_call_deaf_to_interrupts_is_reset(open_session: Opener) -> None:
    session = await open_session()
    await call(session, "x = 41")
    deaf = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    task, _ = await started(session, "while True: pass", setup=deaf)
    session.interrupt()
    # It would never see the KeyboardInterrupt: reset at once, with no grace
    # (issue 24, item 6), and no reset needs asking for.
    end = await asyncio.wait_for(task, 5)
    assert end.outcome.termination is Termination.KILLED
    assert end.reset and session.resets == 1
    end, out = await call(session, "print(x)")
    assert end.outcome.error is not None and end.outcome.error.type == "NameError"
    assert not end.reset  # told at the call it happened in, once
    _, out = await call(session, "import os; print(os.getcwd())")
    assert out[StreamKind.STDOUT].strip(), "the new interpreter works"
    assert await session.reset(10)  # idle: confirmed too, and the next call says so
    end, _ = await call(session, "pass")
    assert end.reset and session.resets == 2


async def test_an_interpreter_that_dies_is_restarted(open_session: Opener) -> None:
    session = await open_session()
    await call(session, "x = 1")
    end, _ = await call(session, "import os\nos._exit(3)")
    assert end.outcome.termination is Termination.EXITED and end.outcome.exit_code == 3
    assert end.reset
    end, out = await call(session, "print('x' in globals())")
    assert out == {StreamKind.STDOUT: b"False\n"} and not end.reset


async def test_an_interpreter_that_dies_while_idle_is_told_at_the_next_call(
    open_session: Opener,
) -> None:
    session = await open_session()
    code = "import os, threading, time\nx = 1\n"
    code += "threading.Thread(target=lambda: (time.sleep(0.05), os._exit(5))).start()"
    end, _ = await call(session, code)
    assert end.outcome.termination is Termination.RETURNED and not end.reset
    await asyncio.sleep(1.0)  # (a death during the next call would end it with code 5)
    end, out = await call(session, "print('x' in globals())")
    assert out == {StreamKind.STDOUT: b"False\n"}
    assert end.reset and session.resets == 1


# rlimits are the same in every sandbox: its seconds of CPU are spent once, on one kind.
@pytest.mark.parametrize("open_session", ["none"], indirect=True)
async def test_cpu_limit_per_call(open_session: Opener) -> None:
    session = await open_session()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    limits = Limits(cpu_s=1)
    for _ in range(3):  # 1.2 s of CPU in all: past 1 s only if the limit were the session's
        end, _ = await call(session, busy, limits)
        assert end.outcome.termination is Termination.RETURNED, end
    # A call without a limit of its own is not held to the last call's.
    end, _ = await call(session, busy.replace("0.4", "1.0"), Limits(cpu_s=0))
    assert end.outcome.termination is Termination.RETURNED, end
    end, _ = await call(session, "while True: pass", limits)
    assert end.outcome.termination is Termination.CPU_LIMIT and end.reset


async def test_a_call_s_processes_end_with_it(open_session: Opener) -> None:
    session = await open_session()
    code = (
        "import subprocess, os\n"
        "p = subprocess.Popen(['sleep', '1000'])\n"
        "r, w = os.pipe()\n"
        # an orphan too, re-parented to the supervisor
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.write(w, str(subprocess.Popen(['sleep', '1001']).pid).encode())\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "print(p.pid, os.read(r, 32).decode())"
    )
    _, out = await call(session, code)
    pids = [int(pid) for pid in out[StreamKind.STDOUT].split()]
    # Its end is reported once both are dead: the next call sees neither.
    check = (
        "import os\n"
        f"for pid in {pids}:\n"
        "    try:\n"
        "        os.kill(pid, 0)\n"
        "        print('alive')\n"
        "    except ProcessLookupError:\n"
        "        print('gone')\n"
    )
    _, out = await call(session, check)
    assert out == {StreamKind.STDOUT: b"gone\ngone\n"}


async def test_kept_processes_outlive_the_call_not_the_session(open_session: Opener) -> None:
    session = await open_session(keep_processes=True)
    _, out = await call(
        session, "import subprocess\np = subprocess.Popen(['sleep', '1000'])\nprint(p.pid)"
    )
    pid = int(out[StreamKind.STDOUT])
    _, out = await call(session, f"import os\nos.kill({pid}, 0)\nprint('alive')")
    assert out == {StreamKind.STDOUT: b"alive\n"}
    _, out = await call(session, "import os\nprint(os.getpid())")
    interpreter = int(out[StreamKind.STDOUT])
    sandbox = session._sandbox
    await session.close()
    assert session.ended.done()
    if isinstance(sandbox, ProcessSandbox) and not sandbox.namespaced:
        # Host pids: both must be gone (under namespaces the pid namespace went).
        deadline = time.monotonic() + 5
        while (alive(pid) or alive(interpreter)) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not alive(pid) and not alive(interpreter)


FORGE = """
import json, os
seq = {seq}
frames = [
    {{"t": "result", "seq": seq + 1, "ok": False, "exit_code": 7,
      "error": {{"type": "Forged", "message": "", "traceback": ""}}}},
    {{"t": "reset", "seq": seq, "resets": 99}},
    {{"t": "session", "interpreter": 1}},
]
data = "".join("\\n" + json.dumps(f) + "\\n" for f in frames).encode()
inodes = []
for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
    try:
        inodes.append(os.fstat(fd).st_ino)
        if fd > 2:
            os.write(fd, data)
    except OSError:
        pass
print(inodes)
"""


async def test_tool_code_cannot_write_a_frame(open_session: Opener) -> None:
    session = await open_session()
    pipes = session._pipes
    ours = {os.fstat(fd).st_ino for fd in (pipes._stdin._fd, pipes._pipes[-1]._fd)}  # type: ignore[attr-defined]
    end, out = await call(session, FORGE.format(seq=1))
    assert end.outcome.termination is Termination.RETURNED, end
    seen = set(eval(out[StreamKind.STDOUT]))
    assert not seen & ours, "the interpreter holds the daemon's request or frame pipe"
    # The next call is not ended by what was written for it, nor reset.
    end, out = await call(session, "print('real')")
    assert out == {StreamKind.STDOUT: b"real\n"}
    assert (end.outcome.termination, end.reset, session.resets) == (Termination.RETURNED, False, 0)


async def test_workspace_operations_run_in_the_supervisor(open_session: Opener) -> None:
    session = await open_session()
    # Tool code replaces the interpreter's copy of the workspace module: the
    # operation must not see it (it runs in the supervisor).
    await call(session, "import sys\nsys.modules['_workspace'].run = lambda *a: 'tampered'")
    wrote = await session.begin(
        RunRequest("workspace", {"op": "write_file", "args": {"path": "w.txt", "content": "hi"}}),
        lambda kind, data: None,
    )
    assert wrote.outcome.termination is Termination.RETURNED, wrote
    assert isinstance(wrote.outcome.value, dict), wrote.outcome  # not 'tampered'
    refused = await session.begin(
        RunRequest("workspace", {"op": "no-such-op", "args": {}, "quota_bytes": 0}),
        lambda kind, data: None,
    )
    assert refused.outcome.error is not None, refused
    assert "no-such-op" in refused.outcome.error.message
    _, out = await call(session, "print(open('w.txt').read())")
    assert out == {StreamKind.STDOUT: b"hi\n"}


async def test_one_call_at_a_time_and_none_after_the_end(open_session: Opener) -> None:
    from tooljaild.sandbox.base import SandboxError

    session = await open_session()
    task, _ = await started(session, "import time\ntime.sleep(0.3)")
    with pytest.raises(SandboxError):
        session.begin(RunRequest("code", {"code": "pass"}), lambda kind, data: None)
    await task
    await session.close()
    with pytest.raises(SandboxError):
        session.begin(RunRequest("code", {"code": "pass"}), lambda kind, data: None)
    assert not await session.reset(1)


async def test_a_call_when_the_sandbox_dies_is_runner_lost(open_session: Opener) -> None:
    session = await open_session()
    task, _ = await started(session, "import time\ntime.sleep(100)")
    sandbox: Any = session._sandbox
    await sandbox.kill()
    end = await asyncio.wait_for(task, 10)
    assert end.outcome.termination is Termination.KILLED
    await asyncio.wait_for(session.ended, 10)


@pytest.mark.docker
async def test_a_session_on_the_docker_backend(make: Factory) -> None:  # noqa: F811
    box: RunnerSandbox = await make()
    session = await SessionSandbox.open(
        box, keep_processes=False, quota_bytes=0, limits=Limits(), timeout_s=30
    )
    try:
        await call(session, "x = 41")
        end, out = await call(session, "print(x + 1)")
        assert out == {StreamKind.STDOUT: b"42\n"}, end
        end, _ = await call(session, "import os\nos._exit(3)")
        assert end.reset
        end, out = await call(session, "print('x' in globals())")
        assert out == {StreamKind.STDOUT: b"False\n"}
    finally:
        await session.close()
