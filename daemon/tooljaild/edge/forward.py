"""rpc ForwardPort: one TCP connection to a port on a session's own loopback.

As `kubectl port-forward` does, for one connection: the client's first
`PortData` names the session and the port (1-65535); the daemon connects to
127.0.0.1:port inside the session's sandbox (`SessionSandbox.connect_port`,
over the session's own pipes: nothing of the sandbox's network changes) and
answers one `PortData` naming the session and the port, with no data: the
connection is open. Then bytes go both ways; `eof` is a half close of that
side (shutdown(SHUT_WR) in the sandbox for the client's; the daemon sends one
with `eof` once the server in the sandbox closed its side). The RPC ends once
both sides closed; cancelling it closes the connection at once.

Nothing listens on the port: PORT_UNREACHABLE (FAILED_PRECONDITION) at
connect time, before any byte; a port outside 1-65535 is refused the same
way, before anything is done. Backpressure both ways: the sandbox socket is
read only once the previous chunk went to gRPC, and the next client message
is read only once the previous one was written in the sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from tooljail.errors import InvalidRequestError, PortUnreachableError
from tooljail.v1 import tooljail_pb2 as pb
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import CHUNK, PortError, PortStream, ProcessGoneError
from tooljaild.sessions.session import Session, ended_error

__all__ = ["MAX_PORT_DATA_BYTES", "check_port", "serve_forward"]

MAX_PORT_DATA_BYTES = 1 << 20
"""The most bytes one client `PortData` may carry (the SDK sends 64 KiB pieces)."""


def check_port(port: int, session_id: str) -> int:
    """`port` if it is a TCP port (1-65535).

    Raises:
        PortUnreachableError: It is not (nothing can listen there).
    """
    if not 1 <= port <= 65535:
        raise PortUnreachableError(
            f"port {port} is outside 1-65535: nothing can listen on it in session "
            f"{session_id!r}; name the port the server in the session listens on"
        )
    return port


async def _first(requests: AsyncIterator[pb.PortData], timeout_s: float) -> pb.PortData:
    try:
        async with asyncio.timeout(timeout_s):  # (no task per stream, as wait_for makes)
            first = await anext(requests, None)
    except TimeoutError:
        raise InvalidRequestError(
            f"a forwarded port's first message did not come within {timeout_s:g}s"
        ) from None
    if first is None or not first.session_id:
        raise InvalidRequestError(
            "a forwarded port's first message must name the session and the port"
        )
    return first


async def _pump_in(
    requests: AsyncIterator[pb.PortData], stream: PortStream, session: Session
) -> None:
    """The client's bytes into the sandbox's connection, until its half close."""
    async for message in requests:
        session.touch()  # a tunnel in use is the session in use (its idle TTL)
        if len(message.data) > MAX_PORT_DATA_BYTES:
            raise InvalidRequestError(
                f"a forwarded port's message of {len(message.data)} bytes is too large: "
                f"send at most {MAX_PORT_DATA_BYTES} per message"
            )
        if message.data:
            try:
                await stream.write(message.data)
            except ProcessGoneError:
                return  # the server closed the connection: what it did not take is lost
        if message.eof:
            stream.write_eof()
            return
    # The client's stream ended without `eof`: the same half close.
    stream.write_eof()


async def serve_forward(
    requests: AsyncIterator[pb.PortData],
    own_session: Callable[[str], Session],
    *,
    open_timeout_s: float,
) -> AsyncIterator[pb.PortData]:
    """The ForwardPort RPC: connect, answer once connected, relay both ways.

    Args:
        requests: The client's messages.
        own_session: The caller's open session of an id (another client's is
            NOT_FOUND, `ToolRunnerServicer._own_session`).
        open_timeout_s: How long the first message may take.

    Raises:
        InvalidRequestError: The first message names no session, or a message
            is too large.
        PortUnreachableError: The port is outside 1-65535, or nothing listens
            on it in the session.
        SessionNotFoundError, SessionEndedError: As `own_session`.
    """
    first = await _first(requests, open_timeout_s)
    port = check_port(first.port, first.session_id)
    session = own_session(first.session_id)
    if len(first.data) > MAX_PORT_DATA_BYTES:
        raise InvalidRequestError(
            f"a forwarded port's message of {len(first.data)} bytes is too large: "
            f"send at most {MAX_PORT_DATA_BYTES} per message"
        )
    # The client's first bytes (an HTTP request, say) go with the connect: the
    # supervisor writes them the moment the socket is connected.
    carried = first.data if len(first.data) <= CHUNK else b""
    try:
        stream = await session.channel.connect_port(port, first=carried)
    except PortError as exc:
        raise PortUnreachableError(
            f"nothing listens on port {port} in session {session.id!r} ({exc}): start "
            "the server first, on 127.0.0.1 or 0.0.0.0, and check the port it prints"
        ) from None
    except SandboxError:
        session.check_open()
        raise ended_error(session.id, "sandbox_died") from None
    pump: asyncio.Task[None] | None = None
    try:
        if first.data and not carried:
            await stream.write(first.data)
        if first.eof:
            stream.write_eof()
        yield pb.PortData(session_id=session.id, port=port)
        if not first.eof:
            pump = asyncio.ensure_future(_pump_in(requests, stream, session))
            # A refused input ends the connection, and so the reads below.
            pump.add_done_callback(lambda done: _close_on_error(done, stream))
        # The next read waits for each write: the sandbox's socket is read only
        # as fast as the client takes its bytes.
        while data := await stream.read():
            # What has already come goes in the same message (headers and body
            # of a reply, say): fewer messages, no wait for more.
            while stream.buffered and len(data) < MAX_PORT_DATA_BYTES // 2:
                data += await stream.read()
            session.touch()
            yield pb.PortData(data=data)
        if pump is not None and pump.done() and not pump.cancelled() and pump.exception():
            raise pump.exception()  # type: ignore[misc]
        yield pb.PortData(eof=True)
        if pump is not None:
            # The client's side may still be sending; not once the sandbox is gone.
            ended = session.channel.ended
            await asyncio.wait((pump, ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if pump is not None:
            pump.cancel()
        stream.close()


def _close_on_error(pump: asyncio.Task[None], stream: PortStream) -> None:
    if not pump.cancelled() and pump.exception() is not None:
        stream.close()
