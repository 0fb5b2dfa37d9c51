"""The daemon's one error edge: every exception an RPC ends with, as a gRPC status.

`STATUS_BY_ERROR` is the one table from the error tree (`tooljail.errors`) to
gRPC status codes; the code in the reply's `ErrorDetail` is the table class's
`code`, and the SDK's `ERRORS_BY_CODE` maps it back (a test pins that the two
tables and the proto's `ErrorCode` list agree).

`ErrorEdge`, a server interceptor, puts that table in front of every ToolRunner
method, so nothing leaves as gRPC's UNKNOWN with a Python exception's text:

- request bytes that do not parse as the method's message (corrupt protobuf,
  strings that are not UTF-8) end INVALID_ARGUMENT ("invalid_request");
- a `TooljailError` ends with its table status; one whose class the table does
  not list (a daemon-side `SandboxError`, say) ends INTERNAL ("internal");
- a `RecursionError` (JSON arguments nested thousands deep) ends
  INVALID_ARGUMENT: the request is the only thing that deep;
- any other exception ends INTERNAL ("internal"), logged with its traceback.

Every message and detail field is `bounded`, since it may echo the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
import grpc.aio

from tooljail.common import bounded
from tooljail.errors import (
    ArtifactGoneError,
    ArtifactNotFoundError,
    BadTimeoutError,
    CallIdConflictError,
    CallNotFoundError,
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
    UnauthenticatedError,
    WorkspaceFileNotFoundError,
    WorkspaceFullError,
)
from tooljail.wire import ERROR_DETAIL_KEY, error_detail_for

log = logging.getLogger(__name__)

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
    # The daemon's `JournalError` is one.
    JournalUnavailableError: grpc.StatusCode.UNAVAILABLE,
    InternalError: grpc.StatusCode.INTERNAL,
    SessionNotFoundError: grpc.StatusCode.NOT_FOUND,
    # The session's state is gone: retrying the same request cannot work.
    SessionEndedError: grpc.StatusCode.FAILED_PRECONDITION,
    WorkspaceFileNotFoundError: grpc.StatusCode.NOT_FOUND,
    InvalidPathError: grpc.StatusCode.INVALID_ARGUMENT,
    WorkspaceFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ArtifactNotFoundError: grpc.StatusCode.NOT_FOUND,
    ArtifactGoneError: grpc.StatusCode.NOT_FOUND,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    NotAwaitingApprovalError: grpc.StatusCode.FAILED_PRECONDITION,
    # Retrying cannot help: the daemon's config has no [egress] section.
    EgressUnavailableError: grpc.StatusCode.FAILED_PRECONDITION,
    SessionRequiredError: grpc.StatusCode.FAILED_PRECONDITION,
    ProcessNotFoundError: grpc.StatusCode.NOT_FOUND,
    ProcessLimitError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PortUnreachableError: grpc.StatusCode.FAILED_PRECONDITION,
}
"""Error class -> status. A subclass travels as the first listed class it derives from."""

TOO_DEEP_MESSAGE = (
    "the request nests too deeply to be read (JSON arrays or objects nested about "
    "a thousand levels or more): send flatter arguments"
)


def _listed(exc: TooljailError) -> type[TooljailError] | None:
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return cls
    return None


def status_for(exc: TooljailError) -> grpc.StatusCode:
    """The gRPC status for `exc`: its first class in the table, else INTERNAL."""
    listed = _listed(exc)
    return grpc.StatusCode.INTERNAL if listed is None else STATUS_BY_ERROR[listed]


def wire_error(exc: BaseException) -> TooljailError:
    """What the caller is told for `exc`: an error whose code the table lists.

    Args:
        exc: Whatever ended the RPC.

    Returns:
        `exc` itself when its class is (or derives from) one in the table;
        `InvalidRequestError` for a `RecursionError`; else an `InternalError`
        naming the exception (a daemon-side error such as `SandboxError`, or a bug).
    """
    if isinstance(exc, TooljailError):
        listed = _listed(exc)
        if listed is not None and exc.code == listed.code:
            return exc
        return InternalError(exc.message)
    if isinstance(exc, RecursionError):
        return InvalidRequestError(TOO_DEEP_MESSAGE)
    return InternalError(
        f"the daemon failed while handling the request ({type(exc).__name__}: {exc}); "
        "its log has the details"
    )


async def abort_with(context: grpc.aio.ServicerContext, exc: TooljailError) -> NoReturn:
    """End the RPC with the status for `exc` and its machine-readable detail.

    Raises:
        grpc.aio.AbortError: Always: that is how the RPC ends.
    """
    exc = wire_error(exc)
    detail = error_detail_for(exc)
    context.set_trailing_metadata(((ERROR_DETAIL_KEY, detail.SerializeToString()),))
    await context.abort(status_for(exc), bounded(exc.message))
    raise AssertionError("unreachable: abort raises")


class _Undecodable:
    """Stands for request bytes that do not parse, so the handler can refuse them."""

    def __init__(self, message_name: str, error: Exception) -> None:
        self.error = InvalidRequestError(
            f"the request is not a valid {message_name} message ({error}); "
            "send it with the tooljail.v1 stubs"
        )


def _lenient(deserializer: Callable[[bytes], Any], message_name: str) -> Callable[[bytes], Any]:
    # gRPC's own deserializer failure ends the RPC as UNKNOWN with the Python
    # exception's text, before any of our code runs: hand the handler a marker.
    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:
            return _Undecodable(message_name, exc)

    return deserialize


async def _end(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    if not isinstance(exc, TooljailError | RecursionError):
        log.exception("unexpected error in an RPC handler", exc_info=exc)
    await abort_with(context, wire_error(exc))


def _guard_unary(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await abort_with(context, request.error)
        try:
            return await behaviour(request, context)
        except grpc.aio.AbortError:
            raise  # the handler ended the RPC itself
        except Exception as exc:
            await _end(context, exc)

    return guarded


def _guard_stream(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, _Undecodable):
            await abort_with(context, request.error)
        try:
            async for response in behaviour(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _end(context, exc)

    return guarded


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A request stream's messages, the first one that could not be decoded raised."""
    async for request in requests:
        if isinstance(request, _Undecodable):
            raise request.error
        yield request


def _guard_stream_unary(
    behaviour: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]]:
    async def guarded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(_checked(requests), context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _end(context, exc)

    return guarded


def _guard_stream_stream(
    behaviour: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Any]],
) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Any]]:
    # Bidirectional (Terminal, ForwardPort): requests checked as a request
    # stream's, failures mapped as a response stream's.
    async def guarded(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        try:
            async for response in behaviour(_checked(requests), context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _end(context, exc)

    return guarded


class ErrorEdge(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Maps every failure of the service's methods through `STATUS_BY_ERROR`.

    Args:
        service: The protobuf descriptor of the service whose methods it guards
            (`tooljail.v1.ToolRunner`); health and reflection are left as they are.
    """

    def __init__(self, service: Any) -> None:
        self._prefix = f"/{service.full_name}/"
        # For the sentence that refuses bytes which do not parse.
        self._request_types: dict[str, str] = {
            m.name: m.input_type.full_name for m in service.methods
        }

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        if handler.request_deserializer is None:
            return handler
        name = self._request_types.get(method.removeprefix(self._prefix), "request")
        guarded: Any = handler._replace(
            request_deserializer=_lenient(handler.request_deserializer, name)
        )
        if handler.request_streaming:
            if handler.response_streaming:
                return guarded._replace(stream_stream=_guard_stream_stream(handler.stream_stream))
            return guarded._replace(stream_unary=_guard_stream_unary(handler.stream_unary))
        if handler.response_streaming:
            guarded = guarded._replace(unary_stream=_guard_stream(handler.unary_stream))
        else:
            guarded = guarded._replace(unary_unary=_guard_unary(handler.unary_unary))
        return guarded
