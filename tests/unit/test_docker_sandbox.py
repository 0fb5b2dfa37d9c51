"""The docker backend against a real engine: results, streaming, kill, memory, hardening.

Every test here needs a Docker engine and the python sandbox image (`tooljail
images build python`); they skip, saying which is missing, where either is
absent, and in CI a skip is a failure (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import socket
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tooljail import StreamKind
from tooljaild.sandbox.base import RunOutcome, RunRequest, SandboxError, Termination
from tooljaild.sandbox.docker import (
    LABEL_DAEMON,
    LABEL_SANDBOX,
    LABEL_SANDBOX_ID,
    LABEL_STATE_DIR,
    DockerContext,
    DockerEngine,
    DockerSandbox,
    EngineUnavailableError,
    ImageMissingError,
    build_docker_sandbox,
    new_daemon_id,
    remove_own_containers,
    remove_stale_containers,
)
from tooljaild.sandbox.docker_engine import engine_for
from tooljaild.sandbox.isolation import install_runner
from tooljaild.settings.sandbox import DockerSandboxConfig, Limits

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

IMAGE = DockerSandboxConfig().image


@pytest.fixture(scope="module")
def engine() -> Iterator[DockerEngine]:
    """The local engine, with the python sandbox image; skips saying which is missing."""
    engine = engine_for(DockerSandboxConfig())
    try:
        client = engine.connect()
    except EngineUnavailableError as exc:
        engine.close()
        pytest.skip(str(exc))  # "no Docker engine answers at ...: start it ..."
    from docker.errors import ImageNotFound

    try:
        client.images.get(IMAGE)
    except ImageNotFound:
        engine.close()
        pytest.skip(f"no image {IMAGE}: build it with `tooljail images build python`")
    yield engine
    engine.close()


@pytest.fixture
def context(engine: DockerEngine, tmp_path: Path) -> Iterator[DockerContext]:
    """A context like the daemon's, with its own daemon id; checks nothing is left behind."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o711)
    context = DockerContext(
        engine=engine,
        runner_dir=install_runner(state),
        state_dir=state,
        daemon_id=new_daemon_id(),
    )
    yield context
    client = engine.connect()
    left = client.api.containers(all=True, filters={"label": f"{LABEL_DAEMON}={context.daemon_id}"})
    remove_own_containers(client, context.daemon_id)
    assert left == [], "containers left behind"
    channels = state / "docker"
    assert not channels.exists() or not any(channels.iterdir()), "channel directories left behind"


Factory = Callable[..., Awaitable[DockerSandbox]]


@pytest.fixture
async def make(context: DockerContext) -> AsyncIterator[Factory]:
    """Start sandboxes (`await make(limits=..., **config)`); all are closed at teardown."""
    boxes: list[DockerSandbox] = []

    async def make_one(limits: Limits | None = None, **config: Any) -> DockerSandbox:
        box = build_docker_sandbox(DockerSandboxConfig(**config), context, limits)
        boxes.append(box)
        await box.start()
        return box

    yield make_one
    await asyncio.gather(*(box.close() for box in boxes))


async def run(box: DockerSandbox, code: str) -> tuple[RunOutcome, dict[StreamKind, bytes]]:
    """Run code; its outcome and its output per stream."""
    out: dict[StreamKind, bytes] = {}

    def sink(stream: StreamKind, data: bytes) -> None:
        out[stream] = out.get(stream, b"") + data

    return await box.run(RunRequest("code", {"code": code}), sink), out


def containers_of(engine: DockerEngine, box: DockerSandbox) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = engine.connect().api.containers(
        all=True, filters={"label": f"{LABEL_SANDBOX_ID}={box.id}"}
    )
    return found


async def test_print_returns_stdout(make: Factory) -> None:
    box = await make()
    assert box.alive
    outcome, out = await run(box, "print(1)")
    assert outcome.termination is Termination.RETURNED, outcome
    assert out == {StreamKind.STDOUT: b"1\n"}
    assert not box.alive


async def test_raising_tool_reports_the_traceback(make: Factory) -> None:
    box = await make()
    outcome, out = await run(box, "def f():\n    raise ValueError('boom')\nf()")
    assert outcome.termination is Termination.RAISED
    assert outcome.error is not None
    assert outcome.error.type == "ValueError"
    assert outcome.error.message == "boom"
    assert 'File "<code>", line 2, in f' in outcome.error.traceback
    for own in ("_runner.py", "_kinds.py", "_frames.py"):  # the runner's frames are left out
        assert own not in outcome.error.traceback
    assert b"ValueError: boom" in out[StreamKind.STDERR]


async def test_exit_codes_and_signals(make: Factory) -> None:
    exited, _ = await run(await make(), "import sys; sys.exit(3)")
    assert (exited.termination, exited.exit_code) == (Termination.EXITED, 3)
    # A SIGKILL that is not the kernel's OOM killer is a plain signal.
    signaled, _ = await run(await make(), "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert (signaled.termination, signaled.signal) == (Termination.SIGNALED, 9)


async def test_output_streams_line_by_line(make: Factory) -> None:
    box = await make()
    arrivals: list[tuple[float, bytes]] = []
    request = RunRequest(
        "code",
        {"code": "import time\nfor i in range(4):\n    print(f'line {i}')\n    time.sleep(0.3)"},
    )
    outcome = await box.run(request, lambda kind, data: arrivals.append((time.monotonic(), data)))
    assert outcome.termination is Termination.RETURNED
    assert b"".join(data for _, data in arrivals) == b"line 0\nline 1\nline 2\nline 3\n"
    # Each line came alone, as printed, well before the next one was.
    assert [data for _, data in arrivals] == [f"line {i}\n".encode() for i in range(4)]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
    assert all(gap > 0.2 for gap in gaps), gaps


async def test_yields_of_a_generator_tool(make: Factory, context: DockerContext) -> None:
    tools = context.state_dir.parent / "tools"
    tools.mkdir()
    tools.chmod(0o755)
    module = tools / "gen.py"
    module.write_text(
        "from tooljail import tool\n\n@tool\ndef count(n: int):\n"
        "    for i in range(n):\n        yield {'i': i}\n"
    )
    module.chmod(0o644)
    shared = dataclasses.replace(context, shared_dirs=(tools,))
    box = build_docker_sandbox(DockerSandboxConfig(), shared)
    try:
        await box.start()
        chunks: list[bytes] = []
        outcome = await box.run(
            RunRequest("user", {"module_path": str(module), "function": "count", "args": {"n": 3}}),
            lambda kind, data: chunks.append(data) if kind is StreamKind.YIELD else None,
        )
    finally:
        await box.close()
    assert outcome.termination is Termination.RETURNED, outcome
    assert outcome.yields == 3
    assert [json.loads(c) for c in chunks] == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_kill_ends_the_call_and_close_removes_the_container(
    make: Factory, engine: DockerEngine
) -> None:
    box = await make()
    started = asyncio.Event()

    def sink(kind: StreamKind, data: bytes) -> None:
        if b"sleeping" in data:
            started.set()

    code = (
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print('sleeping', flush=True)\n"
        "time.sleep(300)"
    )
    task = asyncio.create_task(box.run(RunRequest("code", {"code": code}), sink))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()
    await box.kill()
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.termination is Termination.KILLED
    assert time.monotonic() - t0 < 2.0
    assert len(containers_of(engine, box)) == 1
    await box.close()
    assert containers_of(engine, box) == []
    await box.kill()  # idempotent, and harmless after close


async def test_kill_through_the_engine(make: Factory, engine: DockerEngine) -> None:
    """Without a pidfd (a daemon that may not signal the sandbox uid) the engine kills."""
    box = await make()
    assert box._pidfd is not None
    os.close(box._pidfd)
    box._pidfd = None
    started = asyncio.Event()
    task = asyncio.create_task(
        box.run(
            RunRequest("code", {"code": "print('up', flush=True)\nimport time; time.sleep(300)"}),
            lambda kind, data: started.set(),
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    await box.kill()
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.termination is Termination.KILLED


async def test_a_container_that_dies_before_its_call_is_not_alive(
    make: Factory, engine: DockerEngine
) -> None:
    box = await make()
    assert box.alive and box.container_id is not None
    await engine.call(engine.connect().api.kill, box.container_id)
    deadline = time.monotonic() + 10
    while box.alive and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not box.alive


async def test_a_tool_s_leftover_process_does_not_hold_the_call(make: Factory) -> None:
    box = await make()
    t0 = time.monotonic()
    outcome, _ = await run(
        box, "import subprocess\nsubprocess.Popen(['sleep', '300'], start_new_session=True)"
    )
    assert outcome.termination is Termination.RETURNED
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("told_by", ["cgroup", "engine"])
async def test_memory_past_the_limit_is_out_of_memory(make: Factory, told_by: str) -> None:
    box = await make(Limits(sandbox_memory_bytes=64 * 1024**2))
    assert box._memory_cgroup is not None, "this host's memory cgroup of the container"
    if told_by == "engine":
        box._memory_cgroup = None  # as when the runtime removed the cgroup first
    outcome, out = await asyncio.wait_for(
        run(box, "x = bytearray(512 * 1024 * 1024)\nprint('survived')"), 30
    )
    assert outcome.termination is Termination.OUT_OF_MEMORY, outcome
    assert outcome.error is not None and outcome.error.type == "OutOfMemory"
    assert b"survived" not in out.get(StreamKind.STDOUT, b"")


HARDENING_PROBE = r"""
import ctypes, errno, json, os, socket

def attempt(fn):
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"

def write(path):
    with open(path, "w") as f:
        f.write("x")

def connect():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect(("1.1.1.1", 53))
        s.send(b"x")

libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": 250, "aarch64": 219}

def libc_call(name, *args):
    def call():
        if getattr(libc, name)(*args) == -1:
            raise OSError(ctypes.get_errno(), name)
    return call

status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines())
interfaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
    "CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
    "write_root": attempt(lambda: write("/probe")),
    "write_usr": attempt(lambda: write("/usr/probe")),
    "write_workspace": attempt(lambda: write("/workspace/probe")),
    "write_tmp": attempt(lambda: write("/tmp/probe")),
    "write_shm": attempt(lambda: write("/dev/shm/probe")),
    "connect": attempt(connect),
    "interfaces": interfaces,
    "mount": attempt(libc_call("mount", b"none", b"/tmp", b"tmpfs", 0, None)),
    "unshare_user": attempt(libc_call("unshare", 0x10000000)),
    "keyctl": attempt(libc_call("syscall", KEYCTL[os.uname().machine], 0, -3, 0)),
    "io_uring_setup": attempt(libc_call("syscall", 425, 1, None)),
    "clone3": attempt(libc_call("syscall", 435, None, 0)),
    "no_aslr": attempt(libc_call("personality", 0x0040000)),
    "docker_socket": [p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p)],
    "channel": os.listdir("/run/tooljail-channel"),
    "environ": sorted(os.environ),
    "hostname": socket.gethostname(),
}))
"""


async def test_hardening(make: Factory) -> None:
    box = await make()
    outcome, out = await run(box, HARDENING_PROBE)
    assert outcome.termination is Termination.RETURNED, (outcome, out)
    seen = json.loads(out[StreamKind.STDOUT])
    assert (seen["uid"], seen["gid"]) == (65534, 65534)
    assert seen["cwd"] == "/workspace"
    assert int(seen["CapEff"], 16) == 0 and int(seen["CapBnd"], 16) == 0
    assert seen["NoNewPrivs"] == "1"
    assert seen["Seccomp"] == "2"
    assert seen["write_root"] == "EROFS"
    assert seen["write_usr"] == "EROFS"
    assert (seen["write_workspace"], seen["write_tmp"], seen["write_shm"]) == ("ok", "ok", "ok")
    assert seen["connect"] in ("ENETUNREACH", "EHOSTUNREACH", "EACCES", "EPERM")
    assert seen["interfaces"] == ["lo"]
    assert seen["mount"] == "EPERM"
    assert seen["unshare_user"] == "EPERM"
    # Only the seccomp filter answers these so (else: a key id, EFAULT, EFAULT, ok).
    assert seen["keyctl"] == "EPERM"
    assert seen["io_uring_setup"] == "EPERM"
    assert seen["clone3"] == "ENOSYS"
    assert seen["no_aslr"] == "EPERM"
    assert seen["docker_socket"] == []
    assert seen["channel"] == []  # the socket is gone once the runner connected
    assert seen["environ"] == sorted(
        ["PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"]
    )


async def test_container_settings(make: Factory, engine: DockerEngine) -> None:
    limits = Limits(sandbox_memory_bytes=200 * 1024**2, sandbox_pids=50, cpus=0.5)
    box = await make(limits)
    assert box.container_id is not None
    attrs = engine.connect().api.inspect_container(box.container_id)
    host = attrs["HostConfig"]
    assert attrs["Config"]["User"] == "65534:65534"
    assert attrs["Config"]["Labels"][LABEL_SANDBOX] == "1"
    assert attrs["Name"] == f"/tooljail-{box.id}"
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert (host["Memory"], host["MemorySwap"]) == (200 * 1024**2, 200 * 1024**2)
    assert host["PidsLimit"] == 50
    assert host["NanoCpus"] == 500_000_000
    assert host["Privileged"] is False
    assert not any("docker.sock" in (m.get("Source") or "") for m in attrs["Mounts"])


async def test_network_when_allowed(make: Factory) -> None:
    box = await make(network=True)
    outcome, out = await run(
        box, "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))"
    )
    assert outcome.termination is Termination.RETURNED
    assert "eth0" in out[StreamKind.STDOUT].decode()


def _labelled(engine: DockerEngine, daemon_id: str, state_dir: Path, name: str) -> str:
    created: dict[str, Any] = engine.connect().api.create_container(
        IMAGE,
        command=["true"],
        name=name,
        labels={
            LABEL_SANDBOX: "1",
            LABEL_DAEMON: daemon_id,
            LABEL_SANDBOX_ID: "sbx-" + name[-12:],
            LABEL_STATE_DIR: str(state_dir),
        },
    )
    return str(created["Id"])


async def test_remove_stale_containers(engine: DockerEngine, context: DockerContext) -> None:
    client = engine.connect()
    tag = os.urandom(6).hex()
    other_state = context.state_dir.parent / "other-state"
    stale = _labelled(engine, "crashed-daemon", context.state_dir, f"tooljail-test-stale-{tag}")
    own = _labelled(engine, context.daemon_id, context.state_dir, f"tooljail-test-own-{tag}")
    elsewhere = _labelled(engine, "another-daemon", other_state, f"tooljail-test-else-{tag}")
    try:
        channel = context.channel_root / ("sbx-" + f"tooljail-test-stale-{tag}"[-12:])
        channel.mkdir(parents=True)
        # Channel directories of no container: an old one (a crash) and a
        # fresh one (a start in progress).
        orphan = context.channel_root / "sbx-000000000000"
        starting = context.channel_root / "sbx-111111111111"
        for directory in (orphan, starting):
            directory.mkdir()
        os.utime(orphan, (time.time() - 3600, time.time() - 3600))
        removed = await engine.call(
            remove_stale_containers, client, context.daemon_id, state_dir=context.state_dir
        )
        assert removed == 1
        ids = {c["Id"] for c in client.api.containers(all=True)}
        assert stale not in ids
        assert own in ids and elsewhere in ids
        assert not channel.exists()
        assert not orphan.exists()
        assert starting.exists()
        starting.rmdir()
        assert await engine.call(remove_own_containers, client, context.daemon_id) == 1
        assert own not in {c["Id"] for c in client.api.containers(all=True)}
    finally:
        from docker.errors import NotFound

        for container in (stale, own, elsewhere):
            with contextlib.suppress(NotFound):
                await engine.call(client.api.remove_container, container, force=True)


async def test_no_engine_fails_fast_and_says_how_to_start_one(
    context: DockerContext, tmp_path: Path
) -> None:
    # A socket that is not there, and one that accepts but never answers.
    silent = socket.socket(socket.AF_UNIX)
    silent_path = tmp_path / "silent.sock"
    silent.bind(str(silent_path))
    silent.listen(8)
    try:
        for host in ("unix:///nonexistent/docker.sock", f"unix://{silent_path}"):
            config = DockerSandboxConfig(docker_host=host, connect_timeout_s=1.0)
            engine = engine_for(config)
            box = build_docker_sandbox(config, dataclasses.replace(context, engine=engine))
            t0 = time.monotonic()
            with pytest.raises(EngineUnavailableError) as caught:
                await box.start()
            assert time.monotonic() - t0 < 5.0
            assert f"no Docker engine answers at {host}" in str(caught.value)
            assert "systemctl start docker" in str(caught.value)
            assert isinstance(caught.value, SandboxError)
            await box.close()
            engine.close()
    finally:
        silent.close()


async def test_missing_image_says_how_to_build_it(make: Factory, engine: DockerEngine) -> None:
    with pytest.raises(ImageMissingError) as caught:
        await make(image="tooljail/nosuchimage:latest")
    assert "tooljail images build nosuchimage" in str(caught.value)


async def test_a_start_that_fails_halfway_leaves_nothing(
    context: DockerContext, engine: DockerEngine
) -> None:
    box = build_docker_sandbox(
        DockerSandboxConfig(python="/nonexistent/python3", start_timeout_s=10), context
    )
    with pytest.raises(SandboxError):
        await box.start()
    assert containers_of(engine, box) == []
    assert not (context.channel_root / box.id).exists()


async def test_a_cancelled_start_leaves_nothing(
    context: DockerContext, engine: DockerEngine
) -> None:
    # At several points of the start (a start takes ~0.3 s here): whichever
    # request or wait the cancel lands in, close() finds and removes the container.
    for delay in (0.0, 0.01, 0.05, 0.1, 0.2, 0.25):
        box = build_docker_sandbox(DockerSandboxConfig(), context)
        task = asyncio.create_task(box.start())
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await box.close()
        assert containers_of(engine, box) == []


@pytest.mark.timeout(600)
async def test_timing_of_the_call_path(make: Factory, context: DockerContext) -> None:
    """Not an assertion: prints start cost and run() p50 on warm containers (pytest -s)."""
    starts = []
    boxes = []
    for _ in range(50):
        t0 = time.perf_counter()
        boxes.append(await make())
        starts.append(time.perf_counter() - t0)
    runs = []
    for box in boxes:
        t0 = time.perf_counter()
        outcome, out = await run(box, "print(1)")
        runs.append(time.perf_counter() - t0)
        assert outcome.termination is Termination.RETURNED and out[StreamKind.STDOUT] == b"1\n"
    ms = sorted(r * 1000 for r in runs)
    print(
        f"\ndocker sandbox: start p50 {statistics.median(starts) * 1000:.0f} ms "
        f"(of {len(starts)} sequential); run() on a warm container over {len(ms)} calls: "
        f"p50 {statistics.median(ms):.2f} ms, p90 {ms[int(len(ms) * 0.9)]:.2f} ms, "
        f"max {ms[-1]:.2f} ms"
    )
