"""The wire conversions, public: domain types to protobuf messages and back, and errors.

Both sides convert through these, so the daemon's edge (its gRPC servicer and
error mapping) imports them from here, never from the private module. No I/O:
pure functions over the generated messages.
"""

from tooljail._wire import (
    ERROR_DETAIL_KEY,
    MAX_DETAIL_FIELD_BYTES,
    MAX_ERROR_MESSAGE_BYTES,
    artifact_info_to_proto,
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
    session_info_to_proto,
    status_from_proto,
    status_to_proto,
    stream_kind_from_proto,
    stream_kind_to_proto,
    tool_info_from_proto,
    tool_info_to_proto,
)

__all__ = [
    "ERROR_DETAIL_KEY",
    "MAX_DETAIL_FIELD_BYTES",
    "MAX_ERROR_MESSAGE_BYTES",
    "artifact_info_to_proto",
    "bounded",
    "call_info_from_proto",
    "call_info_to_proto",
    "call_state_from_proto",
    "call_state_to_proto",
    "diagnostic_from_proto",
    "diagnostic_to_proto",
    "effect_from_proto",
    "effect_to_proto",
    "error_detail_for",
    "error_from_rpc",
    "output_from_proto",
    "output_to_proto",
    "result_from_proto",
    "result_to_proto",
    "session_info_to_proto",
    "status_from_proto",
    "status_to_proto",
    "stream_kind_from_proto",
    "stream_kind_to_proto",
    "tool_info_from_proto",
    "tool_info_to_proto",
]
