"""tooljail: run AI agents' tool calls in sandboxes, through a daemon, over gRPC.

    from tooljail import Client

    with Client() as client:
        result = client.call("execute_python_code", {"code": "print(1)"})
        print(result.status, result.data)

        with client.session() as s:  # an interpreter and workspace kept across calls
            s.call("execute_python_code", {"code": "x = 41"})
            print(s.call("execute_python_code", {"code": "print(x + 1)"}).data)

A tool that fails is a `ToolResult` with a non-success `status`, never an
exception; the exceptions below (the tree in `tooljail.errors`) are for
requests the daemon refuses and RPCs that fail. This package imports neither
the daemon (`tooljaild`) nor docker or psutil: an agent host needs only grpcio,
protobuf and pydantic.
"""

from tooljail._async_processes import AsyncProcesses
from tooljail._async_session import AsyncSession
from tooljail._call_types import ApprovalEvent, ApprovalEventKind, CallInfo, CallPage
from tooljail._client import AsyncClient, Client, default_target
from tooljail._forward import AsyncForward, Forward
from tooljail._processes import Processes
from tooljail._session import Session
from tooljail._terminal import AsyncTerminal, Terminal
from tooljail._tooldef import tool
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
from tooljail._watch import AsyncWatch, Watch
from tooljail.errors import (
    ArtifactGoneError,
    ArtifactNotFoundError,
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    DaemonUnavailableError,
    EgressUnavailableError,
    InternalError,
    InvalidArgumentsError,
    InvalidPathError,
    InvalidRequestError,
    JournalUnavailableError,
    NotAwaitingApprovalError,
    OverloadedError,
    PermissionDeniedError,
    PortUnreachableError,
    ProcessLimitError,
    ProcessNotFoundError,
    SessionEndedError,
    SessionNotFoundError,
    SessionRequiredError,
    ShuttingDownError,
    TooljailError,
    ToolNotFoundError,
    TransportError,
    UnauthenticatedError,
    UnknownError,
    WorkspaceFileNotFoundError,
    WorkspaceFullError,
)

__version__ = "0.1.0"

__all__ = [
    "ApprovalEvent",
    "ApprovalEventKind",
    "ArtifactGoneError",
    "ArtifactInfo",
    "ArtifactNotFoundError",
    "ArtifactRef",
    "AsyncClient",
    "AsyncForward",
    "AsyncProcesses",
    "AsyncSession",
    "AsyncTerminal",
    "AsyncWatch",
    "BadTimeoutError",
    "CallIdConflictError",
    "CallInfo",
    "CallNotFoundError",
    "CallPage",
    "CallState",
    "CallStatus",
    "Client",
    "DaemonUnavailableError",
    "Diagnostic",
    "Effect",
    "EgressDenial",
    "EgressUnavailableError",
    "Forward",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidPathError",
    "InvalidRequestError",
    "JournalUnavailableError",
    "NotAwaitingApprovalError",
    "Output",
    "OverloadedError",
    "PermissionDeniedError",
    "PortUnreachableError",
    "ProcessLimitError",
    "ProcessNotFoundError",
    "Processes",
    "Session",
    "SessionEndedError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionRequiredError",
    "SessionState",
    "ShuttingDownError",
    "StreamKind",
    "Terminal",
    "ToolError",
    "ToolInfo",
    "ToolNotFoundError",
    "ToolResult",
    "TooljailError",
    "TransportError",
    "UnauthenticatedError",
    "UnknownError",
    "Usage",
    "Watch",
    "WorkspaceFileNotFoundError",
    "WorkspaceFullError",
    "__version__",
    "default_target",
    "tool",
]
