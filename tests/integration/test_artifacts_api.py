"""The artifact API through a real daemon over gRPC: the SDK (sync and async),
the raw stream, and `tooljail artifacts` on the command line.

Artifacts are put straight into the running daemon's store (on its event loop,
the store's one thread), as the call manager does: these tests are about
reading them back, whatever made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from tests.conftest import _reachable
from tooljail import (
    ArtifactGoneError,
    ArtifactInfo,
    ArtifactNotFoundError,
    ArtifactRef,
    AsyncClient,
    Client,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.app.daemon import Daemon
from tooljaild.artifacts.store import CHUNK_BYTES, ArtifactStore, Origin
from tooljaild.settings.config import load_settings

_T = TypeVar("_T")
MIB = 1024**2


@dataclass
class Served:
    """A daemon on its own event loop in a thread, with a hand on its store."""

    daemon: Daemon
    loop: asyncio.AbstractEventLoop
    target: str

    def on_loop(self, action: Callable[[ArtifactStore], _T]) -> _T:
        """`action(store)` on the daemon's loop, the store's one thread."""
        store = self.daemon.artifacts
        assert store is not None

        async def run() -> _T:
            return action(store)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def put(
        self,
        owner: str,
        data: bytes,
        *,
        name: str = "out.txt",
        mime_type: str = "text/plain",
        call_id: str = "call-1",
        session_id: str = "",
    ) -> ArtifactRef:
        origin = Origin(owner, call_id=call_id, session_id=session_id, tool="execute_python_code")
        return self.on_loop(lambda store: store.put(name, mime_type, data, origin, "output"))


@contextlib.contextmanager
def _serve(base: Path, **settings: Any) -> Iterator[Served]:
    resolved = load_settings(
        listen=f"unix://{base / 'tooljail.sock'}", state_dir=base / "state", pool_size=0, **settings
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="artifacts-daemon", daemon=True)
    thread.start()
    daemon = Daemon(resolved)
    try:
        asyncio.run_coroutine_threadsafe(daemon.start(), loop).result(60)
        yield Served(daemon, loop, resolved.listen)
    finally:
        asyncio.run_coroutine_threadsafe(daemon.stop(5.0), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with _serve(_reachable(tmp_path)) as s:
        yield s


def _big() -> bytes:
    """Several chunks' worth, every byte value, not a multiple of a chunk."""
    return os.urandom(3 * CHUNK_BYTES + 12345)


def test_read_list_and_delete_through_the_sdk(served: Served) -> None:
    data = _big()
    big = served.put("agent-a", data, name="big.bin", mime_type="application/octet-stream")
    other_call = served.put("agent-a", b"second", call_id="call-2", session_id="s-1")
    with Client(served.target, client_name="agent-a") as client:
        assert client.client_name == "agent-a"
        assert client.get_artifact(big.artifact_id) == data

        listed = client.list_artifacts()
        assert [a.artifact_id for a in listed] == [other_call.artifact_id, big.artifact_id]
        info = listed[1]
        assert isinstance(info, ArtifactInfo)
        assert (info.name, info.mime_type, info.size_bytes) == (
            "big.bin",
            "application/octet-stream",
            len(data),
        )
        assert (info.call_id, info.tool, info.source) == ("call-1", "execute_python_code", "output")
        assert info.created_unix > 0
        assert [a.name for a in client.list_artifacts(call_id="call-2")] == ["out.txt"]
        assert [a.call_id for a in client.list_artifacts(session_id="s-1")] == ["call-2"]
        assert client.list_artifacts(call_id="call-1", session_id="s-1") == []

        assert client.delete_artifact(big.artifact_id) is True
        assert client.delete_artifact(big.artifact_id) is False  # twice is no error
        with pytest.raises(ArtifactGoneError) as gone:
            client.get_artifact(big.artifact_id)
        assert gone.value.reason == "deleted"
        assert [a.artifact_id for a in client.list_artifacts()] == [other_call.artifact_id]

        with pytest.raises(ArtifactNotFoundError):
            client.get_artifact("f" * 32)


def test_an_artifact_streams_in_chunks_with_its_info_first(served: Served) -> None:
    data = _big()
    big = served.put("agent-a", data)
    empty = served.put("agent-a", b"", name="empty.txt")
    metadata = (("tooljail-client", "agent-a"),)
    with grpc.insecure_channel(served.target) as channel:
        stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        chunks = list(
            stub.GetArtifact(pb.GetArtifactRequest(artifact_id=big.artifact_id), metadata=metadata)
        )
        assert [len(c.data) for c in chunks] == [CHUNK_BYTES] * 3 + [12345]
        assert chunks[0].HasField("info") and chunks[0].info.size_bytes == len(data)
        assert not any(c.HasField("info") for c in chunks[1:])
        assert b"".join(c.data for c in chunks) == data

        # An empty artifact is one chunk: its info, no data.
        (only,) = stub.GetArtifact(
            pb.GetArtifactRequest(artifact_id=empty.artifact_id), metadata=metadata
        )
        assert only.info.name == "empty.txt" and only.data == b""
    with Client(served.target, client_name="agent-a") as client:
        assert client.get_artifact(empty.artifact_id) == b""


def test_another_client_finds_nothing(served: Served) -> None:
    ref = served.put("agent-a", b"secret")
    for other in (Client(served.target, client_name="agent-b"), Client(served.target)):
        with other:
            with pytest.raises(ArtifactNotFoundError) as caught:
                other.get_artifact(ref.artifact_id)
            with pytest.raises(ArtifactNotFoundError) as never:
                other.get_artifact("0" * 32)
            # Word for word the answer for an id never made: nothing leaks.
            assert str(caught.value).replace(ref.artifact_id, "0" * 32) == str(never.value)
            with pytest.raises(ArtifactNotFoundError):
                other.delete_artifact(ref.artifact_id)
            assert other.list_artifacts() == []
    with Client(served.target, client_name="agent-a") as owner:
        assert owner.get_artifact(ref.artifact_id) == b"secret"  # the tries changed nothing


def test_a_gone_artifact_says_why(tmp_path: Path) -> None:
    # A store of 2 MiB: a third MiB-sized artifact evicts the oldest.
    with _serve(_reachable(tmp_path), artifacts={"max_bytes": 2 * MIB}) as served:
        old = served.put("agent-a", b"o" * MIB)
        served.put("agent-a", b"m" * MIB)
        served.put("agent-a", b"n" * MIB)
        with Client(served.target, client_name="agent-a") as client:
            with pytest.raises(ArtifactGoneError) as gone:
                client.get_artifact(old.artifact_id)
            assert gone.value.reason == "evicted"
            assert "evicted" in str(gone.value)
            assert len(client.list_artifacts()) == 2
        # Gone or not, to another client it is not found.
        with (
            Client(served.target, client_name="agent-b") as other,
            pytest.raises(ArtifactNotFoundError),
        ):
            other.get_artifact(old.artifact_id)


async def test_the_async_client(served: Served) -> None:
    data = _big()
    ref = await asyncio.to_thread(served.put, "agent-a", data)
    async with AsyncClient(served.target, client_name="agent-a") as client:
        assert await client.get_artifact(ref.artifact_id) == data
        assert [a.artifact_id for a in await client.list_artifacts(call_id="call-1")] == [
            ref.artifact_id
        ]
        assert await client.delete_artifact(ref.artifact_id) is True
        with pytest.raises(ArtifactGoneError):
            await client.get_artifact(ref.artifact_id)
    async with AsyncClient(served.target, client_name="agent-b") as other:
        with pytest.raises(ArtifactNotFoundError):
            await other.get_artifact(ref.artifact_id)


def test_the_client_name_comes_from_the_environment(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = served.put("from-env", b"env")
    monkeypatch.setenv("TOOLJAIL_CLIENT", "from-env")
    with Client(served.target) as client:
        assert client.get_artifact(ref.artifact_id) == b"env"


# ------------------------------------------------------------------ the command line


def _cli(
    *args: str, target: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args],
        capture_output=True,
        timeout=60,
        env={**os.environ, "TOOLJAIL_TARGET": target, **(env or {})},
    )


def _ok(proc: subprocess.CompletedProcess[bytes]) -> bytes:
    assert proc.returncode == 0, (proc.returncode, proc.stdout[:500], proc.stderr.decode())
    return proc.stdout


def test_artifacts_on_the_command_line(served: Served, tmp_path: Path) -> None:
    t = served.target
    data = bytes(range(256)) * 9000  # binary, every byte value, past a chunk
    binary = served.put("agent-a", data, name="data.bin", call_id="call-7")
    text = served.put("agent-a", b"hello\n", name="hello.txt", call_id="call-8")

    rows = _ok(_cli("artifacts", "ls", "--client", "agent-a", target=t)).decode().splitlines()
    assert rows[0].split()[:2] == ["ARTIFACT", "SIZE"]
    assert [r.split()[0] for r in rows[1:]] == [text.artifact_id, binary.artifact_id]
    assert rows[2].endswith("data.bin") and "call-7" in rows[2]

    listed = json.loads(
        _ok(_cli("artifacts", "ls", "--call", "call-7", "--json", "--client", "agent-a", target=t))
    )
    assert [a["artifact_id"] for a in listed] == [binary.artifact_id]
    assert listed[0]["size_bytes"] == len(data)

    # TOOLJAIL_CLIENT does what --client does.
    env = {"TOOLJAIL_CLIENT": "agent-a"}
    assert _ok(_cli("artifacts", "get", binary.artifact_id, target=t, env=env)) == data
    out = tmp_path / "copy.bin"
    got = _cli(
        "artifacts", "get", binary.artifact_id, "-o", str(out), "--client", "agent-a", target=t
    )
    assert _ok(got) == b"" and out.read_bytes() == data
    assert f"wrote {len(data)} bytes" in got.stderr.decode()

    # Another client (this process's default name, or another name) finds nothing.
    for other in ((), ("--client", "agent-b")):
        refused = _cli("artifacts", "get", binary.artifact_id, *other, target=t)
        assert refused.returncode == 2 and refused.stdout == b""
        assert "no artifact" in refused.stderr.decode()
        empty = _cli("artifacts", "ls", *other, target=t)
        assert _ok(empty).decode().splitlines()[1:] == []
        assert "no artifacts of client" in empty.stderr.decode()

    assert _ok(_cli("artifacts", "rm", text.artifact_id, "--client", "agent-a", target=t)) == (
        b"deleted\n"
    )
    again = _cli("artifacts", "rm", text.artifact_id, "--client", "agent-a", target=t)
    assert _ok(again) == b"already gone\n"
    gone = _cli("artifacts", "get", text.artifact_id, "--client", "agent-a", target=t)
    assert gone.returncode == 2
    assert "[reason: deleted]" in gone.stderr.decode()


def test_the_command_line_names_its_client_for_calls_too(served: Served) -> None:
    # `tooljail call --client NAME` goes by NAME (a name gRPC cannot carry is
    # refused before anything is sent, so the option reaches the client).
    bad = _cli("call", "--client", "agent\n", "execute_python_code", "{}", target=served.target)
    assert bad.returncode == 2
    assert "printable ASCII" in bad.stderr.decode()
    no_daemon = _cli("artifacts", "ls", "--client", "agent-a", target="unix:///nonexistent/x.sock")
    assert no_daemon.returncode == 3


def test_raw_callers_and_hostile_ids(served: Served) -> None:
    ref = served.put("agent-a", b"secret")
    with grpc.insecure_channel(served.target) as channel:
        stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        # No client name at all (a raw gRPC caller): not the owner either.
        assert list(stub.ListArtifacts(pb.ListArtifactsRequest()).artifacts) == []
        for artifact_id in (ref.artifact_id, "x" * 100_000, "", "../" * 50):
            with pytest.raises(grpc.RpcError) as err:
                list(stub.GetArtifact(pb.GetArtifactRequest(artifact_id=artifact_id)))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert len(err.value.details() or "") < 300  # the id is not echoed whole
            with pytest.raises(grpc.RpcError) as err:
                stub.DeleteArtifact(pb.DeleteArtifactRequest(artifact_id=artifact_id))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with Client(served.target, client_name="agent-a") as owner:
        assert owner.get_artifact(ref.artifact_id) == b"secret"


def test_a_reader_that_goes_away_mid_stream(served: Served) -> None:
    data = os.urandom(20 * CHUNK_BYTES)
    ref = served.put("agent-a", data)
    metadata = (("tooljail-client", "agent-a"),)
    with grpc.insecure_channel(served.target) as channel:
        stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        for _ in range(5):
            rpc = stub.GetArtifact(
                pb.GetArtifactRequest(artifact_id=ref.artifact_id), metadata=metadata
            )
            assert len(next(rpc).data) == CHUNK_BYTES
            rpc.cancel()
    with Client(served.target, client_name="agent-a") as client:
        assert client.get_artifact(ref.artifact_id) == data  # the daemon reads on, unharmed
