"""`Router`: how a blocking `Client` sends each request, to one daemon or over many.

With one plain target it only applies the retry policy to the one channel
(nothing more on the hot path). With many it routes as `tooljail._routing`
says, and a daemon thread keeps the daemon table fresh. Every policy is a flow
of `RouterBase` (`tooljail._steps`); this module only does its steps, with
blocking calls. The asyncio twin is `tooljail._async_router`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Generator
from contextlib import closing, suppress
from typing import Any, TypeVar

import grpc

from tooljail._link import ClientLink
from tooljail._router_base import RouterBase
from tooljail._routing import HEALTH_INTERVAL_S, INFO_TIMEOUT_S, Daemon, Targets, resolve_dns
from tooljail._steps import END, Cursor, Emit, Failed, Flow, Read, Refresh, Step, Try, Wait
from tooljail._types import Output, ToolResult
from tooljail.errors import TooljailError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["Router"]

_T = TypeVar("_T")


class Router(RouterBase):
    """Does a `Client`'s flows with blocking calls; see `RouterBase` for the policies."""

    def __init__(self, link: ClientLink, targets: Targets) -> None:
        super().__init__(link, targets, grpc)
        self._start_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def close(self) -> None:
        """Stops the health thread and closes every channel."""
        self._closed.set()
        self._wake.set()
        for daemon in list(self.table.daemons):
            daemon.channel.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=INFO_TIMEOUT_S + 1)

    # --- driving flows ---

    def run(self, flow: Flow[_T]) -> _T:
        """Does each step of `flow` (one that emits nothing) and returns its value.

        Raises:
            TooljailError: As the flow raises.
        """
        cursor = Cursor(flow)
        for item in self._drive(cursor):
            raise AssertionError(f"a unary flow emitted {item!r}")
        return cursor.value

    def stream(self, flow: Flow[None]) -> Generator[Output | ToolResult, None, None]:
        """The items `flow` emits, as a generator; closing it early closes the flow."""
        return self._drive(Cursor(flow))

    def _drive(self, cursor: Cursor[Any]) -> Generator[Output | ToolResult, None, None]:
        with closing(cursor):
            cursor.begin()
            while not cursor.done:
                if isinstance(cursor.step, Emit):
                    yield cursor.step.item
                    cursor.take(None)
                else:
                    cursor.take(self._do(cursor.step))

    def _do(self, step: Step | None) -> Any:
        """One step's I/O: its answer, or `Failed` with the RPC error it raised."""
        try:
            if isinstance(step, Try):
                answer = step.rpc.start(step.daemon.stub)
                return list(answer) if step.rpc.streamed else answer
            if isinstance(step, Read):
                return next(step.call, END)
            if isinstance(step, Wait):
                return time.sleep(step.seconds)
            return self.refresh() if isinstance(step, Refresh) else self._start()
        except grpc.RpcError as e:
            return Failed(e)

    # --- the table ---

    def _start(self) -> None:
        """The first routed request learns every daemon's id, then starts the health thread."""
        with self._start_lock:
            if not self._started:
                self.refresh()
                # The thread holds the router weakly: a client dropped without
                # close() is collected (its channels with it), and the thread ends.
                self._thread = threading.Thread(
                    target=_health_loop,
                    args=(weakref.ref(self), self._wake, self._closed),
                    name="tooljail-daemon-health",
                    daemon=True,
                )
                self._thread.start()
                self._started = True

    def refresh(self) -> None:
        """Re-resolves a dns name and asks every listed daemon for its DaemonInfo."""
        if self.targets.dns_name:
            with suppress(OSError):  # keep what we had: a resolver hiccup is not an empty fleet
                self._relist(resolve_dns(self.targets.dns_name))
        request = pb.GetDaemonInfoRequest()
        asked = [
            (d, d.stub.GetDaemonInfo.future(
                request, timeout=INFO_TIMEOUT_S, metadata=self._link.metadata
            ))
            for d in self.table.daemons
            if d.listed
        ]  # fmt: skip
        for daemon, future in asked:
            try:
                answer: Any = future.result()
            except grpc.RpcError as e:
                answer = e
            self._note_info(daemon, answer)

    def _note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        super()._note_failure(daemon, error)
        self._wake.set()


def _health_loop(ref: weakref.ref[Router], wake: threading.Event, closed: threading.Event) -> None:
    """Refreshes the router's table every `HEALTH_INTERVAL_S`, or when woken."""
    while not closed.is_set():
        wake.wait(HEALTH_INTERVAL_S)
        wake.clear()
        router = ref()
        if router is None or closed.is_set():
            return
        try:
            router.refresh()
        except ValueError:
            return  # a channel closed under us: the client is closing
        del router
        # A burst of failures wakes us often; ask at most 5 times a second.
        time.sleep(0.2)
