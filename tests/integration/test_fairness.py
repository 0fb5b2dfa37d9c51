"""One agent host cannot take the whole daemon: past its share of running and
queued calls it is refused, while another host's calls still get in."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from tests.conftest import ServedDaemon
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

SLOW = '{"code": "import time; time.sleep(3)"}'


def _call(stub: object, name: str, code: str = SLOW) -> grpc.RpcError | pb.Result:
    try:
        return stub.Run(  # type: ignore[attr-defined, no-any-return]
            pb.CallRequest(tool="execute_python_code", arguments_json=code),
            metadata=(("tooljail-client", name),),
        )
    except grpc.RpcError as exc:
        return exc


def test_a_greedy_client_is_refused_past_its_share_and_others_still_get_in(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(max_concurrent=2, max_queue=6, max_calls_per_client=3)
    with grpc.insecure_channel(served.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        greedy: list[grpc.RpcError | pb.Result] = []
        threads = [
            threading.Thread(target=lambda: greedy.append(_call(stub, "greedy"))) for _ in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        refused = [r for r in greedy if isinstance(r, grpc.RpcError)]
        assert len(refused) == 2, greedy
        assert all(r.code() is grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)
        assert all("its share" in (r.details() or "") for r in refused)
        done = [r for r in greedy if isinstance(r, pb.Result)]
        assert len(done) == 3 and all(r.status == pb.STATUS_SUCCESS for r in done)
        # Meanwhile another client was never refused (checked after: it is served).
        other = _call(stub, "polite", '{"code": "print(1)"}')
        assert isinstance(other, pb.Result) and other.status == pb.STATUS_SUCCESS
