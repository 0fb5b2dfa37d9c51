"""A session's background process on the wire: `ProcessInfo` both ways."""

from __future__ import annotations

from tooljail._types import ProcessInfo, ProcessState
from tooljail._wire_enums import from_pb, invert
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["process_info_from_proto", "process_info_to_proto"]


_PROCESS_STATE_TO_PB: dict[ProcessState, int] = {
    ProcessState.RUNNING: pb.PROCESS_STATE_RUNNING,
    ProcessState.EXITED: pb.PROCESS_STATE_EXITED,
    ProcessState.KILLED: pb.PROCESS_STATE_KILLED,
}
_PROCESS_STATE_FROM_PB = invert(_PROCESS_STATE_TO_PB)

_PROCESS_FIELDS = (
    "process_id",
    "session_id",
    "name",
    "command",
    "pid",
    "signal",
    "started_unix",
    "ended_unix",
    "cpu_s",
    "memory_bytes",
    "output_bytes",
    "ring_start",
    "output_artifact_id",
    "terminal",
)


def process_info_to_proto(p: ProcessInfo) -> pb.ProcessInfo:
    """A background process's description as its wire message."""
    return pb.ProcessInfo(
        state=_PROCESS_STATE_TO_PB[p.state],  # type: ignore[arg-type]
        exit_code=p.exit_code or 0,
        has_exit_code=p.exit_code is not None,
        **{name: getattr(p, name) for name in _PROCESS_FIELDS},
    )


def process_info_from_proto(m: pb.ProcessInfo) -> ProcessInfo:
    """A background process's description from its wire message.

    Raises:
        ValueError: When the state is unset or unknown to this SDK.
    """
    return ProcessInfo(
        state=from_pb(_PROCESS_STATE_FROM_PB, m.state, "ProcessState"),
        exit_code=m.exit_code if m.has_exit_code else None,
        **{name: getattr(m, name) for name in _PROCESS_FIELDS},
    )
