"""The SDK's clients: `Client` (blocking) and `AsyncClient` (asyncio).

Everything that does no I/O lives in `_BaseClient`: target normalisation,
argument checks, request building, event decoding and error mapping. `Client`
and `AsyncClient` add only the methods that touch the channel, so a fix to the
logic is made once for both.

Error contract: a tool that fails is not an exception, it is a `ToolResult` with
`status != SUCCESS`. Methods raise only for problems outside the tool: the
request was refused (`ToolNotFoundError`, `InvalidArgumentsError`, ...), or the
RPC failed (`TransportError`, `DaemonUnavailableError`). Bad arguments to the
methods themselves raise `TypeError` (wrong Python type) or a `TooljailError`
that is also a `ValueError` (wrong value) before anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Generator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
import grpc.aio

from tooljail._types import CallInfo, CallState, Diagnostic, Output, ToolInfo, ToolResult
from tooljail._wire import (
    call_info_from_proto,
    call_state_from_proto,
    diagnostic_from_proto,
    error_from_rpc,
    output_from_proto,
    result_from_proto,
    tool_info_from_proto,
)
from tooljail.errors import (
    BadTimeoutError,
    InvalidRequestError,
    TooljailError,
    TransportError,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

__all__ = ["AsyncClient", "Client", "default_socket_path", "default_target"]

CLIENT_KEY = "tooljail-client"
"""Metadata naming this client to the daemon (its share of calls is per client)."""

TARGET_ENV = "TOOLJAIL_TARGET"
"""Environment variable naming the daemon to dial when no target is given."""

MAX_RECEIVE_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message the SDK accepts (a result carries a tool's whole data)."""

# The generated stub is untyped; this alias gives mypy a typed constructor.
_new_stub: Callable[[Any], Any] = tooljail_pb2_grpc.ToolRunnerStub

# Target schemes gRPC resolves itself; anything else with "://" is a mistake such
# as "http://host:port", which gRPC would only reject later and obscurely.
_GRPC_SCHEMES = frozenset({"unix", "unix-abstract", "dns", "ipv4", "ipv6", "vsock"})


def default_socket_path() -> Path:
    """The Unix socket a daemon listens on, and a client dials, by default.

    Returns:
        `$XDG_RUNTIME_DIR/tooljail/tooljail.sock` when XDG_RUNTIME_DIR is set;
        otherwise `/run/tooljail/tooljail.sock` for root (the systemd
        RuntimeDirectory) and `/tmp/tooljail-<uid>/tooljail.sock` for anyone else.
    """
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return Path(runtime_dir) / "tooljail" / "tooljail.sock"
    uid = os.getuid()
    if uid == 0:
        return Path("/run/tooljail/tooljail.sock")
    return Path(f"/tmp/tooljail-{uid}/tooljail.sock")


def default_target() -> str:
    """The daemon a client dials when it is given no target.

    Returns:
        The TOOLJAIL_TARGET environment variable when set, else
        `unix://` + `default_socket_path()`.
    """
    env = os.environ.get(TARGET_ENV, "").strip()
    if env:
        return env
    return f"unix://{default_socket_path()}"


class _BaseClient:
    """What `Client` and `AsyncClient` share: everything that does no I/O."""

    _target: str
    _timeout: float | None
    _retries: int

    def __init__(
        self, target: str | None = None, *, timeout: float | None = None, retries: int = 3
    ) -> None:
        self._target = self._normalize_target(default_target() if target is None else target)
        self._timeout = self._check_seconds(timeout, "timeout", InvalidRequestError)
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise TypeError(f"retries must be an int, got {retries!r}")
        if retries < 0:
            raise InvalidRequestError(f"retries must be 0 or more, got {retries}")
        self._retries = retries
        # Who we are, for the daemon's fairness between agent hosts.
        self._metadata = ((CLIENT_KEY, f"{socket.gethostname()}/{os.getpid()}"),)

    @staticmethod
    def _check_seq(from_seq: int) -> int:
        if isinstance(from_seq, bool) or not isinstance(from_seq, int):
            raise TypeError(f"from_seq must be an int, got {from_seq!r}")
        if from_seq < 0:
            raise InvalidRequestError(f"from_seq must be 0 or more, got {from_seq}")
        return from_seq

    # --- retries ---

    @staticmethod
    def _new_call_id() -> str:
        """An id for a call the caller gave none: retries send the same one."""
        return uuid.uuid4().hex

    def _should_retry(self, error: TooljailError, attempt: int) -> bool:
        """Whether to send the same call again after `error` (attempt 0 is the first).

        Only when the daemon could not be reached or dropped the connection
        (UNAVAILABLE): the call id makes the retry join the call the daemon may
        already run, never start a second one.
        """
        return (
            attempt < self._retries
            and isinstance(error, TransportError)
            and error.status == "UNAVAILABLE"
        )

    @staticmethod
    def _backoff_s(attempt: int) -> float:
        """0.1 s, 0.3 s, 0.9 s, ... (at most 3 s), each with up to 25% jitter."""
        return min(3.0, 0.1 * float(3**attempt)) * (1 + random.random() / 4)

    @property
    def target(self) -> str:
        """The gRPC target this client dials, normalised (e.g. "unix:///run/x.sock")."""
        return self._target

    @property
    def timeout(self) -> float | None:
        """The deadline of each unary RPC in seconds; None means no deadline."""
        return self._timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target={self._target!r}, timeout={self._timeout!r})"

    # --- target and channel ---

    @staticmethod
    def _normalize_target(target: str) -> str:
        """A gRPC target from what a user may write.

        Accepts "unix:///abs/path", "unix:/abs", "unix:relative" (made absolute),
        a bare path ("/x/y.sock", "./y.sock", "~/y.sock"), "host:port", and any
        target with a scheme gRPC resolves ("dns:///h:p", "ipv4:...", ...).

        Raises:
            TypeError: When the target is not a string.
            InvalidRequestError: When the target is empty or cannot name a daemon.
        """
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, got {type(target).__name__}")
        t = target.strip()
        if not t:
            raise InvalidRequestError("target is empty: give a socket path or host:port")
        if t.startswith(("/", "./", "../", "~")):
            return "unix://" + os.path.abspath(os.path.expanduser(t))
        scheme, sep, rest = t.partition(":")
        if sep and scheme == "unix":
            if rest.startswith("//"):
                path = rest[2:]
                if not path.startswith("/"):
                    raise InvalidRequestError(
                        f"target {target!r}: unix:// needs an absolute path "
                        "(three slashes: unix:///path/to.sock)"
                    )
                return t
            if not rest:
                raise InvalidRequestError(f"target {target!r} names no socket path")
            return "unix://" + os.path.abspath(os.path.expanduser(rest))
        if sep and scheme.lower() in _GRPC_SCHEMES:
            return t
        if "://" in t:
            raise InvalidRequestError(
                f"target {target!r}: unsupported scheme {scheme!r}; use host:port, "
                "a socket path, or unix:///path/to.sock"
            )
        return t

    @staticmethod
    def _channel_options() -> list[tuple[str, Any]]:
        """Options for the gRPC channel (same for the sync and the async one)."""
        return [("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES)]

    # --- argument checks ---

    @staticmethod
    def _check_seconds(value: float | None, what: str, error: type[TooljailError]) -> float | None:
        """A duration in seconds: None, or a positive finite number.

        Raises:
            TypeError: When the value is not a number (bool is not a number here).
            TooljailError: Of class `error`, when the number is not positive and finite.
        """
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{what} must be a number of seconds or None, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise error(f"{what} must be a positive number of seconds, got {value!r}")
        return float(value)

    @staticmethod
    def _check_tool(tool: str) -> str:
        if not isinstance(tool, str):
            raise TypeError(f"tool must be a str (the tool's name), got {type(tool).__name__}")
        if not tool:
            raise InvalidRequestError("tool name is empty")
        return tool

    @staticmethod
    def _check_call_id(call_id: str | None, *, required: bool) -> str:
        """A call id as sent on the wire ("" asks the daemon to generate one).

        Raises:
            TypeError: When the id is not a string (or None where allowed).
            InvalidRequestError: When the id is empty (or None where required).
        """
        if call_id is None and not required:
            return ""
        if not isinstance(call_id, str):
            raise TypeError(f"call_id must be a str, got {type(call_id).__name__}")
        if not call_id:
            # "" on the wire means "generate one": an explicit empty id is a bug.
            raise InvalidRequestError("call_id is empty")
        return call_id

    @staticmethod
    def _encode_args(args: dict[str, Any] | None) -> str:
        """The arguments as the JSON object text of `CallRequest.arguments_json`.

        Raises:
            TypeError: When `args` is not a dict with str keys (or None for {}).
            InvalidRequestError: When a value cannot be written as JSON.
        """
        if args is None:
            return "{}"
        if not isinstance(args, dict):
            raise TypeError(
                f"args must be a dict of argument name to value, got {type(args).__name__}"
            )
        for key in args:
            if not isinstance(key, str):
                raise TypeError(f"argument names must be str, got {key!r}")
        try:
            return json.dumps(args, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"args cannot be sent as JSON: {e}") from e

    def _build_call_request(
        self,
        tool: str,
        args: dict[str, Any] | None,
        *,
        timeout: float | None,
        call_id: str | None,
    ) -> pb.CallRequest:
        """The `CallRequest` for a call, after checking every argument.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When the tool name or call id is empty, or the
                arguments are not JSON-serialisable.
            BadTimeoutError: When the timeout is not a positive finite number.
        """
        checked_timeout = self._check_seconds(timeout, "timeout", BadTimeoutError)
        return pb.CallRequest(
            tool=self._check_tool(tool),
            arguments_json=self._encode_args(args),
            call_id=self._check_call_id(call_id, required=False) or self._new_call_id(),
            # 0 on the wire means "the tool's default timeout".
            timeout_s=checked_timeout or 0.0,
        )

    # --- decoding ---

    @staticmethod
    def _protocol_error(e: ValueError) -> TransportError:
        return TransportError(f"the daemon sent a message this SDK cannot read: {e}")

    @classmethod
    def _decode_event(cls, event: pb.CallEvent) -> Output | ToolResult | None:
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
            raise cls._protocol_error(e) from e
        return None

    @classmethod
    def _decode_result(cls, m: pb.Result) -> ToolResult:
        if m.status == pb.STATUS_UNSPECIFIED:
            # A Result with no status is no result at all.
            raise cls._no_result_error()
        try:
            return result_from_proto(m)
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_tools(cls, resp: pb.ListToolsResponse) -> list[ToolInfo]:
        try:
            return [tool_info_from_proto(t) for t in resp.tools]
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_diagnostics(cls, resp: pb.ListToolsResponse) -> list[Diagnostic]:
        try:
            return [diagnostic_from_proto(d) for d in resp.diagnostics]
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_call_info(cls, m: pb.CallInfo) -> CallInfo:
        try:
            return call_info_from_proto(m)
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_cancel(cls, m: pb.CancelResponse) -> CallState:
        try:
            return call_state_from_proto(m.state)
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @staticmethod
    def _no_result_error() -> TransportError:
        return TransportError(
            "the call's stream ended without a result; the call may still be running on "
            "the daemon: ask for it with get_call(call_id)"
        )

    # --- errors ---

    def _map_rpc_error(self, e: grpc.RpcError) -> TooljailError:
        """Our exception for a failed RPC (the one mapping of the SDK's edge)."""
        # A bare grpc.RpcError carries no status; every real call error does.
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else None
        trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
        code_name = code.name if code is not None else "UNKNOWN"
        return error_from_rpc(code_name, details, trailing, target=self._target)

    @staticmethod
    def _openai_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in tools]


class Client(_BaseClient):
    """A blocking client of one tooljail daemon.

    Example:
        with Client() as client:
            result = client.call("execute_python_code", {"code": "print(1)"})

    Args:
        target: The daemon: "unix:///path.sock", a bare socket path, or
            "host:port". None means `default_target()`.
        timeout: The deadline in seconds of each unary RPC (`list_tools`,
            `get_call`, `cancel`, ...). None means no deadline. It does not bound
            `call`/`stream`, which last as long as the tool's own timeout.
        retries: How many times `call`, `stream` and `attach` try again when the
            daemon cannot be reached or the connection drops (UNAVAILABLE), with
            backoff (0.1 s, 0.3 s, 0.9 s, ...). Every try carries the same call
            id (the SDK makes one when none is given), so the daemon joins the
            call it already runs instead of running it twice; a broken stream
            resumes with `attach` after the last chunk received.

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the target is unusable or the timeout is not
            a positive number.
    """

    def __init__(
        self, target: str | None = None, *, timeout: float | None = None, retries: int = 3
    ) -> None:
        super().__init__(target, timeout=timeout, retries=retries)
        # Plaintext: the default target is a Unix socket guarded by file modes.
        self._channel = grpc.insecure_channel(self._target, options=self._channel_options())
        self._stub = _new_stub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel; RPCs still in flight fail. Calling it twice is fine."""
        self._channel.close()

    def _unary(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            raise self._map_rpc_error(e) from e

    def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves.

        Raises:
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        resp: pb.ListToolsResponse = self._unary(self._stub.ListTools, pb.ListToolsRequest())
        return self._decode_tools(resp)

    def diagnostics(self) -> list[Diagnostic]:
        """The problems the daemon found while loading user tools.

        Raises:
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        resp: pb.ListToolsResponse = self._unary(self._stub.ListTools, pb.ListToolsRequest())
        return self._decode_diagnostics(resp)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The served tools as OpenAI function-calling tool definitions.

        Raises:
            TransportError: When the RPC fails.
        """
        return self._openai_tools(self.list_tools())

    def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """Runs a tool and waits for its result; output chunks are not kept.

        A tool that fails, times out or is cancelled is a result, not an
        exception: check `result.status` (and `result.effect` before retrying).

        Args:
            tool: The tool's name.
            args: The tool's arguments (a JSON-serialisable dict); None means {}.
            timeout: The call's timeout in seconds, within the tool's bounds.
                None means the tool's default. Sent to the daemon, which enforces it.
            call_id: An idempotency key: the same id and arguments return the
                stored outcome instead of running again. None: the SDK makes one.

        Returns:
            The call's one final result.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When an argument is malformed (or the daemon says so).
            BadTimeoutError: When the timeout is out of bounds.
            ToolNotFoundError: When no such tool is served.
            InvalidArgumentsError: When the arguments do not fit the tool's schema.
            CallIdConflictError: When the call id was used with other arguments.
            OverloadedError: When the daemon is full; see `retry_after_s`.
            ShuttingDownError: When the daemon is draining.
            TransportError: When the RPC fails or ends without a result.
        """
        request = self._build_call_request(tool, args, timeout=timeout, call_id=call_id)
        attempt = 0
        while True:
            try:
                return self._decode_result(
                    self._stub.Run(request, wait_for_ready=False, metadata=self._metadata)
                )
            except grpc.RpcError as e:
                error = self._map_rpc_error(e)
                if not self._should_retry(error, attempt):
                    raise error from e
            time.sleep(self._backoff_s(attempt))
            attempt += 1

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        call_id: str | None = None,
    ) -> Generator[Output | ToolResult, None, None]:
        """Runs a tool and yields its output as it arrives, then its result.

        Arguments are checked when `stream` is called, not at the first `next()`.

        Closing the iterator before the result (`break`, `.close()`, garbage
        collection) cancels the RPC only: the call keeps running on the daemon.
        To stop it, pass a `call_id` and call `cancel(call_id)`; to get its
        outcome later, `get_call(call_id)`.

        Args:
            tool: The tool's name.
            args: The tool's arguments (a JSON-serialisable dict); None means {}.
            timeout: The call's timeout in seconds; None means the tool's default.
            call_id: An idempotency key; None lets the SDK make one.

        Returns:
            An iterator of `Output` chunks in order, and the `ToolResult` last.

        Raises:
            TypeError, InvalidRequestError, BadTimeoutError: As for `call`, at once.
            TooljailError: As for `call`, from the iterator.
        """
        request = self._build_call_request(tool, args, timeout=timeout, call_id=call_id)
        return self._stream(request)

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> Generator[Output | ToolResult, None, None]:
        """Follows a call the daemon knows: its output from `from_seq` on, then its result.

        For a caller that lost its stream: pass the last `Output.seq` it saw + 1,
        and nothing is missing and nothing comes twice (while the daemon still
        keeps the chunks; an `Output` of stream NOTICE says when some are gone).
        It follows the call to its real end, past a timeout its caller heard.

        Raises:
            CallNotFoundError: When the daemon does not know the call.
            TooljailError: As for `stream`.
        """
        request = pb.AttachRequest(
            call_id=self._check_call_id(call_id, required=True),
            from_seq=self._check_seq(from_seq),
        )
        return self._follow(
            lambda: self._stub.Attach(request, wait_for_ready=False, metadata=self._metadata),
            request,
        )

    def _stream(self, request: pb.CallRequest) -> Generator[Output | ToolResult, None, None]:
        return self._follow(
            lambda: self._stub.Call(request, wait_for_ready=False, metadata=self._metadata), request
        )

    def _follow(
        self, start: Callable[[], Any], request: pb.CallRequest | pb.AttachRequest
    ) -> Generator[Output | ToolResult, None, None]:
        """The events of one call; a dropped connection is resumed where it broke."""
        progress = _Progress(request)
        attempt = 0
        rpc = start()
        while True:
            try:
                for event in rpc:
                    if progress.result is not None:
                        # Nothing may follow the Result; read on only to reach the status.
                        continue
                    item = progress.take(self._decode_event(event))
                    if item is not None:
                        yield item
                break
            except grpc.RpcError as e:
                # Once the result is in, the call's outcome is known: a failure while
                # reading the final status changes nothing for the caller.
                if progress.result is not None:
                    break
                error = self._map_rpc_error(e)
                if not self._should_retry(error, attempt):
                    raise error from e
            finally:
                # Left early (caller closed us, or an error): stop the RPC. Not after
                # the result, so the daemon's handler finishes undisturbed.
                if progress.result is None:
                    rpc.cancel()
            time.sleep(self._backoff_s(attempt))
            attempt += 1
            rpc = progress.resume(self._stub, start, self._metadata)
        if progress.result is None:
            raise self._no_result_error()

    def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call: its state and, once ended, its result.

        Raises:
            CallNotFoundError: When the daemon does not remember the call.
            TransportError: When the RPC fails.
        """
        request = pb.GetCallRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CallInfo = self._unary(self._stub.GetCall, request)
        return self._decode_call_info(resp)

    def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call; effects already done stay done.

        Returns:
            The call's state after the cancel was handled (a finished call keeps
            its state).

        Raises:
            CallNotFoundError: When the daemon does not remember the call.
            TransportError: When the RPC fails.
        """
        request = pb.CancelRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CancelResponse = self._unary(self._stub.Cancel, request)
        return self._decode_cancel(resp)


class AsyncClient(_BaseClient):
    """An asyncio client of one tooljail daemon; the async twin of `Client`.

    Create it inside the event loop that uses it (gRPC binds the channel to it).

    Example:
        async with AsyncClient() as client:
            async for item in client.stream("execute_python_code_stream", {...}):
                ...

    Args:
        target: As for `Client`.
        timeout: As for `Client`: the deadline of each unary RPC; None means none.
        retries: As for `Client`.

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the target is unusable or the timeout is not
            a positive number.
    """

    def __init__(
        self, target: str | None = None, *, timeout: float | None = None, retries: int = 3
    ) -> None:
        super().__init__(target, timeout=timeout, retries=retries)
        self._channel = grpc.aio.insecure_channel(self._target, options=self._channel_options())
        self._stub = _new_stub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; RPCs still in flight are cancelled."""
        await self._channel.close()

    async def _unary(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            raise self._map_rpc_error(e) from e

    async def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves. See `Client.list_tools`."""
        resp: pb.ListToolsResponse = await self._unary(self._stub.ListTools, pb.ListToolsRequest())
        return self._decode_tools(resp)

    async def diagnostics(self) -> list[Diagnostic]:
        """The problems found while loading user tools. See `Client.diagnostics`."""
        resp: pb.ListToolsResponse = await self._unary(self._stub.ListTools, pb.ListToolsRequest())
        return self._decode_diagnostics(resp)

    async def openai_tools(self) -> list[dict[str, Any]]:
        """The served tools as OpenAI tool definitions. See `Client.openai_tools`."""
        return self._openai_tools(await self.list_tools())

    async def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        # The tool call's own timeout, enforced by the daemon: not an await deadline.
        timeout: float | None = None,  # noqa: ASYNC109
        call_id: str | None = None,
    ) -> ToolResult:
        """Runs a tool and waits for its result. See `Client.call` for the contract.

        Cancelling the awaiting task cancels the RPC only, not the call on the daemon.
        """
        request = self._build_call_request(tool, args, timeout=timeout, call_id=call_id)
        attempt = 0
        while True:
            try:
                return self._decode_result(
                    await self._stub.Run(request, wait_for_ready=False, metadata=self._metadata)
                )
            except grpc.RpcError as e:
                error = self._map_rpc_error(e)
                if not self._should_retry(error, attempt):
                    raise error from e
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        call_id: str | None = None,
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Runs a tool and yields its output as it arrives, then its result.

        Arguments are checked when `stream` is called. Closing the iterator early
        (`break` then `aclose()`, e.g. via `contextlib.aclosing`) cancels the RPC
        only: the call keeps running on the daemon; use `cancel(call_id)` to stop
        it. See `Client.stream`.
        """
        request = self._build_call_request(tool, args, timeout=timeout, call_id=call_id)
        return self._stream(request)

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """Follows a call the daemon knows. See `Client.attach`."""
        request = pb.AttachRequest(
            call_id=self._check_call_id(call_id, required=True),
            from_seq=self._check_seq(from_seq),
        )
        return self._follow(
            lambda: self._stub.Attach(request, wait_for_ready=False, metadata=self._metadata),
            request,
        )

    def _stream(self, request: pb.CallRequest) -> AsyncGenerator[Output | ToolResult, None]:
        return self._follow(
            lambda: self._stub.Call(request, wait_for_ready=False, metadata=self._metadata), request
        )

    async def _follow(
        self, start: Callable[[], Any], request: pb.CallRequest | pb.AttachRequest
    ) -> AsyncGenerator[Output | ToolResult, None]:
        """The events of one call; a dropped connection is resumed where it broke."""
        progress = _Progress(request)
        attempt = 0
        rpc = start()
        while True:
            try:
                async for event in rpc:
                    if progress.result is not None:
                        continue  # nothing may follow the Result (see Client._follow)
                    item = progress.take(self._decode_event(event))
                    if item is not None:
                        yield item
                break
            except grpc.RpcError as e:
                if progress.result is not None:
                    break
                error = self._map_rpc_error(e)
                if not self._should_retry(error, attempt):
                    raise error from e
            finally:
                if progress.result is None:
                    rpc.cancel()
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1
            rpc = progress.resume(self._stub, start, self._metadata)
        if progress.result is None:
            raise self._no_result_error()

    async def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call. See `Client.get_call`."""
        request = pb.GetCallRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CallInfo = await self._unary(self._stub.GetCall, request)
        return self._decode_call_info(resp)

    async def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call. See `Client.cancel`."""
        request = pb.CancelRequest(call_id=self._check_call_id(call_id, required=True))
        resp: pb.CancelResponse = await self._unary(self._stub.Cancel, request)
        return self._decode_cancel(resp)


class _Progress:
    """How far a caller got in one call's events, to resume it after a drop."""

    def __init__(self, request: pb.CallRequest | pb.AttachRequest) -> None:
        self._request = request
        self._last_seq = (
            max(0, request.from_seq - 1) if isinstance(request, pb.AttachRequest) else 0
        )
        self._seen = False
        self.result: ToolResult | None = None

    def take(self, item: Output | ToolResult | None) -> Output | ToolResult | None:
        """Note an event; return it unless it is one the caller already has."""
        if item is None:
            self._seen = True  # Started: the daemon has the call
            return None
        self._seen = True
        if isinstance(item, ToolResult):
            self.result = item
            return item
        if item.seq:
            if item.seq <= self._last_seq:
                return None  # replayed after a resume: the caller has it
            self._last_seq = item.seq
        return item

    def resume(self, stub: Any, start: Callable[[], Any], metadata: Any) -> Any:
        """The RPC that picks up where the broken one stopped.

        Before the daemon was seen to have the call, the same request again
        (its call id makes the daemon join a call it already runs); after,
        Attach from the chunk after the last one the caller got.
        """
        if not self._seen and isinstance(self._request, pb.CallRequest):
            return start()
        call_id = self._request.call_id
        return stub.Attach(
            pb.AttachRequest(call_id=call_id, from_seq=self._last_seq + 1),
            wait_for_ready=False,
            metadata=metadata,
        )
