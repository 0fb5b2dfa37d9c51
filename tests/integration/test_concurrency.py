"""50 concurrent calls from 50 threads (or 50 tasks): all complete correctly.

Each call prints its own index and a value computed from it, so a result
delivered to the wrong caller, mixed output, or a lost call shows. Past the
daemon's bound of running plus queued calls, a call is refused with
RESOURCE_EXHAUSTED and a retry hint, and the admitted calls are unharmed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import grpc
import pytest

import tooljail
from tests.conftest import ServedDaemon
from tooljail.v1 import tooljail_pb2 as pb

N = 50


def _code(i: int) -> str:
    return f"import sys\nprint({i}, sum(range({i} * 1000)))\nprint('err', {i}, file=sys.stderr)"


def _check(i: int, result: tooljail.ToolResult) -> None:
    assert result.status is tooljail.CallStatus.SUCCESS, (i, result)
    assert result.data == {
        "stdout": f"{i} {sum(range(i * 1000))}\n",
        "stderr": f"err {i}\n",
        "exit_code": 0,
    }, (i, result)


def _run_threads(worker: Callable[[int], tooljail.ToolResult]) -> dict[int, tooljail.ToolResult]:
    results: dict[int, tooljail.ToolResult] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(N)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = worker(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a call never returned"
    assert not errors, errors
    return results


@pytest.fixture
def busy_daemon(serve: Callable[..., ServedDaemon]) -> ServedDaemon:
    return serve(pool_size=8)


def test_50_threads_each_with_its_own_client(busy_daemon: ServedDaemon) -> None:
    def worker(i: int) -> tooljail.ToolResult:
        with tooljail.Client(busy_daemon.target) as client:
            return client.call("execute_python_code", {"code": _code(i)})

    results = _run_threads(worker)
    assert sorted(results) == list(range(N))
    for i, result in results.items():
        _check(i, result)
    assert len({r.call_id for r in results.values()}) == N
    busy_daemon.assert_serving()


def test_50_threads_sharing_one_client(busy_daemon: ServedDaemon) -> None:
    with tooljail.Client(busy_daemon.target) as client:
        results = _run_threads(lambda i: client.call("execute_python_code", {"code": _code(i)}))
    assert sorted(results) == list(range(N))
    for i, result in results.items():
        _check(i, result)
    assert len({r.call_id for r in results.values()}) == N


def test_50_threads_streaming_get_their_own_chunks(busy_daemon: ServedDaemon) -> None:
    def worker(i: int) -> tooljail.ToolResult:
        with tooljail.Client(busy_daemon.target) as client:
            items = list(
                client.stream(
                    "execute_python_code_stream",
                    {"code": f"for k in range(3):\n    print({i}, k, flush=True)"},
                )
            )
        *outputs, result = items
        assert isinstance(result, tooljail.ToolResult)
        stdout = "".join(
            o.data for o in outputs if isinstance(o, tooljail.Output) and o.stream == "stdout"
        )
        assert stdout == "".join(f"{i} {k}\n" for k in range(3)), (i, outputs)
        seqs = [o.seq for o in outputs if isinstance(o, tooljail.Output)]
        assert seqs == list(range(1, len(seqs) + 1)), (i, seqs)
        return result

    results = _run_threads(worker)
    assert all(r.ok for r in results.values())
    assert len({r.call_id for r in results.values()}) == N


async def test_50_tasks_on_one_async_client(busy_daemon: ServedDaemon) -> None:
    async with tooljail.AsyncClient(busy_daemon.target) as client:
        results = await asyncio.wait_for(
            asyncio.gather(
                *(client.call("execute_python_code", {"code": _code(i)}) for i in range(N))
            ),
            timeout=60,
        )
    for i, result in enumerate(results):
        _check(i, result)
    assert len({r.call_id for r in results}) == N


def test_overload_is_refused_with_a_retry_hint(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(max_concurrent=1, max_queue=1)
    outcomes: dict[int, tooljail.ToolResult | BaseException] = {}
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        with tooljail.Client(served.target) as client:
            barrier.wait(timeout=30)
            try:
                outcomes[i] = client.call(
                    "execute_python_code", {"code": f"import time\ntime.sleep(3)\nprint({i})"}
                )
            except BaseException as exc:
                outcomes[i] = exc

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    refused = {i: o for i, o in outcomes.items() if isinstance(o, BaseException)}
    admitted = {i: o for i, o in outcomes.items() if isinstance(o, tooljail.ToolResult)}
    assert len(outcomes) == 3
    # One runs, one waits in the queue of 1, the third is refused.
    assert len(refused) == 1, outcomes
    assert len(admitted) == 2, outcomes
    for exc in refused.values():
        assert isinstance(exc, tooljail.OverloadedError), exc
        assert exc.retry_after_s > 0
        cause = exc.__cause__
        assert isinstance(cause, grpc.RpcError)
        assert cause.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        details = [
            pb.ErrorDetail.FromString(v)
            for k, v in cause.trailing_metadata() or ()
            if k == "tooljail-error-bin"
        ]
        assert details and details[0].code == "overloaded"
        assert details[0].retry_after_s > 0
    for i, result in admitted.items():
        assert result.ok, result
        assert result.data["stdout"] == f"{i}\n"
    # Run one after the other: the queued one waited for the running one.
    assert time.monotonic() - started >= 6.0
    served.assert_serving()
