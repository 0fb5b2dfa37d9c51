from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_KIND_UNSPECIFIED: _ClassVar[StreamKind]
    STREAM_KIND_STDOUT: _ClassVar[StreamKind]
    STREAM_KIND_STDERR: _ClassVar[StreamKind]
    STREAM_KIND_YIELD: _ClassVar[StreamKind]
    STREAM_KIND_NOTICE: _ClassVar[StreamKind]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_SUCCESS: _ClassVar[Status]
    STATUS_PARTIAL: _ClassVar[Status]
    STATUS_ERROR: _ClassVar[Status]
    STATUS_TIMEOUT: _ClassVar[Status]
    STATUS_CANCELLED: _ClassVar[Status]
    STATUS_LOST: _ClassVar[Status]

class Effect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EFFECT_UNSPECIFIED: _ClassVar[Effect]
    EFFECT_NONE: _ClassVar[Effect]
    EFFECT_APPLIED: _ClassVar[Effect]
    EFFECT_UNKNOWN: _ClassVar[Effect]

class CallState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_STATE_UNSPECIFIED: _ClassVar[CallState]
    CALL_STATE_QUEUED: _ClassVar[CallState]
    CALL_STATE_RUNNING: _ClassVar[CallState]
    CALL_STATE_SUCCEEDED: _ClassVar[CallState]
    CALL_STATE_FAILED: _ClassVar[CallState]
    CALL_STATE_TIMED_OUT: _ClassVar[CallState]
    CALL_STATE_CANCELLED: _ClassVar[CallState]
    CALL_STATE_LOST: _ClassVar[CallState]
    CALL_STATE_AWAITING_APPROVAL: _ClassVar[CallState]

class RunningFilter(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNNING_FILTER_ANY: _ClassVar[RunningFilter]
    RUNNING_FILTER_RUNNING: _ClassVar[RunningFilter]
    RUNNING_FILTER_ENDED: _ClassVar[RunningFilter]

class ApprovalEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_EVENT_KIND_UNSPECIFIED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_REQUESTED: _ClassVar[ApprovalEventKind]
    APPROVAL_EVENT_KIND_DECIDED: _ClassVar[ApprovalEventKind]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_OPEN: _ClassVar[SessionState]
    SESSION_STATE_CLOSED: _ClassVar[SessionState]

class ProcessState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_STATE_UNSPECIFIED: _ClassVar[ProcessState]
    PROCESS_STATE_RUNNING: _ClassVar[ProcessState]
    PROCESS_STATE_EXITED: _ClassVar[ProcessState]
    PROCESS_STATE_KILLED: _ClassVar[ProcessState]

class OutputSelect(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_SELECT_BOTH: _ClassVar[OutputSelect]
    OUTPUT_SELECT_STDOUT: _ClassVar[OutputSelect]
    OUTPUT_SELECT_STDERR: _ClassVar[OutputSelect]

class WorkspaceEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKSPACE_EVENT_KIND_UNSPECIFIED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_CREATED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_MODIFIED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_DELETED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_MOVED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_DROPPED: _ClassVar[WorkspaceEventKind]
    WORKSPACE_EVENT_KIND_WATCHING: _ClassVar[WorkspaceEventKind]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_TOOL_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_CALL_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENTS: _ClassVar[ErrorCode]
    ERROR_CODE_BAD_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_REQUEST: _ClassVar[ErrorCode]
    ERROR_CODE_CALL_ID_CONFLICT: _ClassVar[ErrorCode]
    ERROR_CODE_OVERLOADED: _ClassVar[ErrorCode]
    ERROR_CODE_SHUTTING_DOWN: _ClassVar[ErrorCode]
    ERROR_CODE_JOURNAL_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_ENDED: _ClassVar[ErrorCode]
    ERROR_CODE_FILE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_PATH: _ClassVar[ErrorCode]
    ERROR_CODE_WORKSPACE_FULL: _ClassVar[ErrorCode]
    ERROR_CODE_ARTIFACT_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_ARTIFACT_GONE: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_PERMISSION_DENIED: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_AWAITING_APPROVAL: _ClassVar[ErrorCode]
    ERROR_CODE_EGRESS_UNAVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_REQUIRED: _ClassVar[ErrorCode]
    ERROR_CODE_PROCESS_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_PROCESS_LIMIT: _ClassVar[ErrorCode]
    ERROR_CODE_PORT_UNREACHABLE: _ClassVar[ErrorCode]
STREAM_KIND_UNSPECIFIED: StreamKind
STREAM_KIND_STDOUT: StreamKind
STREAM_KIND_STDERR: StreamKind
STREAM_KIND_YIELD: StreamKind
STREAM_KIND_NOTICE: StreamKind
STATUS_UNSPECIFIED: Status
STATUS_SUCCESS: Status
STATUS_PARTIAL: Status
STATUS_ERROR: Status
STATUS_TIMEOUT: Status
STATUS_CANCELLED: Status
STATUS_LOST: Status
EFFECT_UNSPECIFIED: Effect
EFFECT_NONE: Effect
EFFECT_APPLIED: Effect
EFFECT_UNKNOWN: Effect
CALL_STATE_UNSPECIFIED: CallState
CALL_STATE_QUEUED: CallState
CALL_STATE_RUNNING: CallState
CALL_STATE_SUCCEEDED: CallState
CALL_STATE_FAILED: CallState
CALL_STATE_TIMED_OUT: CallState
CALL_STATE_CANCELLED: CallState
CALL_STATE_LOST: CallState
CALL_STATE_AWAITING_APPROVAL: CallState
RUNNING_FILTER_ANY: RunningFilter
RUNNING_FILTER_RUNNING: RunningFilter
RUNNING_FILTER_ENDED: RunningFilter
APPROVAL_EVENT_KIND_UNSPECIFIED: ApprovalEventKind
APPROVAL_EVENT_KIND_REQUESTED: ApprovalEventKind
APPROVAL_EVENT_KIND_DECIDED: ApprovalEventKind
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_OPEN: SessionState
SESSION_STATE_CLOSED: SessionState
PROCESS_STATE_UNSPECIFIED: ProcessState
PROCESS_STATE_RUNNING: ProcessState
PROCESS_STATE_EXITED: ProcessState
PROCESS_STATE_KILLED: ProcessState
OUTPUT_SELECT_BOTH: OutputSelect
OUTPUT_SELECT_STDOUT: OutputSelect
OUTPUT_SELECT_STDERR: OutputSelect
WORKSPACE_EVENT_KIND_UNSPECIFIED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_CREATED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_MODIFIED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_DELETED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_MOVED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_DROPPED: WorkspaceEventKind
WORKSPACE_EVENT_KIND_WATCHING: WorkspaceEventKind
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_TOOL_NOT_FOUND: ErrorCode
ERROR_CODE_CALL_NOT_FOUND: ErrorCode
ERROR_CODE_INVALID_ARGUMENTS: ErrorCode
ERROR_CODE_BAD_TIMEOUT: ErrorCode
ERROR_CODE_INVALID_REQUEST: ErrorCode
ERROR_CODE_CALL_ID_CONFLICT: ErrorCode
ERROR_CODE_OVERLOADED: ErrorCode
ERROR_CODE_SHUTTING_DOWN: ErrorCode
ERROR_CODE_JOURNAL_UNAVAILABLE: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_SESSION_NOT_FOUND: ErrorCode
ERROR_CODE_SESSION_ENDED: ErrorCode
ERROR_CODE_FILE_NOT_FOUND: ErrorCode
ERROR_CODE_INVALID_PATH: ErrorCode
ERROR_CODE_WORKSPACE_FULL: ErrorCode
ERROR_CODE_ARTIFACT_NOT_FOUND: ErrorCode
ERROR_CODE_ARTIFACT_GONE: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_NOT_AWAITING_APPROVAL: ErrorCode
ERROR_CODE_EGRESS_UNAVAILABLE: ErrorCode
ERROR_CODE_SESSION_REQUIRED: ErrorCode
ERROR_CODE_PROCESS_NOT_FOUND: ErrorCode
ERROR_CODE_PROCESS_LIMIT: ErrorCode
ERROR_CODE_PORT_UNREACHABLE: ErrorCode

class GetDaemonInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DaemonInfo(_message.Message):
    __slots__ = ("daemon_id", "version", "draining", "started_unix")
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    daemon_id: str
    version: str
    draining: bool
    started_unix: float
    def __init__(self, daemon_id: _Optional[str] = ..., version: _Optional[str] = ..., draining: _Optional[bool] = ..., started_unix: _Optional[float] = ...) -> None: ...

class ListToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "timeout_s", "max_timeout_s", "kill_after_s", "idempotent", "streaming", "source", "egress", "secrets", "cache_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    KILL_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    CACHE_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    timeout_s: float
    max_timeout_s: float
    kill_after_s: float
    idempotent: bool
    streaming: bool
    source: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    secrets: _containers.RepeatedScalarFieldContainer[str]
    cache_s: float
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., timeout_s: _Optional[float] = ..., max_timeout_s: _Optional[float] = ..., kill_after_s: _Optional[float] = ..., idempotent: _Optional[bool] = ..., streaming: _Optional[bool] = ..., source: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ..., secrets: _Optional[_Iterable[str]] = ..., cache_s: _Optional[float] = ...) -> None: ...

class Diagnostic(_message.Message):
    __slots__ = ("severity", "code", "message", "file", "tool")
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    severity: str
    code: str
    message: str
    file: str
    tool: str
    def __init__(self, severity: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., file: _Optional[str] = ..., tool: _Optional[str] = ...) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools", "diagnostics")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    diagnostics: _containers.RepeatedCompositeFieldContainer[Diagnostic]
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., diagnostics: _Optional[_Iterable[_Union[Diagnostic, _Mapping]]] = ...) -> None: ...

class CallRequest(_message.Message):
    __slots__ = ("tool", "arguments_json", "call_id", "timeout_s", "session_id", "egress", "secrets")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    tool: str
    arguments_json: str
    call_id: str
    timeout_s: float
    session_id: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    secrets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., call_id: _Optional[str] = ..., timeout_s: _Optional[float] = ..., session_id: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ..., secrets: _Optional[_Iterable[str]] = ...) -> None: ...

class CallEvent(_message.Message):
    __slots__ = ("started", "output", "result")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    started: Started
    output: Output
    result: Result
    def __init__(self, started: _Optional[_Union[Started, _Mapping]] = ..., output: _Optional[_Union[Output, _Mapping]] = ..., result: _Optional[_Union[Result, _Mapping]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("call_id", "sandbox_id", "tool", "daemon_id")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    sandbox_id: str
    tool: str
    daemon_id: str
    def __init__(self, call_id: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., tool: _Optional[str] = ..., daemon_id: _Optional[str] = ...) -> None: ...

class Output(_message.Message):
    __slots__ = ("seq", "stream", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    stream: StreamKind
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., stream: _Optional[_Union[StreamKind, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ToolError(_message.Message):
    __slots__ = ("type", "message", "traceback")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    traceback: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("call_id", "status", "data_json", "message", "error", "effect", "still_running", "truncated", "duration_s", "tool", "output_bytes", "session_id", "session_reset", "artifacts", "usage", "daemon_id", "egress_denied", "processes_ended", "arguments_sha256", "cached", "cached_from")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    STILL_RUNNING_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_RESET_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    EGRESS_DENIED_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_ENDED_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    CACHED_FROM_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    status: Status
    data_json: str
    message: str
    error: ToolError
    effect: Effect
    still_running: bool
    truncated: bool
    duration_s: float
    tool: str
    output_bytes: int
    session_id: str
    session_reset: bool
    artifacts: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    usage: Usage
    daemon_id: str
    egress_denied: _containers.RepeatedCompositeFieldContainer[EgressDenial]
    processes_ended: _containers.RepeatedCompositeFieldContainer[ProcessInfo]
    arguments_sha256: str
    cached: bool
    cached_from: str
    def __init__(self, call_id: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., data_json: _Optional[str] = ..., message: _Optional[str] = ..., error: _Optional[_Union[ToolError, _Mapping]] = ..., effect: _Optional[_Union[Effect, str]] = ..., still_running: _Optional[bool] = ..., truncated: _Optional[bool] = ..., duration_s: _Optional[float] = ..., tool: _Optional[str] = ..., output_bytes: _Optional[int] = ..., session_id: _Optional[str] = ..., session_reset: _Optional[bool] = ..., artifacts: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., daemon_id: _Optional[str] = ..., egress_denied: _Optional[_Iterable[_Union[EgressDenial, _Mapping]]] = ..., processes_ended: _Optional[_Iterable[_Union[ProcessInfo, _Mapping]]] = ..., arguments_sha256: _Optional[str] = ..., cached: _Optional[bool] = ..., cached_from: _Optional[str] = ...) -> None: ...

class EgressDenial(_message.Message):
    __slots__ = ("host", "port", "reason", "rule", "count")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    reason: str
    rule: str
    count: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., reason: _Optional[str] = ..., rule: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("cpu_s", "memory_peak_bytes", "wall_s", "output_bytes", "net_connections", "net_bytes_out", "net_bytes_in")
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NET_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    NET_BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    NET_BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    cpu_s: float
    memory_peak_bytes: int
    wall_s: float
    output_bytes: int
    net_connections: int
    net_bytes_out: int
    net_bytes_in: int
    def __init__(self, cpu_s: _Optional[float] = ..., memory_peak_bytes: _Optional[int] = ..., wall_s: _Optional[float] = ..., output_bytes: _Optional[int] = ..., net_connections: _Optional[int] = ..., net_bytes_out: _Optional[int] = ..., net_bytes_in: _Optional[int] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("artifact_id", "name", "mime_type", "size_bytes")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    name: str
    mime_type: str
    size_bytes: int
    def __init__(self, artifact_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("call_id", "from_seq")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    from_seq: int
    def __init__(self, call_id: _Optional[str] = ..., from_seq: _Optional[int] = ...) -> None: ...

class GetCallRequest(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class CallInfo(_message.Message):
    __slots__ = ("call_id", "tool", "state", "result", "has_result", "daemon_id", "arguments_json", "arguments_truncated", "arguments_bytes", "arguments_sha256", "client_name", "session_id", "received_at_unix", "started_at_unix", "ended_at_unix", "timeout_s", "sandbox_id")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HAS_RESULT_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_SHA256_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    tool: str
    state: CallState
    result: Result
    has_result: bool
    daemon_id: str
    arguments_json: str
    arguments_truncated: bool
    arguments_bytes: int
    arguments_sha256: str
    client_name: str
    session_id: str
    received_at_unix: float
    started_at_unix: float
    ended_at_unix: float
    timeout_s: float
    sandbox_id: str
    def __init__(self, call_id: _Optional[str] = ..., tool: _Optional[str] = ..., state: _Optional[_Union[CallState, str]] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., has_result: _Optional[bool] = ..., daemon_id: _Optional[str] = ..., arguments_json: _Optional[str] = ..., arguments_truncated: _Optional[bool] = ..., arguments_bytes: _Optional[int] = ..., arguments_sha256: _Optional[str] = ..., client_name: _Optional[str] = ..., session_id: _Optional[str] = ..., received_at_unix: _Optional[float] = ..., started_at_unix: _Optional[float] = ..., ended_at_unix: _Optional[float] = ..., timeout_s: _Optional[float] = ..., sandbox_id: _Optional[str] = ...) -> None: ...

class ListCallsRequest(_message.Message):
    __slots__ = ("tool", "session_id", "status", "since_unix", "until_unix", "running", "client_name", "limit", "cursor")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    tool: str
    session_id: str
    status: Status
    since_unix: float
    until_unix: float
    running: RunningFilter
    client_name: str
    limit: int
    cursor: str
    def __init__(self, tool: _Optional[str] = ..., session_id: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., since_unix: _Optional[float] = ..., until_unix: _Optional[float] = ..., running: _Optional[_Union[RunningFilter, str]] = ..., client_name: _Optional[str] = ..., limit: _Optional[int] = ..., cursor: _Optional[str] = ...) -> None: ...

class ListCallsResponse(_message.Message):
    __slots__ = ("calls", "next_cursor")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[CallInfo]
    next_cursor: str
    def __init__(self, calls: _Optional[_Iterable[_Union[CallInfo, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("calls",)
    CALLS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[CallInfo]
    def __init__(self, calls: _Optional[_Iterable[_Union[CallInfo, _Mapping]]] = ...) -> None: ...

class WatchApprovalsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ApprovalEvent(_message.Message):
    __slots__ = ("kind", "call")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    kind: ApprovalEventKind
    call: CallInfo
    def __init__(self, kind: _Optional[_Union[ApprovalEventKind, str]] = ..., call: _Optional[_Union[CallInfo, _Mapping]] = ...) -> None: ...

class ApproveRequest(_message.Message):
    __slots__ = ("call_id", "approve", "reason")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    APPROVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    approve: bool
    reason: str
    def __init__(self, call_id: _Optional[str] = ..., approve: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("call_id",)
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    def __init__(self, call_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: CallState
    def __init__(self, state: _Optional[_Union[CallState, str]] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("idle_ttl_s", "max_lifetime_s", "memory_bytes", "pids", "cpus", "workspace_bytes", "keep_processes", "egress", "secrets")
    IDLE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEEP_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    idle_ttl_s: float
    max_lifetime_s: float
    memory_bytes: int
    pids: int
    cpus: float
    workspace_bytes: int
    keep_processes: bool
    egress: _containers.RepeatedScalarFieldContainer[str]
    secrets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, idle_ttl_s: _Optional[float] = ..., max_lifetime_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., pids: _Optional[int] = ..., cpus: _Optional[float] = ..., workspace_bytes: _Optional[int] = ..., keep_processes: _Optional[bool] = ..., egress: _Optional[_Iterable[str]] = ..., secrets: _Optional[_Iterable[str]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "state", "end_reason", "sandbox_id", "created_unix", "last_used_unix", "idle_ttl_s", "max_lifetime_s", "memory_bytes", "pids", "cpus", "workspace_bytes", "keep_processes", "calls", "queued", "resets", "daemon_id", "egress", "secrets")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEEP_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    DAEMON_ID_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    state: SessionState
    end_reason: str
    sandbox_id: str
    created_unix: float
    last_used_unix: float
    idle_ttl_s: float
    max_lifetime_s: float
    memory_bytes: int
    pids: int
    cpus: float
    workspace_bytes: int
    keep_processes: bool
    calls: int
    queued: int
    resets: int
    daemon_id: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    secrets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., state: _Optional[_Union[SessionState, str]] = ..., end_reason: _Optional[str] = ..., sandbox_id: _Optional[str] = ..., created_unix: _Optional[float] = ..., last_used_unix: _Optional[float] = ..., idle_ttl_s: _Optional[float] = ..., max_lifetime_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., pids: _Optional[int] = ..., cpus: _Optional[float] = ..., workspace_bytes: _Optional[int] = ..., keep_processes: _Optional[bool] = ..., calls: _Optional[int] = ..., queued: _Optional[int] = ..., resets: _Optional[int] = ..., daemon_id: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ..., secrets: _Optional[_Iterable[str]] = ...) -> None: ...

class StartProcessRequest(_message.Message):
    __slots__ = ("session_id", "command", "argv", "name", "cwd", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    command: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    name: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., command: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ProcessInfo(_message.Message):
    __slots__ = ("process_id", "session_id", "name", "command", "pid", "state", "exit_code", "has_exit_code", "signal", "started_unix", "ended_unix", "cpu_s", "memory_bytes", "output_bytes", "ring_start", "output_artifact_id", "terminal")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RING_START_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    session_id: str
    name: str
    command: str
    pid: int
    state: ProcessState
    exit_code: int
    has_exit_code: bool
    signal: int
    started_unix: float
    ended_unix: float
    cpu_s: float
    memory_bytes: int
    output_bytes: int
    ring_start: int
    output_artifact_id: str
    terminal: bool
    def __init__(self, process_id: _Optional[str] = ..., session_id: _Optional[str] = ..., name: _Optional[str] = ..., command: _Optional[str] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[ProcessState, str]] = ..., exit_code: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., signal: _Optional[int] = ..., started_unix: _Optional[float] = ..., ended_unix: _Optional[float] = ..., cpu_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., output_bytes: _Optional[int] = ..., ring_start: _Optional[int] = ..., output_artifact_id: _Optional[str] = ..., terminal: _Optional[bool] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessInfo]
    def __init__(self, processes: _Optional[_Iterable[_Union[ProcessInfo, _Mapping]]] = ...) -> None: ...

class ReadProcessOutputRequest(_message.Message):
    __slots__ = ("session_id", "process_id", "offset", "follow", "select", "limit")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    process_id: str
    offset: int
    follow: bool
    select: OutputSelect
    limit: int
    def __init__(self, session_id: _Optional[str] = ..., process_id: _Optional[str] = ..., offset: _Optional[int] = ..., follow: _Optional[bool] = ..., select: _Optional[_Union[OutputSelect, str]] = ..., limit: _Optional[int] = ...) -> None: ...

class ProcessOutput(_message.Message):
    __slots__ = ("offset", "next_offset", "stream", "data", "skipped", "process")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    next_offset: int
    stream: StreamKind
    data: bytes
    skipped: int
    process: ProcessInfo
    def __init__(self, offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., stream: _Optional[_Union[StreamKind, str]] = ..., data: _Optional[bytes] = ..., skipped: _Optional[int] = ..., process: _Optional[_Union[ProcessInfo, _Mapping]] = ...) -> None: ...

class WriteProcessInputRequest(_message.Message):
    __slots__ = ("session_id", "process_id", "data", "eof")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    process_id: str
    data: bytes
    eof: bool
    def __init__(self, session_id: _Optional[str] = ..., process_id: _Optional[str] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class SignalProcessRequest(_message.Message):
    __slots__ = ("session_id", "process_id", "signal", "grace_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    process_id: str
    signal: int
    grace_s: float
    def __init__(self, session_id: _Optional[str] = ..., process_id: _Optional[str] = ..., signal: _Optional[int] = ..., grace_s: _Optional[float] = ...) -> None: ...

class WaitProcessRequest(_message.Message):
    __slots__ = ("session_id", "process_id", "timeout_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    process_id: str
    timeout_s: float
    def __init__(self, session_id: _Optional[str] = ..., process_id: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class TerminalOpen(_message.Message):
    __slots__ = ("session_id", "rows", "cols", "argv", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    rows: int
    cols: int
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TerminalResize(_message.Message):
    __slots__ = ("rows", "cols")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class TerminalInput(_message.Message):
    __slots__ = ("open", "data", "resize", "signal")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RESIZE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    open: TerminalOpen
    data: bytes
    resize: TerminalResize
    signal: int
    def __init__(self, open: _Optional[_Union[TerminalOpen, _Mapping]] = ..., data: _Optional[bytes] = ..., resize: _Optional[_Union[TerminalResize, _Mapping]] = ..., signal: _Optional[int] = ...) -> None: ...

class TerminalOutput(_message.Message):
    __slots__ = ("opened", "data", "exited")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    opened: ProcessInfo
    data: bytes
    exited: ProcessInfo
    def __init__(self, opened: _Optional[_Union[ProcessInfo, _Mapping]] = ..., data: _Optional[bytes] = ..., exited: _Optional[_Union[ProcessInfo, _Mapping]] = ...) -> None: ...

class PortData(_message.Message):
    __slots__ = ("session_id", "port", "data", "eof")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    port: int
    data: bytes
    eof: bool
    def __init__(self, session_id: _Optional[str] = ..., port: _Optional[int] = ..., data: _Optional[bytes] = ..., eof: _Optional[bool] = ...) -> None: ...

class WatchWorkspaceRequest(_message.Message):
    __slots__ = ("session_id", "path", "recursive")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    recursive: bool
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ...) -> None: ...

class WorkspaceEvent(_message.Message):
    __slots__ = ("kind", "path", "is_dir", "old_path", "dropped", "dropped_hint")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    IS_DIR_FIELD_NUMBER: _ClassVar[int]
    OLD_PATH_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_HINT_FIELD_NUMBER: _ClassVar[int]
    kind: WorkspaceEventKind
    path: str
    is_dir: bool
    old_path: str
    dropped: bool
    dropped_hint: str
    def __init__(self, kind: _Optional[_Union[WorkspaceEventKind, str]] = ..., path: _Optional[str] = ..., is_dir: _Optional[bool] = ..., old_path: _Optional[str] = ..., dropped: _Optional[bool] = ..., dropped_hint: _Optional[str] = ...) -> None: ...

class SetSessionEgressRequest(_message.Message):
    __slots__ = ("session_id", "egress")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EGRESS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    egress: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., egress: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("all_clients",)
    ALL_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    all_clients: bool
    def __init__(self, all_clients: _Optional[bool] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("session_id", "path", "data")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    data: bytes
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class DownloadFileRequest(_message.Message):
    __slots__ = ("session_id", "path")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    path: str
    def __init__(self, session_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("path", "size_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ArtifactInfo(_message.Message):
    __slots__ = ("artifact_id", "name", "mime_type", "size_bytes", "call_id", "session_id", "created_unix", "source", "tool")
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    name: str
    mime_type: str
    size_bytes: int
    call_id: str
    session_id: str
    created_unix: float
    source: str
    tool: str
    def __init__(self, artifact_id: _Optional[str] = ..., name: _Optional[str] = ..., mime_type: _Optional[str] = ..., size_bytes: _Optional[int] = ..., call_id: _Optional[str] = ..., session_id: _Optional[str] = ..., created_unix: _Optional[float] = ..., source: _Optional[str] = ..., tool: _Optional[str] = ...) -> None: ...

class GetArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("info", "data")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    info: ArtifactInfo
    data: bytes
    def __init__(self, info: _Optional[_Union[ArtifactInfo, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ListArtifactsRequest(_message.Message):
    __slots__ = ("call_id", "session_id", "page_size", "page_token")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    session_id: str
    page_size: int
    page_token: str
    def __init__(self, call_id: _Optional[str] = ..., session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListArtifactsResponse(_message.Message):
    __slots__ = ("artifacts", "next_page_token")
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    artifacts: _containers.RepeatedCompositeFieldContainer[ArtifactInfo]
    next_page_token: str
    def __init__(self, artifacts: _Optional[_Iterable[_Union[ArtifactInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteArtifactRequest(_message.Message):
    __slots__ = ("artifact_id",)
    ARTIFACT_ID_FIELD_NUMBER: _ClassVar[int]
    artifact_id: str
    def __init__(self, artifact_id: _Optional[str] = ...) -> None: ...

class DeleteArtifactResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "parameter", "expected", "actual", "retry_after_s", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    parameter: str
    expected: str
    actual: str
    retry_after_s: float
    reason: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., parameter: _Optional[str] = ..., expected: _Optional[str] = ..., actual: _Optional[str] = ..., retry_after_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...
