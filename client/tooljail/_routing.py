"""Routing over many daemons, the part without I/O: targets, ranking, the daemon table.

A `Client` given one target talks to that daemon as it always did. Given a
list of targets, or a `dns:///name:port` name that the SDK resolves itself, it
keeps one channel per daemon address and routes each request:

- a new call goes to the daemon ranked first by rendezvous (highest random
  weight) hashing of its call id over the daemon ids known and serving, so
  calls spread evenly and a retry of the same id, from this process or any
  other, ranks the same daemon first;
- once a call (or session) was sent to daemon D it is pinned to D: its
  retries, `get_call`, `attach`, `cancel` and session calls go to D only. If D
  is gone, the answer is the call LOST (or the session ended, reason
  "daemon_lost"), naming D and why, never a silent re-run elsewhere;
- an id this client never sent is looked up across the daemons in rendezvous
  order until one knows it.

A request may go to the next daemon only when the first never had it: the
daemon refused it as draining (`ShuttingDownError`), or the connection to it
could not be made (see `never_reached`). The policies that follow these rules
(retry, route, look up, resume) are flows of `tooljail._router_base`, done by
the sync and async routers (`tooljail._router`, `tooljail._async_router`),
which also keep the table fresh.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

import grpc

from tooljail._types import CallStatus, Effect, ToolResult
from tooljail._wire import error_from_rpc
from tooljail.errors import (
    DaemonUnavailableError,
    InvalidRequestError,
    SessionEndedError,
    ShuttingDownError,
    TooljailError,
    TransportError,
)
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "ANY",
    "HEALTH_INTERVAL_S",
    "Daemon",
    "DaemonTable",
    "Pins",
    "Route",
    "RouteKind",
    "Targets",
    "never_reached",
    "parse_targets",
    "rendezvous_order",
    "rendezvous_score",
]

HEALTH_INTERVAL_S = 2.0
"""How often the router asks every daemon for its `DaemonInfo` (reachable,
draining, restarted) and re-resolves a dns:/// name; a failure wakes it sooner."""

INFO_TIMEOUT_S = 2.0
"""Deadline of one `GetDaemonInfo`: a host that swallows packets must not stall
the table for a TCP connect timeout."""

PIN_CAPACITY = 100_000
"""Call and session ids remembered with their daemon (least recently used go
first); an id forgotten is looked up across the daemons again."""

DNS_SCHEME = "dns:"

# What gRPC says when the connection could not be made at all: the request was
# never written, so no daemon had it and the next one may take it. A connection
# that broke after the request went out says something else ("Socket closed",
# "Connection reset"), and that request stays with its daemon.
_CONNECT_FAILURES = (
    "failed to connect to all addresses",
    "Connection refused",
    "No such file or directory",
    "connections to all backends failing",
)

_K = TypeVar("_K")
_V = TypeVar("_V")


# --- targets ----------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """What a client was told to dial.

    Attributes:
        addresses: The gRPC targets of the daemons, normalised (empty for a
            dns:/// name until it is resolved).
        dns_name: "host:port" of a dns:/// target the SDK resolves itself; "".
        routed: False for one plain target (today's behaviour, no routing).
    """

    addresses: tuple[str, ...]
    dns_name: str = ""
    routed: bool = False

    @property
    def display(self) -> str:
        """The target as a user wrote it, normalised (for messages and `repr`)."""
        if self.dns_name:
            return f"dns:///{self.dns_name}"
        return ",".join(self.addresses)


def _split_dns(target: str) -> str:
    """ "host:port" of "dns:///host:port" or "dns:host:port" (an authority is ignored)."""
    rest = target[len(DNS_SCHEME) :]
    if rest.startswith("//"):
        rest = rest[2:].partition("/")[2]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidRequestError(
            f"target {target!r}: a dns target needs a name and a port (dns:///name:7070)"
        )
    return f"{host.strip('[]')}:{port}"


def parse_targets(target: Any, normalize: Any) -> Targets:
    """The daemons a target names.

    Args:
        target: One str ("unix:///p.sock", "/p.sock", "host:port": one daemon, no
            routing), a "dns:///name:port" str (every address the name resolves
            to, routed), or a list/tuple of plain targets (routed, mixed TCP and
            Unix allowed).
        normalize: The one-target normaliser (`_BaseClient._normalize_target`).

    Raises:
        TypeError: When the target is not a str, list or tuple of str.
        InvalidRequestError: When a target is unusable, the list is empty, an
            address is listed twice, or a dns target has no port.
    """
    if isinstance(target, str):
        if target.strip().lower().startswith(DNS_SCHEME):
            return Targets((), dns_name=_split_dns(target.strip()), routed=True)
        return Targets((normalize(target),))
    if not isinstance(target, list | tuple):
        raise TypeError(f"target must be a str or a list of str, got {type(target).__name__}")
    if not target:
        raise InvalidRequestError("the list of targets is empty: name at least one daemon")
    addresses: list[str] = []
    for one in target:
        if isinstance(one, str) and one.strip().lower().startswith(DNS_SCHEME):
            raise InvalidRequestError(
                f"target {one!r}: a dns:/// name stands alone (it already names many daemons)"
            )
        address = normalize(one)
        if address in addresses:
            raise InvalidRequestError(f"target {address!r} is listed twice")
        addresses.append(address)
    return Targets(tuple(addresses), routed=True)


def resolve_dns(name: str) -> list[str]:
    """The gRPC targets ("ip:port", "[v6]:port") that "host:port" resolves to, sorted.

    Blocking (getaddrinfo): the async router runs it in a thread.

    Raises:
        OSError: When the name does not resolve.
    """
    host, _, port = name.rpartition(":")
    found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    addresses = {
        f"[{info[4][0]}]:{port}" if info[0] == socket.AF_INET6 else f"{info[4][0]}:{port}"
        for info in found
    }
    return sorted(addresses)


# --- rendezvous ---------------------------------------------------------------


def rendezvous_score(key: str, daemon_id: str) -> int:
    """The weight of `daemon_id` for `key`: the same in every process and version.

    blake2b, not `hash()`: Python salts `hash()` per process, and a retry from
    another process must rank the daemons the same.
    """
    digest = hashlib.blake2b(f"{key}\x00{daemon_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, daemon_ids: Iterable[str]) -> list[str]:
    """`daemon_ids` ranked for `key`, first the one that should hold it.

    Removing a daemon moves only the keys it ranked first (to their second);
    adding one takes from each of the others an even share.
    """
    return sorted(daemon_ids, key=lambda d: (rendezvous_score(key, d), d), reverse=True)


# --- pins -----------------------------------------------------------------------


class Pins(Generic[_K, _V]):
    """A bounded, thread-safe map, least recently used first out."""

    def __init__(self, capacity: int = PIN_CAPACITY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[_K, _V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: _K) -> _V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: _K, value: _V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


# --- the daemon table ---------------------------------------------------------


class RouteKind(Enum):
    """How a request finds its daemon."""

    ANY = "any"
    """Any serving daemon (list_tools)."""
    NEW_CALL = "new_call"
    """A call id to send: its pinned daemon, else the first serving by rendezvous."""
    CALL = "call"
    """A call this client may not have sent: its pin, else looked up."""
    SESSION = "session"
    """A session's daemon: its pin, else looked up."""
    NEW_SESSION = "new_session"
    """A session to open: the first serving by rendezvous of a fresh id."""
    ARTIFACT = "artifact"
    """An artifact: looked up in rendezvous order of its id."""


@dataclass(frozen=True)
class Route:
    """Where a request goes: its kind and the id that ranks the daemons."""

    kind: RouteKind
    key: str = ""


ANY = Route(RouteKind.ANY)
"""Any one serving daemon."""


@dataclass(eq=False)
class Daemon:
    """One daemon address, its channel and what the router last learned of it."""

    address: str
    channel: Any
    stub: Any
    daemon_id: str = ""
    """From its DaemonInfo; "" until it answered once."""
    started_unix: float = 0.0
    draining: bool = False
    reachable: bool = False
    checked: bool = False
    """Asked at least once (answered or not)."""
    why: str = "not asked yet"
    """Why it is not serving (for messages)."""
    listed: bool = True
    """Still named by the target (a dns name may stop resolving to it)."""

    @property
    def serving(self) -> bool:
        """Takes new calls: answered, not draining, still listed."""
        return self.reachable and not self.draining and bool(self.daemon_id) and self.listed

    @property
    def channel_and_stub(self) -> tuple[Any, Any]:
        return self.channel, self.stub

    def describe(self) -> str:
        """ "daemon 'host-b:7070' (host-b:7070)", as messages name a daemon."""
        return f"daemon {self.daemon_id or '?'!r} ({self.address})"


@dataclass(frozen=True)
class Pin:
    """A call's or session's daemon, and when that daemon had started when the
    id was pinned: a later start time means it restarted since."""

    daemon: Daemon
    started_unix: float

    @property
    def restarted(self) -> bool:
        return bool(self.started_unix) and self.daemon.started_unix != self.started_unix


@dataclass
class DaemonTable:
    """The daemons of a routed client, and every routing decision that needs no I/O.

    Thread-safe: the sync client's threads and its health thread share it.
    """

    daemons: list[Daemon] = field(default_factory=list)
    calls: Pins[str, Pin] = field(default_factory=Pins)
    sessions: Pins[str, Pin] = field(default_factory=Pins)
    config_error: TooljailError | None = None
    """A duplicate daemon id seen by the health loop, raised at the next request."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, address: str, channel: Any, stub: Any) -> Daemon:
        with self._lock:
            daemon = Daemon(address, channel, stub)
            self.daemons.append(daemon)
            return daemon

    def relist(self, addresses: Sequence[str]) -> list[str]:
        """Marks which addresses the target still names; returns the new ones."""
        with self._lock:
            known = {d.address for d in self.daemons}
            for d in self.daemons:
                d.listed = d.address in addresses
            return [a for a in addresses if a not in known]

    def note_info(self, daemon: Daemon, info: pb.DaemonInfo) -> None:
        """Records a daemon's answer to GetDaemonInfo.

        Raises:
            InvalidRequestError: When another reachable daemon has the same id
                (two daemons with one name cannot be told apart by a pin).
        """
        with self._lock:
            for other in self.daemons:
                if other is not daemon and other.reachable and other.daemon_id == info.daemon_id:
                    self.config_error = InvalidRequestError(
                        f"two daemons answer with daemon_id {info.daemon_id!r}: "
                        f"{other.address} and {daemon.address}; give each its own "
                        "(setting daemon_id)"
                    )
                    raise self.config_error
            daemon.daemon_id = info.daemon_id
            daemon.started_unix = info.started_unix
            daemon.draining = info.draining
            daemon.reachable = daemon.checked = True
            daemon.why = "draining" if info.draining else ""

    def note_failure(self, daemon: Daemon, error: TooljailError) -> None:
        """Records that a daemon could not be reached, or refused as draining."""
        with self._lock:
            daemon.checked = True
            if isinstance(error, ShuttingDownError):
                daemon.draining = True
                daemon.why = "draining"
            else:
                daemon.reachable = False
                daemon.why = f"unreachable: {error}"

    def ranked(self, key: str, *, serving: bool) -> list[Daemon]:
        """The daemons known by id, ranked for `key`; only serving ones if `serving`."""
        with self._lock:
            by_id = {d.daemon_id: d for d in self.daemons if d.daemon_id}
            if serving:
                by_id = {i: d for i, d in by_id.items() if d.serving}
            return [by_id[i] for i in rendezvous_order(key, by_id)]

    def none_serving(self) -> TransportError:
        """The error when no daemon takes new calls, saying why of each."""
        with self._lock:
            states = "; ".join(f"{d.describe()}: {d.why}" for d in self.daemons) or "none known"
        return DaemonUnavailableError(f"no daemon takes new calls ({states})", status="UNAVAILABLE")


# --- outcomes -----------------------------------------------------------------


def map_rpc_error(e: grpc.RpcError, target: str) -> TooljailError:
    """Our exception for a failed RPC to `target` (see `ClientLink.map_error`)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else None
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    code_name = code.name if code is not None else "UNKNOWN"
    return error_from_rpc(code_name, details, trailing, target=target)


def never_reached(error: TooljailError) -> bool:
    """Whether the daemon certainly did not take the request: it refused it as
    draining, or no connection to it could be made. Only such a request may go
    to another daemon."""
    if isinstance(error, ShuttingDownError):
        return True
    return (
        isinstance(error, TransportError)
        and error.status == "UNAVAILABLE"
        and any(s in str(error) for s in _CONNECT_FAILURES)
    )


def is_unavailable(error: TooljailError) -> bool:
    """A transport failure (no answer from tooljail), as the retry policy sees it."""
    return isinstance(error, TransportError) and error.status == "UNAVAILABLE"


def lost_result(call_id: str, daemon: Daemon, why: str) -> ToolResult:
    """The answer for a call whose daemon is gone: LOST, effect UNKNOWN, naming it."""
    return ToolResult(
        call_id=call_id,
        status=CallStatus.LOST,
        effect=Effect.UNKNOWN,
        message=(
            f"{daemon.describe()} {why}; the call was sent there and may or may not have "
            "run; it was not run elsewhere. Ask again with get_call once that daemon is "
            "back, or check its effects before running it again under a new call id."
        ),
        daemon_id=daemon.daemon_id,
    )


def session_lost(session_id: str, daemon: Daemon, why: str) -> SessionEndedError:
    """The error for a session whose daemon is gone or was restarted."""
    return SessionEndedError(
        f"session {session_id} was lost with its {daemon.describe()}, which {why}; "
        "its interpreter and workspace are gone: open a new session",
        reason="daemon_lost",
    )
