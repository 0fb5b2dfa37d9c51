"""Who may run a call now, who waits, who is refused, and which id names which call.

- `Slots`: at most `max_concurrent` calls run; free slots go to the waiting
  clients in turn. In-daemon tools have a small pool of their own
  (`max_in_daemon_calls`), given out the same way.
- `Admission`: the bound on running and queued calls, and each client's share.
  Every call counts, whatever runs it: a fresh sandbox, a session, the daemon
  itself (docs: an identity limited to 2 calls once ran 30 artifact searches).
- `known_call`: a request under an id already used is answered by that call,
  refused (other arguments), or, for a lost call of an idempotent tool, run again;
  `unknown_call`: what is said of an id that names no call the caller may see.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections import Counter, OrderedDict, deque
from typing import Any

from tooljail.errors import (
    CallIdConflictError,
    CallNotFoundError,
    InvalidRequestError,
    OverloadedError,
)
from tooljail.types import CallState
from tooljaild.calls.call import Call, Once, StopReason
from tooljaild.settings.config import Settings
from tooljaild.tools.registry import Tool

CALL_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Slots:
    """At most `n` calls run at once; the others wait, and free slots go to the
    waiting clients in turn (in arrival order within each client).

    asyncio.Semaphore cannot be taken without awaiting, which `submit` must not,
    and knows nothing of clients.
    """

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def try_take(self) -> bool:
        """Take a free slot if one is free and nobody waits for it."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self, client: str = "") -> None:
        """Take a slot, waiting for one in `client`'s turn. Cancel-safe: a slot
        handed over as the wait is cancelled passes on to the next waiter."""
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot just as the wait was cancelled: pass it on
            else:
                queue = self._waiting.get(client)
                if queue is not None:
                    with contextlib.suppress(ValueError):
                        queue.remove(waiter)
                    if not queue:
                        del self._waiting[client]
            raise

    def give(self) -> None:
        """Give a slot back: to the next waiting client's first waiter, else free."""
        while self._waiting:
            client, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(client)  # the next slot: another client first
            else:
                del self._waiting[client]
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the waiter
                return
        self._free += 1


class Admission:
    """The bound on calls running and queued: in all, and per client."""

    def __init__(self, settings: Settings) -> None:
        self._limit = settings.max_concurrent + settings.max_queue
        self._per_client = settings.per_client_limit()
        self._by_client: Counter[str] = Counter()
        self._client_limits: dict[str, int] = {}
        """Clients (identities) whose own bound replaces the per-client share."""
        self.active = 0
        """Calls running and queued."""
        self.slots = Slots(settings.max_concurrent)
        """Calls running in sandboxes of their own."""
        self.in_daemon = Slots(settings.max_in_daemon_calls)
        """Calls of in-daemon tools running (their handlers share the event loop)."""
        self.at_once = Slots(sys.maxsize)
        """Calls of tools that answer at once (`BuiltinRun.at_once`: call_status):
        never waiting, least of all behind the calls they report on."""
        self._room: list[asyncio.Future[None]] = []
        """Calls waiting for room (approved ones, see `wait_for_room`)."""

    def slots_for(self, tool: Tool) -> Slots:
        """The slots an in-daemon call of `tool` takes one of."""
        return self.at_once if tool.run is not None and tool.run.at_once else self.in_daemon

    def check_room(self, client: str, tool: Tool | None = None) -> None:
        """Refuse a call the daemon or its client has no room for (never one of a
        tool that answers at once: `BuiltinRun.at_once`).

        Raises:
            OverloadedError: The queue is full, or the client holds its share.
        """
        if tool is not None and tool.run is not None and tool.run.at_once:
            return
        if self.active >= self._limit:
            raise OverloadedError(
                f"the daemon is at its bound of {self._limit} running and queued calls; "
                "try again shortly",
                retry_after_s=1.0,
            )
        share = self._client_limits.get(client, self._per_client)
        if self._by_client[client] >= share:
            raise OverloadedError(
                f"this client already has {share} running and queued calls, its "
                "share of the daemon; try again when some have finished",
                retry_after_s=1.0,
            )

    def limit_client(self, client: str, limit: int | None) -> None:
        """Hold `client` to `limit` running and queued calls (None: the per-client share)."""
        if limit is None:
            self._client_limits.pop(client, None)
        else:
            self._client_limits[client] = limit

    def admit(self, client: str) -> None:
        """Count a call in (after `check_room`)."""
        self.active += 1
        self._by_client[client] += 1

    def release(self, client: str) -> None:
        """Count a call out: it is over."""
        self.active -= 1
        self._by_client[client] -= 1
        if not self._by_client[client]:
            del self._by_client[client]
        waiters, self._room = self._room, []
        for waiter in waiters:  # each looks again; those still without room wait again
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_room(self, client: str, stop: Once[StopReason]) -> bool:
        """Wait until `client` has room (see `check_room`), then count a call in.

        For a call admitted already but not counted yet: one an approver said yes
        to, which counted against its identity's approvals while it waited. It
        must not pass its identity's bound by being approved, and refusing it
        now would throw the approver's decision away, so it waits for room (its
        place among those waiting is bounded by `max_calls_awaiting_approval`).

        Returns:
            True once counted in (release it with `release`); False if `stop`
            was given first (nothing is counted).
        """
        while not stop.done():
            try:
                self.check_room(client)
            except OverloadedError:
                pass
            else:
                self.admit(client)
                return True
            room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._room.append(room)
            stopped = stop.wait()
            either: set[asyncio.Future[Any]] = {room, stopped}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if not room.done():
                    room.cancel()
                    with contextlib.suppress(ValueError):
                        self._room.remove(room)
        return False


async def take_slot(slots: Slots, call: Call) -> bool:
    """Take one of `slots`, queued in the call's client's turn; False if the call
    is stopped first (nothing is held then)."""
    if slots.try_take():
        return True
    slot = asyncio.ensure_future(slots.take(call.client))
    stopped = call.stop_requested.wait()
    either: set[asyncio.Future[Any]] = {slot, stopped}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if slot.done() and not slot.cancelled():
        return True
    slot.cancel()  # a slot handed over meanwhile passes on (see `Slots.take`)
    return False


def check_call_id(call_id: str) -> None:
    """Raises:
    InvalidRequestError: The id is not 1 to 128 characters of A-Z a-z 0-9 . _ : -.
    """
    if not CALL_ID.match(call_id):
        raise InvalidRequestError("call_id must be 1 to 128 characters of A-Z a-z 0-9 . _ : -")


def unknown_call(call_id: str) -> CallNotFoundError:
    """What a caller hears of an id that names no call it may see: an id never
    used, one forgotten, and (with authentication) another identity's all read
    the same, so that the answer says nothing of whether the id exists."""
    return CallNotFoundError(
        f"no call {call_id!r} is known to this daemon (it may have been "
        "forgotten: the journal keeps calls for a bounded time and number)"
    )


def known_call(existing: Call, tool: Tool, fingerprint: str) -> Call | None:
    """The call that answers a request under `existing`'s id: `existing` itself,
    or None when it must run again (it was lost, and its tool is idempotent).

    Raises:
        CallIdConflictError: The id belongs to a call with other arguments.
    """
    if existing.fingerprint != fingerprint:
        raise CallIdConflictError(
            f"call id {existing.call_id!r} is already used by a call of "
            f"{existing.tool.name!r} with other arguments (or other egress rules or "
            "secrets); use a new id"
        )
    if existing.state is CallState.LOST and tool.options.idempotent:
        return None
    return existing
