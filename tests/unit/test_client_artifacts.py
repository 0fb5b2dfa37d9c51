"""The SDK's artifact methods and client name, against a canned gRPC server."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from tooljail import AsyncClient, Client, InvalidRequestError, TransportError
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

DATA = b"0123456789" * 1000


class CannedArtifacts(tooljail_pb2_grpc.ToolRunnerServicer):
    """Serves one artifact; its first `drops` reads break off mid-stream (UNAVAILABLE)."""

    def __init__(self) -> None:
        self.drops = 0
        self.short = False
        self.reads = 0
        self.clients: list[str] = []
        self.requests: list[Any] = []

    def _note(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        self.clients += [v for k, v in context.invocation_metadata() if k == "tooljail-client"]

    async def GetArtifact(self, request, context):  # type: ignore[no-untyped-def]
        self._note(request, context)
        self.reads += 1
        size = len(DATA) + (1 if self.short else 0)
        yield pb.ArtifactChunk(
            info=pb.ArtifactInfo(artifact_id=request.artifact_id, size_bytes=size),
            data=DATA[:4000],
        )
        if self.drops:
            self.drops -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped")
        yield pb.ArtifactChunk(data=DATA[4000:])

    async def ListArtifacts(self, request, context):  # type: ignore[no-untyped-def]
        self._note(request, context)
        return pb.ListArtifactsResponse(
            artifacts=[
                pb.ArtifactInfo(artifact_id="b" * 32, name="new", call_id="c2"),
                pb.ArtifactInfo(artifact_id="a" * 32, name="old", call_id="c1", size_bytes=3),
            ]
        )

    async def DeleteArtifact(self, request, context):  # type: ignore[no-untyped-def]
        self._note(request, context)
        return pb.DeleteArtifactResponse(deleted=request.artifact_id == "a" * 32)


@pytest.fixture
async def server() -> AsyncIterator[tuple[CannedArtifacts, str]]:
    servicer = CannedArtifacts()
    srv = grpc.aio.server()
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(servicer, srv)  # type: ignore[no-untyped-call]
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


async def test_sync_methods_send_the_client_name_and_retry_reads(server) -> None:  # type: ignore[no-untyped-def]
    servicer, target = server
    servicer.drops = 2

    def run() -> tuple[bytes, list[Any], bool, bool]:
        with Client(target, rpc_timeout_s=10, client_name="agent-a") as client:
            return (
                client.get_artifact("a" * 32),
                client.list_artifacts(call_id="c1", session_id="s1"),
                client.delete_artifact("a" * 32),
                client.delete_artifact("z" * 32),
            )

    data, listed, deleted, not_deleted = await asyncio.to_thread(run)
    assert data == DATA
    assert servicer.reads == 3  # two broken reads, each retried from the start
    assert [a.name for a in listed] == ["new", "old"]
    assert listed[1].size_bytes == 3
    assert (deleted, not_deleted) == (True, False)
    assert set(servicer.clients) == {"agent-a"}
    list_request = servicer.requests[3]
    assert (list_request.call_id, list_request.session_id) == ("c1", "s1")


async def test_async_methods_too(server) -> None:  # type: ignore[no-untyped-def]
    servicer, target = server
    servicer.drops = 1
    async with AsyncClient(target, rpc_timeout_s=10, client_name="agent-b") as client:
        assert client.client_name == "agent-b"
        assert await client.get_artifact("a" * 32) == DATA
        assert servicer.reads == 2
        assert [a.artifact_id for a in await client.list_artifacts()] == ["b" * 32, "a" * 32]
        assert await client.delete_artifact("a" * 32) is True
    assert set(servicer.clients) == {"agent-b"}
    assert (servicer.requests[2].call_id, servicer.requests[2].session_id) == ("", "")


async def test_a_stream_shorter_than_its_size_is_a_transport_error(server) -> None:  # type: ignore[no-untyped-def]
    servicer, target = server
    servicer.short = True
    async with AsyncClient(target, rpc_timeout_s=10) as client:
        with pytest.raises(TransportError, match="got 10000 bytes of 10001"):
            await client.get_artifact("a" * 32)
    assert servicer.reads == 1  # not retried: the daemon answered


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.get_artifact(""), InvalidRequestError),
        (lambda c: c.get_artifact(b"id"), TypeError),
        (lambda c: c.delete_artifact(""), InvalidRequestError),
        (lambda c: c.delete_artifact(None), TypeError),
        (lambda c: c.list_artifacts(call_id=""), InvalidRequestError),
        (lambda c: c.list_artifacts(session_id=""), InvalidRequestError),
        (lambda c: c.list_artifacts(call_id=3), TypeError),
    ],
)
def test_arguments_are_checked_before_anything_is_sent(call: Any, error: type) -> None:
    # Nothing listens there: a check that let the request through would fail otherwise.
    with Client("unix:///nonexistent/tooljail.sock", retries=0) as client, pytest.raises(error):
        call(client)


def test_the_client_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLJAIL_CLIENT", raising=False)
    target = "unix:///nonexistent/tooljail.sock"
    assert Client(target).client_name == f"{socket.gethostname()}/{os.getpid()}"
    assert Client(target, client_name="agent-a").client_name == "agent-a"
    monkeypatch.setenv("TOOLJAIL_CLIENT", " from-env ")
    assert Client(target).client_name == "from-env"
    assert Client(target, client_name="given").client_name == "given"  # the argument wins
    monkeypatch.setenv("TOOLJAIL_CLIENT", "")
    assert Client(target).client_name == f"{socket.gethostname()}/{os.getpid()}"

    for bad in ("", "x" * 129, "agent\n", "agent-é"):
        with pytest.raises(InvalidRequestError, match="client_name"):
            Client(target, client_name=bad)
    assert Client(target, client_name="x" * 128).client_name == "x" * 128
    with pytest.raises(TypeError):
        Client(target, client_name=7)  # type: ignore[arg-type]
    monkeypatch.setenv("TOOLJAIL_CLIENT", "bad\tname")
    with pytest.raises(InvalidRequestError, match=r"\$TOOLJAIL_CLIENT"):
        Client(target)
