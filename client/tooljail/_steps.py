"""Flows: each multi-step policy written once, as I/O-free steps that a driver does.

A flow is a generator (`Flow[T]`). It yields a step ("try this RPC on that
daemon", "wait 0.3 s", "read the stream's next message", "give the caller this
item"), the driver does it with blocking calls (`Router`) or awaited
(`AsyncRouter`) and sends the answer back in; an RPC's failure is thrown in as
the `grpc.RpcError` it raised, where the flow's own `except` decides. The flow
returns its value. This is httpx's shape for auth flows: the retry, routing,
resume and paging loops live in the flows, and each driver is a few lines.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc

from tooljail._link import Rpc
from tooljail._routing import Daemon
from tooljail._types import Output, ToolResult

__all__ = [
    "END",
    "Cursor",
    "Emit",
    "Failed",
    "Flow",
    "Read",
    "Refresh",
    "Start",
    "Step",
    "Try",
    "Wait",
    "then",
]

_T = TypeVar("_T")
_U = TypeVar("_U")


@dataclass(frozen=True, slots=True)
class Try:
    """Make `rpc` on `daemon`. Answer: its response (a list of its messages when
    `rpc.streamed`), or `Failed`."""

    daemon: Daemon
    rpc: Rpc


@dataclass(frozen=True, slots=True)
class Read:
    """Read the next message of the response stream `call`. Answer: the message,
    `END` when the stream ended, or `Failed` when it broke."""

    call: Any


@dataclass(frozen=True, slots=True)
class Emit:
    """Give `item` to the caller of a stream. Answer: None."""

    item: Output | ToolResult


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep `seconds` (a retry's backoff). Answer: None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Refresh:
    """Ask every daemon for its `DaemonInfo` now (and resolve a dns name again)."""


@dataclass(frozen=True, slots=True)
class Start:
    """Learn every daemon and start keeping the table fresh, once: the first routed request."""


Step = Try | Read | Emit | Wait | Refresh | Start

Flow = Generator[Step, Any, _T]
"""A policy as steps: yields a `Step`, is sent its answer, returns its value."""


class _End:
    def __repr__(self) -> str:
        return "END"


END = _End()
"""The answer to `Read` at the end of a stream."""


@dataclass(frozen=True, slots=True)
class Failed:
    """A step's RPC failed with `error`; the driver throws it into the flow."""

    error: grpc.RpcError


def then(flow: Flow[_T], finish: Callable[[_T], _U]) -> Flow[_U]:
    """`flow`, its value passed through `finish` (e.g. decoding the answer)."""
    return finish((yield from flow))


class Cursor(Generic[_T]):
    """A driver's place in a flow: the step to do next, or the flow's value once it ended.

    It starts the flow at `begin()`, not when made, so that a stream does
    nothing until its first item is asked for.
    """

    def __init__(self, flow: Flow[_T]) -> None:
        self._flow = flow
        self.step: Step | None = None
        self.done = False
        self._value: _T | None = None

    def begin(self) -> None:
        """Runs the flow to its first step."""
        self._advance(lambda: next(self._flow))

    def take(self, answer: Any) -> None:
        """Hands the current step's answer (or its `Failed`) in; runs to the next step."""
        if isinstance(answer, Failed):
            self._advance(lambda: self._flow.throw(answer.error))
        else:
            self._advance(lambda: self._flow.send(answer))

    def _advance(self, go: Callable[[], Step]) -> None:
        try:
            self.step = go()
        except StopIteration as stop:
            self.done, self.step, self._value = True, None, stop.value

    @property
    def value(self) -> _T:
        """What the flow returned (once `done`)."""
        return cast(_T, self._value)

    def close(self) -> None:
        """Ends the flow where it stands: its `finally` blocks run (a stream's RPC is cancelled)."""
        self._flow.close()
