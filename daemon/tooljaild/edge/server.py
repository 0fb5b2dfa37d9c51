"""The gRPC servers: `create_server(...) -> (server, port)` and the health server.

Apart from the servicer (one thin handler per RPC) because building a server is
its own concern: the interceptors, message size bounds, credentials, the
health and reflection services, and binding the address.
"""

from __future__ import annotations

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.calls import CallManager
from tooljaild.edge.authenticator import Authenticator, AuthGate
from tooljaild.edge.drain import Refusals
from tooljaild.edge.errors import ErrorEdge
from tooljaild.edge.health_watch import BoundedHealthServicer
from tooljaild.edge.servicer import SERVICE_NAME, ToolRunnerServicer
from tooljaild.sessions.manager import SessionManager
from tooljaild.settings.addresses import default_daemon_id

__all__ = ["create_health_server", "create_server"]


def create_server(
    manager: CallManager,
    address: str,
    *,
    max_request_bytes: int,
    sessions: SessionManager | None = None,
    artifacts: ArtifactStore | None = None,
    authenticator: Authenticator | None = None,
    credentials: grpc.ServerCredentials | None = None,
    daemon_id: str = "",
    listen: str | None = None,
    started_unix: float | None = None,
    refusals: Refusals | None = None,
    max_health_watches: int = 64,
    max_health_watches_per_peer: int = 8,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build the server with ToolRunner, health checking and reflection.

    Args:
        manager: Runs the calls.
        address: "unix:///path" or "host:port" (port 0 picks a free one).
        max_request_bytes: Larger requests fail with RESOURCE_EXHAUSTED.
        sessions: Serves the session methods; None: they are refused.
        artifacts: Serves the artifact methods; None: they are refused.
        authenticator: Who is calling (every method but health checks refuses a
            request it does not authenticate); None: nobody is asked.
        credentials: Serve TLS with these (`authenticator.server_credentials`);
            None: plaintext.
        daemon_id: The name this daemon answers with (setting `daemon_id`); empty:
            `settings.addresses.default_daemon_id` of `listen` and the bound port.
        listen: The address clients dial, for that default (the daemon binds a
            Unix socket at a private name first); None: `address`.
        started_unix: When the daemon started (GetDaemonInfo); None: now.
        refusals: Told of each call or session refused because the daemon drains.
        max_health_watches: Health Watch streams open at once, in all (settings
            `health_max_watches`; `tooljaild.edge.health_watch`).
        max_health_watches_per_peer: Health Watch streams open at once from one
            peer (`health_max_watches_per_peer`).

    Returns:
        The server (not started), the bound port (0 for Unix sockets) and the
        health servicer, whose status the daemon sets as it starts and drains.

    Raises:
        RuntimeError: When the address cannot be bound.
    """
    interceptors: list[grpc.aio.ServerInterceptor] = [
        ErrorEdge(pb.DESCRIPTOR.services_by_name["ToolRunner"])
    ]
    if authenticator is not None and authenticator.required:
        interceptors.append(AuthGate(authenticator))
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ],
    )
    servicer = ToolRunnerServicer(
        manager, sessions, artifacts, authenticator, started_unix=started_unix, refusals=refusals
    )
    tooljail_pb2_grpc.add_ToolRunnerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = BoundedHealthServicer(
        max_watches=max_health_watches, max_watches_per_peer=max_health_watches_per_peer
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0 and not address.startswith("unix"):
        raise RuntimeError(f"cannot listen on {address}")
    # Named once bound: the default name holds the port port 0 picked.
    servicer.daemon_id = daemon_id or default_daemon_id(listen or address, port)
    return server, port, health_servicer


def create_health_server(
    health_servicer: health.aio.HealthServicer, address: str
) -> tuple[grpc.aio.Server, int]:
    """A plaintext server of `health_servicer` alone, on `address` ("HOST:PORT").

    It shares the main server's servicer, so it answers exactly what the main
    one does, NOT_SERVING from the drain's start included. Plaintext and open
    to anyone who reaches it: it tells a prober SERVING or NOT_SERVING, nothing
    of the daemon's tools, calls or identities (no reflection either).

    Returns:
        The server (not started) and the bound port.

    Raises:
        RuntimeError: When the address cannot be bound.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            # A health request is a service name: nothing bigger is worth reading.
            ("grpc.max_receive_message_length", 4096),
        ]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot listen on {address}")
    return server, port
