"""The SDK's result and info types, public: what a call returns and what the daemon builds.

The daemon builds these same types (its calls' results, infos and diagnostics)
and imports them from here, never from the private module they live in.
"""

from tooljail._call_types import ApprovalEvent, ApprovalEventKind, CallInfo, CallPage
from tooljail._process_types import ProcessChunk, ProcessOutputPage
from tooljail._types import (
    TIMEOUT_MESSAGE,
    ArtifactInfo,
    ArtifactRef,
    CallState,
    CallStatus,
    Diagnostic,
    Effect,
    EgressDenial,
    Output,
    ProcessInfo,
    ProcessState,
    SessionInfo,
    SessionState,
    StreamKind,
    ToolError,
    ToolInfo,
    ToolResult,
    Usage,
    WorkspaceEvent,
    WorkspaceEventKind,
)

__all__ = [
    "TIMEOUT_MESSAGE",
    "ApprovalEvent",
    "ApprovalEventKind",
    "ArtifactInfo",
    "ArtifactRef",
    "CallInfo",
    "CallPage",
    "CallState",
    "CallStatus",
    "Diagnostic",
    "Effect",
    "EgressDenial",
    "Output",
    "ProcessChunk",
    "ProcessInfo",
    "ProcessOutputPage",
    "ProcessState",
    "SessionInfo",
    "SessionState",
    "StreamKind",
    "ToolError",
    "ToolInfo",
    "ToolResult",
    "Usage",
    "WorkspaceEvent",
    "WorkspaceEventKind",
]
