#!/usr/bin/env python3
"""tooljail-probe: the Kubernetes probes of a daemon that serves TLS.

The kubelet's native `grpc:` probe speaks plaintext only, and a daemon
listening beyond loopback serves TLS (plaintext there is refused at start), so
the pod's probes run this inside the container instead: one
`grpc.health.v1.Health/Check` of the whole server (service "") over TLS to
127.0.0.1, checked against the CA of the tooljail-tls Secret. The health
service needs no token.

    tooljail-probe ready [--port 7070]   exit 0 only when SERVING
    tooljail-probe live  [--port 7070]   exit 0 when the health service answers
                                         at all (NOT_SERVING included)

`ready` fails while the pools warm and from the first moment of a drain
(SIGTERM sets NOT_SERVING), so the pod leaves the Service's DNS answers.
`live` keeps passing through a drain: a daemon finishing its calls must not be
restarted; it fails when the daemon no longer answers (a stuck event loop).

Exit status: 0 pass, 1 fail (the reason on stderr, shown by `kubectl describe pod`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_CA = "/etc/tooljail/tls/ca.crt"
DEFAULT_SERVER_NAME = "tooljail.tooljail.svc.cluster.local"
"""The name the daemon's certificate is checked for: the headless Service's,
which its certificate carries for the SDK's dns:/// target anyway."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tooljail-probe", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("ready", "live"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070)
    parser.add_argument(
        "--ca",
        default=os.environ.get("TOOLJAIL_PROBE_CA", DEFAULT_CA),
        help="CA certificate (PEM) the daemon's certificate chains to; "
        "'none' for a plaintext daemon on loopback",
    )
    parser.add_argument(
        "--server-name",
        default=os.environ.get("TOOLJAIL_PROBE_SERVER_NAME", DEFAULT_SERVER_NAME),
        help="the name checked in the daemon's certificate",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds for the whole check")
    return parser


def check(
    mode: str, host: str, port: int, ca: str | None, server_name: str, timeout: float
) -> str | None:
    """Ask the daemon's health service once.

    Args:
        mode: "ready" (SERVING only passes) or "live" (any answer passes).
        host: Where the daemon listens (its pod's loopback).
        port: The daemon's gRPC port.
        ca: A CA file for TLS; None: plaintext (a loopback daemon without TLS).
        server_name: The name the server's certificate must carry.
        timeout: Seconds for the whole check, connection included.

    Returns:
        None when the probe passes, else why it fails.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"{host}:{port}"
    if ca is None:
        channel = grpc.insecure_channel(target)
    else:
        try:
            root = Path(ca).read_bytes()
        except OSError as exc:
            return f"cannot read the CA file {ca}: {exc.strerror or exc}"
        channel = grpc.secure_channel(
            target,
            grpc.ssl_channel_credentials(root_certificates=root),
            options=[("grpc.ssl_target_name_override", server_name)],
        )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError as exc:
            return f"no answer from {target}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    if mode == "ready" and answer.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{target} is {status} (warming its pools, or draining)"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one probe; 0 when it passes, 1 when it fails (why on stderr)."""
    args = _parser().parse_args(argv)
    ca = None if args.ca == "none" else args.ca
    problem = check(args.mode, args.host, args.port, ca, args.server_name, args.timeout)
    if problem is not None:
        print(f"tooljail-probe {args.mode}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
