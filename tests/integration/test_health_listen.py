"""`health_listen`: health checks alone, in plaintext, beside a daemon's API.

What the kubelet's native gRPC probe needs (it speaks no TLS); the pod's own
configuration is exercised in test_kubernetes_probe.py.
"""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tooljail import Client, testing
from tooljaild.app.errors import DaemonError


def _check(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return int(answer.status)


def test_health_answers_on_its_own_port_beside_the_api() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with testing.daemon(health_listen=f"127.0.0.1:{port}") as target:
        assert _check(port) == health_pb2.HealthCheckResponse.SERVING
        with Client(target) as client:
            assert client.call("execute_python_code", {"code": "print(1)"}).ok


def test_a_health_port_that_cannot_be_bound_stops_the_start_and_says_which() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = pytest.raises(
            DaemonError, match=f"cannot serve health checks on 127.0.0.1:{port}"
        )
        with refused, testing.daemon(health_listen=f"127.0.0.1:{port}"):
            pass
