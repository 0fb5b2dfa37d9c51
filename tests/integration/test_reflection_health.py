"""Generic gRPC tooling works: health checking, and calling a tool through reflection.

A client with no tooljail code (grpcurl, a load balancer's health probe, another
language) can discover the service from the daemon itself and call
execute_python_code. The daemon also serves over TCP.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.conftest import ServedDaemon
from tooljail.testing import wait_for

SERVICE = "tooljail.v1.ToolRunner"


def _check(stub: Any, service: str) -> str:
    """The health status name of a service, or the gRPC error code's name."""
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    except grpc.RpcError as err:
        return str(err.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def _settled(stub: Any, service: str, timeout: float = 10.0) -> str:
    # The fixture waits for "" only; the service's own status may follow a moment
    # later (see test_not_serving_before_the_service_is_ready for why that is a bug).
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: _check(stub, service) == "SERVING", timeout, interval=0.02)
    return _check(stub, service)


def test_health_check_serving_for_the_server_and_the_service(served: ServedDaemon) -> None:
    with grpc.insecure_channel(served.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert _check(stub, "") == "SERVING"
        assert _settled(stub, SERVICE) == "SERVING"
        try:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        except grpc.RpcError as err:
            assert err.code() is grpc.StatusCode.NOT_FOUND
        else:
            raise AssertionError("an unknown service must not report a status")


def test_health_watch_reports_serving(served: ServedDaemon) -> None:
    with grpc.insecure_channel(served.target) as channel:
        assert _settled(health_pb2_grpc.HealthStub(channel), SERVICE) == "SERVING"
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=5
        )
        first = next(iter(stream))
        stream.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING


def test_not_serving_before_the_service_is_ready(tmp_path: Path) -> None:
    # A load balancer or the fixture trusts "" SERVING: from that moment on the
    # ToolRunner service must say SERVING too (DESIGN: READY after the pool is warm).
    target = f"unix://{tmp_path}/tooljail.sock"
    argv = [sys.executable, "-m", "tooljaild", "serve", "--listen", target,
            "--state-dir", str(tmp_path / "state"), "--pool-size", "8"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            # A new channel each time: a failed connect would back off for a second.
            with grpc.insecure_channel(target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                if _check(stub, "") == "SERVING":
                    assert _check(stub, SERVICE) == "SERVING"
                    break
            assert process.poll() is None, "the daemon exited"
            assert time.monotonic() < deadline, "the daemon never said SERVING"
            time.sleep(0.005)
    finally:
        process.terminate()
        process.wait(30)


def _reflected_call(target: str, arguments: dict[str, Any]) -> list[Any]:
    """Call ToolRunner/Call using only what the server's reflection says."""
    with grpc.insecure_channel(target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert SERVICE in services, services
        assert "grpc.health.v1.Health" in services
        pool = descriptor_pool.DescriptorPool(database)  # fresh: nothing pre-registered
        service = pool.FindServiceByName(SERVICE)
        assert {"Call", "ListTools", "GetCall", "Cancel"} <= set(service.methods_by_name)
        method = service.methods_by_name["Call"]
        assert method.server_streaming and not method.client_streaming
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        assert request_class.DESCRIPTOR.file.pool is pool

        request = request_class()
        request.tool = "execute_python_code"
        request.arguments_json = json.dumps(arguments)
        call = channel.unary_stream(
            f"/{SERVICE}/{method.name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        return list(call(request, timeout=30))


def test_call_execute_python_code_through_reflection(served: ServedDaemon) -> None:
    events = _reflected_call(served.target, {"code": "print(1)"})
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started"
    assert kinds[-1] == "result"
    assert kinds.count("result") == 1
    result = events[-1].result
    status_enum = result.DESCRIPTOR.fields_by_name["status"].enum_type
    assert status_enum.values_by_number[result.status].name == "STATUS_SUCCESS"
    data = json.loads(result.data_json)
    assert data["stdout"] == "1\n"
    assert data["exit_code"] == 0
    assert result.call_id == events[0].started.call_id


def test_free_tcp_port_daemon_works_with_the_sdk(serve: Callable[..., ServedDaemon]) -> None:
    from tooljail import Client

    served = serve(listen="127.0.0.1:0")  # the target names the port the daemon bound
    host, _, port = served.target.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0, served.target
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": "print(6 * 7)"})
        assert {t.name for t in client.list_tools()} >= {"execute_python_code"}
    assert result.ok, result
    assert result.data["stdout"] == "42\n"
    served.assert_serving()
