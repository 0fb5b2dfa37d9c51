"""What a client hands its router (`ClientLink`), and what both read of a call: no I/O.

A router sees its client only through `ClientLink`: how to dial a daemon, what
every RPC carries, and the retry policy. Requests travel as `Rpc` values (which
method, which message, which deadline), made anew on each try by a driver; a
call's events are decoded here, once for both clients and both routers.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from tooljail._types import Output, ToolResult
from tooljail._wire import error_from_rpc, output_from_proto, result_from_proto
from tooljail.errors import TooljailError, TransportError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "ClientLink",
    "Metadata",
    "Rpc",
    "backoff_s",
    "decode_event",
    "decode_result",
    "no_result_error",
    "protocol_error",
    "renamed_keyword",
]

Metadata = tuple[tuple[str, str], ...]
"""gRPC metadata: (key, value) pairs sent with every RPC."""


@dataclass(frozen=True, slots=True)
class Rpc:
    """One request to whichever daemon a router picks, made anew on each try.

    Attributes:
        method: The `ToolRunner` method of the daemon's stub ("Run", "GetCall", ...).
        message: The request message (None for a request stream).
        metadata: What the RPC carries: the client's name and credentials.
        timeout_s: The deadline of one try in seconds; None: no deadline (a
            call's own RPCs, which last as long as the tool may run).
        messages: For a request stream: what makes a fresh iterator of its
            messages, so a retry sends them all again.
        streamed: The answer is a stream of messages that a driver gathers
            into a list within the same try (a break is retried from the start).
    """

    method: str
    message: Any
    metadata: Metadata
    timeout_s: float | None = None
    messages: Callable[[], Iterable[Any]] | None = None
    streamed: bool = False

    def start(self, stub: Any) -> Any:
        """The RPC on `stub` (`grpc` or `grpc.aio`).

        A unary answer blocks (grpc) or is awaitable (grpc.aio), so only a
        driver starts one; a response stream starts without waiting, so a flow
        may start it and read it with `Read` steps.
        """
        message = self.message if self.messages is None else self.messages()
        return getattr(stub, self.method)(
            message, timeout=self.timeout_s, wait_for_ready=False, metadata=self.metadata
        )


def backoff_s(attempt: int) -> float:
    """0.1 s, 0.3 s, 0.9 s, ... (at most 3 s), each with up to 25% jitter."""
    return min(3.0, 0.1 * float(3**attempt)) * (1 + random.random() / 4)


@dataclass(frozen=True, slots=True)
class ClientLink:
    """What a router needs of the client it sends for, handed in by that client.

    Attributes:
        target: The target as the client shows it; it names the daemon in the
            errors of a client of one daemon.
        metadata: What every RPC carries (the client's name, its token).
        rpc_timeout_s: The deadline of one try of a unary RPC; None: none.
        retries: How many times a request is tried again after a transport failure.
        open_channel: A channel of a module (`grpc` or `grpc.aio`) to one
            daemon's address, with the client's credentials and options.
    """

    target: str
    metadata: Metadata
    rpc_timeout_s: float | None
    retries: int
    open_channel: Callable[[Any, str], Any]

    def rpc(
        self,
        method: str,
        message: Any = None,
        *,
        deadline: bool = True,
        messages: Callable[[], Iterable[Any]] | None = None,
        streamed: bool = False,
    ) -> Rpc:
        """`method` with `message`, the client's metadata and (when `deadline`) its RPC deadline."""
        timeout = self.rpc_timeout_s if deadline else None
        return Rpc(method, message, self.metadata, timeout, messages, streamed)

    def should_retry(self, error: TooljailError, attempt: int) -> bool:
        """Whether to send the same request again after `error` (attempt 0 is the first).

        The retry policy, in one place: only when the daemon could not be
        reached or the connection dropped, i.e. UNAVAILABLE without tooljail's
        `ErrorDetail` (`DaemonUnavailableError`). Anything the daemon answered
        (a `ShuttingDownError`, a `JournalUnavailableError`, or a code this SDK
        does not know, `UnknownError`) is not a transport failure and is never
        retried. The call id makes the retry join the call the daemon may
        already run, never start a second one.
        """
        return (
            attempt < self.retries
            and isinstance(error, TransportError)
            and error.status == "UNAVAILABLE"
        )

    def map_error(self, e: grpc.RpcError) -> TooljailError:
        """Our exception for a failed RPC (the one mapping of the SDK's edge)."""
        # A bare grpc.RpcError carries no status; every real call error does.
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else None
        trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
        code_name = code.name if code is not None else "UNKNOWN"
        return error_from_rpc(code_name, details, trailing, target=self.target)


# --- a call's events ---


def protocol_error(e: ValueError) -> TransportError:
    """The error for a message from the daemon that this SDK cannot read."""
    return TransportError(f"the daemon sent a message this SDK cannot read: {e}")


def no_result_error() -> TransportError:
    """The error for a call's stream that ended without its `Result`."""
    return TransportError(
        "the call's stream ended without a result; the call may still be running on "
        "the daemon: ask for it with get_call(call_id)"
    )


def decode_event(event: pb.CallEvent) -> Output | ToolResult | None:
    """One event of a call's stream; None for events the caller does not see.

    `Started` is skipped, and so is an event kind a newer daemon may add.

    Raises:
        TransportError: When the event cannot be decoded.
    """
    kind = event.WhichOneof("event")
    try:
        if kind == "output":
            return output_from_proto(event.output)
        if kind == "result":
            return result_from_proto(event.result)
    except ValueError as e:
        raise protocol_error(e) from e
    return None


def decode_result(m: pb.Result) -> ToolResult:
    """A call's final result.

    Raises:
        TransportError: When the message is empty (no status) or cannot be decoded.
    """
    if m.status == pb.STATUS_UNSPECIFIED:
        # A Result with no status is no result at all.
        raise no_result_error()
    try:
        return result_from_proto(m)
    except ValueError as e:
        raise protocol_error(e) from e


# --- renamed keywords ---

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def renamed_keyword(old: str, new: str, value: Any, given: Any) -> Any:
    """The value of a keyword renamed from `old` to `new`, warning when `old` was used.

    Args:
        old: The old keyword's name.
        new: The new keyword's name.
        value: What was given as `new` (None: not given).
        given: What was given as `old` (None: not given).

    Returns:
        `value`, or `given` when only the old keyword was used.

    Raises:
        TypeError: When both were given.
    """
    if given is None:
        return value
    if value is not None:
        raise TypeError(f"give {new}= only ({old}= is its old name), not both")
    warnings.warn(
        f"{old}= is deprecated here: it is now called {new}=", DeprecationWarning, _user_level()
    )
    return given


def _user_level() -> int:
    """The warnings stacklevel of the first frame outside this package: the user's line."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level
