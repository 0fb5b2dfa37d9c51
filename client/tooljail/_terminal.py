"""`Terminal` and `AsyncTerminal`: a shell on a PTY in a session, over one gRPC stream.

Made by `Client.terminal(session_id)` / `Session.terminal()` (and the async
twins). The stream is rpc Terminal: the first message opens it, the daemon
answers with the shell's `ProcessInfo`, then bytes both ways, and last the
shell's exit. Both directions are bounded: `write` waits while gRPC's flow
control has no room (the PTY in the sandbox is full), and output is read from
the stream only as fast as `read` is called (a few messages are read ahead),
so a terminal nobody reads stops the shell's writes, as a real one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

import grpc

from tooljail._session_base import check_session_id
from tooljail._types import ProcessInfo
from tooljail._wire import process_info_from_proto
from tooljail.errors import InvalidRequestError, TooljailError, TransportError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "AsyncTerminal",
    "Opening",
    "StreamEnd",
    "Terminal",
    "open_request",
    "session_stream_target",
    "session_stream_target_async",
]

WRITE_CHUNK_BYTES = 64 * 1024
"""Bytes per data message: well under the daemon's per-message bound (1 MiB)."""

READ_AHEAD = 4
"""Output messages read from the stream before `read` asks for them."""

MapError = Callable[[grpc.RpcError], TooljailError]


class _AsyncClosable(Protocol):
    async def close(self) -> None: ...


_Closable = TypeVar("_Closable", bound=_AsyncClosable)


def _check_size(value: int | None, what: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 1 <= value <= 10_000:
        raise InvalidRequestError(f"{what} must be from 1 to 10000, got {value}")
    return value


def open_request(
    session_id: str,
    rows: int | None,
    cols: int | None,
    argv: Sequence[str] | None,
    env: Mapping[str, str] | None,
) -> pb.TerminalInput:
    """The first message of a terminal (checked: nothing is sent if it is wrong).

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the session id is empty or a size is out of range.
    """
    if argv is not None and (isinstance(argv, str) or not all(isinstance(a, str) for a in argv)):
        raise TypeError("argv must be a sequence of str (the program and its arguments)")
    if env is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError("env must map str to str")
    return pb.TerminalInput(
        open=pb.TerminalOpen(
            session_id=check_session_id(session_id),
            rows=_check_size(rows, "rows"),
            cols=_check_size(cols, "cols"),
            argv=list(argv or ()),
            env=dict(env or {}),
        )
    )


def _pieces(data: bytes | bytearray | memoryview) -> Iterator[bytes]:
    if isinstance(data, str) or not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__} (encode a str)")
    view = memoryview(data).cast("B")
    for start in range(0, len(view), WRITE_CHUNK_BYTES):
        yield bytes(view[start : start + WRITE_CHUNK_BYTES])


class StreamEnd:
    """Marks the end of a request iterator (its half close)."""


_END = StreamEnd()


def session_stream_target(client: Any, session_id: str) -> tuple[Any, Any, MapError]:
    """The stub of the daemon that holds `session_id`, the metadata an RPC carries,
    and how to map an RPC's failure there, for a blocking `Client`.

    Raises:
        SessionEndedError: reason "daemon_lost", when routed and its daemon is gone.
        TooljailError: When no daemon is serving.
    """
    from tooljail._routing import Route, RouteKind

    router = client._router
    daemon = router.run(router._stream_daemon(Route(RouteKind.SESSION, session_id)))
    return daemon.stub, client._link.metadata, lambda e: router.map_error(daemon, e)


async def session_stream_target_async(client: Any, session_id: str) -> tuple[Any, Any, MapError]:
    """As `session_stream_target`, for an `AsyncClient`."""
    from tooljail._routing import Route, RouteKind

    router = client._router
    daemon = await router.run(router._stream_daemon(Route(RouteKind.SESSION, session_id)))
    return daemon.stub, client._link.metadata, lambda e: router.map_error(daemon, e)


def _exit_code(info: ProcessInfo | None) -> int | None:
    if info is None:
        return None
    if info.exit_code is not None:
        return info.exit_code
    return 128 + info.signal if info.signal else None


class Terminal:
    """A shell on a PTY in a session (blocking). Use it as a context manager.

    Example:
        with session.terminal(rows=24, cols=80) as term:
            term.write(b"echo $((6*7))\\n")
            print(term.read(timeout=5))

    `read` returns the PTY's next bytes (b"" once the shell exited; then
    `exit_code` and `process` tell how); `write` sends keys (Ctrl-C is b"\\x03");
    `resize` changes the window; `signal` signals the foreground process
    group; `close` hangs the shell up (SIGHUP, then SIGKILL after a grace) if
    it still runs.
    """

    def __init__(self, stub: Any, metadata: Any, map_error: MapError, first: pb.TerminalInput):
        self._map_error = map_error
        # Bounded: `write` waits while gRPC has not taken the previous messages.
        self._requests: queue.Queue[pb.TerminalInput | StreamEnd] = queue.Queue(maxsize=4)
        self._requests.put(first)
        self._call = stub.Terminal(self._request_iterator(), metadata=metadata)
        self._closed = False
        self._exited: ProcessInfo | None = None
        try:
            opened = next(self._call)
            if opened.WhichOneof("kind") != "opened":
                raise TransportError("the daemon answered a terminal with no `opened` first")
        except BaseException as e:
            self._closed = True
            self._call.cancel()
            self._end_requests()  # gRPC's thread reading them ends too
            if isinstance(e, grpc.RpcError):
                raise self._map_error(e) from e
            if isinstance(e, StopIteration):
                raise TransportError("the terminal's stream ended before it opened") from None
            raise
        self.process: ProcessInfo = process_info_from_proto(opened.opened)
        """The shell as a process of the session; once it exited, how it ended."""
        self._output: queue.Queue[bytes | BaseException | StreamEnd] = queue.Queue(READ_AHEAD)
        self._reader = threading.Thread(
            target=self._read_stream, name="tooljail-terminal", daemon=True
        )
        self._reader.start()

    def _end_requests(self) -> None:
        """Ends the request iterator, whatever it still held (the stream is over)."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._requests.get_nowait()
        with contextlib.suppress(queue.Full):
            self._requests.put_nowait(_END)

    def _request_iterator(self) -> Iterator[pb.TerminalInput]:
        while not isinstance(item := self._requests.get(), StreamEnd):
            yield item

    def _put(self, item: bytes | BaseException | StreamEnd) -> bool:
        """Hands `item` to `read`; False once the terminal is closed (nobody reads)."""
        while not self._closed:
            try:
                self._output.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        with contextlib.suppress(queue.Full):
            self._output.put_nowait(_END)
        return False

    def _read_stream(self) -> None:
        try:
            for message in self._call:
                kind = message.WhichOneof("kind")
                if kind == "data":
                    if not self._put(message.data):
                        return
                elif kind == "exited":
                    self._exited = process_info_from_proto(message.exited)
                    self.process = self._exited
            self._put(_END)
        except grpc.RpcError as e:
            self._put(_END if self._closed else self._map_error(e))
        except Exception as e:  # a message this SDK cannot read
            self._put(e)

    @property
    def exit_code(self) -> int | None:
        """The shell's exit status once it exited (128 + N when signal N ended it)."""
        return _exit_code(self._exited)

    def read(self, timeout: float | None = None) -> bytes:
        """The PTY's next bytes, as they came.

        Args:
            timeout: Seconds to wait at most; None waits until bytes come.

        Returns:
            The next bytes; b"" once the shell exited (and every byte was read).

        Raises:
            TimeoutError: When nothing came within `timeout`.
            TooljailError: When the stream failed (the session ended, ...).
        """
        try:
            item = self._output.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the terminal printed nothing within {timeout:g}s") from None
        if isinstance(item, StreamEnd):
            self._output.put(item)  # every later read sees the end too
            return b""
        if isinstance(item, BaseException):
            self._output.put(item)
            raise item
        return item

    def _send(self, message: pb.TerminalInput) -> None:
        # Waits while gRPC has not taken the previous messages (the PTY is full),
        # but not for a stream that has ended: nothing would take it any more.
        while True:
            if self._closed or self._call.done():
                raise InvalidRequestError("this terminal has ended (or was closed)")
            try:
                self._requests.put(message, timeout=0.1)
                return
            except queue.Full:
                continue

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Types `data` into the terminal (waits while the PTY has no room)."""
        for piece in _pieces(data):
            self._send(pb.TerminalInput(data=piece))

    def resize(self, rows: int, cols: int) -> None:
        """Sets the window size (the shell gets SIGWINCH)."""
        resize = pb.TerminalResize(rows=_check_size(rows, "rows"), cols=_check_size(cols, "cols"))
        self._send(pb.TerminalInput(resize=resize))

    def signal(self, signum: int) -> None:
        """Sends `signum` to the terminal's foreground process group (2: as Ctrl-C)."""
        if not isinstance(signum, int) or not 1 <= signum <= 64:
            raise InvalidRequestError(f"signal must be a signal number (1-64), got {signum!r}")
        self._send(pb.TerminalInput(signal=signum))

    def close(self) -> None:
        """Ends the stream: a shell still running is hung up. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._call.cancel()
        self._end_requests()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncTerminal:
    """The asyncio twin of `Terminal`; made by `await client.terminal(...)` or
    `async with session.terminal() as term` (see `Terminal` for the contract)."""

    def __init__(self, call: Any, map_error: MapError, opened: pb.TerminalOutput) -> None:
        self._call = call
        self._map_error = map_error
        self._closed = False
        self._exited: ProcessInfo | None = None
        self.process: ProcessInfo = process_info_from_proto(opened.opened)
        self._output: asyncio.Queue[bytes | BaseException | StreamEnd] = asyncio.Queue(READ_AHEAD)
        self._reader = asyncio.get_running_loop().create_task(self._read_stream())

    @classmethod
    async def open(
        cls, stub: Any, metadata: Any, map_error: MapError, first: pb.TerminalInput
    ) -> AsyncTerminal:
        """Opens the stream and waits for the shell's `opened`."""
        call = stub.Terminal(metadata=metadata)
        try:
            await call.write(first)
            opened = await call.read()
        except grpc.RpcError as e:
            raise map_error(e) from e
        if opened is grpc.aio.EOF or opened.WhichOneof("kind") != "opened":
            call.cancel()
            raise TransportError("the daemon answered a terminal with no `opened` first")
        return cls(call, map_error, opened)

    async def _read_stream(self) -> None:
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "data":
                    await self._output.put(message.data)
                elif kind == "exited":
                    self._exited = process_info_from_proto(message.exited)
                    self.process = self._exited
            await self._output.put(_END)
        except grpc.RpcError as e:
            if self._closed:
                await self._output.put(_END)
            else:
                await self._output.put(self._map_error(e))

    @property
    def exit_code(self) -> int | None:
        """The shell's exit status once it exited (128 + N when signal N ended it)."""
        return _exit_code(self._exited)

    async def read(self, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        """The PTY's next bytes; b"" at the end. See `Terminal.read`."""
        try:
            item = await asyncio.wait_for(self._output.get(), timeout)
        except TimeoutError:
            raise TimeoutError(f"the terminal printed nothing within {timeout:g}s") from None
        if isinstance(item, StreamEnd | BaseException):
            self._output.put_nowait(item)
            if isinstance(item, BaseException):
                raise item
            return b""
        return item

    async def _send(self, message: pb.TerminalInput) -> None:
        if self._closed:
            raise InvalidRequestError("this terminal is closed")
        try:
            await self._call.write(message)
        except grpc.RpcError as e:
            raise self._map_error(e) from e
        except asyncio.InvalidStateError:
            raise InvalidRequestError("the terminal's stream has ended") from None

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Types `data` into the terminal. See `Terminal.write`."""
        for piece in _pieces(data):
            await self._send(pb.TerminalInput(data=piece))

    async def resize(self, rows: int, cols: int) -> None:
        """Sets the window size. See `Terminal.resize`."""
        resize = pb.TerminalResize(rows=_check_size(rows, "rows"), cols=_check_size(cols, "cols"))
        await self._send(pb.TerminalInput(resize=resize))

    async def signal(self, signum: int) -> None:
        """Signals the foreground process group. See `Terminal.signal`."""
        if not isinstance(signum, int) or not 1 <= signum <= 64:
            raise InvalidRequestError(f"signal must be a signal number (1-64), got {signum!r}")
        await self._send(pb.TerminalInput(signal=signum))

    async def close(self) -> None:
        """Ends the stream: a shell still running is hung up. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        with contextlib.suppress(asyncio.QueueFull):
            self._output.put_nowait(_END)  # a later `read` ends, not waits

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Opening(Generic[_Closable]):
    """An async terminal or forward about to open: `await` it, or `async with` it
    (closed at the block's end). Never awaited, it opens nothing."""

    def __init__(self, opening: Callable[[], Coroutine[Any, Any, _Closable]]) -> None:
        self._opening = opening
        self._opened: _Closable | None = None

    def __await__(self) -> Generator[Any, None, _Closable]:
        return self._opening().__await__()

    async def __aenter__(self) -> _Closable:
        self._opened = await self._opening()
        return self._opened

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._opened is not None:
            await self._opened.close()
