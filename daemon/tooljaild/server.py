"""The gRPC edge: each RPC turns proto into a call on the manager and back.

Nothing here decides anything about calls; errors are mapped once, in
`tooljaild.errors`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tooljail._errors import TooljailError
from tooljail._wire import (
    call_info_to_proto,
    call_state_to_proto,
    diagnostic_to_proto,
    result_to_proto,
    stream_kind_to_proto,
    tool_info_to_proto,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.calls import Call, CallManager
from tooljaild.errors import ErrorEdge, abort_with

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ToolRunner"].full_name


class ToolRunnerServicer(tooljail_pb2_grpc.ToolRunnerServicer):
    """tooljail.v1.ToolRunner over a CallManager."""

    def __init__(self, manager: CallManager) -> None:
        self._manager = manager

    async def ListTools(
        self, request: pb.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListToolsResponse:
        registry = self._manager.registry
        return pb.ListToolsResponse(
            tools=[tool_info_to_proto(t.info()) for t in registry.tools()],
            diagnostics=[diagnostic_to_proto(d) for d in registry.diagnostics],
        )

    async def _submit(self, request: pb.CallRequest, context: grpc.aio.ServicerContext) -> Call:
        """Admit the call a Call or Run request asks for, or end the RPC with why not."""
        try:
            return self._manager.submit(
                request.tool,
                request.arguments_json,
                request.call_id,
                request.timeout_s,
                client=client_of(context),
            )
        except TooljailError as exc:
            await abort_with(context, exc)

    async def Call(
        self, request: pb.CallRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallEvent]:
        call = await self._submit(request, context)
        # Leaving this generator (client gone) does not stop the call: it runs
        # on, and GetCall answers for it.
        await _first_of(call.started, call.caller_result)
        if call.started.done() and not call.started.cancelled():
            yield pb.CallEvent(
                started=pb.Started(
                    call_id=call.call_id, sandbox_id=call.sandbox_id, tool=call.tool.name
                )
            )
        async for event in call.stream():
            yield pb.CallEvent(
                output=pb.Output(
                    seq=event.seq, stream=stream_kind_to_proto(event.stream), data=event.data
                )
            )
        result = await call.caller_result
        yield pb.CallEvent(result=result_to_proto(result))

    async def Run(self, request: pb.CallRequest, context: grpc.aio.ServicerContext) -> pb.Result:
        call = await self._submit(request, context)
        # A caller that goes away does not stop the call (as for Call).
        return result_to_proto(await call.answer_waiter())

    async def Attach(
        self, request: pb.AttachRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallEvent]:
        try:
            call = self._manager.get(request.call_id)
        except TooljailError as exc:
            await abort_with(context, exc)
        await _first_of(call.started, call.done.wait())
        if call.started.done() and not call.started.cancelled():
            yield pb.CallEvent(
                started=pb.Started(
                    call_id=call.call_id, sandbox_id=call.sandbox_id, tool=call.tool.name
                )
            )
        # To the call's real end: past a timeout its caller already heard, too.
        async for event in call.events.follow(max(1, request.from_seq)):
            yield pb.CallEvent(
                output=pb.Output(
                    seq=event.seq, stream=stream_kind_to_proto(event.stream), data=event.data
                )
            )
        await call.done.wait()
        assert call.final is not None
        yield pb.CallEvent(result=result_to_proto(call.final))

    async def GetCall(
        self, request: pb.GetCallRequest, context: grpc.aio.ServicerContext
    ) -> pb.CallInfo:
        try:
            return call_info_to_proto(self._manager.get(request.call_id).info())
        except TooljailError as exc:
            await abort_with(context, exc)

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelResponse:
        try:
            state = await self._manager.cancel(request.call_id)
        except TooljailError as exc:
            await abort_with(context, exc)
        return pb.CancelResponse(state=call_state_to_proto(state))


async def _first_of(*waitables: asyncio.Future[Any] | Coroutine[Any, Any, Any]) -> None:
    """Wait until one is done. Only tasks made here for coroutines are cancelled after."""
    if any(isinstance(w, asyncio.Future) and w.done() for w in waitables):
        for w in waitables:
            if not isinstance(w, asyncio.Future):
                w.close()  # never started: nothing to cancel
        return
    made = [asyncio.ensure_future(w) for w in waitables if not isinstance(w, asyncio.Future)]
    futures = [w for w in waitables if isinstance(w, asyncio.Future)]
    try:
        await asyncio.wait([*futures, *made], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in made:
            task.cancel()


CLIENT_KEY = "tooljail-client"
"""Metadata key an agent host may name itself by (the SDK sends its host and pid)."""


def client_of(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for fairness: the name the client sent, else its address.

    A TCP peer counts by host (its port changes per connection); every caller on
    the Unix socket that sends no name shares one share.
    """
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_KEY and isinstance(value, str) and value:
            return value[:128]
    peer = context.peer() or ""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return kind + ":" + address.rsplit(":", 1)[0]
    return kind


def create_server(
    manager: CallManager, address: str, *, max_request_bytes: int
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build the server with ToolRunner, health checking and reflection.

    Args:
        manager: Runs the calls.
        address: "unix:///path" or "host:port" (port 0 picks a free one).
        max_request_bytes: Larger requests fail with RESOURCE_EXHAUSTED.

    Returns:
        The server (not started), the bound port (0 for Unix sockets) and the
        health servicer, whose status the daemon sets as it starts and drains.

    Raises:
        RuntimeError: When the address cannot be bound.
    """
    server = grpc.aio.server(
        interceptors=[ErrorEdge(pb.DESCRIPTOR.services_by_name["ToolRunner"])],
        options=[
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ]
    )
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(ToolRunnerServicer(manager), server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    port = server.add_insecure_port(address)
    if port == 0 and not address.startswith("unix"):
        raise RuntimeError(f"cannot listen on {address}")
    return server, port, health_servicer
