"""The one error tree of tooljail: every exception the SDK and the daemon raise.

    TooljailError
    ├── ToolNotFoundError (LookupError)          NOT_FOUND, code "tool_not_found"
    ├── CallNotFoundError (LookupError)          NOT_FOUND, code "call_not_found"
    ├── InvalidArgumentsError (ValueError)       INVALID_ARGUMENT, code "invalid_arguments"
    ├── BadTimeoutError (ValueError)             INVALID_ARGUMENT, code "bad_timeout"
    ├── InvalidRequestError (ValueError)         INVALID_ARGUMENT, code "invalid_request"
    ├── CallIdConflictError                      ALREADY_EXISTS, code "call_id_conflict"
    ├── OverloadedError                          RESOURCE_EXHAUSTED, code "overloaded"
    ├── ShuttingDownError                        UNAVAILABLE, code "shutting_down"
    ├── JournalUnavailableError                  UNAVAILABLE, code "journal_unavailable"
    ├── InternalError                            INTERNAL, code "internal"
    ├── SessionNotFoundError (LookupError)       NOT_FOUND, code "session_not_found"
    ├── SessionEndedError                        FAILED_PRECONDITION, code "session_ended"
    ├── WorkspaceFileNotFoundError (LookupError) NOT_FOUND, code "file_not_found"
    ├── InvalidPathError (ValueError)            INVALID_ARGUMENT, code "invalid_path"
    ├── WorkspaceFullError                       RESOURCE_EXHAUSTED, code "workspace_full"
    ├── ArtifactNotFoundError (LookupError)      NOT_FOUND, code "artifact_not_found"
    ├── ArtifactGoneError (LookupError)          NOT_FOUND, code "artifact_gone"
    ├── UnauthenticatedError (PermissionError)   UNAUTHENTICATED, code "unauthenticated"
    ├── PermissionDeniedError (PermissionError)  PERMISSION_DENIED, code "permission_denied"
    ├── NotAwaitingApprovalError                 FAILED_PRECONDITION, code "not_awaiting_approval"
    ├── EgressUnavailableError                   FAILED_PRECONDITION, code "egress_unavailable"
    ├── SessionRequiredError                     FAILED_PRECONDITION, code "session_required"
    ├── ProcessNotFoundError (LookupError)       NOT_FOUND, code "process_not_found"
    ├── ProcessLimitError                        RESOURCE_EXHAUSTED, code "process_limit"
    ├── PortUnreachableError (ConnectionError)   FAILED_PRECONDITION, code "port_unreachable"
    ├── UnknownError                             any status, a code this SDK does not know
    └── TransportError (ConnectionError)         a failed RPC without tooljail's detail
        └── DaemonUnavailableError               UNAVAILABLE: no daemon answers

The daemon raises these from its domain code (its own exceptions, such as a
sandbox that cannot start, derive from `TooljailError` too) and maps them to a
gRPC status and an `ErrorDetail` in one table (`tooljaild.edge.errors`); the SDK maps
a failed RPC back to the same classes by the detail's `code` through
`ERRORS_BY_CODE`. Every code is also listed in the proto, as `tooljail.v1.ErrorCode`.

Only a `TransportError` means the request may not have reached a daemon; the SDK
retries only `DaemonUnavailableError` (UNAVAILABLE without a detail: nothing
answered, or the connection dropped). Anything the daemon said, including a code
this SDK does not know (`UnknownError`), is its answer and is never retried.

A tool's own exception is never one of these: it is data in the call's `ToolResult`.
"""

from __future__ import annotations

__all__ = [
    "ERRORS_BY_CODE",
    "ArtifactGoneError",
    "ArtifactNotFoundError",
    "BadTimeoutError",
    "CallIdConflictError",
    "CallNotFoundError",
    "DaemonUnavailableError",
    "EgressUnavailableError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidPathError",
    "InvalidRequestError",
    "JournalUnavailableError",
    "NotAwaitingApprovalError",
    "OverloadedError",
    "PermissionDeniedError",
    "PortUnreachableError",
    "ProcessLimitError",
    "ProcessNotFoundError",
    "SessionEndedError",
    "SessionNotFoundError",
    "SessionRequiredError",
    "ShuttingDownError",
    "ToolNotFoundError",
    "TooljailError",
    "TransportError",
    "UnauthenticatedError",
    "UnknownError",
    "WorkspaceFileNotFoundError",
    "WorkspaceFullError",
]


class TooljailError(Exception):
    """Base of every error tooljail raises.

    Attributes:
        code: The machine-readable code carried on the wire. A class the daemon's
            table does not list travels as "internal".
        message: The sentence the error was made with.
    """

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolNotFoundError(TooljailError, LookupError):
    """No tool of that name is served."""

    code = "tool_not_found"


class CallNotFoundError(TooljailError, LookupError):
    """The daemon does not know (or no longer remembers) that call id."""

    code = "call_not_found"


class InvalidArgumentsError(TooljailError, ValueError):
    """The arguments do not match the tool's schema; the tool did not run.

    Attributes:
        parameter: The offending parameter ("" when the whole object is wrong).
        expected: What the schema expects there.
        actual: What was given.
    """

    code = "invalid_arguments"

    def __init__(
        self, message: str, *, parameter: str = "", expected: str = "", actual: str = ""
    ) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.expected = expected
        self.actual = actual


class BadTimeoutError(TooljailError, ValueError):
    """The requested timeout is outside the tool's bounds."""

    code = "bad_timeout"


class InvalidRequestError(TooljailError, ValueError):
    """The request itself is malformed (bad call id, bad JSON, bytes that do not parse, ...)."""

    code = "invalid_request"


class CallIdConflictError(TooljailError):
    """The call id is already used by a call with other arguments or another tool."""

    code = "call_id_conflict"


class OverloadedError(TooljailError):
    """The daemon is at its bound of concurrent and queued calls.

    Attributes:
        retry_after_s: When trying again makes sense.
    """

    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDownError(TooljailError):
    """The daemon is draining and takes no new calls: use another daemon or retry later."""

    code = "shutting_down"


class JournalUnavailableError(TooljailError):
    """The daemon cannot record calls in its journal, so it runs none; nothing ran.

    The daemon never runs a call it cannot record (that is what makes a retry
    under the same call id safe), so it refuses new calls until its operator
    fixes the journal: the message names the file and what is wrong with it.
    Not retried by the SDK: it is the daemon's answer, and lasts until fixed.

    Attributes:
        reason: What is wrong, when the daemon says: "full" (no space left),
            "unwritable" (read-only disk, file or directory), "busy", "corrupt",
            "incompatible" or "io"; "" when it did not say.
    """

    code = "journal_unavailable"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class InternalError(TooljailError):
    """The daemon failed while handling the request (a bug, or a broken sandbox host).

    The message says what failed; the daemon's log has the details.
    """

    code = "internal"


class SessionNotFoundError(TooljailError, LookupError):
    """No session of that id was ever known to this daemon (a typo, or another daemon's)."""

    code = "session_not_found"


class SessionEndedError(TooljailError):
    """The session has ended: its interpreter, variables and workspace files are gone.

    Nothing ran. Create a new session (and rebuild what the old one held).

    Attributes:
        reason: Why it ended: "closed" (by a client), "idle_ttl" (no call for its
            idle TTL), "max_lifetime", "sandbox_died" (its sandbox ended under
            it), "shutdown" (the daemon stopped) or "daemon_restart" (the
            daemon was restarted, or killed, while it was open); "" when the
            daemon did not say. Over many daemons the SDK itself says
            "daemon_lost" when the session's daemon is unreachable or was
            restarted, naming it in the message.
    """

    code = "session_ended"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class WorkspaceFileNotFoundError(TooljailError, LookupError):
    """No such file in the session's workspace."""

    code = "file_not_found"


class InvalidPathError(TooljailError, ValueError):
    """A workspace path that is absolute, leaves the workspace, or names a directory
    where a file is wanted: paths are relative to the workspace and stay inside it."""

    code = "invalid_path"


class WorkspaceFullError(TooljailError):
    """The write would pass the workspace's quota; nothing was written.

    Not transient, so not retried: free space in the workspace first (or open a
    session with a larger `workspace_bytes`, up to the daemon's bound).
    """

    code = "workspace_full"


class ArtifactNotFoundError(TooljailError, LookupError):
    """No artifact of that id was made by this client's calls (another client's is
    not found either: nothing is told of it)."""

    code = "artifact_not_found"


class ArtifactGoneError(TooljailError, LookupError):
    """This client's artifact existed and is gone.

    Attributes:
        reason: "evicted" (the store's byte bound made room for newer ones),
            "expired" (its age bound) or "deleted"; "" when the daemon did not say.
    """

    code = "artifact_gone"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class UnauthenticatedError(TooljailError, PermissionError):
    """The daemon requires a valid bearer token or client certificate, and the
    request had none it accepts. Its message tells nothing of the daemon's state.

    Not retried: pass `Client(token=...)` (or TOOLJAIL_TOKEN), or the TLS
    client certificate the daemon's operator issued.
    """

    code = "unauthenticated"


class PermissionDeniedError(TooljailError, PermissionError):
    """The caller's identity may not do this: a tool outside its allow-list
    (such a tool is not even listed to it), or an approval without
    `approver = true` in its policy."""

    code = "permission_denied"


class NotAwaitingApprovalError(TooljailError):
    """`approve` or `deny` named a call that does not wait for approval: it
    never did, or it was decided, timed out or cancelled (`get_call` says which)."""

    code = "not_awaiting_approval"


class EgressUnavailableError(TooljailError):
    """The request asks for egress or secrets, and the daemon has no `[egress]`
    section: its sandboxes have no network at all. Ask without them, or ask the
    operator to configure egress."""

    code = "egress_unavailable"


class SessionRequiredError(TooljailError):
    """The tool works on a session (`install_packages` installs into one) and the
    call names none: create a session and call the tool in it."""

    code = "session_required"


class ProcessNotFoundError(TooljailError, LookupError):
    """No process of that id in the caller's session: it never was, or it is
    another session's or another client's (nothing is told of those).
    `list_processes` names the session's processes."""

    code = "process_not_found"


class ProcessLimitError(TooljailError):
    """The session holds as many processes as it may (`[sessions]
    max_processes`, or its sandbox's pids limit): stop one first."""

    code = "process_limit"


class PortUnreachableError(TooljailError, ConnectionError):
    """Nothing listens on that port on the session's loopback (or the port is
    outside 1-65535): start the server first, and check the port it prints."""

    code = "port_unreachable"


class UnknownError(TooljailError):
    """The daemon refused the request with a code this SDK does not know.

    A newer daemon may send codes an older SDK has no class for: the request was
    answered (it is not a transport failure), so it is never retried.

    Attributes:
        code: The code the daemon sent (this instance's, not the class's).
        status: The gRPC status code name, e.g. "UNAVAILABLE".
    """

    code = "unknown"

    def __init__(self, message: str, *, code: str, status: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class TransportError(TooljailError, ConnectionError):
    """The RPC failed without an answer from tooljail: network, gRPC, protocol.

    Attributes:
        status: The gRPC status code name, e.g. "UNAVAILABLE".
    """

    code = "transport"

    def __init__(self, message: str, *, status: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.status = status


class DaemonUnavailableError(TransportError):
    """No daemon answers at the target, or the connection to it dropped."""

    code = "unavailable"


ERRORS_BY_CODE: dict[str, type[TooljailError]] = {
    cls.code: cls
    for cls in (
        ToolNotFoundError,
        CallNotFoundError,
        InvalidArgumentsError,
        BadTimeoutError,
        InvalidRequestError,
        CallIdConflictError,
        OverloadedError,
        ShuttingDownError,
        JournalUnavailableError,
        InternalError,
        SessionNotFoundError,
        SessionEndedError,
        WorkspaceFileNotFoundError,
        InvalidPathError,
        WorkspaceFullError,
        ArtifactNotFoundError,
        ArtifactGoneError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotAwaitingApprovalError,
        EgressUnavailableError,
        SessionRequiredError,
        ProcessNotFoundError,
        ProcessLimitError,
        PortUnreachableError,
    )
}
"""Wire code -> class, for the SDK's mapping of failed RPCs: every code the daemon sends."""
