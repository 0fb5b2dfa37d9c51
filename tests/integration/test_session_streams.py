"""A session's background processes, terminals and port connections, at the sandbox floor.

Through `SessionSandbox` on real sandboxes (runner/_streams.py in the
supervisor, sandbox/session_streams.py in the daemon): each kind of process
sandbox this host can make (no namespaces, bubblewrap, the zygote's forks),
and the docker backend where an engine is there.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tests.unit.test_docker_sandbox import context, engine  # noqa: F401
from tests.unit.test_process_sandbox import NAMESPACES, build
from tooljaild.sandbox.docker import build_docker_sandbox
from tooljaild.sandbox.isolation import resolve
from tooljaild.sandbox.process import build_process_sandbox, zygote_for
from tooljaild.sandbox.session_channel import SessionSandbox
from tooljaild.sandbox.session_streams import SandboxProcess, Spawn
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
