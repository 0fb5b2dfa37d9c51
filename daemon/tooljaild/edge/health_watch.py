"""gRPC health checking with its one unbounded method bounded: `Watch`.

Health is answered without authentication (probes carry no token), and a
`Watch` stream is held open by the daemon for as long as the caller likes: so
the streams open at once are bounded in all and per peer (a TCP host, or a
uid on the Unix socket), and a service name past `MAX_SERVICE_NAME` is refused
(the servicer keeps one waiting condition per name watched). Past a bound:
RESOURCE_EXHAUSTED with a retry hint. `Check`, what probes use (the kubelet's
`grpc:` probe, grpc_health_probe), is not touched.
"""

from __future__ import annotations

from collections import Counter

import grpc.aio
from grpc_health.v1 import health, health_pb2

from tooljail.errors import InvalidRequestError, OverloadedError
from tooljaild.auth.peer import peer_uid
from tooljaild.edge.errors import abort_with

__all__ = ["MAX_SERVICE_NAME", "BoundedHealthServicer", "peer_key"]

MAX_SERVICE_NAME = 256
"""The longest service name a Watch may name (ours are far shorter)."""


def peer_key(peer: str) -> str:
    """Whom a connection counts for: "uid:N" on the relayed Unix socket, the host
    on TCP (its port changes per connection), else the transport's kind."""
    uid = peer_uid(peer)
    if uid is not None:
        return f"uid:{uid}"
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return kind + ":" + address.rsplit(":", 1)[0]
    return kind


class BoundedHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """grpc_health's servicer, with Watch streams bounded (see the module doc).

    Args:
        max_watches: Watch streams open at once, in all.
        max_watches_per_peer: Watch streams open at once from one peer (`peer_key`).
    """

    def __init__(self, *, max_watches: int, max_watches_per_peer: int) -> None:
        super().__init__()
        self._max = max_watches
        self._max_per_peer = max_watches_per_peer
        self._by_peer: Counter[str] = Counter()

    @property
    def watching(self) -> int:
        """Watch streams open now."""
        return sum(self._by_peer.values())

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> None:
        if len(request.service) > MAX_SERVICE_NAME:
            await abort_with(
                context,
                InvalidRequestError(f"a service name has at most {MAX_SERVICE_NAME} characters"),
            )
        key = peer_key(context.peer() or "")
        if self.watching >= self._max:
            await abort_with(
                context,
                OverloadedError(
                    f"this daemon serves {self._max} health Watch streams at most, and all "
                    "are open; use Check, or try again later",
                    retry_after_s=5.0,
                ),
            )
        if self._by_peer[key] >= self._max_per_peer:
            await abort_with(
                context,
                OverloadedError(
                    f"this peer already holds {self._max_per_peer} health Watch streams, "
                    "its most; close one, or use Check",
                    retry_after_s=5.0,
                ),
            )
        # No await between the checks and the count: no other Watch slips in.
        self._by_peer[key] += 1
        try:
            await super().Watch(request, context)
        finally:
            self._by_peer[key] -= 1
            if not self._by_peer[key]:
                del self._by_peer[key]
