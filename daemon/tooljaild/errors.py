"""The one table from our errors to gRPC status codes, and the abort helper."""

from __future__ import annotations

from typing import NoReturn

import grpc
import grpc.aio

from tooljail._errors import (
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
    InvalidArgumentsError,
    InvalidRequestError,
    OverloadedError,
    ShuttingDownError,
    TooljailError,
    ToolNotFoundError,
)
from tooljail._wire import ERROR_DETAIL_KEY, error_detail_for
from tooljaild.journal import JournalError

STATUS_BY_ERROR: dict[type[TooljailError], grpc.StatusCode] = {
    ToolNotFoundError: grpc.StatusCode.NOT_FOUND,
    CallNotFoundError: grpc.StatusCode.NOT_FOUND,
    InvalidArgumentsError: grpc.StatusCode.INVALID_ARGUMENT,
    BadTimeoutError: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    CallIdConflictError: grpc.StatusCode.ALREADY_EXISTS,
    OverloadedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ShuttingDownError: grpc.StatusCode.UNAVAILABLE,
    # The journal cannot record the call (full or read-only disk): nothing ran.
    JournalError: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: TooljailError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        code = STATUS_BY_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


async def abort_with(context: grpc.aio.ServicerContext, exc: TooljailError) -> NoReturn:
    """End the RPC with the status for `exc` and its machine-readable detail."""
    detail = error_detail_for(exc)
    context.set_trailing_metadata(((ERROR_DETAIL_KEY, detail.SerializeToString()),))
    await context.abort(status_for(exc), exc.message)
    raise AssertionError("unreachable: abort raises")
