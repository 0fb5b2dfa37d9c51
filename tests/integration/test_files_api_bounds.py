"""The files API as a hostile client plays it, through raw stubs against a real
`tooljail serve`: idle streams, many large uploads queued behind a busy session,
tiny chunks, downloads nobody reads. The daemon holds: each is refused or ended
with a status a model can act on, its RSS stays bounded (psutil on its pid), and
a cheap RPC answers promptly all along.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest

from tests.conftest import RunningDaemon
from tooljail import Client
from tooljail._wire import error_from_rpc
from tooljail.errors import InvalidRequestError, OverloadedError
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

MiB = 1024 * 1024


def _env(**keys: object) -> dict[str, str]:
    return {f"TOOLJAIL_SESSIONS__{k.upper()}": str(v) for k, v in keys.items()}


def _rss(daemon: RunningDaemon) -> int:
    return int(psutil.Process(daemon.process.pid).memory_info().rss)


def _info_latency(stub: tooljail_pb2_grpc.ToolRunnerStub) -> float:
    start = time.monotonic()
    stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=10)
    return time.monotonic() - start


def _stalled(
    session_id: str, release: threading.Event, data: bytes = b"x"
) -> Iterator[pb.FileChunk]:
    """An upload that sends its first chunk, then nothing until `release`."""
    yield pb.FileChunk(session_id=session_id, path="idle.bin", data=data)
    release.wait(60)


def _decoded(exc: grpc.RpcError) -> Exception:
    return error_from_rpc(exc.code().name, exc.details(), exc.trailing_metadata())


def _error(future: grpc.Future) -> Exception:
    exc = future.exception(timeout=60)
    assert isinstance(exc, grpc.RpcError), exc
    return _decoded(exc)


@pytest.fixture
def bounded(start_daemon: Callable[..., RunningDaemon]) -> RunningDaemon:
    return start_daemon(
        env=_env(
            max_transfers=6,
            max_transfers_per_client=4,
            max_transfers_per_session=4,
            transfer_idle_timeout_s=2,
        ),
        pool_size=1,
    )


def test_idle_upload_streams_are_bounded_and_end(bounded: RunningDaemon) -> None:
    release = threading.Event()
    with Client(bounded.target) as client, grpc.insecure_channel(bounded.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        session = client.session()
        before = _rss(bounded)
        try:
            streams = [
                stub.UploadFile.future(_stalled(session.id, release, b"x" * MiB)) for _ in range(40)
            ]
            # Past the client's 4 places, each is refused at once, with a retry hint.
            refused = [_error(f) for f in streams[4:]]
            assert all(isinstance(e, OverloadedError) for e in refused), refused[:3]
            first = refused[0]
            assert isinstance(first, OverloadedError) and first.retry_after_s > 0
            assert "max_transfers_per_client" in first.message
            # The loop answers while they idle.
            assert _info_latency(stub) < 1.0
            # The idle ones end after the idle timeout, saying why; nothing was written.
            for future in streams[:4]:
                err = _error(future)
                assert isinstance(err, InvalidRequestError), err
                assert "no chunk for 2s" in err.message
            assert _rss(bounded) - before < 64 * MiB
            assert not session.call("ls", {}).data["entries"]
            # Their places are free again.
            assert session.upload("after.txt", b"ok") == 2
        finally:
            release.set()
            session.close()


def test_large_uploads_queued_behind_a_busy_session_wait_on_disk(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(
        env=_env(max_transfers=32, max_transfers_per_client=32, max_transfers_per_session=32),
        pool_size=1,
    )
    blob = bytes(range(256)) * (31 * 1024)  # 7.75 MiB
    with Client(daemon.target) as client, grpc.insecure_channel(daemon.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        session = client.session()
        busy = threading.Thread(
            target=session.call,
            args=("execute_python_code", {"code": "import time; time.sleep(6)"}),
        )
        busy.start()
        time.sleep(0.5)  # the call holds the session's turn
        before = _rss(daemon)
        peak = before
        with ThreadPoolExecutor(16) as pool:
            uploads = [pool.submit(session.upload, f"up{i % 2}.bin", blob) for i in range(16)]
            while not all(u.done() for u in uploads):
                peak = max(peak, _rss(daemon))
                assert _info_latency(stub) < 1.0
                time.sleep(0.2)
            sizes = [u.result() for u in uploads]
        assert sizes == [len(blob)] * 16
        # 16 x 7.75 MiB waited for the session's turn on disk, not in the daemon's
        # memory: measured +111..122 MiB (gRPC's own stream buffers, bounded by
        # max_transfers), against +179 MiB when the chunks waited in memory.
        assert peak - before < 150 * MiB, (peak - before) / MiB
        assert session.download("up0.bin") == blob
        busy.join(30)
        session.close()


def test_tiny_chunks_are_bounded(bounded: RunningDaemon) -> None:
    with Client(bounded.target) as client, grpc.insecure_channel(bounded.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        session = client.session()
        process = psutil.Process(bounded.process.pid)
        cpu = process.cpu_times()

        def tiny() -> Iterator[pb.FileChunk]:
            yield pb.FileChunk(session_id=session.id, path="tiny.bin", data=b"x")
            for _ in range(20_000):
                yield pb.FileChunk(data=b"x")

        with pytest.raises(grpc.RpcError) as info:
            stub.UploadFile(tiny(), timeout=60)
        err = _decoded(info.value)
        assert isinstance(err, InvalidRequestError) and "chunks" in err.message, err
        used = sum(process.cpu_times()[:2]) - sum(cpu[:2])
        # Refused within a little over FREE_CHUNKS chunks: a bounded cost.
        assert used < 2.0, used
        assert session.upload("ok.bin", b"y" * (3 * MiB)) == 3 * MiB
        session.close()


def test_a_download_nobody_reads_ends_and_frees_its_place(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(
        env=_env(max_transfers_per_client=1, transfer_idle_timeout_s=2), pool_size=1
    )
    with Client(daemon.target) as client:
        session = client.session()
        session.upload("big.bin", b"z" * (24 * MiB))
        # A raw stream whose client never reads past the first message.
        with grpc.insecure_channel(
            daemon.target, options=[("grpc.max_receive_message_length", 64 * MiB)]
        ) as channel:
            stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
            stream = stub.DownloadFile(
                pb.DownloadFileRequest(session_id=session.id, path="big.bin"), timeout=60
            )
            next(stream)
            # Its place is held meanwhile: the client's only one.
            with pytest.raises(OverloadedError):
                session.download("big.bin")
            time.sleep(6)  # the idle timeout, and its end's round trip
            assert len(session.download("big.bin")) == 24 * MiB
            stream.cancel()
        session.close()
