"""Malformed requests through raw gRPC stubs: each its status, small; the daemon serves on.

Not the SDK, which checks its arguments before sending: the generated
`ToolRunnerStub`, and a bare channel method for bytes that are no message at
all, against a real daemon. Every refusal must carry our status code and
`ErrorDetail` (never UNKNOWN with a Python exception's text), and its status
text and metadata must stay small whatever the request echoed: a reply whose
metadata passes gRPC's 16 KiB limit reaches the caller as RESOURCE_EXHAUSTED
"Stream removed" instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from tests.conftest import RunningDaemon
from tooljail._wire import ERROR_DETAIL_KEY
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

MAX_REPLY_TEXT = 4096
"""Bytes of status text plus metadata a refusal may take, whatever it echoes."""

NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT

HUGE = "x" * 10_000
DEEP = "[" * 100_000 + "]" * 100_000
CODE_OK = json.dumps({"code": "print('ok')"})


@dataclass(frozen=True)
class Refusal:
    status: grpc.StatusCode
    details: str
    detail: pb.ErrorDetail | None
    metadata_bytes: int


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    # One daemon for the whole corpus: that it survives all of it is the point.
    from tests.conftest import spawn_daemon, wait_serving

    process, target, base = spawn_daemon(tmp_path_factory.mktemp("edge"), pool_size=1)
    daemon = RunningDaemon(process, target, base / "state", base / "daemon.log")
    wait_serving(target, process, daemon.log_path)
    yield daemon
    daemon.assert_serving()  # after the whole corpus, whatever order it ran in
    daemon.stop()


@pytest.fixture
def channel(edge: RunningDaemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(edge.target) as ch:
        yield ch


def _refusal(err: grpc.RpcError) -> Refusal:
    trailing = err.trailing_metadata() or ()
    detail = None
    size = 0
    for key, value in trailing:
        size += len(key) + len(value if isinstance(value, bytes) else value.encode())
        if key == ERROR_DETAIL_KEY:
            detail = pb.ErrorDetail.FromString(value)
    return Refusal(err.code(), err.details() or "", detail, size)


def _refused(rpc: Callable[[], object]) -> Refusal:
    with pytest.raises(grpc.RpcError) as info:
        reply = rpc()
        if not isinstance(
            reply, pb.Result | pb.CallInfo | pb.CancelResponse | pb.SessionInfo | pb.FileInfo
        ):
            reply = list(reply)  # type: ignore[call-overload]
        raise AssertionError(f"not refused: {reply}")
    return _refusal(info.value)


def _check(got: Refusal, status: grpc.StatusCode, code: str) -> None:
    assert got.status == status, got
    assert got.detail is not None, got
    assert got.detail.code == code, got
    assert got.detail.message, got
    assert "Traceback" not in got.details and "Unexpected <class" not in got.details, got
    assert len(got.details.encode()) + got.metadata_bytes < MAX_REPLY_TEXT, got


def _call(channel: grpc.Channel, method: str = "Run", **fields: object) -> Refusal:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    request = pb.CallRequest(**fields)  # type: ignore[arg-type]
    return _refused(lambda: getattr(stub, method)(request, timeout=60))


# --- names -----------------------------------------------------------------


@pytest.mark.parametrize("method", ["Run", "Call"])
def test_a_10000_character_tool_name_is_not_found_and_small(
    channel: grpc.Channel, method: str
) -> None:
    # Before: the detail echoed the name whole; the reply passed gRPC's
    # metadata limit and the caller saw RESOURCE_EXHAUSTED "Stream removed".
    got = _call(channel, method, tool=HUGE, arguments_json="{}")
    _check(got, NOT_FOUND, "tool_not_found")
    assert "10,000 characters in all" in got.details  # the name's length
    assert "Available tools: execute_python_code" in got.details  # not cut away


@pytest.mark.parametrize(
    "name", ["", " ", "a\x00b", "tab\tnew\nline\r", "\x1b[31mred", "é" * 5000, "😀" * 3000]
)
def test_odd_tool_names_are_not_found(channel: grpc.Channel, name: str) -> None:
    _check(_call(channel, tool=name, arguments_json="{}"), NOT_FOUND, "tool_not_found")


# --- call ids --------------------------------------------------------------


@pytest.mark.parametrize("call_id", [HUGE, "a b", "../../etc/passwd", "id\x00", "é", "a" * 129])
def test_bad_call_ids_are_invalid_requests(channel: grpc.Channel, call_id: str) -> None:
    got = _call(channel, tool="execute_python_code", arguments_json=CODE_OK, call_id=call_id)
    _check(got, INVALID, "invalid_request")


@pytest.mark.parametrize("call_id", [HUGE, "a b", "\x00", "😀" * 3000])
def test_lookups_of_odd_ids_are_not_found_and_small(channel: grpc.Channel, call_id: str) -> None:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    for rpc in (
        lambda: stub.GetCall(pb.GetCallRequest(call_id=call_id), timeout=30),
        lambda: stub.Cancel(pb.CancelRequest(call_id=call_id), timeout=30),
        lambda: stub.Attach(pb.AttachRequest(call_id=call_id, from_seq=2**64 - 1), timeout=30),
    ):
        _check(_refused(rpc), NOT_FOUND, "call_not_found")


# --- timeouts --------------------------------------------------------------


@pytest.mark.parametrize("timeout_s", [-1.0, -math.inf, math.nan, math.inf, 1e308, 5e-324])
def test_bad_timeouts_are_refused(channel: grpc.Channel, timeout_s: float) -> None:
    got = _call(channel, tool="execute_python_code", arguments_json=CODE_OK, timeout_s=timeout_s)
    _check(got, INVALID, "bad_timeout")


# --- JSON arguments --------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments_json", "code"),
    [
        ("{", "invalid_request"),
        ("{'code': 1}", "invalid_request"),
        ("NaN", "invalid_arguments"),  # Python's json reads it; not an object
        (DEEP, "invalid_request"),  # before: RecursionError, UNKNOWN
        ('{"code": ' + DEEP[:50_000] + DEEP[150_000:] + "}", "invalid_request"),
        ("[1, 2]", "invalid_arguments"),
        ("null", "invalid_arguments"),
        ('"a string"', "invalid_arguments"),
        ("5", "invalid_arguments"),
        ('{"code": ' + "9" * 5000 + "}", "invalid_request"),  # past int's digit limit
        ('{"code": 1e999}', "invalid_arguments"),  # infinity, not a string
        ('{"code": "x", "' + HUGE + '": 1}', "invalid_arguments"),
        ('{"\\ud800": 1}', "invalid_arguments"),  # a lone surrogate, echoed
        ('{"code": ["' + HUGE + '"]}', "invalid_arguments"),
    ],
)
def test_bad_arguments_json_is_invalid_argument(
    channel: grpc.Channel, arguments_json: str, code: str
) -> None:
    got = _call(channel, tool="execute_python_code", arguments_json=arguments_json)
    _check(got, INVALID, code)


def test_duplicate_keys_take_the_last_value(channel: grpc.Channel) -> None:
    # What Python's json does, and what the journal's fingerprint sees too.
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    args = '{"code": "print(1)", "code": "print(2)"}'
    result = stub.Run(pb.CallRequest(tool="execute_python_code", arguments_json=args), timeout=60)
    assert result.status == pb.STATUS_SUCCESS
    assert json.loads(result.data_json)["stdout"] == "2\n"


def test_a_lone_surrogate_in_code_is_the_tools_failure(channel: grpc.Channel) -> None:
    # JSON may carry "\ud800", which Python reads as a lone surrogate: the
    # call runs, and printing it fails inside the tool, as a result.
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    args = '{"code": "print(\'\\ud800\')"}'
    result = stub.Run(pb.CallRequest(tool="execute_python_code", arguments_json=args), timeout=60)
    assert result.status == pb.STATUS_ERROR, result
    assert "surrogate" in result.data_json


# --- bytes that are no message -----------------------------------------------


def _raw(channel: grpc.Channel, method: str, streaming: bool) -> Callable[[bytes], Refusal]:
    path = f"/tooljail.v1.ToolRunner/{method}"
    if streaming:
        stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        return lambda raw: _refused(lambda: stream(raw, timeout=30))
    unary = channel.unary_unary(path, request_serializer=None, response_deserializer=None)

    def send(raw: bytes) -> Refusal:
        with pytest.raises(grpc.RpcError) as info:
            unary(raw, timeout=30)
        return _refusal(info.value)

    return send


BAD_BYTES = {
    "garbage": b"\xff\xff\xff\xff",
    "truncated": b"\x0a\x10abc",  # field 1 says 16 bytes, 3 follow
    "tool_not_utf8": b"\x0a\x03\xff\xfe\xfd",
    "tool_lone_surrogate": b"\x0a\x03\xed\xa0\x80",  # UTF-8 of U+D800
    "id_not_utf8": b"\x1a\x02\xc3\x28",
    "huge_varint": b"\x20" + b"\xff" * 11,
}


@pytest.mark.parametrize("name", list(BAD_BYTES))
@pytest.mark.parametrize(
    ("method", "streaming"),
    [("Run", False), ("Call", True), ("GetCall", False), ("Cancel", False), ("Attach", True)],
)
def test_bytes_that_do_not_parse_are_invalid_argument(
    channel: grpc.Channel, method: str, streaming: bool, name: str
) -> None:
    got = _raw(channel, method, streaming)(BAD_BYTES[name])
    if method in ("Run", "Call"):
        _check(got, INVALID, "invalid_request")
        assert "tooljail.v1.CallRequest" in got.details
    else:
        # Bytes may parse as another method's message (a field it does not
        # have is skipped): then it is the ordinary refusal of an empty id.
        _check(got, got.status, got.detail.code if got.detail else "?")
        assert got.status in (NOT_FOUND, INVALID), got


def test_the_daemon_serves_after_the_corpus(edge: RunningDaemon) -> None:
    edge.assert_serving()
    assert edge.process.poll() is None


# --- sessions and files ----------------------------------------------------


@pytest.fixture
def session_id(channel: grpc.Channel) -> Iterator[str]:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    info = stub.CreateSession(pb.CreateSessionRequest(), timeout=60)
    yield info.session_id
    stub.CloseSession(pb.CloseSessionRequest(session_id=info.session_id), timeout=60)


@pytest.mark.parametrize("session_id", [HUGE, "a b", "../x", "id\x00", ""])
def test_bad_session_ids_are_invalid_requests(channel: grpc.Channel, session_id: str) -> None:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    if session_id:
        got = _call(
            channel, tool="execute_python_code", arguments_json=CODE_OK, session_id=session_id
        )
        _check(got, INVALID, "invalid_request")
    got = _refused(lambda: stub.CloseSession(pb.CloseSessionRequest(session_id=session_id)))
    _check(got, INVALID, "invalid_request")


def test_an_unknown_session_is_not_found(channel: grpc.Channel) -> None:
    got = _call(channel, tool="execute_python_code", arguments_json=CODE_OK, session_id="f" * 32)
    _check(got, NOT_FOUND, "session_not_found")
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    request = pb.DownloadFileRequest(session_id="f" * 32, path="a")
    _check(_refused(lambda: stub.DownloadFile(request)), NOT_FOUND, "session_not_found")


@pytest.mark.parametrize(
    "fields",
    [
        {"idle_ttl_s": -1},
        {"idle_ttl_s": math.nan},
        {"max_lifetime_s": 1e12},
        {"memory_bytes": 2**62},
        {"cpus": math.inf},
        {"workspace_bytes": 1000},
        {"pids": 2},
    ],
)
def test_session_options_out_of_bounds_are_refused_by_name(
    channel: grpc.Channel, fields: dict[str, object]
) -> None:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    request = pb.CreateSessionRequest(**fields)  # type: ignore[arg-type]
    got = _refused(lambda: stub.CreateSession(request, timeout=60))
    _check(got, INVALID, "invalid_request")
    assert next(iter(fields)) in got.details


def test_uploads_that_break_the_rules_are_refused(channel: grpc.Channel, session_id: str) -> None:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    _check(_refused(lambda: stub.UploadFile(iter(()))), INVALID, "invalid_request")
    mixed = [
        pb.FileChunk(session_id=session_id, path="a.txt", data=b"1"),
        pb.FileChunk(session_id="other", data=b"2"),
    ]
    _check(_refused(lambda: stub.UploadFile(iter(mixed))), INVALID, "invalid_request")
    for path in ("../a", "/etc/passwd", "", "a/../../b"):
        chunks = [pb.FileChunk(session_id=session_id, path=path, data=b"x")]
        _check(_refused(lambda c=chunks: stub.UploadFile(iter(c))), INVALID, "invalid_path")
    # Nothing half-written was left by the refused upload.
    listing = stub.Run(
        pb.CallRequest(tool="ls", arguments_json="{}", session_id=session_id), timeout=60
    )
    assert "a.txt" not in listing.data_json


def test_downloads_of_what_is_not_a_file_are_refused(
    channel: grpc.Channel, session_id: str
) -> None:
    stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
    missing = pb.DownloadFileRequest(session_id=session_id, path="missing.txt")
    _check(_refused(lambda: stub.DownloadFile(missing)), NOT_FOUND, "file_not_found")
    for path in ("..", "/etc/passwd", "."):
        request = pb.DownloadFileRequest(session_id=session_id, path=path)
        _check(_refused(lambda r=request: stub.DownloadFile(r)), INVALID, "invalid_path")
