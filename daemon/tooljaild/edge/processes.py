"""The process RPCs: proto to a session's `ProcessTable` and back.

The servicer finds the caller's own session (`_own_session`: another client's
is NOT_FOUND) and hands it here; a process id of another session is then
"not found" by the table, in the words of an unknown id. Each RPC does a
model-facing tool's work, so an identity's tool policy is kept at its door
(`sessions.policy.check_file_rpc`): StartProcess is `start_process`'s work,
and so on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tooljail.errors import InvalidRequestError
from tooljail.types import StreamKind
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.wire import process_info_to_proto, stream_kind_to_proto
from tooljaild.auth.policy import Identity
from tooljaild.sessions.policy import check_file_rpc
from tooljaild.sessions.process_output import Chunk, Select
from tooljaild.sessions.session import Session

__all__ = [
    "list_processes",
    "read_process_output",
    "signal_process",
    "start_process",
    "wait_process",
    "write_process_input",
]

_SELECT: dict[int, Select] = {
    pb.OUTPUT_SELECT_BOTH: "both",
    pb.OUTPUT_SELECT_STDOUT: "stdout",
    pb.OUTPUT_SELECT_STDERR: "stderr",
}
_STREAM = {
    "stdout": stream_kind_to_proto(StreamKind.STDOUT),
    "stderr": stream_kind_to_proto(StreamKind.STDERR),
    "pty": stream_kind_to_proto(StreamKind.STDOUT),
}
MAX_WAIT_S = 3600.0
"""The longest WaitProcess waits in one RPC (ask again to wait on)."""


async def start_process(
    session: Session, request: pb.StartProcessRequest, identity: Identity | None
) -> pb.ProcessInfo:
    """StartProcess: exactly one of command and argv, in the session's workspace."""
    check_file_rpc(identity, "StartProcess", "start_process")
    session.touch()
    info = await session.processes.start_command(
        request.command,
        tuple(request.argv),
        name=request.name,
        cwd=request.cwd,
        env=dict(request.env),
    )
    return process_info_to_proto(info)


async def list_processes(session: Session, identity: Identity | None) -> pb.ListProcessesResponse:
    check_file_rpc(identity, "ListProcesses", "list_processes")
    session.touch()
    infos = await session.processes.list()
    return pb.ListProcessesResponse(processes=[process_info_to_proto(i) for i in infos])


async def read_process_output(
    session: Session, request: pb.ReadProcessOutputRequest, identity: Identity | None
) -> AsyncIterator[pb.ProcessOutput]:
    """ReadProcessOutput: a message per chunk from `offset`, then the process.

    Without `follow`: what is kept now (at most `limit` bytes). With it: live,
    until the process ended and all of its output was sent (or `limit`).
    """
    check_file_rpc(identity, "ReadProcessOutput", "read_process_output")
    session.touch()
    select = _SELECT.get(request.select)
    if select is None:
        raise InvalidRequestError(f"select {request.select} is not an OutputSelect")
    table = session.processes
    process_id, offset, limit = request.process_id, request.offset, request.limit
    if request.follow:
        async for chunk in table.follow(process_id, offset, select, limit):
            yield _message(chunk)
            offset = chunk.end
    else:
        left = limit
        while True:
            chunks, offset, _ = table.read(process_id, offset, left if limit else 0, select)
            for chunk in chunks:
                yield _message(chunk)
                left -= len(chunk.data)
            if not chunks and offset >= table.get(process_id).info().output_bytes:
                break
            if limit and left <= 0:
                break
            if not chunks:  # a passed-over stream: let the loop breathe between reads
                await asyncio.sleep(0)
    info = table.get(process_id).info()
    yield pb.ProcessOutput(
        offset=max(0, offset),
        next_offset=max(0, offset),
        process=process_info_to_proto(info),
    )


def _message(chunk: Chunk) -> pb.ProcessOutput:
    return pb.ProcessOutput(
        offset=chunk.offset,
        next_offset=chunk.end,
        stream=_STREAM.get(chunk.stream, _STREAM["stdout"]),
        data=chunk.data,
        skipped=chunk.skipped,
    )


async def write_process_input(
    session: Session, request: pb.WriteProcessInputRequest, identity: Identity | None
) -> pb.ProcessInfo:
    check_file_rpc(identity, "WriteProcessInput", "write_process_input")
    session.touch()
    info = await session.processes.write(request.process_id, request.data, request.eof)
    return process_info_to_proto(info)


async def signal_process(
    session: Session, request: pb.SignalProcessRequest, identity: Identity | None
) -> pb.ProcessInfo:
    """SignalProcess: a signal to its process group; 0 stops it (TERM, then KILL
    after `grace_s`, default 5)."""
    check_file_rpc(identity, "SignalProcess", "stop_process")
    session.touch()
    table = session.processes
    if request.signal:
        info = table.signal(request.process_id, request.signal)
    else:
        info = await table.stop(request.process_id, grace_s=request.grace_s or 5.0)
    return process_info_to_proto(info)


async def wait_process(
    session: Session, request: pb.WaitProcessRequest, identity: Identity | None
) -> pb.ProcessInfo:
    check_file_rpc(identity, "WaitProcess", "list_processes")
    session.touch()
    if not 0 <= request.timeout_s <= MAX_WAIT_S:
        raise InvalidRequestError(
            f"timeout_s {request.timeout_s:g} must be within [0, {MAX_WAIT_S:g}] seconds "
            "(ask again to wait on)"
        )
    info = await session.processes.wait(request.process_id, request.timeout_s)
    return process_info_to_proto(info)
