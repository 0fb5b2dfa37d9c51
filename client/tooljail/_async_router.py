"""`AsyncRouter`: the asyncio twin of `tooljail._router.Router`, for `AsyncClient`.

The same flows (`RouterBase`), their steps awaited; the health loop is a task
of the client's event loop, started by its first routed request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

import grpc
import grpc.aio

from tooljail._link import ClientLink
from tooljail._router_base import RouterBase
from tooljail._routing import HEALTH_INTERVAL_S, INFO_TIMEOUT_S, Daemon, Targets, resolve_dns
from tooljail._steps import END, Cursor, Emit, Failed, Flow, Read, Refresh, Step, Try, Wait
from tooljail._types import Output, ToolResult
from tooljail.errors import TooljailError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncRouter"]

_T = TypeVar("_T")


class AsyncRouter(RouterBase):
    """Does an `AsyncClient`'s flows awaited; see `RouterBase` for the policies."""

    def __init__(self, link: ClientLink, targets: Targets) -> None:
        super().__init__(link, targets, grpc.aio)
        self._start_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        """Stops the health task and closes every channel."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for daemon in list(self.table.daemons):
            await daemon.channel.close()

    # --- driving flows ---

    async def run(self, flow: Flow[_T]) -> _T:
        """Awaits each step of `flow` (one that emits nothing); its value. See `Router.run`."""
        cursor = Cursor(flow)
        async for item in self._drive(cursor):
            raise AssertionError(f"a unary flow emitted {item!r}")
        return cursor.value

    def stream(self, flow: Flow[None]) -> AsyncGenerator[Output | ToolResult, None]:
        """The items `flow` emits; closing it early (`aclose()`) closes the flow."""
        return self._drive(Cursor(flow))

    async def _drive(self, cursor: Cursor[Any]) -> AsyncGenerator[Output | ToolResult, None]:
        with contextlib.closing(cursor):
            cursor.begin()
            while not cursor.done:
                step = cursor.step
                if not isinstance(step, Emit):
                    cursor.take(await self._do(step))
                    continue
                yield step.item
                cursor.take(None)

    async def _do(self, step: Step | None) -> Any:
        """One step's I/O, awaited: its answer, or `Failed` with the RPC error it raised."""
        try:
            if isinstance(step, Try):
                call = step.rpc.start(step.daemon.stub)
                return [m async for m in call] if step.rpc.streamed else await call
            if isinstance(step, Read):
                return await anext(aiter(step.call), END)
            if isinstance(step, Wait):
                return await asyncio.sleep(step.seconds)
            return await (self.refresh() if isinstance(step, Refresh) else self._start())
        except grpc.RpcError as e:
            return Failed(e)

    # --- the table ---

    async def _start(self) -> None:
        async with self._start_lock:
            if not self._started:
                await self.refresh()
                self._task = asyncio.create_task(self._health_loop())
                self._started = True

    async def refresh(self) -> None:
        """Re-resolves a dns name and asks every listed daemon for its DaemonInfo."""
        if self.targets.dns_name:
            with contextlib.suppress(OSError):  # a resolver hiccup is not an empty fleet
                self._relist(await asyncio.to_thread(resolve_dns, self.targets.dns_name))
        request = pb.GetDaemonInfoRequest()
        listed = [d for d in self.table.daemons if d.listed]
        answers = await asyncio.gather(
            *(
                d.stub.GetDaemonInfo(request, timeout=INFO_TIMEOUT_S, metadata=self._link.metadata)
                for d in listed
            ),
            return_exceptions=True,
        )
        for daemon, answer in zip(listed, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, grpc.RpcError):
                raise answer
            self._note_info(daemon, answer)

    async def _health_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), HEALTH_INTERVAL_S)
            self._wake.clear()
            await self.refresh()
            # A burst of failures wakes us often; ask at most 5 times a second.
            await asyncio.sleep(0.2)

    def _note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        super()._note_failure(daemon, error)
        self._wake.set()
