"""Health `Watch` streams, open to anyone, are bounded in all and per peer (issue 21, low).

A caller that opens Watch after Watch gets RESOURCE_EXHAUSTED past the bound,
with a retry hint, while `Check` (what probes use) still answers at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import ServedDaemon
from tests.holds import MiB, daemon_holds
from tooljail.v1 import tooljail_pb2 as pb
from tooljaild.edge.health_watch import MAX_SERVICE_NAME, peer_key


def _watch(stub: health_pb2_grpc.HealthStub, service: str = "") -> Iterator[object]:
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=service))
    return stream  # type: ignore[no-any-return]


def _refused(stream: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)  # type: ignore[call-overload]
    return caught.value


@pytest.mark.parametrize(("total", "per_peer"), [(100, 3), (3, 100)])
def test_watch_streams_past_the_bound_are_refused_and_check_still_answers(
    serve: Callable[..., ServedDaemon], total: int, per_peer: int
) -> None:
    served = serve(health_max_watches=total, health_max_watches_per_peer=per_peer)
    with grpc.insecure_channel(served.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        held = [_watch(stub) for _ in range(3)]
        try:
            for stream in held:
                assert next(stream).status == health_pb2.HealthCheckResponse.SERVING  # type: ignore[call-overload, attr-defined]
            # A flood of Watch streams past the bound: each refused at once, none
            # held, while the daemon's loop answers and its memory stays put.
            with daemon_holds(served.target, rss_bytes=32 * MiB):
                for _ in range(200):
                    flood = _refused(_watch(stub))
                    assert flood.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            error = _refused(_watch(stub))
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
            assert "health Watch streams" in (error.details() or "")  # type: ignore[attr-defined]
            # The machine-readable detail (with its retry hint) comes along.
            status = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
            assert b"overloaded" in status["tooljail-error-bin"]
            # A probe's Check still answers, at once.
            asked = time.monotonic()
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert time.monotonic() - asked < 0.5
        finally:
            for stream in held:
                stream.cancel()  # type: ignore[attr-defined]

        # Once they are closed, a Watch is served again.
        def served_again() -> bool:
            stream = _watch(stub)
            try:
                return next(stream).status == health_pb2.HealthCheckResponse.SERVING  # type: ignore[call-overload, attr-defined, no-any-return]
            except grpc.RpcError:
                return False
            finally:
                stream.cancel()  # type: ignore[attr-defined]

        deadline = time.monotonic() + 5
        while not served_again():
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_watch_of_a_huge_service_name_is_refused(served: ServedDaemon) -> None:
    with grpc.insecure_channel(served.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        error = _refused(_watch(stub, "x" * (MAX_SERVICE_NAME + 1)))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert len(pb.DESCRIPTOR.services_by_name["ToolRunner"].full_name) < MAX_SERVICE_NAME


def test_peers_count_by_uid_on_the_socket_and_by_host_on_tcp() -> None:
    assert peer_key("unix-abstract:tooljail-peer/uid=1000/0123456789abcdef") == "uid:1000"
    assert peer_key("ipv4:10.0.0.7:53211") == "ipv4:10.0.0.7"
    assert peer_key("ipv6:[::1]:53211") == "ipv6:[::1]"
    assert peer_key("unix:") == "unix"
