"""Conversions between the SDK's types and the `tooljail.v1` protobuf messages.

Pure functions with no channel I/O: the SDK uses them to read what the daemon
sends, and the daemon's servicer uses them to write it, so both sides of the wire
agree by construction.

Enum values the other side does not know (`*_UNSPECIFIED`, or a value added by a
newer peer) raise `ValueError` instead of being guessed, except `Effect`, whose
unset value reads as `Effect.UNKNOWN`: "we cannot tell whether it took effect" is
the one safe reading of a missing effect.

Errors travel as a gRPC status code plus a serialized `ErrorDetail` in the
trailing metadata key `ERROR_DETAIL_KEY`. `error_detail_for` writes that detail
from one of our exceptions, and `error_from_rpc` rebuilds the exception from the
detail's `code` through the fixed table `ERRORS_BY_CODE`: a class name sent over
the wire is never imported, and a code it does not know becomes `UnknownError`.
Text in a detail is cut by `bounded`: it may echo the request, and gRPC refuses
a reply whose metadata passes 16 KiB.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from tooljail._call_types import CallInfo, unix_from_utc, utc_from_unix
from tooljail._types import (
    ArtifactInfo,
    ArtifactRef,
    CallState,
    CallStatus,
    Diagnostic,
    Effect,
    EgressDenial,
    Output,
    SessionInfo,
    SessionState,
    StreamKind,
    ToolError,
    ToolInfo,
    ToolResult,
    Usage,
)
from tooljail._wire_enums import from_pb as _from_pb
from tooljail._wire_enums import invert as _invert
from tooljail._wire_process import process_info_from_proto, process_info_to_proto
from tooljail.common import MAX_ERROR_MESSAGE_BYTES, bounded
from tooljail.errors import (
    ERRORS_BY_CODE,
    ArtifactGoneError,
    DaemonUnavailableError,
    InvalidArgumentsError,
    JournalUnavailableError,
    OverloadedError,
    SessionEndedError,
    TooljailError,
    TransportError,
    UnknownError,
)
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "ERROR_DETAIL_KEY",
    "MAX_DETAIL_FIELD_BYTES",
    "MAX_ERROR_MESSAGE_BYTES",
    "bounded",
    "call_info_from_proto",
    "call_info_to_proto",
    "call_state_from_proto",
    "call_state_to_proto",
    "diagnostic_from_proto",
    "diagnostic_to_proto",
    "effect_from_proto",
    "effect_to_proto",
    "egress_denial_from_proto",
    "egress_denial_to_proto",
    "error_detail_for",
    "error_from_rpc",
    "output_from_proto",
    "output_to_proto",
    "process_info_from_proto",
    "process_info_to_proto",
    "result_from_proto",
    "result_to_proto",
    "status_from_proto",
    "status_to_proto",
    "stream_kind_from_proto",
    "stream_kind_to_proto",
    "tool_info_from_proto",
    "tool_info_to_proto",
]

ERROR_DETAIL_KEY = "tooljail-error-bin"
"""Trailing metadata key of a failed RPC that holds a serialized `pb.ErrorDetail`.

The `-bin` suffix makes gRPC carry the value as raw bytes.
"""

MAX_DETAIL_FIELD_BYTES = 256
"""Bound of each other text field of an `ErrorDetail` (parameter, expected, actual)."""

# --- enums -----------------------------------------------------------------

_STATUS_TO_PB: dict[CallStatus, pb.Status] = {
    CallStatus.SUCCESS: pb.STATUS_SUCCESS,
    CallStatus.PARTIAL: pb.STATUS_PARTIAL,
    CallStatus.ERROR: pb.STATUS_ERROR,
    CallStatus.TIMEOUT: pb.STATUS_TIMEOUT,
    CallStatus.CANCELLED: pb.STATUS_CANCELLED,
    CallStatus.LOST: pb.STATUS_LOST,
}
_EFFECT_TO_PB: dict[Effect, pb.Effect] = {
    Effect.NONE: pb.EFFECT_NONE,
    Effect.APPLIED: pb.EFFECT_APPLIED,
    Effect.UNKNOWN: pb.EFFECT_UNKNOWN,
}
_CALL_STATE_TO_PB: dict[CallState, pb.CallState] = {
    CallState.QUEUED: pb.CALL_STATE_QUEUED,
    CallState.RUNNING: pb.CALL_STATE_RUNNING,
    CallState.SUCCEEDED: pb.CALL_STATE_SUCCEEDED,
    CallState.FAILED: pb.CALL_STATE_FAILED,
    CallState.TIMED_OUT: pb.CALL_STATE_TIMED_OUT,
    CallState.CANCELLED: pb.CALL_STATE_CANCELLED,
    CallState.LOST: pb.CALL_STATE_LOST,
    CallState.AWAITING_APPROVAL: pb.CALL_STATE_AWAITING_APPROVAL,
}
_STREAM_KIND_TO_PB: dict[StreamKind, pb.StreamKind] = {
    StreamKind.STDOUT: pb.STREAM_KIND_STDOUT,
    StreamKind.STDERR: pb.STREAM_KIND_STDERR,
    StreamKind.YIELD: pb.STREAM_KIND_YIELD,
    StreamKind.NOTICE: pb.STREAM_KIND_NOTICE,
}


_STATUS_FROM_PB = _invert(_STATUS_TO_PB)
_EFFECT_FROM_PB = _invert(_EFFECT_TO_PB)
_CALL_STATE_FROM_PB = _invert(_CALL_STATE_TO_PB)
_STREAM_KIND_FROM_PB = _invert(_STREAM_KIND_TO_PB)


def status_to_proto(status: CallStatus) -> pb.Status:
    """The wire value of a call status."""
    return _STATUS_TO_PB[status]


def status_from_proto(value: int) -> CallStatus:
    """The call status of a wire value.

    Raises:
        ValueError: When the value is unset or unknown to this SDK.
    """
    return _from_pb(_STATUS_FROM_PB, value, "Status")


def effect_to_proto(effect: Effect) -> pb.Effect:
    """The wire value of an effect."""
    return _EFFECT_TO_PB[effect]


def effect_from_proto(value: int) -> Effect:
    """The effect of a wire value; unset or unknown values read as `Effect.UNKNOWN`."""
    # Not knowing the effect is exactly what UNKNOWN means, so this never raises.
    return _EFFECT_FROM_PB.get(value, Effect.UNKNOWN)


def call_state_to_proto(state: CallState) -> pb.CallState:
    """The wire value of a call state."""
    return _CALL_STATE_TO_PB[state]


def call_state_from_proto(value: int) -> CallState:
    """The call state of a wire value.

    Raises:
        ValueError: When the value is unset or unknown to this SDK.
    """
    return _from_pb(_CALL_STATE_FROM_PB, value, "CallState")


def stream_kind_to_proto(kind: StreamKind) -> pb.StreamKind:
    """The wire value of a stream kind."""
    return _STREAM_KIND_TO_PB[kind]


def stream_kind_from_proto(value: int) -> StreamKind:
    """The stream kind of a wire value.

    Raises:
        ValueError: When the value is unset or unknown to this SDK.
    """
    return _from_pb(_STREAM_KIND_FROM_PB, value, "StreamKind")


# --- messages --------------------------------------------------------------


def result_to_proto(r: ToolResult) -> pb.Result:
    """A call's result as its wire message.

    Args:
        r: The result. `data` must be JSON-serialisable; `None` travels as "null".

    Returns:
        The `pb.Result`; its `error` field is set only when `r.error` is.

    Raises:
        TypeError: When `r.data` is not JSON-serialisable.
        ValueError: When `r.data` holds NaN or infinity (not valid JSON).
    """
    m = pb.Result(
        call_id=r.call_id,
        status=status_to_proto(r.status),
        data_json=json.dumps(r.data, allow_nan=False),
        message=r.message,
        effect=effect_to_proto(r.effect),
        still_running=r.still_running,
        truncated=r.truncated,
        duration_s=r.duration_s,
        tool=r.tool,
        output_bytes=r.output_bytes,
        session_id=r.session_id,
        session_reset=r.session_reset,
        artifacts=[artifact_ref_to_proto(a) for a in r.artifacts],
        daemon_id=r.daemon_id,
        egress_denied=[egress_denial_to_proto(d) for d in r.egress_denied],
        processes_ended=[process_info_to_proto(p) for p in r.processes_ended],
        arguments_sha256=r.arguments_sha256,
        cached=r.cached,
        cached_from=r.cached_from,
    )
    if r.usage is not None:
        m.usage.CopyFrom(pb.Usage(**r.usage.model_dump()))
    if r.error is not None:
        m.error.CopyFrom(
            pb.ToolError(type=r.error.type, message=r.error.message, traceback=r.error.traceback)
        )
    return m


def result_from_proto(m: pb.Result) -> ToolResult:
    """A call's result from its wire message.

    Args:
        m: The message. `data_json` "null" or "" reads as `data=None`.

    Returns:
        The `ToolResult`; `error` is `None` unless the message sets it.

    Raises:
        ValueError: When `data_json` is not JSON or the status is unset/unknown.
    """
    data: Any = None if m.data_json in ("", "null") else json.loads(m.data_json)
    error = (
        ToolError(type=m.error.type, message=m.error.message, traceback=m.error.traceback)
        if m.HasField("error")
        else None
    )
    return ToolResult(
        call_id=m.call_id,
        status=status_from_proto(m.status),
        data=data,
        message=m.message,
        error=error,
        effect=effect_from_proto(m.effect),
        still_running=m.still_running,
        truncated=m.truncated,
        duration_s=m.duration_s,
        tool=m.tool,
        output_bytes=m.output_bytes,
        session_id=m.session_id,
        session_reset=m.session_reset,
        artifacts=tuple(artifact_ref_from_proto(a) for a in m.artifacts),
        usage=(
            Usage(
                cpu_s=m.usage.cpu_s,
                memory_peak_bytes=m.usage.memory_peak_bytes,
                wall_s=m.usage.wall_s,
                output_bytes=m.usage.output_bytes,
                net_connections=m.usage.net_connections,
                net_bytes_out=m.usage.net_bytes_out,
                net_bytes_in=m.usage.net_bytes_in,
            )
            if m.HasField("usage")
            else None
        ),
        daemon_id=m.daemon_id,
        egress_denied=tuple(egress_denial_from_proto(d) for d in m.egress_denied),
        processes_ended=tuple(process_info_from_proto(p) for p in m.processes_ended),
        arguments_sha256=m.arguments_sha256,
        cached=m.cached,
        cached_from=m.cached_from,
    )


def egress_denial_to_proto(d: EgressDenial) -> pb.EgressDenial:
    """A refused connection as its wire message."""
    return pb.EgressDenial(host=d.host, port=d.port, reason=d.reason, rule=d.rule, count=d.count)


def egress_denial_from_proto(m: pb.EgressDenial) -> EgressDenial:
    """A refused connection from its wire message; a count of 0 (unset) reads as 1."""
    return EgressDenial(
        host=m.host, port=m.port, reason=m.reason, rule=m.rule, count=max(1, m.count)
    )


def output_to_proto(o: Output) -> pb.Output:
    """An output chunk as its wire message (text encoded as UTF-8)."""
    return pb.Output(seq=o.seq, stream=stream_kind_to_proto(o.stream), data=o.data.encode())


def output_from_proto(m: pb.Output) -> Output:
    """An output chunk from its wire message.

    The bytes are decoded as UTF-8 with undecodable bytes replaced (U+FFFD): a
    tool may write any bytes, and a chunk boundary may split a character.

    Raises:
        ValueError: When the stream kind is unset or unknown.
    """
    return Output(
        seq=m.seq,
        stream=stream_kind_from_proto(m.stream),
        data=m.data.decode("utf-8", errors="replace"),
    )


def tool_info_to_proto(t: ToolInfo) -> pb.ToolSpec:
    """A tool's description as its wire message (schema as JSON text)."""
    return pb.ToolSpec(
        name=t.name,
        description=t.description,
        input_schema_json=json.dumps(t.input_schema),
        timeout_s=t.timeout_s,
        max_timeout_s=t.max_timeout_s,
        kill_after_s=t.kill_after_s,
        idempotent=t.idempotent,
        streaming=t.streaming,
        source=t.source,
        egress=list(t.egress),
        secrets=list(t.secrets),
        cache_s=t.cache_s,
    )


def tool_info_from_proto(m: pb.ToolSpec) -> ToolInfo:
    """A tool's description from its wire message; an empty schema reads as {}.

    Raises:
        ValueError: When `input_schema_json` is not a JSON object.
    """
    schema: Any = json.loads(m.input_schema_json) if m.input_schema_json else {}
    if not isinstance(schema, dict):
        raise ValueError(f"tool {m.name!r}: input_schema_json is not a JSON object")
    return ToolInfo(
        name=m.name,
        description=m.description,
        input_schema=schema,
        timeout_s=m.timeout_s,
        max_timeout_s=m.max_timeout_s,
        kill_after_s=m.kill_after_s,
        idempotent=m.idempotent,
        streaming=m.streaming,
        source=m.source,
        egress=tuple(m.egress),
        secrets=tuple(m.secrets),
        cache_s=m.cache_s,
    )


def diagnostic_to_proto(d: Diagnostic) -> pb.Diagnostic:
    """A tool-loading problem as its wire message."""
    return pb.Diagnostic(
        severity=d.severity, code=d.code, message=d.message, file=d.file, tool=d.tool
    )


def diagnostic_from_proto(m: pb.Diagnostic) -> Diagnostic:
    """A tool-loading problem from its wire message."""
    return Diagnostic(severity=m.severity, code=m.code, message=m.message, file=m.file, tool=m.tool)


def call_info_to_proto(c: CallInfo) -> pb.CallInfo:
    """What the daemon knows of a call, as its wire message.

    Raises:
        TypeError: When the result's data is not JSON-serialisable.
    """
    m = pb.CallInfo(
        call_id=c.call_id,
        tool=c.tool,
        state=call_state_to_proto(c.state),
        has_result=c.result is not None,
        daemon_id=c.daemon_id,
        arguments_json=c.arguments_json,
        arguments_truncated=c.arguments_truncated,
        arguments_bytes=c.arguments_bytes,
        arguments_sha256=c.arguments_sha256,
        client_name=c.client_name,
        session_id=c.session_id,
        received_at_unix=unix_from_utc(c.received_at),
        started_at_unix=unix_from_utc(c.started_at),
        ended_at_unix=unix_from_utc(c.ended_at),
        timeout_s=c.timeout_s,
        sandbox_id=c.sandbox_id,
    )
    if c.result is not None:
        m.result.CopyFrom(result_to_proto(c.result))
    return m


def call_info_from_proto(m: pb.CallInfo) -> CallInfo:
    """What the daemon knows of a call, from its wire message.

    `has_result` decides whether `result` is read: an unset message field would
    otherwise decode as an all-default result.

    Raises:
        ValueError: When the state or the result's status is unset/unknown.
    """
    return CallInfo(
        call_id=m.call_id,
        tool=m.tool,
        state=call_state_from_proto(m.state),
        result=result_from_proto(m.result) if m.has_result else None,
        daemon_id=m.daemon_id,
        arguments_json=m.arguments_json,
        arguments_truncated=m.arguments_truncated,
        arguments_bytes=m.arguments_bytes,
        arguments_sha256=m.arguments_sha256,
        client_name=m.client_name,
        session_id=m.session_id,
        received_at=utc_from_unix(m.received_at_unix),
        started_at=utc_from_unix(m.started_at_unix),
        ended_at=utc_from_unix(m.ended_at_unix),
        timeout_s=m.timeout_s,
        sandbox_id=m.sandbox_id,
    )


# --- errors ----------------------------------------------------------------


def error_detail_for(exc: TooljailError) -> pb.ErrorDetail:
    """The `ErrorDetail` the daemon sends for one of our exceptions.

    Args:
        exc: The exception; its class's `code` becomes the detail's `code`.

    Returns:
        The detail, with `parameter`/`expected`/`actual` filled for
        `InvalidArgumentsError`, `retry_after_s` for `OverloadedError` and
        `reason` for `JournalUnavailableError`; every text `bounded`.
    """
    detail = pb.ErrorDetail(code=exc.code, message=bounded(exc.message))
    if isinstance(exc, InvalidArgumentsError):
        detail.parameter = bounded(exc.parameter, MAX_DETAIL_FIELD_BYTES)
        detail.expected = bounded(exc.expected, MAX_DETAIL_FIELD_BYTES)
        detail.actual = bounded(exc.actual, MAX_DETAIL_FIELD_BYTES)
    elif isinstance(exc, OverloadedError):
        detail.retry_after_s = exc.retry_after_s
    elif isinstance(exc, (JournalUnavailableError, SessionEndedError, ArtifactGoneError)):
        detail.reason = bounded(exc.reason, MAX_DETAIL_FIELD_BYTES)
    return detail


def _find_detail(trailing: Iterable[tuple[str, str | bytes]] | None) -> pb.ErrorDetail | None:
    for key, value in trailing or ():
        if key != ERROR_DETAIL_KEY:
            continue
        raw = value.encode() if isinstance(value, str) else value
        try:
            detail: pb.ErrorDetail = pb.ErrorDetail.FromString(raw)
        except DecodeError:
            # A garbled detail is no detail: fall back to the status code alone.
            return None
        return detail
    return None


def error_from_rpc(
    code_name: str,
    details: str | None,
    trailing: Iterable[tuple[str, str | bytes]] | None,
    *,
    target: str | None = None,
) -> TooljailError:
    """The exception for a failed RPC.

    Args:
        code_name: The gRPC status code's name, e.g. "NOT_FOUND".
        details: The status's details text (may be empty or None).
        trailing: The trailing metadata as (key, value) pairs; the value of
            `ERROR_DETAIL_KEY` is a serialized `pb.ErrorDetail`.
        target: The address the client dialled, named in the message of
            `DaemonUnavailableError`.

    Returns:
        The class `ERRORS_BY_CODE` names for the detail's code, with its
        attributes, or `UnknownError` for a code this SDK does not know: the
        daemon answered either way. Without a usable detail (nothing of ours
        answered), `DaemonUnavailableError` for UNAVAILABLE and
        `TransportError(status=code_name)` for anything else.
    """
    detail = _find_detail(trailing)
    if detail is not None:
        message = detail.message or details or code_name
        cls = ERRORS_BY_CODE.get(detail.code)
        if cls is InvalidArgumentsError:
            return InvalidArgumentsError(
                message, parameter=detail.parameter, expected=detail.expected, actual=detail.actual
            )
        if cls is OverloadedError:
            # 0 means the daemon gave no hint; keep the class's default then.
            if detail.retry_after_s > 0:
                return OverloadedError(message, retry_after_s=detail.retry_after_s)
            return OverloadedError(message)
        if cls is JournalUnavailableError:
            return JournalUnavailableError(message, reason=detail.reason)
        if cls is SessionEndedError:
            return SessionEndedError(message, reason=detail.reason)
        if cls is ArtifactGoneError:
            return ArtifactGoneError(message, reason=detail.reason)
        if cls is not None:
            return cls(message)
        return UnknownError(
            f"the daemon refused the request ({code_name}, code {detail.code!r}, which this "
            f"SDK does not know; is the daemon newer?): {message}",
            code=detail.code,
            status=code_name,
        )
    if code_name == "UNAVAILABLE":
        where = target or "the target"
        message = (
            f"no tooljail daemon answers at {where}: start one with `tooljail serve`, "
            "or point TOOLJAIL_TARGET (or Client(target=...)) at a running daemon"
        )
        if details:
            message += f" ({details})"
        return DaemonUnavailableError(message, status=code_name)
    return TransportError(f"{code_name}: {details}" if details else code_name, status=code_name)


_SESSION_STATE_TO_PB: dict[SessionState, int] = {
    SessionState.OPEN: pb.SESSION_STATE_OPEN,
    SessionState.CLOSED: pb.SESSION_STATE_CLOSED,
}
_SESSION_STATE_FROM_PB = _invert(_SESSION_STATE_TO_PB)

_SESSION_FIELDS = (
    "session_id",
    "end_reason",
    "sandbox_id",
    "created_unix",
    "last_used_unix",
    "idle_ttl_s",
    "max_lifetime_s",
    "memory_bytes",
    "pids",
    "cpus",
    "workspace_bytes",
    "keep_processes",
    "calls",
    "queued",
    "resets",
    "daemon_id",
)


def session_info_to_proto(s: SessionInfo) -> pb.SessionInfo:
    """A session's description as its wire message."""
    return pb.SessionInfo(
        state=_SESSION_STATE_TO_PB[s.state],  # type: ignore[arg-type]
        egress=list(s.egress),
        secrets=list(s.secrets),
        **{name: getattr(s, name) for name in _SESSION_FIELDS},
    )


def session_info_from_proto(m: pb.SessionInfo) -> SessionInfo:
    """A session's description from its wire message.

    Raises:
        ValueError: When the state is unset or unknown to this SDK.
    """
    return SessionInfo(
        state=_from_pb(_SESSION_STATE_FROM_PB, m.state, "SessionState"),
        egress=tuple(m.egress),
        secrets=tuple(m.secrets),
        **{name: getattr(m, name) for name in _SESSION_FIELDS},
    )


def artifact_ref_to_proto(a: ArtifactRef) -> pb.ArtifactRef:
    """An artifact a result names, as its wire message."""
    return pb.ArtifactRef(
        artifact_id=a.artifact_id, name=a.name, mime_type=a.mime_type, size_bytes=a.size_bytes
    )


def artifact_ref_from_proto(m: pb.ArtifactRef) -> ArtifactRef:
    return ArtifactRef(
        artifact_id=m.artifact_id, name=m.name, mime_type=m.mime_type, size_bytes=m.size_bytes
    )


_ARTIFACT_FIELDS = (
    "artifact_id",
    "name",
    "mime_type",
    "size_bytes",
    "call_id",
    "session_id",
    "created_unix",
    "source",
    "tool",
)


def artifact_info_to_proto(a: ArtifactInfo) -> pb.ArtifactInfo:
    """An artifact's description as its wire message."""
    return pb.ArtifactInfo(**{name: getattr(a, name) for name in _ARTIFACT_FIELDS})


def artifact_info_from_proto(m: pb.ArtifactInfo) -> ArtifactInfo:
    return ArtifactInfo(**{name: getattr(m, name) for name in _ARTIFACT_FIELDS})
