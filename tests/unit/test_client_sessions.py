"""Sessions and workspace files in the SDK, against a real grpc.aio server with canned answers.

This tests what the SDK sends (options on CreateSessionRequest, session_id on
CallRequest, an upload's chunks) and how it reads the answers and error
details, sync and async; not the daemon, whose sessions the integration
tests cover. The servicer below keeps sessions and files in dicts. The sync
client runs in a worker thread so that it does not block the server's loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest

from tooljail import (
    AsyncClient,
    AsyncSession,
    Client,
    DaemonUnavailableError,
    InternalError,
    InvalidPathError,
    InvalidRequestError,
    Output,
    OverloadedError,
    Session,
    SessionEndedError,
    SessionInfo,
    SessionNotFoundError,
    SessionState,
    ToolResult,
    TransportError,
    WorkspaceFileNotFoundError,
    WorkspaceFullError,
)
from tooljail._client_base import CLIENT_KEY
from tooljail._session_base import UPLOAD_CHUNK_BYTES
from tooljail._wire import ERROR_DETAIL_KEY
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

QUOTA_BYTES = 4 * UPLOAD_CHUNK_BYTES


async def _abort(context, status: grpc.StatusCode, code: str = "", **detail) -> None:
    """Fail the RPC; with no `code`, as a dropped connection (no tooljail detail)."""
    trailing = ()
    if code:
        message = pb.ErrorDetail(code=code, message=f"canned {code}", **detail)
        trailing = ((ERROR_DETAIL_KEY, message.SerializeToString()),)
    await context.abort(status, f"canned {code or 'drop'}", trailing_metadata=trailing)


class SessionRunner(tooljail_pb2_grpc.ToolRunnerServicer):
    """Sessions s1, s2, ... and their files in dicts; "ended" is a session that timed out."""

    def __init__(self) -> None:
        self.creates: list[pb.CreateSessionRequest] = []
        self.closes: list[str] = []
        self.lists: list[pb.ListSessionsRequest] = []
        self.uploads: list[list[pb.FileChunk]] = []
        self.downloads: list[pb.DownloadFileRequest] = []
        self.calls: list[pb.CallRequest] = []
        self.client_keys: list[str] = []
        self.sessions: dict[str, pb.SessionInfo] = {}
        self.files: dict[tuple[str, str], bytes] = {}
        # RPC name -> how many more tries fail as a dropped connection.
        self.drops: dict[str, int] = {}
        self.create_answer: pb.SessionInfo | None = None
        self.close_fails = False

    async def _enter(self, name: str, context) -> None:
        self.client_keys.append(dict(context.invocation_metadata()).get(CLIENT_KEY, ""))
        if self.drops.get(name, 0) > 0 and name != "DownloadFile":
            self.drops[name] -= 1
            await _abort(context, grpc.StatusCode.UNAVAILABLE)

    async def _session(self, session_id: str, context) -> pb.SessionInfo:
        if session_id == "ended":
            await _abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "session_ended", reason="idle_ttl"
            )
        if session_id not in self.sessions:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "session_not_found")
        return self.sessions[session_id]

    async def CreateSession(self, request, context):
        self.creates.append(request)
        await self._enter("CreateSession", context)
        if request.pids == 999:
            await _abort(
                context, grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded", retry_after_s=2.5
            )
        if self.create_answer is not None:
            return self.create_answer
        session_id = f"s{len(self.sessions) + 1}"
        self.sessions[session_id] = pb.SessionInfo(
            session_id=session_id,
            state=pb.SESSION_STATE_OPEN,
            sandbox_id="sb-" + session_id,
            idle_ttl_s=request.idle_ttl_s or 600.0,
            workspace_bytes=request.workspace_bytes or QUOTA_BYTES,
            keep_processes=request.keep_processes,
        )
        return self.sessions[session_id]

    async def CloseSession(self, request, context):
        self.closes.append(request.session_id)
        await self._enter("CloseSession", context)
        if self.close_fails:
            await _abort(context, grpc.StatusCode.INTERNAL, "internal")
        info = await self._session(request.session_id, context)
        info.state = pb.SESSION_STATE_CLOSED
        info.end_reason = info.end_reason or "closed"
        return info

    async def ListSessions(self, request, context):
        self.lists.append(request)
        await self._enter("ListSessions", context)
        return pb.ListSessionsResponse(
            sessions=[s for s in self.sessions.values() if s.state == pb.SESSION_STATE_OPEN]
        )

    async def UploadFile(self, request_iterator, context):
        chunks = [chunk async for chunk in request_iterator]
        self.uploads.append(chunks)
        await self._enter("UploadFile", context)
        session_id, path = chunks[0].session_id, chunks[0].path
        info = await self._session(session_id, context)
        data = b"".join(c.data for c in chunks)
        if path.startswith(("/", "..")):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "invalid_path")
        if len(data) > info.workspace_bytes:
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "workspace_full")
        self.files[session_id, path] = data
        return pb.FileInfo(path=path, size_bytes=len(data))

    async def DownloadFile(self, request, context):
        self.downloads.append(request)
        await self._enter("DownloadFile", context)
        await self._session(request.session_id, context)
        data = self.files.get((request.session_id, request.path))
        if data is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, "file_not_found")
        step = max(1, -(-len(data) // 3))  # every file in three chunks (an empty one in one)
        for start in range(0, max(1, len(data)), step):
            head = {"session_id": request.session_id, "path": request.path} if not start else {}
            yield pb.FileChunk(data=data[start : start + step], **head)
            if self.drops.get("DownloadFile", 0) > 0:
                # A connection that drops after the first chunk: the SDK starts over.
                self.drops["DownloadFile"] -= 1
                await _abort(context, grpc.StatusCode.UNAVAILABLE)

    async def Call(self, request, context):
        self.calls.append(request)
        await self._enter("Call", context)
        if request.session_id:
            await self._session(request.session_id, context)
        yield pb.CallEvent(output=pb.Output(seq=1, stream=pb.STREAM_KIND_STDOUT, data=b"42\n"))
        yield pb.CallEvent(
            result=pb.Result(
                call_id=request.call_id,
                tool=request.tool,
                status=pb.STATUS_SUCCESS,
                effect=pb.EFFECT_APPLIED,
                data_json='{"stdout": "42\\n"}',
                session_id=request.session_id,
                session_reset=request.arguments_json == '{"reset": true}',
            )
        )

    async def Run(self, request, context):
        result = pb.Result()
        async for event in self.Call(request, context):
            if event.WhichOneof("event") == "result":
                result = event.result
        return result


@pytest.fixture
async def server() -> AsyncIterator[tuple[SessionRunner, str]]:
    servicer = SessionRunner()
    srv = grpc.aio.server()
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


BIG = bytes(range(256)) * (UPLOAD_CHUNK_BYTES * 5 // 2 // 256) + b"!"  # 2.5 MiB + 1


def _assert_chunked_upload(chunks: list[pb.FileChunk], session_id: str, path: str) -> None:
    # Only the first chunk names the session and the path; none passes the chunk size.
    assert [(c.session_id, c.path) for c in chunks] == [(session_id, path), ("", ""), ("", "")]
    assert [len(c.data) for c in chunks] == [
        UPLOAD_CHUNK_BYTES,
        UPLOAD_CHUNK_BYTES,
        len(BIG) - 2 * UPLOAD_CHUNK_BYTES,
    ]


# --- sync ---


async def test_sync_session_calls_streams_uploads_downloads_and_closes(server) -> None:
    servicer, target = server

    def run():
        with Client(target) as client:
            with client.session(idle_ttl_s=30, workspace_bytes=QUOTA_BYTES) as s:
                first = s.call(
                    "execute_python_code", {"code": "x = 41"}, tool_timeout_s=2, call_id="c1"
                )
                items = list(s.stream("execute_python_code", {"code": "print(x + 1)"}))
                size = s.upload("dir/big.bin", BIG)
                back = s.download("dir/big.bin")
                opened = s.info
            return s, first, items, size, back, opened

    s, first, items, size, back, opened = await asyncio.to_thread(run)
    assert isinstance(s, Session)
    assert s.id == "s1" and opened.state is SessionState.OPEN and opened.idle_ttl_s == 30.0
    assert (first.session_id, first.call_id) == ("s1", "c1")
    assert [(c.session_id, c.tool, c.timeout_s) for c in servicer.calls] == [
        ("s1", "execute_python_code", 2.0),
        ("s1", "execute_python_code", 0.0),
    ]
    assert items[0] == Output(seq=1, stream="stdout", data="42\n")
    assert isinstance(items[-1], ToolResult) and items[-1].session_id == "s1"
    assert size == len(BIG)
    _assert_chunked_upload(servicer.uploads[0], "s1", "dir/big.bin")
    assert back == BIG  # gathered from three chunks
    assert servicer.closes == ["s1"]  # the end of the `with` closed it
    assert s.info.state is SessionState.CLOSED and s.info.end_reason == "closed"
    assert set(servicer.client_keys) == {servicer.client_keys[0]} and servicer.client_keys[0]


async def test_sync_session_opens_at_once_and_closes_once(server) -> None:
    servicer, target = server

    def run() -> tuple[bool, SessionInfo, SessionInfo]:
        with Client(target) as client:
            s = client.session()
            opened_before_any_call = servicer.creates != []
            first = s.close()
            again = s.close()  # nothing sent
            return opened_before_any_call, first, again

    opened, first, again = await asyncio.to_thread(run)
    assert opened
    assert first == again and first.state is SessionState.CLOSED
    assert servicer.closes == ["s1"]


async def test_sync_client_reaches_a_session_by_id(server) -> None:
    servicer, target = server
    servicer.sessions["elsewhere"] = pb.SessionInfo(
        session_id="elsewhere", state=pb.SESSION_STATE_OPEN, workspace_bytes=QUOTA_BYTES
    )

    def run():
        with Client(target) as client:
            result = client.call("t", {"reset": True}, session_id="elsewhere")
            items = list(client.stream("t", session_id="elsewhere"))
            size = client.upload_file("elsewhere", "a.txt", bytearray(b"abc"))
            data = client.download_file("elsewhere", "a.txt")
            listed = client.list_sessions(all_clients=True)
            closed = client.close_session("elsewhere")
            plain = client.call("t")
            return result, items, size, data, listed, closed, plain

    result, items, size, data, listed, closed, plain = await asyncio.to_thread(run)
    assert result.session_id == "elsewhere" and result.session_reset
    assert items[-1].session_id == "elsewhere"
    assert (size, data) == (3, b"abc")
    assert [i.session_id for i in listed] == ["elsewhere"]
    assert servicer.lists[0].all_clients
    assert closed.state is SessionState.CLOSED and closed.session_id == "elsewhere"
    assert plain.session_id == "" and servicer.calls[-1].session_id == ""


@pytest.mark.parametrize(
    ("session_id", "path", "exc_type"),
    [
        ("ended", "a.txt", SessionEndedError),
        ("nobody", "a.txt", SessionNotFoundError),
        ("s1", "missing.txt", WorkspaceFileNotFoundError),
    ],
)
async def test_sync_session_errors_map_to_their_classes(
    server, session_id: str, path: str, exc_type
) -> None:
    _, target = server

    def run() -> None:
        with Client(target) as client:
            client.session()  # s1, left open
            client.download_file(session_id, path)

    with pytest.raises(exc_type) as info:
        await asyncio.to_thread(run)
    if exc_type is SessionEndedError:
        assert info.value.reason == "idle_ttl"


async def test_sync_exit_keeps_the_callers_exception_when_close_fails_too(server) -> None:
    servicer, target = server
    servicer.close_fails = True

    def leaves_with_an_error() -> None:
        with Client(target) as client, client.session():
            raise KeyError("the caller's")

    def leaves_cleanly() -> None:
        with Client(target) as client, client.session():
            pass

    with pytest.raises(KeyError, match="the caller's") as info:
        await asyncio.to_thread(leaves_with_an_error)
    assert any("closing session s1 failed too: InternalError" in n for n in info.value.__notes__)
    with pytest.raises(InternalError):
        await asyncio.to_thread(leaves_cleanly)


# --- async ---


async def test_async_exit_keeps_the_callers_exception_when_close_fails_too(server) -> None:
    servicer, target = server
    servicer.close_fails = True
    async with AsyncClient(target) as client:
        with pytest.raises(KeyError, match="the caller's") as info:
            async with client.session():
                raise KeyError("the caller's")
        assert any("closing session s1 failed too" in n for n in info.value.__notes__)
        with pytest.raises(InternalError):
            async with client.session():
                pass
    assert servicer.closes == ["s1", "s2"]


async def test_async_session_with_and_await(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        async with client.session(
            idle_ttl_s=10,
            max_lifetime_s=60.5,
            memory_bytes=2**30,
            pids=64,
            cpus=0.5,
            workspace_bytes=QUOTA_BYTES,
            keep_processes=True,
        ) as s:
            assert isinstance(s, AsyncSession) and s.id == "s1"
            result = await s.call("execute_python_code", {"code": "x = 41"}, call_id="a1")
            items = [i async for i in s.stream("execute_python_code", {"code": "print(x+1)"})]
            assert await s.upload("big.bin", memoryview(BIG)) == len(BIG)
            assert await s.download("big.bin") == BIG
        assert s.info.state is SessionState.CLOSED
        other = await client.session()
        assert other.id == "s2" and "s2" in repr(other)
        assert [i.session_id for i in await client.list_sessions()] == ["s2"]
        await other.close()
        await other.close()
    assert servicer.creates[0] == pb.CreateSessionRequest(
        idle_ttl_s=10,
        max_lifetime_s=60.5,
        memory_bytes=2**30,
        pids=64,
        cpus=0.5,
        workspace_bytes=QUOTA_BYTES,
        keep_processes=True,
    )
    assert servicer.creates[1] == pb.CreateSessionRequest()  # every option the daemon's
    assert (result.session_id, result.call_id) == ("s1", "a1")
    assert isinstance(items[-1], ToolResult) and items[-1].session_id == "s1"
    assert [c.session_id for c in servicer.calls] == ["s1", "s1"]
    _assert_chunked_upload(servicer.uploads[0], "s1", "big.bin")
    assert servicer.closes == ["s1", "s2"]
    assert not servicer.lists[0].all_clients


async def test_async_client_methods_by_id_and_their_errors(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        s = await client.session(workspace_bytes=10)
        assert (await client.call("t", session_id=s.id)).session_id == "s1"
        assert [i async for i in client.stream("t", session_id=s.id)][-1].session_id == "s1"
        assert await client.upload_file(s.id, "empty", b"") == 0
        assert await client.download_file(s.id, "empty") == b""
        with pytest.raises(WorkspaceFullError):
            await s.upload("too-big", b"x" * 11)
        with pytest.raises(InvalidPathError):  # the daemon's verdict, mapped
            await s.upload("../escape", b"x")
        with pytest.raises(SessionEndedError) as ended:
            await client.call("t", session_id="ended")
        assert ended.value.reason == "idle_ttl"
        with pytest.raises(SessionNotFoundError):
            await client.close_session("nobody")
        closed = await client.close_session(s.id)
        assert closed.state is SessionState.CLOSED
    assert [len(u) for u in servicer.uploads] == [1, 1, 1]  # an empty file is one chunk


async def test_async_session_start_opens_once(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        start = client.session()
        assert servicer.creates == []  # not before it is awaited
        s = await start
        with pytest.raises(RuntimeError, match="already awaited"):
            await start
        await s.close()
        client.session()  # never awaited: opens nothing
    assert len(servicer.creates) == 1


async def test_async_session_refused_when_full(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(OverloadedError) as info:
            async with client.session(pids=999):
                pass
    assert info.value.retry_after_s == 2.5


async def test_an_unreadable_session_info_is_a_transport_error(server) -> None:
    servicer, target = server
    servicer.create_answer = pb.SessionInfo(session_id="x")  # no state
    async with AsyncClient(target) as client:
        with pytest.raises(TransportError, match="cannot read"):
            await client.session()
        servicer.create_answer = pb.SessionInfo(state=pb.SESSION_STATE_OPEN)  # no id
        with pytest.raises(TransportError, match="session id"):
            await client.session()


# --- retries ---


async def test_create_session_is_never_retried(server) -> None:
    servicer, target = server
    servicer.drops["CreateSession"] = 1
    async with AsyncClient(target, retries=3) as client:
        with pytest.raises(DaemonUnavailableError):
            await client.session()

    def run_sync() -> None:
        servicer.drops["CreateSession"] = 1
        with Client(target, retries=3) as client:
            client.session()

    with pytest.raises(DaemonUnavailableError):
        await asyncio.to_thread(run_sync)
    assert len(servicer.creates) == 2  # one try each, async and sync


@pytest.mark.parametrize("sync", [False, True])
async def test_safe_session_rpcs_are_retried_after_a_drop(server, sync: bool) -> None:
    servicer, target = server
    servicer.sessions["s9"] = pb.SessionInfo(
        session_id="s9", state=pb.SESSION_STATE_OPEN, workspace_bytes=QUOTA_BYTES
    )
    for name in ("ListSessions", "CloseSession", "UploadFile", "DownloadFile", "Call"):
        servicer.drops[name] = 1
    payload = b"y" * 250  # three download chunks; the first try breaks after one

    async def run_async():
        async with AsyncClient(target) as client:
            size = await client.upload_file("s9", "f", payload)
            data = await client.download_file("s9", "f")
            listed = await client.list_sessions()
            result = await client.call("t", session_id="s9", call_id="k1")
            closed = await client.close_session("s9")
            return size, data, listed, result, closed

    def run_sync():
        with Client(target) as client:
            return (
                client.upload_file("s9", "f", payload),
                client.download_file("s9", "f"),
                client.list_sessions(),
                client.call("t", session_id="s9", call_id="k1"),
                client.close_session("s9"),
            )

    size, data, listed, result, closed = (
        await asyncio.to_thread(run_sync) if sync else await run_async()
    )
    assert (size, data) == (250, payload)  # the download started over, nothing doubled
    assert [i.session_id for i in listed] == ["s9"]
    assert result.session_id == "s9"
    assert closed.state is SessionState.CLOSED
    assert [len(u) for u in servicer.uploads] == [1, 1]  # the whole file sent again
    assert len(servicer.downloads) == 2 and len(servicer.lists) == 2
    assert [(c.call_id, c.session_id) for c in servicer.calls] == [("k1", "s9"), ("k1", "s9")]
    assert servicer.closes == ["s9", "s9"]


# --- argument checks: before anything is sent ---


@pytest.mark.parametrize(
    ("options", "exc_type"),
    [
        ({"idle_ttl_s": -1}, InvalidRequestError),
        ({"idle_ttl_s": math.nan}, InvalidRequestError),
        ({"max_lifetime_s": math.inf}, InvalidRequestError),
        ({"max_lifetime_s": "60"}, TypeError),
        ({"memory_bytes": 1.5}, TypeError),
        ({"memory_bytes": -1}, InvalidRequestError),
        ({"memory_bytes": 2**64}, InvalidRequestError),
        ({"pids": True}, TypeError),
        ({"pids": 2**32}, InvalidRequestError),
        ({"cpus": -0.5}, InvalidRequestError),
        ({"cpus": "1"}, TypeError),
        ({"workspace_bytes": -5}, InvalidRequestError),
        ({"keep_processes": 1}, TypeError),
        ({"keep_processes": None}, TypeError),
    ],
)
async def test_session_options_are_checked_locally(server, options, exc_type) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(exc_type):
            client.session(**options)  # at the call, before any await

    def run_sync() -> None:
        with Client(target) as client:
            client.session(**options)

    with pytest.raises(exc_type):
        await asyncio.to_thread(run_sync)
    assert servicer.creates == []


@pytest.mark.parametrize(
    ("args", "exc_type"),
    [
        (("", "a", b""), InvalidRequestError),
        ((7, "a", b""), TypeError),
        (("s1", "", b""), InvalidPathError),
        (("s1", None, b""), TypeError),
        (("s1", "a", "text"), TypeError),
        (("s1", "a", 5), TypeError),
        (("s1", "a", [1, 2]), TypeError),
    ],
)
async def test_file_arguments_are_checked_locally(server, args, exc_type) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(exc_type):
            await client.upload_file(*args)
        if isinstance(args[2], bytes):
            with pytest.raises(exc_type):
                await client.download_file(*args[:2])

    def run_sync() -> None:
        with Client(target) as client:
            client.upload_file(*args)

    with pytest.raises(exc_type):
        await asyncio.to_thread(run_sync)
    assert servicer.uploads == [] and servicer.downloads == []


async def test_session_id_arguments_are_checked_locally(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(InvalidRequestError, match="session_id is empty"):
            await client.call("t", session_id="")
        with pytest.raises(TypeError):
            client.stream("t", session_id=3)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError):
            await client.close_session("")
        with pytest.raises(TypeError):
            await client.list_sessions(all_clients="yes")  # type: ignore[arg-type]
    assert servicer.calls == [] and servicer.closes == [] and servicer.lists == []


def test_a_non_contiguous_view_uploads_its_bytes_in_order() -> None:
    from tooljail._session_base import upload_messages

    view = memoryview(b"abcdef")[::2]
    chunks = list(upload_messages("s", "p", view)())
    assert [c.data for c in chunks] == [b"ace"]
