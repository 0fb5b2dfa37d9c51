"""The one error tree of tooljail.

    TooljailError
    ├── ToolNotFoundError (LookupError)          NOT_FOUND, code "tool_not_found"
    ├── CallNotFoundError (LookupError)          NOT_FOUND, code "call_not_found"
    ├── InvalidArgumentsError (ValueError)       INVALID_ARGUMENT, code "invalid_arguments"
    ├── BadTimeoutError (ValueError)             INVALID_ARGUMENT, code "bad_timeout"
    ├── InvalidRequestError (ValueError)         INVALID_ARGUMENT, code "invalid_request"
    ├── CallIdConflictError                      ALREADY_EXISTS, code "call_id_conflict"
    ├── OverloadedError                          RESOURCE_EXHAUSTED, code "overloaded"
    ├── ShuttingDownError                        UNAVAILABLE, code "shutting_down"
    └── TransportError (ConnectionError)         any other failed RPC
        └── DaemonUnavailableError               UNAVAILABLE: no daemon answers

The daemon raises these from its domain code and maps them to a gRPC status and an
`ErrorDetail` in one table; the SDK maps a failed RPC back to the same classes by
the detail's `code`. A tool's own exception is never one of these: it is data in
the call's `ToolResult`.
"""

from __future__ import annotations


class TooljailError(Exception):
    """Base of every error tooljail raises.

    Attributes:
        code: The machine-readable code carried on the wire.
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
    """The request itself is malformed (bad call id, bad JSON, ...)."""

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


class TransportError(TooljailError, ConnectionError):
    """The RPC failed for a reason outside the tool: network, daemon, protocol.

    Attributes:
        status: The gRPC status code name, e.g. "UNAVAILABLE".
    """

    code = "transport"

    def __init__(self, message: str, *, status: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.status = status


class DaemonUnavailableError(TransportError):
    """No daemon answers at the target."""

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
    )
}
"""Wire code -> class, for the SDK's mapping of failed RPCs."""
