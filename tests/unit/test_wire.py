"""The proto <-> SDK conversions of `tooljail._wire`, both directions."""

from __future__ import annotations

import pytest

from tooljail._call_types import CallInfo
from tooljail._types import (
    CallState,
    CallStatus,
    Diagnostic,
    Effect,
    Output,
    StreamKind,
    ToolError,
    ToolInfo,
    ToolResult,
)
from tooljail._wire import (
    ERROR_DETAIL_KEY,
    MAX_DETAIL_FIELD_BYTES,
    bounded,
    call_info_from_proto,
    call_info_to_proto,
    call_state_from_proto,
    call_state_to_proto,
    diagnostic_from_proto,
    diagnostic_to_proto,
    effect_from_proto,
    effect_to_proto,
    error_detail_for,
    error_from_rpc,
    output_from_proto,
    output_to_proto,
    result_from_proto,
    result_to_proto,
    status_from_proto,
    status_to_proto,
    stream_kind_from_proto,
    stream_kind_to_proto,
    tool_info_from_proto,
    tool_info_to_proto,
)
from tooljail.errors import (
    ERRORS_BY_CODE,
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    DaemonUnavailableError,
    InternalError,
    InvalidArgumentsError,
    InvalidRequestError,
    JournalUnavailableError,
    OverloadedError,
    ShuttingDownError,
    TooljailError,
    ToolNotFoundError,
    TransportError,
    UnknownError,
)
from tooljail.v1 import tooljail_pb2 as pb

# --- enums ---


@pytest.mark.parametrize(
    ("to_proto", "from_proto", "enum", "pb_enum", "prefix"),
    [
        (status_to_proto, status_from_proto, CallStatus, pb.Status, "STATUS_"),
        (effect_to_proto, effect_from_proto, Effect, pb.Effect, "EFFECT_"),
        (call_state_to_proto, call_state_from_proto, CallState, pb.CallState, "CALL_STATE_"),
        (stream_kind_to_proto, stream_kind_from_proto, StreamKind, pb.StreamKind, "STREAM_KIND_"),
    ],
)
def test_enum_maps_cover_every_member_both_ways(
    to_proto, from_proto, enum, pb_enum, prefix
) -> None:
    for member in enum:
        wire = to_proto(member)
        # Names line up, so a reordered table cannot pass unnoticed.
        assert pb_enum.Name(wire) == prefix + member.name
        assert from_proto(wire) is member
    # Every wire value except UNSPECIFIED has an SDK member.
    assert {pb_enum.Name(to_proto(m)) for m in enum} == {
        name for name, _ in pb_enum.items() if not name.endswith("_UNSPECIFIED")
    }


@pytest.mark.parametrize(
    "from_proto", [status_from_proto, call_state_from_proto, stream_kind_from_proto]
)
@pytest.mark.parametrize("value", [0, 99])
def test_unset_or_unknown_enum_values_are_refused(from_proto, value: int) -> None:
    with pytest.raises(ValueError, match=str(value)):
        from_proto(value)


@pytest.mark.parametrize("value", [pb.EFFECT_UNSPECIFIED, 99])
def test_unset_or_unknown_effect_reads_as_unknown(value: int) -> None:
    assert effect_from_proto(value) is Effect.UNKNOWN


# --- results and events ---


def _full_result(**overrides) -> ToolResult:
    fields = dict(
        call_id="c-1",
        status=CallStatus.TIMEOUT,
        data={"stdout": "hé\n", "stderr": "", "exit_code": None, "n": [1, 2.5]},
        message="The call timed out after 3s.",
        error=ToolError(type="Timeout", message="too slow", traceback="tb"),
        effect=Effect.UNKNOWN,
        still_running=True,
        truncated=True,
        duration_s=3.25,
        tool="execute_python_code",
        output_bytes=12345,
    )
    fields.update(overrides)
    return ToolResult(**fields)


def test_result_round_trip_keeps_every_field() -> None:
    r = _full_result()
    m = result_to_proto(r)
    assert m.status == pb.STATUS_TIMEOUT
    assert m.effect == pb.EFFECT_UNKNOWN
    assert m.HasField("error")
    back = result_from_proto(pb.Result.FromString(m.SerializeToString()))
    assert back == r


@pytest.mark.parametrize("data", ["text", 0, False, [], {}, [None]])
def test_result_round_trip_keeps_falsy_and_scalar_data(data) -> None:
    r = _full_result(data=data, error=None)
    assert result_from_proto(result_to_proto(r)).data == data


def test_result_none_data_travels_as_null_and_no_error_stays_unset() -> None:
    r = ToolResult(call_id="c", status=CallStatus.SUCCESS, effect=Effect.APPLIED)
    m = result_to_proto(r)
    assert m.data_json == "null"
    assert not m.HasField("error")
    back = result_from_proto(m)
    assert back.data is None
    assert back.error is None
    assert back == r


def test_result_empty_data_json_reads_as_none() -> None:
    m = pb.Result(call_id="c", status=pb.STATUS_SUCCESS, data_json="")
    assert result_from_proto(m).data is None


def test_result_with_unset_status_is_refused() -> None:
    with pytest.raises(ValueError):
        result_from_proto(pb.Result(call_id="c", data_json="null"))


def test_result_with_bad_json_is_refused() -> None:
    with pytest.raises(ValueError):
        result_from_proto(pb.Result(call_id="c", status=pb.STATUS_SUCCESS, data_json="{nope"))


def test_result_to_proto_refuses_unserialisable_data() -> None:
    with pytest.raises(TypeError):
        result_to_proto(_full_result(data={"s": {1, 2}}))
    with pytest.raises(ValueError):
        result_to_proto(_full_result(data=float("nan")))


@pytest.mark.parametrize("kind", list(StreamKind))
def test_output_round_trip(kind: StreamKind) -> None:
    o = Output(seq=7, stream=kind, data="line ✓\n")
    m = output_to_proto(o)
    assert m.data == "line ✓\n".encode()
    assert output_from_proto(pb.Output.FromString(m.SerializeToString())) == o


def test_output_replaces_undecodable_bytes() -> None:
    # A chunk boundary can split a UTF-8 character: "é" is b"\xc3\xa9".
    m = pb.Output(seq=1, stream=pb.STREAM_KIND_STDOUT, data=b"ab\xc3")
    assert output_from_proto(m).data == "ab\ufffd"


def test_tool_info_round_trip() -> None:
    t = ToolInfo(
        name="grep",
        description="Search files.",
        input_schema={
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
        },
        timeout_s=5.0,
        max_timeout_s=60.0,
        kill_after_s=30.0,
        idempotent=True,
        streaming=True,
        source="user",
    )
    m = tool_info_to_proto(t)
    assert m.input_schema_json.startswith("{")
    assert tool_info_from_proto(pb.ToolSpec.FromString(m.SerializeToString())) == t


def test_tool_info_empty_schema_reads_as_empty_dict() -> None:
    assert tool_info_from_proto(pb.ToolSpec(name="x")).input_schema == {}


def test_tool_info_non_object_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="not a JSON object"):
        tool_info_from_proto(pb.ToolSpec(name="x", input_schema_json="[1]"))


def test_diagnostic_round_trip() -> None:
    d = Diagnostic(severity="error", code="bad_schema", message="no type", file="/t/a.py", tool="a")
    assert diagnostic_from_proto(diagnostic_to_proto(d)) == d


@pytest.mark.parametrize("result", [None, _full_result()])
def test_call_info_round_trip(result: ToolResult | None) -> None:
    c = CallInfo(call_id="c-1", tool="t", state=CallState.TIMED_OUT, result=result)
    m = call_info_to_proto(c)
    assert m.has_result is (result is not None)
    assert call_info_from_proto(pb.CallInfo.FromString(m.SerializeToString())) == c


def test_call_info_ignores_result_without_has_result() -> None:
    m = pb.CallInfo(call_id="c", tool="t", state=pb.CALL_STATE_RUNNING, has_result=False)
    m.result.CopyFrom(pb.Result(call_id="c", status=pb.STATUS_SUCCESS))
    assert call_info_from_proto(m).result is None


# --- errors ---


def _trailer(detail: pb.ErrorDetail) -> list[tuple[str, str | bytes]]:
    return [("other-key", "x"), (ERROR_DETAIL_KEY, detail.SerializeToString())]


@pytest.mark.parametrize(
    ("exc", "code_name"),
    [
        (ToolNotFoundError("no tool 'x'"), "NOT_FOUND"),
        (CallNotFoundError("no call 'c'"), "NOT_FOUND"),
        (BadTimeoutError("timeout 0 is out of [1, 60]"), "INVALID_ARGUMENT"),
        (InvalidRequestError("bad call id"), "INVALID_ARGUMENT"),
        (CallIdConflictError("id used"), "ALREADY_EXISTS"),
        (ShuttingDownError("draining"), "UNAVAILABLE"),
    ],
)
def test_error_detail_round_trip_rebuilds_the_class(exc: TooljailError, code_name: str) -> None:
    detail = error_detail_for(exc)
    assert detail.code == exc.code
    got = error_from_rpc(code_name, "ignored", _trailer(detail))
    assert type(got) is type(exc)
    assert got.message == exc.message
    assert str(got) == str(exc)


def test_invalid_arguments_detail_keeps_its_attributes() -> None:
    exc = InvalidArgumentsError(
        "n: expected integer, got string", parameter="n", expected="integer", actual="string"
    )
    detail = error_detail_for(exc)
    assert (detail.parameter, detail.expected, detail.actual) == ("n", "integer", "string")
    got = error_from_rpc("INVALID_ARGUMENT", "", _trailer(detail))
    assert isinstance(got, InvalidArgumentsError)
    assert isinstance(got, ValueError)
    assert (got.parameter, got.expected, got.actual) == ("n", "integer", "string")


def test_overloaded_detail_keeps_retry_after() -> None:
    detail = error_detail_for(OverloadedError("full", retry_after_s=2.5))
    assert detail.retry_after_s == 2.5
    got = error_from_rpc("RESOURCE_EXHAUSTED", "", _trailer(detail))
    assert isinstance(got, OverloadedError)
    assert got.retry_after_s == 2.5


def test_overloaded_without_hint_keeps_the_default() -> None:
    got = error_from_rpc("RESOURCE_EXHAUSTED", "", _trailer(pb.ErrorDetail(code="overloaded")))
    assert isinstance(got, OverloadedError)
    assert got.retry_after_s == OverloadedError("x").retry_after_s


def test_every_wire_code_maps_to_its_class() -> None:
    for code, cls in ERRORS_BY_CODE.items():
        got = error_from_rpc("UNKNOWN", "", _trailer(pb.ErrorDetail(code=code, message="m")))
        assert type(got) is cls


def test_detail_without_message_falls_back_to_status_details() -> None:
    got = error_from_rpc(
        "NOT_FOUND", "from status", _trailer(pb.ErrorDetail(code="tool_not_found"))
    )
    assert got.message == "from status"


@pytest.mark.parametrize("code", ["no_such_code", "TransportError", "__class__", "transport", ""])
def test_unknown_code_is_an_unknown_error_not_a_transport_error(code: str) -> None:
    # A code is looked up in the table, never resolved as a class name; a code
    # the SDK does not know is still the daemon's answer, so never retried.
    detail = pb.ErrorDetail(code=code, message="boom")
    got = error_from_rpc("UNAVAILABLE", "d", _trailer(detail))
    assert type(got) is UnknownError
    assert not isinstance(got, TransportError)
    assert got.code == code
    assert got.status == "UNAVAILABLE"
    assert "boom" in got.message


def test_internal_code_is_an_internal_error() -> None:
    got = error_from_rpc("INTERNAL", "d", _trailer(pb.ErrorDetail(code="internal", message="x")))
    assert type(got) is InternalError
    assert got.message == "x"


def test_journal_unavailable_round_trips_with_its_reason() -> None:
    exc = JournalUnavailableError("the call journal /x is full", reason="full")
    detail = error_detail_for(exc)
    assert (detail.code, detail.reason) == ("journal_unavailable", "full")
    got = error_from_rpc("UNAVAILABLE", "d", _trailer(detail))
    assert type(got) is JournalUnavailableError
    assert (got.message, got.reason) == (exc.message, "full")


def test_echoed_text_in_a_detail_is_bounded() -> None:
    # A 10,000-character tool name echoed whole would pass gRPC's 16 KiB limit.
    name = "n" * 10_000
    exc = InvalidArgumentsError(f"no tool {name}", parameter=name, expected="x", actual=name)
    detail = error_detail_for(exc)
    assert len(detail.SerializeToString()) < 2_000
    assert detail.message.startswith("no tool nnn")
    assert "10,008 characters in all" in detail.message
    assert len(detail.parameter.encode()) <= MAX_DETAIL_FIELD_BYTES


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("x" * 5000, 100),
        ("é" * 5000, 101),
        ("😀" * 999, 64),
        ("a\ud800b" * 300, 200),
        ("short", 64),
        ("", 64),
    ],
)
def test_bounded_fits_its_limit_and_always_encodes(text: str, limit: int) -> None:
    got = bounded(text, limit)
    assert len(got.encode("utf-8")) <= limit  # strict: no surrogate survives
    if len(text) <= limit and text.isascii():
        assert got == text
    else:
        assert got.endswith(f" [... {len(text):,} characters in all]")


def test_bounded_escapes_lone_surrogates() -> None:
    assert bounded("a\ud800b") == "a\\ud800b"


def test_unavailable_without_detail_is_daemon_unavailable() -> None:
    got = error_from_rpc("UNAVAILABLE", "connect failed", None, target="unix:///tmp/x.sock")
    assert type(got) is DaemonUnavailableError
    assert isinstance(got, TransportError)
    assert isinstance(got, ConnectionError)
    assert got.status == "UNAVAILABLE"
    assert "unix:///tmp/x.sock" in got.message
    assert "tooljail serve" in got.message
    assert "connect failed" in got.message


@pytest.mark.parametrize("code_name", ["DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED", "UNKNOWN"])
def test_other_status_without_detail_is_transport_error(code_name: str) -> None:
    got = error_from_rpc(code_name, "why", [("x", "y")])
    assert type(got) is TransportError
    assert got.status == code_name
    assert "why" in got.message


def test_garbled_detail_is_ignored() -> None:
    got = error_from_rpc("NOT_FOUND", "d", [(ERROR_DETAIL_KEY, b"\xff\xff\xff")])
    assert type(got) is TransportError
    assert got.status == "NOT_FOUND"


def test_detail_as_str_value_is_accepted() -> None:
    raw = pb.ErrorDetail(code="call_not_found", message="gone").SerializeToString()
    got = error_from_rpc("NOT_FOUND", "", [(ERROR_DETAIL_KEY, raw.decode("latin-1"))])
    # Only ASCII-safe payloads survive a str round trip; this one is.
    assert type(got) is CallNotFoundError
