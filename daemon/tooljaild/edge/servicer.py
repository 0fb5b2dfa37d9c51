"""The gRPC edge: each RPC turns proto into a call on the manager and back.

Nothing here decides anything about calls; errors are mapped once, in
`tooljaild.edge.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import NoReturn, TypeVar

import grpc
import grpc.aio

from tooljail import __version__
from tooljail.errors import (
    InvalidRequestError,
    ShuttingDownError,
    TooljailError,
)
from tooljail.types import ToolResult
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljail.wire import (
    artifact_info_to_proto,
    call_info_to_proto,
    call_state_to_proto,
    diagnostic_to_proto,
    result_to_proto,
    session_info_to_proto,
    stream_kind_to_proto,
    tool_info_to_proto,
)
from tooljaild.artifacts.store import ArtifactStore
from tooljaild.auth.policy import Identity
from tooljaild.calls import Call, CallManager
from tooljaild.calls.approvals import waiting_notice
from tooljaild.calls.call import Once
from tooljaild.calls.intake import CallRequest
from tooljaild.calls.output import Event
from tooljaild.edge import approvals as edge_approvals
from tooljaild.edge import processes
from tooljaild.edge.authenticator import Authenticator
from tooljaild.edge.drain import Refusals
from tooljaild.edge.errors import abort_with
from tooljaild.edge.forward import serve_forward
from tooljaild.edge.history import list_calls
from tooljaild.edge.terminal import serve_terminal
from tooljaild.edge.watch import watch_workspace
from tooljaild.sessions.manager import SessionManager
from tooljaild.sessions.policy import (
    DOWNLOAD_TOOL,
    UPLOAD_TOOL,
    check_file_rpc,
    check_may_open_session,
)
from tooljaild.sessions.session import Session, SessionOptions
from tooljaild.tools.registry import Tool

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ToolRunner"].full_name

_Named = TypeVar("_Named", pb.Result, pb.CallInfo, pb.SessionInfo, pb.Started)


class ToolRunnerServicer(tooljail_pb2_grpc.ToolRunnerServicer):
    """tooljail.v1.ToolRunner over a CallManager.

    Args:
        daemon_id: The name every Result, CallInfo, SessionInfo and Started
            carries, and GetDaemonInfo answers (`create_server` sets the default).
        started_unix: When this daemon started (GetDaemonInfo); None: now.
        refusals: Told of each call or session refused because the daemon drains
            (`tooljaild.edge.drain`); None: a fresh one nobody reads.
    """

    def __init__(
        self,
        manager: CallManager,
        sessions: SessionManager | None = None,
        artifacts: ArtifactStore | None = None,
        authenticator: Authenticator | None = None,
        *,
        daemon_id: str = "",
        started_unix: float | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self._manager = manager
        self._sessions = sessions
        self._artifacts = artifacts
        self._auth = authenticator or Authenticator(None, client_certificates=False)
        self.daemon_id = daemon_id
        self.started_unix = time.time() if started_unix is None else started_unix
        self._refusals = refusals or Refusals()

    def _named(self, message: _Named) -> _Named:
        """`message`, naming this daemon: the one place every answer gets its daemon_id
        (a client routing over many daemons pins the call or session to it)."""
        message.daemon_id = self.daemon_id
        if isinstance(message, pb.CallInfo) and message.HasField("result"):
            message.result.daemon_id = self.daemon_id
        return message

    def _identity(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The authenticated caller; None when the daemon has no authentication
        (`AuthGate` has already refused a request without a valid one)."""
        return self._auth.identify(context)

    def _owner(self, context: grpc.aio.ServicerContext) -> str:
        """Who the caller is for fairness and ownership: its identity's name when
        authenticated (what it declares is then ignored), else `client_of`."""
        identity = self._identity(context)
        return client_of(context) if identity is None else identity.name

    async def _refuse(self, context: grpc.aio.ServicerContext, exc: TooljailError) -> NoReturn:
        """End the RPC with `exc`, noting a refusal because the daemon drains: the
        daemon stops listening once such refusals stop (`tooljaild.edge.drain`)."""
        if isinstance(exc, ShuttingDownError):
            self._refusals.note()
        await abort_with(context, exc)

    def _own_call(
        self, call_id: str, context: grpc.aio.ServicerContext, *, approvers_too: bool = False
    ) -> Call:
        """The call, if the caller may see it: an authenticated caller sees its own
        calls only, live or answered from the journal; another's is "not found",
        in the very words said of an id never used. With `approvers_too`, an
        approver sees any call (to judge what it approves).

        Raises:
            CallNotFoundError: No call of that id, or none the caller may see.
        """
        return self._manager.history.visible(
            call_id, self._identity(context), approvers_too=approvers_too
        )

    def _own_session(self, session_id: str, context: grpc.aio.ServicerContext) -> Session:
        """The open session, if the caller may use it (as `_own_call`): another
        identity's, open or ended, is "not found" in the very words said of an
        id never used."""
        identity = self._identity(context)
        return self._session_manager().get(session_id, None if identity is None else identity.name)

    def _session_manager(self) -> SessionManager:
        if self._sessions is None:
            raise InvalidRequestError("this daemon serves no sessions")
        return self._sessions

    def _artifact_store(self) -> ArtifactStore:
        if self._artifacts is None:
            raise InvalidRequestError("this daemon keeps no artifacts")
        return self._artifacts

    async def ListTools(
        self, request: pb.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListToolsResponse:
        registry = self._manager.registry
        identity = self._identity(context)
        # A tool outside the caller's allow-list is not even named to it.
        infos = [
            i for i in self._manager.tool_infos() if identity is None or identity.may_use(i.name)
        ]
        return pb.ListToolsResponse(
            tools=[tool_info_to_proto(info) for info in infos],
            diagnostics=[diagnostic_to_proto(d) for d in registry.diagnostics],
        )

    async def _submit(self, request: pb.CallRequest, context: grpc.aio.ServicerContext) -> Call:
        """Admit the call a Call or Run request asks for, or end the RPC with why not."""
        identity = self._identity(context)
        asked = CallRequest(
            request.tool,
            request.arguments_json,
            request.call_id,
            request.timeout_s,
            request.session_id,
            tuple(request.egress),
            tuple(request.secrets),
        )
        try:
            # One trip: the policy, the arguments, whose session and id, the admission.
            client = client_of(context) if identity is None else identity.name
            return await self._manager.admit(asked, identity=identity, client=client)
        except TooljailError as exc:
            await self._refuse(context, exc)

    async def Call(
        self, request: pb.CallRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallEvent]:
        call = await self._submit(request, context)
        # A call awaiting approval may wait long: its notice goes out now.
        notice = waiting_notice(call, self._manager.approvals.timeout_s)
        if notice is not None:
            yield _output(notice)
        # Leaving this generator (client gone) does not stop the call: it runs
        # on, and GetCall answers for it.
        if await _ran(call, until=call.answered):
            yield pb.CallEvent(started=self._named(_started(call)))
        async for event in call.stream(notice.seq + 1 if notice else 1):
            yield _output(event)
        yield pb.CallEvent(result=self._named(result_to_proto(await call.answered.wait())))

    async def Run(self, request: pb.CallRequest, context: grpc.aio.ServicerContext) -> pb.Result:
        call = await self._submit(request, context)
        # A caller that goes away does not stop the call (as for Call).
        return self._named(result_to_proto(await call.answered.wait()))

    async def Attach(
        self, request: pb.AttachRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.CallEvent]:
        try:
            call = self._own_call(request.call_id, context)
        except TooljailError as exc:
            await abort_with(context, exc)
        if await _ran(call, until=call.ended):
            yield pb.CallEvent(started=self._named(_started(call)))
        # To the call's real end: past a timeout its caller already heard, too.
        async for event in call.events.follow(max(1, request.from_seq)):
            yield _output(event)
        yield pb.CallEvent(result=self._named(result_to_proto(await call.ended.wait())))

    async def GetCall(
        self, request: pb.GetCallRequest, context: grpc.aio.ServicerContext
    ) -> pb.CallInfo:
        try:
            call = self._own_call(request.call_id, context, approvers_too=True)
            return self._named(call_info_to_proto(self._manager.history.info(call)))
        except TooljailError as exc:
            await abort_with(context, exc)

    async def ListCalls(
        self, request: pb.ListCallsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCallsResponse:
        # Who may list what, and the page: `edge.history`, `calls.history`.
        return list_calls(self._manager.history, request, self._identity(context), self.daemon_id)

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelResponse:
        try:
            state = await self._manager.cancel(self._own_call(request.call_id, context).call_id)
        except TooljailError as exc:
            await abort_with(context, exc)
        return pb.CancelResponse(state=call_state_to_proto(state))

    async def Approve(
        self, request: pb.ApproveRequest, context: grpc.aio.ServicerContext
    ) -> pb.CallInfo:
        try:
            call = await self._manager.decide(
                request.call_id, self._identity(context), request.approve, request.reason
            )
        except TooljailError as exc:
            await abort_with(context, exc)
        return self._named(call_info_to_proto(self._manager.history.info(call)))

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        # A session is a sandbox to run tools in: the identity must be allowed one.
        check_may_open_session(
            self._identity(context),
            (t.name for t in self._manager.registry.tools() if _runs_in_a_sandbox(t)),
        )
        options = SessionOptions(
            idle_ttl_s=request.idle_ttl_s,
            max_lifetime_s=request.max_lifetime_s,
            memory_bytes=request.memory_bytes,
            pids=request.pids,
            cpus=request.cpus,
            workspace_bytes=request.workspace_bytes,
            keep_processes=request.keep_processes,
        )
        identity = self._identity(context)
        try:
            session = await self._session_manager().create(
                options,
                self._owner(context),
                max_sessions=None if identity is None else identity.max_sessions,
                identity=identity,
                egress=tuple(request.egress),
                secrets=tuple(request.secrets),
            )
        except TooljailError as exc:
            await self._refuse(context, exc)
        return self._named(session_info_to_proto(session.info()))

    async def SetSessionEgress(
        self, request: pb.SetSessionEgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        # Owned as CloseSession: another identity's session is not found.
        identity = self._identity(context)
        info = self._session_manager().set_egress(
            request.session_id,
            tuple(request.egress),
            identity=identity,
            client=None if identity is None else identity.name,
        )
        return self._named(session_info_to_proto(info))

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SessionInfo:
        identity = self._identity(context)
        closed = await self._session_manager().close(
            request.session_id, None if identity is None else identity.name
        )
        return self._named(session_info_to_proto(closed))

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        # An authenticated caller sees its own sessions only.
        all_clients = request.all_clients and self._identity(context) is None
        client = None if all_clients else self._owner(context)
        infos = self._session_manager().list(client)
        return pb.ListSessionsResponse(
            sessions=[self._named(session_info_to_proto(i)) for i in infos]
        )

    async def UploadFile(
        self, requests: AsyncIterator[pb.FileChunk], context: grpc.aio.ServicerContext
    ) -> pb.FileInfo:
        # An upload is write_file's work (`sessions.policy`); it holds a place
        # (`sessions.transfers`) from before its first chunk, and its chunks go to a
        # spool file as they come: nothing of it waits in memory for the session.
        sessions = self._session_manager()
        check_file_rpc(self._identity(context), "UploadFile", UPLOAD_TOOL)
        idle_s = sessions.settings.transfer_idle_timeout_s
        with sessions.transfers.held(self._owner(context)) as place:
            async with asyncio.timeout(idle_s) as idle:
                first = await _next_chunk(requests, idle, idle_s)
                if first is None:
                    raise InvalidRequestError(
                        "an upload needs a first chunk naming the session and path"
                    )
                session = self._own_session(first.session_id, context)
                place.bind(session.id)
                path = first.path
                spool = sessions.transfers.spool(
                    max_bytes=session.terms.limits.workspace_bytes, path=path
                )
                try:
                    await spool.add(first.data)
                    while (chunk := await _next_chunk(requests, idle, idle_s)) is not None:
                        if (chunk.session_id and chunk.session_id != first.session_id) or (
                            chunk.path and chunk.path != path
                        ):
                            raise InvalidRequestError(
                                "every chunk of an upload goes to the session and path of "
                                "its first chunk (later chunks may leave them empty)"
                            )
                        await spool.add(chunk.data)
                    idle.reschedule(None)  # the stream is read: the rest is ours to do
                    written, size = await sessions.upload(session, path, spool)
                finally:
                    spool.close()
        return pb.FileInfo(path=written, size_bytes=size)

    async def DownloadFile(
        self, request: pb.DownloadFileRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FileChunk]:
        # A download is read_file's work; it holds a place, and a client that reads
        # nothing for the idle timeout loses it: each chunk is written with
        # `context.write` under that timeout (a `yield` could wait forever).
        sessions = self._session_manager()
        check_file_rpc(self._identity(context), "DownloadFile", DOWNLOAD_TOOL)
        idle_s = sessions.settings.transfer_idle_timeout_s
        with sessions.transfers.held(self._owner(context)) as place:
            session = self._own_session(request.session_id, context)
            place.bind(session.id)
            first = True
            async for data in sessions.download(session, request.path):
                if first:
                    chunk = pb.FileChunk(session_id=session.id, path=request.path, data=data)
                    first = False
                else:
                    chunk = pb.FileChunk(data=data)
                try:
                    await asyncio.wait_for(context.write(chunk), idle_s)
                except TimeoutError:
                    raise InvalidRequestError(
                        f"the download of {request.path!r} was ended: its client read "
                        f"nothing for {idle_s:g}s ([sessions] transfer_idle_timeout_s); "
                        "read the stream as it comes"
                    ) from None
        return
        yield  # an async generator (the error edge wraps one), which writes its own chunks

    # The process methods (issue 24): each a delegate to `edge.processes`, on the
    # caller's own session (another client's is NOT_FOUND).

    async def StartProcess(
        self, request: pb.StartProcessRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProcessInfo:
        session = self._own_session(request.session_id, context)
        identity = self._identity(context)
        allowed = self._manager.commands_allowed("start_process", identity)
        return await processes.start_process(session, request, identity, allowed)

    async def ListProcesses(
        self, request: pb.ListProcessesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListProcessesResponse:
        session = self._own_session(request.session_id, context)
        return await processes.list_processes(session, self._identity(context))

    async def ReadProcessOutput(
        self, request: pb.ReadProcessOutputRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessOutput]:
        session = self._own_session(request.session_id, context)
        identity = self._identity(context)
        async for message in processes.read_process_output(session, request, identity):
            yield message

    async def WriteProcessInput(
        self, request: pb.WriteProcessInputRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProcessInfo:
        session = self._own_session(request.session_id, context)
        return await processes.write_process_input(session, request, self._identity(context))

    async def SignalProcess(
        self, request: pb.SignalProcessRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProcessInfo:
        session = self._own_session(request.session_id, context)
        return await processes.signal_process(session, request, self._identity(context))

    async def WaitProcess(
        self, request: pb.WaitProcessRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProcessInfo:
        session = self._own_session(request.session_id, context)
        return await processes.wait_process(session, request, self._identity(context))

    # The artifact methods answer for the caller's own artifacts only (`client_of`):
    # another client's id is "not found", exactly as an id never made.

    async def GetArtifact(
        self, request: pb.GetArtifactRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ArtifactChunk]:
        store, owner = self._artifact_store(), self._owner(context)
        info = store.get(request.artifact_id, owner)
        chunks = store.chunks(request.artifact_id, owner)
        try:
            # Disk reads off the event loop; one at a time, in order.
            data = await asyncio.to_thread(next, chunks, b"")
            # The first chunk carries the info (and no data for an empty artifact).
            yield pb.ArtifactChunk(info=artifact_info_to_proto(info), data=data)
            while data := await asyncio.to_thread(next, chunks, b""):
                yield pb.ArtifactChunk(data=data)
        finally:
            # The file, now rather than at garbage collection; unless a read is
            # still running on its thread (the RPC was cancelled under it): then
            # the generator cannot be closed ("already executing"), and is collected.
            with contextlib.suppress(ValueError):
                chunks.close()

    async def ListArtifacts(
        self, request: pb.ListArtifactsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListArtifactsResponse:
        # One page: its size bounded (MAX_PAGE_SIZE), so is the answer and the
        # loop's time to build it, whatever the store holds (an index walk).
        page = self._artifact_store().page(
            self._owner(context),
            call_id=request.call_id,
            session_id=request.session_id,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return pb.ListArtifactsResponse(
            artifacts=[artifact_info_to_proto(i) for i in page.artifacts],
            next_page_token=page.next_page_token,
        )

    async def GetDaemonInfo(
        self, request: pb.GetDaemonInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.DaemonInfo:
        return pb.DaemonInfo(
            daemon_id=self.daemon_id,
            version=__version__,
            # Set the moment a drain begins, before health says NOT_SERVING
            # (`Daemon.stop`): a client that asks never sends a call it would refuse.
            draining=self._manager.draining,
            started_unix=self.started_unix,
        )

    async def DeleteArtifact(
        self, request: pb.DeleteArtifactRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteArtifactResponse:
        deleted = self._artifact_store().delete(request.artifact_id, self._owner(context))
        return pb.DeleteArtifactResponse(deleted=deleted)

    # --- a terminal and forwarded ports (issue 24; edge/terminal.py, edge/forward.py) ---

    async def Terminal(
        self, requests: AsyncIterator[pb.TerminalInput], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TerminalOutput]:
        sessions = self._session_manager()
        outputs = serve_terminal(
            requests,
            lambda session_id: self._own_session(session_id, context),
            open_timeout_s=sessions.settings.transfer_idle_timeout_s,
            # A terminal is a process the caller starts, as start_process's are.
            commands_allowed=self._manager.commands_allowed(
                "start_process", self._identity(context)
            ),
        )
        async for output in outputs:
            yield output

    async def ForwardPort(
        self, requests: AsyncIterator[pb.PortData], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.PortData]:
        sessions = self._session_manager()
        outputs = serve_forward(
            requests,
            lambda session_id: self._own_session(session_id, context),
            open_timeout_s=sessions.settings.transfer_idle_timeout_s,
        )
        async for output in outputs:
            yield output

    # --- the approval queue, for approvers (issue 25 item 2; edge/approvals.py) ---

    async def ListApprovals(
        self, request: pb.ListApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListApprovalsResponse:
        approvals, identity = self._manager.approvals, self._identity(context)
        return edge_approvals.list_approvals(approvals, identity, self.daemon_id)

    async def WatchApprovals(
        self, request: pb.WatchApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ApprovalEvent]:
        approvals, identity = self._manager.approvals, self._identity(context)
        async for event in edge_approvals.watch_approvals(
            approvals, identity, context, self.daemon_id
        ):
            yield event

    # --- workspace change events (issue 24 item 5; edge/watch.py) ---

    async def WatchWorkspace(
        self, request: pb.WatchWorkspaceRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WorkspaceEvent]:
        settings = self._session_manager().settings
        session = self._own_session(request.session_id, context)
        events = watch_workspace(
            session,
            request,
            self._identity(context),
            max_watches=settings.max_watches,
            max_dirs=settings.watch_max_dirs,
        )
        async for event in events:
            yield event


async def _ran(call: Call, until: Once[ToolResult]) -> bool:
    """Wait until the call runs or `until` is given; True if it runs (or ran).

    Waits on futures of its own (`Once.wait`): a caller that goes away cancels
    nothing of the call.
    """
    if not (call.running.done() or until.done()):
        await asyncio.wait((call.running.wait(), until.wait()), return_when=asyncio.FIRST_COMPLETED)
    return call.running.done()


async def _next_chunk(
    requests: AsyncIterator[pb.FileChunk], idle: asyncio.Timeout, idle_s: float
) -> pb.FileChunk | None:
    """The upload's next chunk (None at its end), within `idle_s` of the last one.

    Raises:
        InvalidRequestError: No chunk came for `idle_s` (the stream is given up).
    """
    idle.reschedule(asyncio.get_running_loop().time() + idle_s)
    try:
        return await anext(requests, None)
    except asyncio.CancelledError:
        if idle.expired():
            raise InvalidRequestError(
                f"the upload sent no chunk for {idle_s:g}s ([sessions] "
                "transfer_idle_timeout_s) and was ended; nothing was written. Send the "
                "file's chunks without pausing."
            ) from None
        raise


def _runs_in_a_sandbox(tool: Tool) -> bool:
    """Whether `tool` runs in a sandbox (so in a session), not in the daemon; or works
    on a session from the daemon (install_packages, the process tools)."""
    return not tool.runs_in_daemon or (tool.run is not None and tool.run.needs_session)


def _started(call: Call) -> pb.Started:
    return pb.Started(call_id=call.call_id, sandbox_id=call.sandbox_id, tool=call.tool.name)


def _output(event: Event) -> pb.CallEvent:
    return pb.CallEvent(
        output=pb.Output(seq=event.seq, stream=stream_kind_to_proto(event.stream), data=event.data)
    )


CLIENT_KEY = "tooljail-client"
"""Metadata key an agent host may name itself by (the SDK sends its host and pid)."""


def client_of(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for fairness: the name the client sent, else its address.

    A TCP peer counts by host (its port changes per connection); every caller on
    the Unix socket that sends no name shares one share.
    """
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_KEY and isinstance(value, str) and value:
            return value[:128]
    peer = context.peer() or ""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return kind + ":" + address.rsplit(":", 1)[0]
    return kind
