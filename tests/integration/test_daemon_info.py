"""Who a daemon is, on the wire: its `daemon_id` on every answer, GetDaemonInfo,
and what it still does while it drains.

A client routing over many daemons pins a call or a session to the daemon an
answer names, asks each daemon once who it is (and whether it drains), and
stops sending new work to one that drains while its calls finish there. These
tests speak the raw stub, so they hold whatever the SDK makes of the fields.
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tooljail
from tests.conftest import RunningDaemon, ServedDaemon
from tooljail._wire import error_from_rpc
from tooljail.errors import ShuttingDownError, UnauthenticatedError
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

PRINT = '{"code": "print(1)"}'
SLOW = '{"code": "import time; time.sleep(4); print(\\"done\\")"}'
"""Long enough to be caught running by everything a test asks during the drain."""


def _stub(channel: grpc.Channel) -> Any:
    return tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture
def channel_to() -> Iterator[Callable[[str], grpc.Channel]]:
    channels: list[grpc.Channel] = []

    def open_channel(target: str) -> grpc.Channel:
        channels.append(grpc.insecure_channel(target))
        return channels[-1]

    yield open_channel
    for channel in channels:
        channel.close()


def _error(err: grpc.RpcError) -> Exception:
    """The SDK's exception for a failed RPC (the daemon's error code, mapped once)."""
    call: Any = err
    return error_from_rpc(call.code().name, call.details(), call.trailing_metadata())


def test_every_answer_names_the_daemon(
    serve: Callable[..., ServedDaemon], channel_to: Callable[[str], grpc.Channel]
) -> None:
    before = time.time()
    stub = _stub(channel_to(serve(daemon_id="alpha").target))
    info = stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
    assert (info.daemon_id, info.version, info.draining) == ("alpha", tooljail.__version__, False)
    assert before - 60 < info.started_unix <= time.time()

    events = list(stub.Call(pb.CallRequest(tool="execute_python_code", arguments_json=PRINT,
                                           call_id="streamed"), timeout=30))  # fmt: skip
    started = [e.started for e in events if e.HasField("started")]
    results = [e.result for e in events if e.HasField("result")]
    assert [s.daemon_id for s in started] == ["alpha"]
    assert [(r.call_id, r.daemon_id) for r in results] == [("streamed", "alpha")]
    run = stub.Run(pb.CallRequest(tool="execute_python_code", arguments_json=PRINT), timeout=30)
    assert run.daemon_id == "alpha"
    call_info = stub.GetCall(pb.GetCallRequest(call_id="streamed"), timeout=10)
    assert (call_info.daemon_id, call_info.result.daemon_id) == ("alpha", "alpha")
    attached = list(stub.Attach(pb.AttachRequest(call_id="streamed"), timeout=10))
    assert [e.result.daemon_id for e in attached if e.HasField("result")] == ["alpha"]

    session = stub.CreateSession(pb.CreateSessionRequest(), timeout=30)
    assert session.daemon_id == "alpha"
    listed = stub.ListSessions(pb.ListSessionsRequest(), timeout=10).sessions
    assert [(s.session_id, s.daemon_id) for s in listed] == [(session.session_id, "alpha")]
    closed = stub.CloseSession(pb.CloseSessionRequest(session_id=session.session_id), timeout=30)
    assert closed.daemon_id == "alpha"


def test_a_result_read_back_from_the_journal_names_the_daemon(
    serve: Callable[..., ServedDaemon], channel_to: Callable[[str], grpc.Channel]
) -> None:
    # One finished call kept in memory: the first is answered from the journal.
    stub = _stub(channel_to(serve(daemon_id="beta", remembered_calls=1).target))
    for call_id in ("first", "second"):
        stub.Run(pb.CallRequest(tool="execute_python_code", arguments_json=PRINT,
                                call_id=call_id), timeout=30)  # fmt: skip
    info = stub.GetCall(pb.GetCallRequest(call_id="first"), timeout=10)
    assert json.loads(info.result.data_json)["stdout"] == "1\n"
    assert (info.daemon_id, info.result.daemon_id) == ("beta", "beta")
    retried = stub.Run(pb.CallRequest(tool="execute_python_code", arguments_json=PRINT,
                                      call_id="first"), timeout=30)  # fmt: skip
    assert retried.daemon_id == "beta"


def test_the_default_daemon_id_is_the_hostname_and_the_socket_or_the_bound_port(
    serve: Callable[..., ServedDaemon], channel_to: Callable[[str], grpc.Channel]
) -> None:
    on_socket = serve().target
    on_port = serve(listen="127.0.0.1:0").target  # port 0: the one it picked counts
    host = socket.gethostname()
    for target, expected in (
        (on_socket, f"{host}:{on_socket.removeprefix('unix://')}"),
        (on_port, f"{host}:{on_port.rsplit(':', 1)[1]}"),
    ):
        info = _stub(channel_to(target)).GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
        assert info.daemon_id == expected


def test_daemon_info_is_for_authenticated_callers_only_and_health_stays_open(
    serve: Callable[..., ServedDaemon], channel_to: Callable[[str], grpc.Channel], tmp_path: Path
) -> None:
    token = "token-of-the-router"
    tokens = tmp_path / "tokens.toml"
    digest = hashlib.sha256(token.encode()).hexdigest()
    tokens.write_text(f'[identities.router]\ntoken_sha256 = "{digest}"\n')
    tokens.chmod(0o600)
    channel = channel_to(serve(daemon_id="gamma", auth={"tokens_file": tokens}).target)
    with pytest.raises(grpc.RpcError) as refused:
        _stub(channel).GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
    assert isinstance(_error(refused.value), UnauthenticatedError)
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    metadata = (("authorization", f"Bearer {token}"),)
    info = _stub(channel).GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10, metadata=metadata)
    assert info.daemon_id == "gamma"


def _health(channel: grpc.Channel) -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(reply.status)


def _refused(action: Callable[[], object]) -> Exception:
    with pytest.raises(grpc.RpcError) as refused:
        action()
    call: Any = refused.value
    assert call.code() is grpc.StatusCode.UNAVAILABLE
    return _error(refused.value)


def test_a_draining_daemon_refuses_new_work_and_answers_for_what_it_holds(
    start_daemon: Callable[..., RunningDaemon], channel_to: Callable[[str], grpc.Channel]
) -> None:
    daemon = start_daemon("--daemon-id", "delta")
    channel = channel_to(daemon.target)
    stub = _stub(channel)
    session = stub.CreateSession(pb.CreateSessionRequest(), timeout=30)
    stream = stub.Call(pb.CallRequest(tool="execute_python_code", arguments_json=SLOW,
                                      call_id="slow"), timeout=60)  # fmt: skip
    events: list[pb.CallEvent] = [next(stream)]
    assert events[0].HasField("started")
    doomed = stub.Call(pb.CallRequest(tool="execute_python_code", arguments_json=SLOW,
                                      call_id="doomed"), timeout=60)  # fmt: skip
    assert next(doomed).HasField("started")
    # The rest of the stream is read on while the daemon drains: it must end in the result.
    reader = threading.Thread(target=lambda: events.extend(stream), daemon=True)
    reader.start()

    daemon.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=5).draining, 10, interval=0.02
    )
    assert _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
    new_call = pb.CallRequest(tool="execute_python_code", arguments_json=PRINT, call_id="new")
    assert isinstance(_refused(lambda: stub.Run(new_call, timeout=10)), ShuttingDownError)
    assert isinstance(
        _refused(lambda: stub.CreateSession(pb.CreateSessionRequest(), timeout=10)),
        ShuttingDownError,
    )

    # What it holds: the running call (asked, attached, retried by its id), the session.
    info = stub.GetCall(pb.GetCallRequest(call_id="slow"), timeout=10)
    assert (info.state, info.daemon_id) == (pb.CALL_STATE_RUNNING, "delta")
    cancelled = stub.Cancel(pb.CancelRequest(call_id="doomed"), timeout=10)
    assert cancelled.state == pb.CALL_STATE_CANCELLED
    assert [e.result.status for e in doomed if e.HasField("result")] == [pb.STATUS_CANCELLED]
    sessions = stub.ListSessions(pb.ListSessionsRequest(), timeout=10).sessions
    assert [s.session_id for s in sessions] == [session.session_id]
    written = stub.UploadFile(
        iter([pb.FileChunk(session_id=session.session_id, path="kept.txt", data=b"kept")]),
        timeout=10,
    )
    assert written.size_bytes == 4
    chunks = stub.DownloadFile(
        pb.DownloadFileRequest(session_id=session.session_id, path="kept.txt"), timeout=10
    )
    assert b"".join(c.data for c in chunks) == b"kept"
    retry = pb.CallRequest(tool="execute_python_code", arguments_json=SLOW, call_id="slow")
    joined = stub.Run(retry, timeout=30)  # the same call, not a refused new one
    attached = list(stub.Attach(pb.AttachRequest(call_id="slow"), timeout=30))

    reader.join(30)
    results = [e.result for e in events if e.HasField("result")]
    for result in (*results, joined, *(e.result for e in attached if e.HasField("result"))):
        assert (result.call_id, result.status, result.daemon_id) == (
            "slow", pb.STATUS_SUCCESS, "delta"
        )  # fmt: skip
        assert json.loads(result.data_json)["stdout"] == "done\n"
    assert len(results) == 1
    assert daemon.process.wait(30) == 0


def test_a_draining_daemon_listens_on_while_clients_still_send_new_work(
    start_daemon: Callable[..., RunningDaemon], channel_to: Callable[[str], grpc.Channel]
) -> None:
    # Its one call ends ~1 s into the drain. Had the daemon stopped listening
    # then, a call arriving at that moment could be answered CANCELLED (did it
    # run?) instead of a refusal its client can send elsewhere.
    daemon = start_daemon("--daemon-id", "epsilon")
    stub = _stub(channel_to(daemon.target))
    short = '{"code": "import time; time.sleep(1)"}'
    running = stub.Call(
        pb.CallRequest(tool="execute_python_code", arguments_json=short), timeout=30
    )
    assert next(running).HasField("started")
    daemon.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=5).draining, 10, interval=0.02
    )
    new_call = pb.CallRequest(tool="execute_python_code", arguments_json=PRINT)
    until = time.monotonic() + 3.0
    while time.monotonic() < until:  # a client that has not heard, sending on
        assert isinstance(_refused(lambda: stub.Run(new_call, timeout=10)), ShuttingDownError)
        time.sleep(0.2)
    assert [e.result.status for e in running if e.HasField("result")] == [pb.STATUS_SUCCESS]
    stopped = time.monotonic()
    assert daemon.process.wait(30) == 0  # once the refusals stop: within a quiet second or so
    assert time.monotonic() - stopped < 10
