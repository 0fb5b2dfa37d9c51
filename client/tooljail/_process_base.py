"""What `session.processes` (sync and async) shares: its types, requests and decoding, no I/O.

`Processes` and `AsyncProcesses` build every process request and read every
answer through these functions, so the twins cannot drift.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from tooljail._process_types import ProcessChunk, ProcessOutputPage, ProcessStream
from tooljail._types import ProcessInfo
from tooljail._wire import process_info_from_proto, stream_kind_from_proto
from tooljail.errors import InvalidRequestError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["ProcessChunk", "ProcessOutputPage", "ProcessStream"]

_SELECT = {
    "both": pb.OUTPUT_SELECT_BOTH,
    "stdout": pb.OUTPUT_SELECT_STDOUT,
    "stderr": pb.OUTPUT_SELECT_STDERR,
}


def start_request(
    session_id: str,
    command: str | None,
    argv: Sequence[str] | None,
    name: str,
    cwd: str,
    env: Mapping[str, str] | None,
) -> pb.StartProcessRequest:
    """The `StartProcessRequest` for `start`.

    Raises:
        TypeError: An argument of the wrong type (argv a str: a list was meant).
        InvalidRequestError: Both or neither of command and argv.
    """
    if isinstance(argv, str | bytes):
        raise TypeError("argv must be a list of str (a command line goes in command)")
    if (command is None or command == "") == (not argv):
        raise InvalidRequestError("give exactly one of command and argv")
    for value, what in ((command or "", "command"), (name, "name"), (cwd, "cwd")):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    return pb.StartProcessRequest(
        session_id=session_id,
        command=command or "",
        argv=list(argv or ()),
        name=name,
        cwd=cwd,
        env=dict(env or {}),
    )


def read_request(
    session_id: str,
    process_id: str,
    offset: int,
    limit: int,
    stream: ProcessStream,
    *,
    follow: bool,
) -> pb.ReadProcessOutputRequest:
    """The `ReadProcessOutputRequest` for `read` and `follow`.

    Raises:
        InvalidRequestError: A negative offset or limit, or an unknown stream.
    """
    if not isinstance(offset, int) or offset < 0:
        raise InvalidRequestError(f"offset must be an int >= 0, got {offset!r}")
    if not isinstance(limit, int) or limit < 0:
        raise InvalidRequestError(f"limit must be an int >= 0 (0: no bound), got {limit!r}")
    if stream not in _SELECT:
        raise InvalidRequestError(f"stream must be 'both', 'stdout' or 'stderr', not {stream!r}")
    return pb.ReadProcessOutputRequest(
        session_id=session_id,
        process_id=process_id,
        offset=offset,
        follow=follow,
        select=_SELECT[stream],
        limit=limit,
    )


def signal_request(
    session_id: str, process_id: str, signum: int, grace_s: float = 0.0
) -> pb.SignalProcessRequest:
    """The `SignalProcessRequest` for `signal` (signum > 0) and `stop` (signum 0).

    Raises:
        InvalidRequestError: A signal outside 0..64, or a bad grace.
    """
    signum = int(signum)
    if not 0 <= signum <= 64:
        raise InvalidRequestError(f"signal {signum} is not a signal number (1 to 64)")
    if not (math.isfinite(grace_s) and grace_s >= 0):
        raise InvalidRequestError(f"grace_s must be a number >= 0, got {grace_s!r}")
    return pb.SignalProcessRequest(
        session_id=session_id, process_id=process_id, signal=signum, grace_s=grace_s
    )


def wait_request(session_id: str, process_id: str, timeout_s: float) -> pb.WaitProcessRequest:
    if not (math.isfinite(timeout_s) and timeout_s >= 0):
        raise InvalidRequestError(f"timeout_s must be a number >= 0, got {timeout_s!r}")
    return pb.WaitProcessRequest(session_id=session_id, process_id=process_id, timeout_s=timeout_s)


def decode_chunk(m: pb.ProcessOutput) -> ProcessChunk | None:
    """A chunk of output from its message; None for the last (the process's) message."""
    if m.HasField("process") and not m.data:
        return None
    return ProcessChunk(
        offset=m.offset,
        next_offset=m.next_offset,
        stream=stream_kind_from_proto(m.stream),
        data=m.data,
        skipped=m.skipped,
    )


def decode_page(messages: Iterable[pb.ProcessOutput], offset: int) -> ProcessOutputPage:
    """A read's messages as one page (from `offset`, where it was asked)."""
    chunks: list[ProcessChunk] = []
    process: ProcessInfo | None = None
    next_offset, skipped = offset, 0
    for m in messages:
        if m.HasField("process"):
            process = process_info_from_proto(m.process)
        chunk = decode_chunk(m)
        if chunk is not None:
            chunks.append(chunk)
            skipped += chunk.skipped
        next_offset = max(next_offset, m.next_offset)
    return ProcessOutputPage(
        data=b"".join(c.data for c in chunks),
        chunks=tuple(chunks),
        next_offset=next_offset,
        skipped=skipped,
        process=process,
    )


def decode_infos(m: pb.ListProcessesResponse) -> list[ProcessInfo]:
    return [process_info_from_proto(p) for p in m.processes]
