"""A session's background processes, terminals and port connections, at the sandbox floor.

Through `SessionSandbox` on real sandboxes (runner/_streams.py in the
supervisor, sandbox/session_streams.py in the daemon): each kind of process
sandbox this host can make (no namespaces, bubblewrap, the zygote's forks),
and the docker backend where an engine is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psutil
import pytest

from tests.unit.test_docker_sandbox import context, engine  # noqa: F401
from tests.unit.test_process_sandbox import NAMESPACES, build
from tooljail import StreamKind
from tooljaild.sandbox.base import RunRequest, Termination
from tooljaild.sandbox.channels import FrameChannel, FrameItem, Malformed
from tooljaild.sandbox.docker import build_docker_sandbox
from tooljaild.sandbox.isolation import resolve
from tooljaild.sandbox.process import build_process_sandbox, zygote_for
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.sandbox.session_streams import (
    CHUNK,
    STREAM_FRAMES,
    WINDOW,
    BadPortError,
    PortError,
    ProcessGoneError,
    SandboxProcess,
    Spawn,
    SpawnError,
    StreamMux,
)
from tooljaild.settings.sandbox import DockerSandboxConfig, Limits

pytestmark = pytest.mark.timeout(120)

Opener = Callable[..., Awaitable[SessionSandbox]]
BACKENDS = ["none", "bwrap", "zygote", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
async def open_session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Open sessions (`await open_session(limits=...)`) on one kind of sandbox;
    all are closed at teardown."""
    kind = request.param
    zygote = None
    if kind == "docker":
        docker = request.getfixturevalue("context")

        async def started(limits: Limits) -> object:
            box = build_docker_sandbox(DockerSandboxConfig(), docker, limits)
            await box.start()
            return box

    else:
        if kind == "none":
            iso = resolve("none", use_cgroups=False)
        else:
            if not NAMESPACES.namespaces:
                pytest.skip("bubblewrap cannot make namespaces here")
            iso = NAMESPACES
        first = build(tmp_path, iso)
        config, sandboxes = first._config, first._context
        if kind == "zygote":
            zygote = zygote_for(config, sandboxes, Limits())
            await zygote.start()
            sandboxes = dataclasses.replace(sandboxes, zygote=zygote)

        async def started(limits: Limits) -> object:
            box = build_process_sandbox(config, sandboxes, limits)
            await box.start()
            return box

    sessions: list[SessionSandbox] = []

    async def open_one(
        keep_processes: bool = False, limits: Limits | None = None
    ) -> SessionSandbox:
        limits = limits or Limits()
        box = await started(limits)
        session = await SessionSandbox.open(
            box,  # type: ignore[arg-type]
            keep_processes=keep_processes,
            quota_bytes=0,
            limits=limits,
            timeout_s=20,
        )
        sessions.append(session)
        return session

    yield open_one
    for session in sessions:
        await session.close()
    if zygote is not None:
        await zygote.close()


async def drain(process: SandboxProcess, within_s: float = 30) -> list[tuple[str, bytes]]:
    """Every chunk until the end of its output."""
    chunks: list[tuple[str, bytes]] = []

    async def read() -> None:
        while (chunk := await process.output()) is not None:
            chunks.append(chunk)

    await asyncio.wait_for(read(), within_s)
    return chunks


def joined(chunks: list[tuple[str, bytes]], stream: str) -> bytes:
    return b"".join(data for name, data in chunks if name == stream)


async def test_a_background_process_runs_and_exits(open_session: Opener) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("sh", "-c", "echo hi; echo err >&2; sleep 1")))
    assert process.pid > 0
    chunks = await drain(process)
    assert joined(chunks, "stdout") == b"hi\n"
    assert joined(chunks, "stderr") == b"err\n"
    end = await asyncio.wait_for(process.exited, 10)
    assert (end.code, end.signal, end.killed) == (0, None, False)


async def call(session: SessionSandbox, code: str) -> bytes:
    """Run `code` as a call in the session; its stdout (it must succeed)."""
    out = bytearray()

    def sink(kind: StreamKind, data: bytes) -> None:
        if kind is StreamKind.STDOUT:
            out.extend(data)

    end = await session.begin(RunRequest("code", {"code": code}, Limits()), sink)
    assert end.outcome.termination is Termination.RETURNED, end
    return bytes(out)


async def until(text: bytes, process: SandboxProcess, within_s: float = 20) -> bytes:
    """Read its output until `text` has come; all of it so far."""
    seen = b""

    async def read() -> None:
        nonlocal seen
        while text not in seen:
            chunk = await process.output()
            assert chunk is not None, seen
            seen += chunk[1]

    await asyncio.wait_for(read(), within_s)
    return seen


ALIVE = """
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
"""


async def test_the_sweep_spares_background_processes_not_a_calls_orphans(
    open_session: Opener,
) -> None:
    session = await open_session()
    background = await session.spawn(Spawn(("sleep", "100")))
    # A call's own processes: one plain orphan, one that made a session of its own.
    out = await call(
        session,
        "import subprocess\n"
        "a = subprocess.Popen(['sleep', '100'])\n"
        "b = subprocess.Popen(['sleep', '100'], start_new_session=True)\n"
        "print(a.pid, b.pid)",
    )
    orphans = [int(pid) for pid in out.split()]
    out = await call(
        session, ALIVE + f"print(alive({background.pid}), *(alive(p) for p in {orphans}))"
    )
    assert out.split() == [b"True", b"False", b"False"]
    assert not background.exited.done()


async def test_output_comes_in_arrival_order_with_its_stream(open_session: Opener) -> None:
    session = await open_session()
    script = "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c; sleep 0.2; echo d >&2"
    process = await session.spawn(Spawn(("sh", "-c", script)))
    chunks = await drain(process)
    assert chunks == [
        ("stdout", b"a\n"),
        ("stderr", b"b\n"),
        ("stdout", b"c\n"),
        ("stderr", b"d\n"),
    ]


TEN_MB = """
import os, sys, tty
tty.setraw(1)  # no \\r added to each \\n: the bytes arrive as written
for i in range(0, 1_250_000, 12500):
    os.write(1, b"".join(b"%07d\\n" % n for n in range(i, i + 12500)))
"""


def ten_mb() -> bytes:
    return b"".join(b"%07d\n" % n for n in range(1_250_000))


async def test_ten_megabytes_through_a_terminal_arrive_whole_and_in_order(
    open_session: Opener,
) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("python3", "-c", TEN_MB), terminal=(24, 80)))
    chunks = await drain(process, within_s=60)
    assert {name for name, _ in chunks} == {"pty"}
    data = b"".join(data for _, data in chunks)
    assert len(data) == 10_000_000
    assert data == ten_mb()
    assert (await process.exited).code == 0


async def test_a_reader_that_stops_stops_the_supervisor_reading(open_session: Opener) -> None:
    session = await open_session()
    supervisor = int(await call(session, "import os\nprint(os.getppid())"))
    for spec in (
        Spawn(("head", "-c", "8000000", "/dev/zero")),
        Spawn(("head", "-c", "8000000", "/dev/zero"), terminal=(24, 80)),
    ):
        process = await session.spawn(spec)
        first = await process.output()
        assert first is not None
        await asyncio.sleep(0.3)
        cpu_before = await cpu_s(session, supervisor)
        await asyncio.sleep(1.0)
        # Nobody reads: the daemon holds at most its window, and the writer waits
        # (the supervisor too: it does not spin on a descriptor it may not read).
        assert process.buffered <= WINDOW + CHUNK
        assert session.streams.buffered <= WINDOW + CHUNK
        assert not process.exited.done()
        assert await cpu_s(session, supervisor) - cpu_before < 0.2
        total = len(first[1]) + sum(len(data) for _, data in await drain(process))
        assert total == 8_000_000
        assert (await process.exited).code == 0


async def cpu_s(session: SessionSandbox, pid: int) -> float:
    """CPU seconds `pid` has used (its /proc stat, read by a call in the session)."""
    out = await call(
        session,
        f"import os\nf = open('/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
        "print((int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK'))",
    )
    return float(out)


async def test_stdin_to_cat_then_its_end(open_session: Opener) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("cat",)))
    data = os.urandom(1_000_000)
    reader = asyncio.ensure_future(drain(process))
    await asyncio.wait_for(process.write(data), 30)
    process.close_stdin()
    assert joined(await reader, "stdout") == data
    assert (await process.exited).code == 0
    with pytest.raises(ProcessGoneError):
        await process.write(b"more")


async def test_a_process_that_traps_a_signal_sees_it(open_session: Opener) -> None:
    session = await open_session()
    script = 'trap "echo got TERM; exit 3" TERM; echo ready; while :; do sleep 0.05; done'
    process = await session.spawn(Spawn(("sh", "-c", script), stdin=False))
    await until(b"ready", process)
    process.signal(signal.SIGTERM)
    assert b"got TERM" in await until(b"got TERM", process)
    end = await asyncio.wait_for(process.exited, 10)
    assert (end.code, end.killed) == (3, False)
    with pytest.raises(ProcessGoneError):
        await process.write(b"x")  # stdin was never open


async def test_ctrl_c_on_a_terminal_ends_the_foreground_job_not_the_shell(
    open_session: Opener,
) -> None:
    session = await open_session()
    shell = await session.spawn(
        Spawn(("sh", "-i"), terminal=(24, 80), env={"PS1": "$ ", "ENV": ""})
    )
    await shell.write(b"echo ready\n")
    await until(b"ready\r\n", shell)
    await shell.write(b"sleep 100\n")
    # The shell runs it in a process group of its own, the terminal's foreground.
    for _ in range(100):
        await asyncio.sleep(0.05)
        figures = await session.stats([shell.pid])
        if figures and await _has_child(session, shell):
            break
    else:
        pytest.fail("the shell never started sleep")
    shell.signal(signal.SIGINT, foreground=True)
    await shell.write(b"echo alive $((6*7))\n")
    await until(b"alive 42", shell)
    assert not shell.exited.done()
    await shell.write(b"exit 5\n")
    assert (await asyncio.wait_for(shell.exited, 10)).code == 5


async def _has_child(session: SessionSandbox, shell: SandboxProcess) -> bool:
    """Whether the shell's child has become `sleep` (then it is the foreground job)."""
    out = await call(
        session,
        "def comm(pid):\n    try:\n        return open(f'/proc/{pid}/comm').read().strip()\n"
        "    except OSError:\n        return ''\n"
        f"kids = open('/proc/{shell.pid}/task/{shell.pid}/children').read().split()\n"
        "print(any(comm(k) == 'sleep' for k in kids))",
    )
    return out.strip() == b"True"


async def test_a_terminal_resizes(open_session: Opener) -> None:
    session = await open_session()
    shell = await session.spawn(Spawn(("sh", "-i"), terminal=(24, 80), env={"PS1": "$ "}))
    await shell.write(b"stty size\n")
    await until(b"24 80", shell)
    shell.resize(50, 132)
    await shell.write(b"stty size\n")
    await until(b"50 132", shell)
    shell.signal(signal.SIGKILL)
    end = await asyncio.wait_for(shell.exited, 10)
    assert end.signal == signal.SIGKILL


async def test_a_terminal_cannot_be_opened_from_another_sandbox(
    request: pytest.FixtureRequest, open_session: Opener
) -> None:
    if "[none]" in request.node.name:
        pytest.skip("no isolation: the host's /dev/pts is every sandbox's")
    mine, other = await open_session(), await open_session()
    shell = await mine.spawn(Spawn(("sh", "-c", "tty; exec sleep 100"), terminal=(24, 80)))
    name = (await until(b"\n", shell)).strip().decode()
    assert name.startswith("/dev/pts/"), name
    out = await call(
        other,
        "import os\n"
        f"try:\n    os.close(os.open({name!r}, os.O_RDWR | os.O_NOCTTY))\n"
        "    print('opened')\n"
        "except OSError as exc:\n    print('refused', exc.errno)\n"
        "print(sorted(os.listdir('/dev/pts')))",
    )
    assert out.startswith(b"refused"), out


async def test_past_the_pids_limit_a_spawn_is_refused_saying_so(
    request: pytest.FixtureRequest, open_session: Opener
) -> None:
    if "[none]" in request.node.name and os.getuid() == 0:
        pytest.skip("no namespaces and root: no process limit holds")
    # Process backend (no cgroup here): the rlimit; docker: the container's pids
    # limit (its uid's rlimit counts other containers' processes too).
    docker = "[docker]" in request.node.name
    session = await open_session(limits=Limits(nproc=256 if docker else 24, sandbox_pids=24))
    started: list[SandboxProcess] = []
    with pytest.raises(SpawnError) as refused:
        for _ in range(50):
            started.append(await session.spawn(Spawn(("sleep", "100"), stdin=False)))
    assert refused.value.limit
    assert "limit" in str(refused.value) and "pids" in str(refused.value)
    assert 5 < len(started) < 24
    # Its processes run on; when one ends there is room again.
    started[0].signal(signal.SIGKILL)
    await asyncio.wait_for(started[0].exited, 10)
    await session.spawn(Spawn(("sleep", "100"), stdin=False))


async def test_a_spawn_that_cannot_start_says_why(open_session: Opener) -> None:
    session = await open_session()
    with pytest.raises(SpawnError, match="no-such-program") as missing:
        await session.spawn(Spawn(("no-such-program",)))
    assert not missing.value.limit
    with pytest.raises(SpawnError, match="leaves the workspace"):
        await session.spawn(Spawn(("true",), cwd="../.."))
    with pytest.raises(SpawnError, match="not a directory"):
        await session.spawn(Spawn(("true",), cwd="nowhere"))
    await call(session, "import os\nos.makedirs('repo/sub')")
    process = await session.spawn(Spawn(("sh", "-c", "pwd; echo $GREETING"), cwd="repo/sub",
                                        env={"GREETING": "hello"}))  # fmt: skip
    out = joined(await drain(process), "stdout").decode().split()
    assert out[0].endswith("/repo/sub") and out[1] == "hello"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_port_in_the_session_both_ways_with_a_half_close(open_session: Opener) -> None:
    session = await open_session()
    port = free_port()  # (no namespaces: the host's loopback is the session's)
    server = await session.spawn(
        Spawn(("python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"), stdin=False)
    )
    for _ in range(200):
        try:
            stream = await session.connect_port(port)
            break
        except PortError:
            await asyncio.sleep(0.05)
    else:
        pytest.fail(f"http.server never listened on {port}")
    await stream.write(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    stream.write_eof()  # our side is done: the answer still comes
    answer = b""
    while data := await asyncio.wait_for(stream.read(), 20):
        answer += data
    assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
    stream.close()
    assert b'"GET / HTTP/1.0" 200' in await until(b'"GET / HTTP/1.0" 200', server)


async def test_a_port_nothing_listens_on_or_no_port_at_all(open_session: Opener) -> None:
    session = await open_session()
    port = free_port()
    loop = asyncio.get_running_loop()
    begun = loop.time()
    with pytest.raises(PortError, match=f"nothing listens on port {port} in the session"):
        await session.connect_port(port)
    assert loop.time() - begun < 2
    asked = session.streams._next
    for bad in (0, -1, 65536, 10**9):
        with pytest.raises(BadPortError, match="1-65535") as refused:
            await session.connect_port(bad)
        assert isinstance(refused.value, ValueError)
    assert session.streams._next == asked  # refused here: nothing was sent


async def test_stats_of_a_process_and_its_children(open_session: Opener) -> None:
    session = await open_session()
    burn = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    process = await session.spawn(
        Spawn(("sh", "-c", 'python3 -c "$0"; echo done; sleep 100', burn), stdin=False)
    )
    await until(b"done", process)
    figures = await session.stats([process.pid, 999999])
    assert set(figures) == {process.pid}
    cpu, rss = figures[process.pid]
    assert cpu >= 0.4  # the child it waited for counts
    assert rss > 100_000
    process.signal(signal.SIGKILL)
    await asyncio.wait_for(process.exited, 10)
    assert await session.stats([process.pid]) == {}


def host_processes(marker: str) -> list[psutil.Process]:
    """The host's processes with `marker` in their command line."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(process.info["cmdline"] or ()):
                found.append(process)
    return found


async def test_closing_the_session_leaves_nothing_on_the_host(open_session: Opener) -> None:
    session = await open_session()
    marker = f"1000.{secrets.randbelow(10**9)}"  # sleep's argument, unique to this test
    escaping = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        f"subprocess.run(['sleep', '{marker}'])"
    )
    processes = [
        await session.spawn(Spawn(("sleep", marker))),
        await session.spawn(Spawn(("sh", "-c", f"sleep {marker}; :"), terminal=(24, 80))),
        await session.spawn(Spawn(("python3", "-c", escaping), stdin=False)),
    ]
    for _ in range(100):
        if len(host_processes(marker)) >= 4:
            break
        await asyncio.sleep(0.05)
    assert len(host_processes(marker)) >= 4
    await session.close()
    for process in processes:
        end = await asyncio.wait_for(process.exited, 10)
        assert end.killed
        await asyncio.wait_for(drain(process), 10)  # what was read, then None
    for _ in range(100):
        if not host_processes(marker):
            break
        await asyncio.sleep(0.05)
    assert host_processes(marker) == []


async def test_a_reset_kills_the_background_processes(open_session: Opener) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("sh", "-c", "echo before; exec sleep 100")))
    terminal = await session.spawn(Spawn(("sh",), terminal=(24, 80)))
    assert b"before" in await until(b"before", process)
    assert await session.reset(20)
    for each in (process, terminal):
        end = await asyncio.wait_for(each.exited, 10)
        assert end.killed and end.signal == signal.SIGKILL, end
        await asyncio.wait_for(drain(each), 10)  # its output ends
    with pytest.raises(ProcessGoneError):
        await process.write(b"x")
    assert process.signal(signal.SIGTERM) is None  # ended: a no-op
    # The session goes on: new processes, new calls.
    again = await session.spawn(Spawn(("echo", "after")))
    assert joined(await drain(again), "stdout") == b"after\n"
    assert (await call(session, "print(6 * 7)")).strip() == b"42"


async def test_no_descriptor_of_the_supervisor_reaches_a_process_or_a_new_interpreter(
    open_session: Opener,
) -> None:
    session = await open_session()
    port = free_port()
    await session.spawn(
        Spawn(("python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"), stdin=False)
    )
    for _ in range(200):
        with contextlib.suppress(PortError):
            stream = await session.connect_port(port)
            break
        await asyncio.sleep(0.05)
    await session.spawn(Spawn(("sh",), terminal=(24, 80)))
    lister = await session.spawn(
        Spawn(("python3", "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"))
    )
    assert joined(await drain(lister), "stdout") == b"['0', '1', '2', '3']\n"
    # A fresh interpreter is forked from the supervisor while it holds a PTY
    # master and a connection: it must hold neither.
    await stream.write(b"GET / HTTP/1.0\r\n\r\n")
    assert await session.reset(20)
    out = await call(
        session,
        "import os\nlinks = []\nfor fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n        links.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
        "    except OSError:\n        pass\n"
        "print(sum(link.startswith('socket:') for link in links), "
        "any('pt' in link for link in links))",
    )
    assert out.split() == [b"1", b"False"]  # its own request socket, no terminal


HOSTILE_OPS = [
    b"not json",
    b"[1, 2]",
    b'{"op": "spawn"}',
    b'{"op": "spawn", "id": "x", "argv": ["true"]}',
    b'{"op": "spawn", "id": 9001, "argv": [1, 2]}',
    b'{"op": "spawn", "id": 9002, "argv": []}',
    b'{"op": "spawn", "id": 9003, "argv": ["true"], "env": {"A=B": "c"}}',
    b'{"op": "spawn", "id": 9004, "argv": ["true"], "env": [1]}',
    b'{"op": "spawn", "id": 9005, "argv": ["true"], "terminal": [0, 99999]}',
    b'{"op": "spawn", "id": 9006, "argv": ["true"], "cwd": 5}',
    b'{"op": "spawn", "id": 9007, "argv": ["tr\\u0000ue"]}',
    b'{"op": "connect", "id": 9008, "port": 70000}',
    b'{"op": "connect", "id": 9009, "port": true}',
    b'{"op": "stats", "id": 9010, "pids": "all"}',
    b'{"op": "write", "id": 1, "d": "!!!not base64"}',
    b'{"op": "write", "id": 1, "d": 5}',
    b'{"op": "credit", "id": 1, "n": -5}',
    b'{"op": "credit", "id": 1, "n": 99999999999999999999}',
    b'{"op": "signal", "id": 1, "sig": 0}',
    b'{"op": "signal", "id": 1, "sig": "KILL"}',
    b'{"op": "resize", "id": 1, "rows": -1, "cols": 1e9}',
    b'{"op": "eof", "id": 123456789}',
    b'{"op": "close", "id": 1.5}',
    b'{"op": "spawn", "id": 9011, "argv": ["true"]' + b"[" * 100000 + b"}",
]


async def test_malformed_ops_never_end_the_supervisor(open_session: Opener) -> None:
    session = await open_session()
    cat = await session.spawn(Spawn(("cat",)))  # id 1: the ops above aim at it too
    for line in HOSTILE_OPS:
        session._pipes.send(line + b"\n")
    await cat.write(b"still here\n")
    assert b"still here" in await until(b"still here", cat)
    process = await session.spawn(Spawn(("echo", "alive")))
    assert joined(await drain(process), "stdout") == b"alive\n"
    assert (await call(session, "print('and calls run')")).strip() == b"and calls run"


def test_malformed_frames_are_dropped_by_the_daemon() -> None:
    sent: list[bytes] = []
    mux = StreamMux(sent.append)
    for frame in (
        {"t": "out"},
        {"t": "out", "id": "x"},
        {"t": "out", "id": 7, "s": "stdout", "d": "!!"},
        {"t": "spawned", "id": 3, "pid": -1},
        {"t": "room", "id": 7, "n": True},
        {"t": "exited", "id": 7, "code": "zero"},
        {"t": "stats", "id": 99, "v": {"x": [1]}},
    ):
        mux.on_frame(frame)
    assert mux.bad_frames >= 2
    assert mux.buffered == 0


async def test_stream_frames_do_not_count_against_a_calls_frame_budget() -> None:
    frames: list[FrameItem] = []
    channel = FrameChannel(frames.append, max_bytes=1 << 20, max_containers=1000)
    channel.unbudgeted = STREAM_FRAMES
    channel.limit(10_000)
    out = b'{"t": "out", "id": 1, "s": "stdout", "d": "' + b"A" * 8000 + b'"}\n'
    for _ in range(10):  # 80 kB of output: eight times the call's budget
        channel.data_received(out)
    assert all(isinstance(frame, dict) for frame in frames) and len(frames) == 10
    channel.data_received(b'{"t": "yield", "v": "' + b"x" * 20_000 + b'"}\n')
    assert isinstance(frames[-1], Malformed) and frames[-1].fatal  # a call's frames still do


async def test_a_write_waits_while_the_process_reads_nothing(open_session: Opener) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("sleep", "100")))  # never reads its stdin
    writing = asyncio.ensure_future(process.write(b"x" * 4_000_000))
    await asyncio.sleep(1.0)
    # The pipe and the supervisor's window are full: the rest waits here, unsent.
    assert not writing.done()
    assert process._out.credit < CHUNK
    process.signal(signal.SIGKILL)
    with pytest.raises(ProcessGoneError):
        await asyncio.wait_for(writing, 10)
    assert (await process.exited).signal == signal.SIGKILL


async def test_the_interpreters_death_ends_the_background_processes(open_session: Opener) -> None:
    session = await open_session()
    process = await session.spawn(Spawn(("sleep", "100")))
    end = await session.begin(
        RunRequest("code", {"code": "import os\nos._exit(3)"}, Limits()), lambda *_: None
    )
    assert end.reset
    assert (await asyncio.wait_for(process.exited, 10)).killed
    assert (await call(session, "print('a fresh one')")).strip() == b"a fresh one"
