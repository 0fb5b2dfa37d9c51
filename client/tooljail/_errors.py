"""The error tree's old, private home: kept so that `tooljail._errors` imports work.

The tree lives in `tooljail.errors`; import it from there (or from `tooljail`).
"""

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

__all__ = [
    "ERRORS_BY_CODE",
    "BadTimeoutError",
    "CallIdConflictError",
    "CallNotFoundError",
    "DaemonUnavailableError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "JournalUnavailableError",
    "OverloadedError",
    "ShuttingDownError",
    "ToolNotFoundError",
    "TooljailError",
    "TransportError",
    "UnknownError",
]
