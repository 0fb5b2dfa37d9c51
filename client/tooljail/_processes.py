"""`session.processes` of a blocking `Session`: its background processes.

Each method is one RPC to the session's daemon (`SessionHost._process_rpc`),
built and decoded by `tooljail._process_base`; the async twin is
`tooljail._async_processes`.
"""

from __future__ import annotations

import builtins
from collections.abc import Generator, Mapping, Sequence

from tooljail._process_base import (
    ProcessChunk,
    ProcessOutputPage,
    ProcessStream,
    decode_chunk,
    decode_infos,
    decode_page,
    read_request,
    signal_request,
    start_request,
    wait_request,
)
from tooljail._session_host import SessionHost
from tooljail._types import ProcessInfo
from tooljail._wire import process_info_from_proto
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["Processes"]


class Processes:
    """The background processes of one session (`Session.processes`).

    They run in the session's sandbox (its workspace, its limits) beside its
    calls, until they end, are stopped, or the session ends or is reset. Their
    output is kept by the daemon: read it from any offset (stdout and stderr
    together, in the order they came), or follow it live.

    Example:
        p = s.processes.start("python -m http.server 8000", name="web")
        ...
        page = s.processes.read(p.process_id)
        for chunk in s.processes.follow(p.process_id, page.next_offset):
            print(chunk.data.decode(), end="")
    """

    def __init__(self, host: SessionHost, session_id: str) -> None:
        self._host = host
        self._session_id = session_id

    def start(
        self,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        name: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Starts a process: a command line (run by `bash -lc`) or a plain `argv`.

        Raises:
            InvalidRequestError: Both or neither of command and argv; a bad env.
            InvalidPathError: `cwd` leaves the workspace.
            ProcessLimitError: The session runs as many processes as it may.
            SessionNotFoundError, SessionEndedError: As for a call.
        """
        request = start_request(self._session_id, command, argv, name, cwd, env)
        return process_info_from_proto(self._host._process_rpc("StartProcess", request))

    def list(self) -> builtins.list[ProcessInfo]:
        """The session's processes, oldest first, with their CPU and memory now."""
        request = pb.ListProcessesRequest(session_id=self._session_id)
        return decode_infos(self._host._process_rpc("ListProcesses", request))

    def read(
        self, process_id: str, offset: int = 0, limit: int = 0, stream: ProcessStream = "both"
    ) -> ProcessOutputPage:
        """What is kept of its output from `offset` (at most `limit` bytes; 0: all),
        at once. An offset past the end answers empty; read on from `next_offset`.

        Raises:
            ProcessNotFoundError: No such process in this session.
            InvalidRequestError: A negative offset or limit.
        """
        request = read_request(self._session_id, process_id, offset, limit, stream, follow=False)
        return decode_page(self._host._process_output(request), offset)

    def follow(
        self, process_id: str, offset: int = 0, stream: ProcessStream = "both"
    ) -> Generator[ProcessChunk, None, None]:
        """Its output from `offset`, live, until it ended and all of it came. An offset
        past the end waits for output to reach it. After a dropped stream, follow
        again from the last chunk's `next_offset`: nothing is missed or repeated.
        Closing the iterator ends the RPC.
        """
        request = read_request(self._session_id, process_id, offset, 0, stream, follow=True)
        messages = self._host._process_output(request)
        try:
            for message in messages:
                chunk = decode_chunk(message)
                if chunk is not None:
                    yield chunk
        finally:
            messages.close()  # closing this generator ends the RPC at once

    def write(self, process_id: str, data: bytes | str, eof: bool = False) -> ProcessInfo:
        """Writes `data` (a str as UTF-8) to its stdin; `eof` closes it after."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        request = pb.WriteProcessInputRequest(
            session_id=self._session_id, process_id=process_id, data=raw, eof=eof
        )
        return process_info_from_proto(self._host._process_rpc("WriteProcessInput", request))

    def signal(self, process_id: str, signum: int) -> ProcessInfo:
        """Sends `signum` to its process group."""
        request = signal_request(self._session_id, process_id, signum)
        return process_info_from_proto(self._host._process_rpc("SignalProcess", request))

    def stop(self, process_id: str, grace_s: float = 5.0) -> ProcessInfo:
        """SIGTERM, then SIGKILL if it still runs `grace_s` later; its state then."""
        request = signal_request(self._session_id, process_id, 0, grace_s)
        answer = self._host._process_rpc("SignalProcess", request, deadline=False)
        return process_info_from_proto(answer)

    def wait(self, process_id: str, timeout_s: float) -> ProcessInfo:
        """Waits at most `timeout_s` for its end; its state then (`running` if it
        still runs)."""
        request = wait_request(self._session_id, process_id, timeout_s)
        answer = self._host._process_rpc("WaitProcess", request, deadline=False)
        return process_info_from_proto(answer)
