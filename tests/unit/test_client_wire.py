"""Client and AsyncClient against a real grpc.aio server with canned behaviour.

This tests the SDK's handling of the wire (event order, error trailers, early
close, deadlines), not the daemon: the servicer below answers from a script keyed
by tool name. The sync client runs in a worker thread so that it does not block
the event loop the server runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tooljail import (
    AsyncClient,
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    CallState,
    CallStatus,
    Client,
    DaemonUnavailableError,
    Effect,
    InternalError,
    InvalidArgumentsError,
    InvalidRequestError,
    JournalUnavailableError,
    Output,
    OverloadedError,
    StreamKind,
    ToolNotFoundError,
    ToolResult,
    TransportError,
    UnknownError,
)
from tooljail._wire import ERROR_DETAIL_KEY
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

_ERRORS: dict[str, tuple[grpc.StatusCode, pb.ErrorDetail | None]] = {
    "missing": (grpc.StatusCode.NOT_FOUND, pb.ErrorDetail(code="tool_not_found", message="no")),
    "badargs": (
        grpc.StatusCode.INVALID_ARGUMENT,
        pb.ErrorDetail(
            code="invalid_arguments",
            message="n: expected integer, got string",
            parameter="n",
            expected="integer",
            actual="string",
        ),
    ),
    "busy": (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        pb.ErrorDetail(code="overloaded", message="full", retry_after_s=3.0),
    ),
    "conflict": (
        grpc.StatusCode.ALREADY_EXISTS,
        pb.ErrorDetail(code="call_id_conflict", message="id taken"),
    ),
    "weird": (grpc.StatusCode.INTERNAL, pb.ErrorDetail(code="from_the_future", message="?")),
    # UNAVAILABLE with our detail is the daemon's answer, not a dropped connection.
    "journal": (
        grpc.StatusCode.UNAVAILABLE,
        pb.ErrorDetail(
            code="journal_unavailable", message="the journal /s/j is full", reason="full"
        ),
    ),
    "newer": (grpc.StatusCode.UNAVAILABLE, pb.ErrorDetail(code="from_the_future", message="?")),
    "internal": (grpc.StatusCode.INTERNAL, pb.ErrorDetail(code="internal", message="bug")),
    "bare": (grpc.StatusCode.INTERNAL, None),
}


def _out(seq: int, kind: int, data: bytes) -> pb.CallEvent:
    return pb.CallEvent(output=pb.Output(seq=seq, stream=kind, data=data))


def _result(request: pb.CallRequest, **fields) -> pb.CallEvent:
    return pb.CallEvent(
        result=pb.Result(
            call_id=request.call_id or "generated-1",
            tool=request.tool,
            status=fields.pop("status", pb.STATUS_SUCCESS),
            effect=fields.pop("effect", pb.EFFECT_APPLIED),
            data_json=fields.pop("data_json", request.arguments_json),
            **fields,
        )
    )


async def _abort(context: grpc.aio.ServicerContext, name: str) -> None:
    code, detail = _ERRORS[name]
    trailing = () if detail is None else ((ERROR_DETAIL_KEY, detail.SerializeToString()),)
    await context.abort(code, f"status details for {name}", trailing_metadata=trailing)


class CannedRunner(tooljail_pb2_grpc.ToolRunnerServicer):
    def __init__(self) -> None:
        self.requests: list[pb.CallRequest] = []
        self.attaches: list[pb.AttachRequest] = []
        self.cancelled = asyncio.Event()

    async def ListTools(self, request, context):
        return pb.ListToolsResponse(
            tools=[
                pb.ToolSpec(
                    name="echo",
                    description="Echoes.",
                    input_schema_json=json.dumps(
                        {"type": "object", "properties": {"x": {"type": "string"}}}
                    ),
                    timeout_s=5,
                    max_timeout_s=10,
                    streaming=True,
                    source="builtin",
                )
            ],
            diagnostics=[
                pb.Diagnostic(severity="error", code="import_failed", message="boom", file="b.py")
            ],
        )

    async def Call(self, request, context):
        self.requests.append(request)
        tool = request.tool
        if tool in _ERRORS:
            await _abort(context, tool)
        if tool.startswith("flaky") and self.requests.count(request) <= int(tool[-1]):
            # The first N tries of the same call fail as a dropped connection would.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        if tool == "dropped":
            yield pb.CallEvent(started=pb.Started(call_id=request.call_id, sandbox_id="s1"))
            yield _out(1, pb.STREAM_KIND_STDOUT, b"line 1\n")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        yield pb.CallEvent(started=pb.Started(call_id=request.call_id, sandbox_id="s1", tool=tool))
        if tool == "echo" or tool.startswith("flaky"):
            yield _out(1, pb.STREAM_KIND_STDOUT, b"a\n")
            yield _out(2, pb.STREAM_KIND_STDERR, b"warn\xc3\n")
            yield _out(3, pb.STREAM_KIND_YIELD, b'{"k": 1}')
            yield _result(request)
        elif tool == "toolfails":
            # A tool's own failure is a result, never a failed RPC.
            yield _result(
                request,
                status=pb.STATUS_ERROR,
                data_json="null",
                message="ZeroDivisionError: division by zero",
                error=pb.ToolError(type="ZeroDivisionError", message="division by zero"),
            )
        elif tool == "no_result":
            yield _out(1, pb.STREAM_KIND_STDOUT, b"x")
        elif tool == "fail_mid_stream":
            yield _out(1, pb.STREAM_KIND_STDOUT, b"x")
            await _abort(context, "busy")
        elif tool == "extra_after_result":
            yield _result(request)
            yield _out(9, pb.STREAM_KIND_STDOUT, b"late")
        elif tool == "slow":
            yield _out(1, pb.STREAM_KIND_STDOUT, b"tick")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            yield _result(request)

    async def Attach(self, request, context):
        # The "dropped" call's later chunks, from any sequence number: from 1 it
        # replays what the first stream already sent.
        self.attaches.append(request)
        if request.call_id == "unknown":
            await _abort(context, "missing")
        for seq in range(max(1, request.from_seq), 4):
            yield _out(seq, pb.STREAM_KIND_STDOUT, f"line {seq}\n".encode())
        yield _result(pb.CallRequest(call_id=request.call_id, tool="dropped"))

    async def Run(self, request, context):
        # The same canned calls, answered with their Result alone; a call that
        # gives none answers with an empty (unreadable) Result.
        result = pb.Result()
        async for event in self.Call(request, context):
            if event.WhichOneof("event") == "result":
                result = event.result
        return result

    async def GetCall(self, request, context):
        if request.call_id == "slow":
            await asyncio.sleep(5)
        if request.call_id != "known":
            detail = pb.ErrorDetail(code="call_not_found", message=f"no call {request.call_id}")
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                "not found",
                trailing_metadata=((ERROR_DETAIL_KEY, detail.SerializeToString()),),
            )
        return pb.CallInfo(
            call_id="known",
            tool="echo",
            state=pb.CALL_STATE_SUCCEEDED,
            has_result=True,
            result=pb.Result(call_id="known", status=pb.STATUS_SUCCESS, data_json='{"v": 1}'),
        )

    async def Cancel(self, request, context):
        return pb.CancelResponse(state=pb.CALL_STATE_CANCELLED)


@pytest.fixture
async def server() -> AsyncIterator[tuple[CannedRunner, str]]:
    servicer = CannedRunner()
    srv = grpc.aio.server()
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    await srv.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await srv.stop(None)


EXPECTED_OUTPUT = [
    Output(seq=1, stream=StreamKind.STDOUT, data="a\n"),
    Output(seq=2, stream=StreamKind.STDERR, data="warn\ufffd\n"),
    Output(seq=3, stream=StreamKind.YIELD, data='{"k": 1}'),
]


# --- AsyncClient ---


async def test_async_stream_yields_outputs_in_order_then_result(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        items = [
            item async for item in client.stream("echo", {"x": "é"}, tool_timeout_s=2, call_id="c1")
        ]
    assert items[:3] == EXPECTED_OUTPUT
    assert items[2].value() == {"k": 1}
    result = items[3]
    assert isinstance(result, ToolResult)
    assert result.call_id == "c1"
    assert result.data == {"x": "é"}
    assert result.effect is Effect.APPLIED
    req = servicer.requests[-1]
    assert (req.tool, req.timeout_s, req.call_id) == ("echo", 2.0, "c1")


async def test_async_call_returns_the_result(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        result = await client.call("echo", {"x": "y"})
    assert result.ok
    # Without a call id the SDK makes one, so that a retry is the same call.
    assert len(result.call_id) == 32
    assert servicer.requests[-1].call_id == result.call_id
    assert result.data == {"x": "y"}


async def test_async_tool_failure_is_a_result(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        result = await client.call("toolfails")
    assert result.status is CallStatus.ERROR
    assert result.data is None
    assert result.error is not None
    assert result.error.type == "ZeroDivisionError"


async def test_async_list_tools_diagnostics_openai(server) -> None:
    _, target = server
    async with AsyncClient(target, rpc_timeout_s=5) as client:
        tools = await client.list_tools()
        diags = await client.diagnostics()
        openai = await client.openai_tools()
    assert [t.name for t in tools] == ["echo"]
    assert tools[0].input_schema["properties"] == {"x": {"type": "string"}}
    assert tools[0].streaming
    assert diags[0].code == "import_failed"
    assert openai[0]["function"]["name"] == "echo"


async def test_async_get_call_and_cancel(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        info = await client.get_call("known")
        assert info.state is CallState.SUCCEEDED
        assert info.result is not None
        assert info.result.data == {"v": 1}
        assert await client.cancel("anything") is CallState.CANCELLED
        with pytest.raises(CallNotFoundError, match="no call nope"):
            await client.get_call("nope")


@pytest.mark.parametrize(
    ("tool", "exc_type"),
    [
        ("missing", ToolNotFoundError),
        ("badargs", InvalidArgumentsError),
        ("busy", OverloadedError),
        ("conflict", CallIdConflictError),
    ],
)
async def test_async_error_trailer_maps_to_class(server, tool: str, exc_type) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(exc_type) as info:
            await client.call(tool)
    if tool == "badargs":
        assert (info.value.parameter, info.value.expected, info.value.actual) == (
            "n",
            "integer",
            "string",
        )
    if tool == "busy":
        assert info.value.retry_after_s == 3.0


async def test_async_missing_detail_is_transport_error(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(TransportError) as info:
            await client.call("bare")
    assert type(info.value) is TransportError
    assert info.value.status == "INTERNAL"


async def test_async_unknown_code_is_an_unknown_error_with_the_code(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(UnknownError) as info:
            await client.call("weird")
    assert not isinstance(info.value, TransportError)
    assert info.value.code == "from_the_future"
    assert info.value.status == "INTERNAL"


@pytest.mark.parametrize(
    ("tool", "exc_type"),
    [("journal", JournalUnavailableError), ("newer", UnknownError), ("internal", InternalError)],
)
async def test_an_answer_from_the_daemon_is_never_retried(server, tool: str, exc_type) -> None:
    # Before: an UNAVAILABLE with a code the SDK did not know was retried as a
    # dropped connection, three times, for a journal that stays full.
    servicer, target = server
    async with AsyncClient(target, retries=3) as client:
        with pytest.raises(exc_type):
            await client.call(tool)

    def run_sync() -> None:
        with Client(target, retries=3) as client:
            client.call(tool)

    with pytest.raises(exc_type):
        await asyncio.to_thread(run_sync)
    assert len(servicer.requests) == 2  # one try each, sync and async


async def test_journal_unavailable_carries_its_reason(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(JournalUnavailableError) as info:
            await client.call("journal")
    assert info.value.reason == "full"
    assert "/s/j" in info.value.message


async def test_async_error_mid_stream_after_output(server) -> None:
    _, target = server
    seen = []
    async with AsyncClient(target) as client:
        with pytest.raises(OverloadedError):
            async for item in client.stream("fail_mid_stream"):
                seen.append(item)
    assert [o.data for o in seen] == ["x"]


async def test_async_stream_without_result_is_transport_error(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(TransportError, match="without a result"):
            await client.call("no_result")


async def test_async_events_after_result_are_ignored(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        items = [i async for i in client.stream("extra_after_result")]
    assert len(items) == 1
    assert isinstance(items[0], ToolResult)


async def test_async_early_close_cancels_the_rpc(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        async with contextlib.aclosing(client.stream("slow")) as stream:
            async for item in stream:
                assert item == Output(seq=1, stream=StreamKind.STDOUT, data="tick")
                break
        await asyncio.wait_for(servicer.cancelled.wait(), 5)


async def test_async_argument_errors_raise_before_any_rpc(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        with pytest.raises(TypeError):
            client.stream("echo", ["not", "a", "dict"])  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="JSON"):
            await client.call("echo", {"s": {1}})
        with pytest.raises(BadTimeoutError):
            await client.call("echo", tool_timeout_s=0)
    assert servicer.requests == []


async def test_async_unary_deadline(server) -> None:
    _, target = server
    async with AsyncClient(target, rpc_timeout_s=0.2) as client:
        with pytest.raises(TransportError) as info:
            await client.get_call("slow")
    assert info.value.status == "DEADLINE_EXCEEDED"


async def test_async_no_daemon(tmp_path: Path) -> None:
    sock = tmp_path / "absent.sock"
    async with AsyncClient(str(sock), rpc_timeout_s=5) as client:
        with pytest.raises(DaemonUnavailableError, match="tooljail serve") as info:
            await client.list_tools()
    assert str(sock) in info.value.message


# --- Client (sync, in a worker thread) ---


async def test_sync_stream_and_call(server) -> None:
    servicer, target = server

    def run() -> tuple[list[Output | ToolResult], ToolResult]:
        with Client(target) as client:
            items = list(client.stream("echo", {"x": "1"}, tool_timeout_s=3))
            return items, client.call("echo", None, call_id="c2")

    items, result = await asyncio.to_thread(run)
    assert items[:3] == EXPECTED_OUTPUT
    assert isinstance(items[3], ToolResult)
    assert items[3].data == {"x": "1"}
    assert result.call_id == "c2"
    assert result.data == {}
    assert servicer.requests[0].timeout_s == 3.0
    assert servicer.requests[1].arguments_json == "{}"


async def test_sync_unary_methods(server) -> None:
    _, target = server

    def run():
        with Client(target, rpc_timeout_s=5) as client:
            return (
                client.list_tools(),
                client.diagnostics(),
                client.openai_tools(),
                client.get_call("known"),
                client.cancel("x"),
            )

    tools, diags, openai, info, state = await asyncio.to_thread(run)
    assert tools[0].name == "echo"
    assert diags[0].file == "b.py"
    assert openai[0]["type"] == "function"
    assert info.result.data == {"v": 1}
    assert state is CallState.CANCELLED


@pytest.mark.parametrize(
    ("tool", "exc_type"),
    [
        ("missing", ToolNotFoundError),
        ("badargs", InvalidArgumentsError),
        ("busy", OverloadedError),
        ("no_result", TransportError),
    ],
)
async def test_sync_errors(server, tool: str, exc_type) -> None:
    _, target = server

    def run() -> None:
        with Client(target) as client:
            client.call(tool)

    with pytest.raises(exc_type):
        await asyncio.to_thread(run)


async def test_sync_get_call_not_found(server) -> None:
    _, target = server

    def run() -> None:
        with Client(target) as client:
            client.get_call("nope")

    with pytest.raises(CallNotFoundError):
        await asyncio.to_thread(run)


async def test_sync_early_close_cancels_the_rpc(server) -> None:
    servicer, target = server

    def run() -> Output | ToolResult:
        with Client(target) as client:
            stream = client.stream("slow")
            first = next(stream)
            stream.close()
            return first

    first = await asyncio.to_thread(run)
    assert first == Output(seq=1, stream=StreamKind.STDOUT, data="tick")
    await asyncio.wait_for(servicer.cancelled.wait(), 5)


async def test_sync_no_daemon(tmp_path: Path) -> None:
    def run() -> None:
        with Client(f"unix:{tmp_path}/absent.sock", rpc_timeout_s=5) as client:
            client.list_tools()

    with pytest.raises(DaemonUnavailableError, match="tooljail serve"):
        await asyncio.to_thread(run)


# --- retries and attach ---


async def test_a_dropped_connection_is_retried_as_the_same_call(server) -> None:
    servicer, target = server
    async with AsyncClient(target) as client:
        result = await client.call("flaky2", {"x": "1"})
    assert result.ok
    ids = {r.call_id for r in servicer.requests}
    assert len(servicer.requests) == 3 and len(ids) == 1  # three tries, one call id


async def test_retries_stop_at_the_limit(server) -> None:
    servicer, target = server
    async with AsyncClient(target, retries=1) as client:
        with pytest.raises(DaemonUnavailableError):
            await client.call("flaky5")
    assert len(servicer.requests) == 2


async def test_a_stream_that_drops_resumes_through_attach_without_gaps_or_repeats(
    server,
) -> None:
    servicer, target = server

    def run() -> list[Output | ToolResult]:
        with Client(target) as client:
            return list(client.stream("dropped", call_id="d1"))

    items = await asyncio.to_thread(run)
    assert [i.data for i in items if isinstance(i, Output)] == ["line 1\n", "line 2\n", "line 3\n"]
    assert isinstance(items[-1], ToolResult)
    assert [(a.call_id, a.from_seq) for a in servicer.attaches] == [("d1", 2)]


async def test_attach_replays_from_the_asked_chunk_and_refuses_unknown_calls(server) -> None:
    _, target = server
    async with AsyncClient(target) as client:
        items = [i async for i in client.attach("d2", from_seq=2)]
        assert [i.data for i in items if isinstance(i, Output)] == ["line 2\n", "line 3\n"]
        assert isinstance(items[-1], ToolResult)
        with pytest.raises(ToolNotFoundError):  # the canned daemon's NOT_FOUND detail
            [i async for i in client.attach("unknown")]
        with pytest.raises(InvalidRequestError):
            client.attach("d2", from_seq=-1)
