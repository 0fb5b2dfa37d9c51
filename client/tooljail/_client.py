"""The SDK's clients: `Client` (blocking) here, and `AsyncClient` (asyncio).

Everything that does no I/O lives below them: checks, requests and decoding
in `_BaseClient` (`tooljail._client_base`), what each method sends and reads
as a flow in `_ClientPlans` (`tooljail._client_plans`), the retry, routing and
resume policies as flows in `RouterBase`. `Client` runs each flow with
blocking calls (`Router`) and `AsyncClient` (`tooljail._async_client`) awaits
it (`AsyncRouter`), so a fix to the logic is made once for both. Both stay
importable from here.

Error contract: a tool that fails is not an exception, it is a `ToolResult` with
`status != SUCCESS`. Methods raise only for problems outside the tool: the
request was refused (`ToolNotFoundError`, `InvalidArgumentsError`,
`JournalUnavailableError`, ...), or the RPC failed (`TransportError`,
`DaemonUnavailableError`). Bad arguments to the methods themselves raise
`TypeError` (wrong Python type) or a `TooljailError` that is also a
`ValueError` (wrong value) before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import grpc

from tooljail._async_client import AsyncClient
from tooljail._call_types import CallInfo
from tooljail._client_approvals import _SyncApprovals
from tooljail._client_base import (
    CLIENT_KEY,
    MAX_RECEIVE_MESSAGE_BYTES,
    TARGET_ENV,
    default_socket_path,
    default_target,
)
from tooljail._client_history import _ClientWithHistory
from tooljail._forward import Forward, check_ports
from tooljail._router import Router
from tooljail._session import Session
from tooljail._session_base import SessionOptions, create_session_request
from tooljail._terminal import Terminal, open_request, session_stream_target
from tooljail._types import (
    ArtifactInfo,
    CallState,
    Diagnostic,
    Output,
    SessionInfo,
    ToolInfo,
    ToolResult,
)
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "CLIENT_KEY",
    "MAX_RECEIVE_MESSAGE_BYTES",
    "TARGET_ENV",
    "AsyncClient",
    "Client",
    "default_socket_path",
    "default_target",
]


class Client(_ClientWithHistory, _SyncApprovals):
    """A blocking client of one tooljail daemon, or of many.

    Example:
        with Client() as client:
            result = client.call("execute_python_code", {"code": "print(1)"})

    Over many daemons (`Client(["host-a:7070", "host-b:7070"])`, or
    `Client("dns:///tooljail.ns.svc:7070")`), each new call goes to the daemon
    that rendezvous hashing of its call id ranks first among those serving, so
    calls spread evenly and a retry of the same id reaches the same daemon;
    `result.daemon_id` names it, and `get_call`, `attach`, `cancel` and the
    session's calls go there. A call whose daemon is gone comes back LOST
    (effect UNKNOWN, its message naming the daemon and why), and a session's
    next call raises `SessionEndedError` (reason "daemon_lost"): nothing is
    silently run on another daemon. A draining daemon gets no new calls.
    `list_tools` asks one daemon; `list_sessions` and `list_artifacts` merge
    the answers of every daemon that answers.

    Args:
        target: The daemon: "unix:///path.sock", a bare socket path, or
            "host:port". None means `default_target()`. Many daemons: a list
            (or tuple) of such targets, Unix and TCP mixed, or a
            "dns:///name:port" target that the SDK resolves itself (every
            address of the name is a daemon; resolved again every 2 s), e.g.
            a Kubernetes headless Service. The credentials apply to each.
        rpc_timeout_s: The deadline in seconds of each try of a request that
            is answered at once (`list_tools`, `get_call`, `cancel`, the
            session, file and artifact methods, ...). None means no deadline.
            It does not bound `call`/`stream`/`attach`, which last as long as
            the tool may run (`tool_timeout_s` of `call`).
        retries: How many times `call`, `stream` and `attach` try again when the
            daemon cannot be reached or the connection drops (UNAVAILABLE), with
            backoff (0.1 s, 0.3 s, 0.9 s, ...). Every try carries the same call
            id (the SDK makes one when none is given), so the daemon joins the
            call it already runs instead of running it twice; a broken stream
            resumes with `attach` after the last chunk received. The session
            methods that are safe to repeat (`list_sessions`, `close_session`,
            `upload_file`, `download_file`) retry the same way; `session()`
            does not (see there). So do the artifact methods.
        client_name: The name this client goes by on the daemon: its share of
            calls, and the owner of the artifacts its calls make (only a client
            of the same name reads, lists or deletes them). None: the
            TOOLJAIL_CLIENT environment variable, else "<host>/<pid>", which no
            other process shares. Give an agent a name to read its artifacts
            from another process (`tooljail artifacts ls --client NAME`). The
            name is not authenticated (until the daemon has tokens): anyone who
            can reach the daemon may claim it, so an artifact's real protection
            is its id, 128 random bits that only its result names. A daemon
            with tokens or client certificates ignores it: the authenticated
            identity is the name.
        token: The bearer token the daemon's tokens file knows (sent as
            `authorization: Bearer <token>`). None: $TOOLJAIL_TOKEN, else none.
        tls_ca_file: CA certificates (PEM) that verify the daemon's TLS
            certificate; given (or $TOOLJAIL_TLS_CA), the channel is TLS.
        tls_cert_file: This client's certificate (PEM), for a daemon that
            requires client certificates (its subject's CN names the
            identity). None: $TOOLJAIL_TLS_CERT, else none.
        tls_key_file: Its private key (PEM). None: $TOOLJAIL_TLS_KEY.
        timeout: Deprecated (a DeprecationWarning): the old name of `rpc_timeout_s`.

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the target is unusable, `rpc_timeout_s` is not
            a positive number, or the client name is empty, too long (over 128
            characters) or not printable ASCII, the token is empty or not
            printable ASCII, a certificate comes without its key, or a TLS file
            cannot be read.
    """

    _router: Router

    def _new_router(self) -> Router:
        return Router(self._link, self._targets)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channels; RPCs still in flight fail. Calling it twice is fine."""
        self._router.close()

    def list_tools(self) -> list[ToolInfo]:
        """The tools the daemon serves.

        Raises:
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        return self._router.run(self._plan_list_tools())

    def diagnostics(self) -> list[Diagnostic]:
        """The problems the daemon found while loading user tools.

        Raises:
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        return self._router.run(self._plan_diagnostics())

    def openai_tools(self) -> list[dict[str, Any]]:
        """The served tools as OpenAI function-calling tool definitions.

        Raises:
            TransportError: When the RPC fails.
        """
        return self._openai_tools(self.list_tools())

    def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> ToolResult:
        """Runs a tool and waits for its result; output chunks are not kept.

        A tool that fails, times out or is cancelled is a result, not an
        exception: check `result.status` (and `result.effect` before retrying).

        Args:
            tool: The tool's name.
            args: The tool's arguments (a JSON-serialisable dict); None means {}.
            tool_timeout_s: How long the tool may run, in seconds, within the
                tool's bounds; None means the tool's default (its `timeout_s`).
                Sent to the daemon, which enforces it: past it the result is
                TIMEOUT (the call may still take effect). Not an RPC deadline.
            call_id: An idempotency key: the same id and arguments return the
                stored outcome instead of running again. None: the SDK makes one.
            session_id: Run in this session (its interpreter and workspace),
                which any client may name; None means a fresh sandbox. A call
                in a session waits for the session's calls before it.
            timeout: Deprecated (a DeprecationWarning): the old name of
                `tool_timeout_s`.
            egress: What the call's sandbox may reach through the daemon's
                egress proxy: rules such as "api.example.com",
                "*.example.org:443", each within the tool's own rules (when it
                has some) and the caller's allowance. None: the tool's rules
                (a tool with none has no network). In a session, the session's
                rules decide, and these may only narrow them for the call.
            secrets: Names of secrets (the daemon's secrets file) the call
                holds: inside the sandbox each is an environment variable with a
                placeholder the proxy swaps for the value only on the way to
                the secret's hosts. In a session: secrets the session holds.

        Returns:
            The call's one final result; over many daemons, LOST (effect
            UNKNOWN) when the daemon it was sent to is gone. Connections the
            egress proxy refused are in `result.egress_denied`.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When an argument is malformed (or the daemon says so).
            BadTimeoutError: When the timeout is out of bounds.
            ToolNotFoundError: When no such tool is served.
            InvalidArgumentsError: When the arguments do not fit the tool's schema.
            CallIdConflictError: When the call id was used with other arguments.
            OverloadedError: When the daemon is full; see `retry_after_s`.
            ShuttingDownError: When the daemon is draining.
            SessionNotFoundError: When the daemon never knew the session.
            SessionEndedError: When the session has ended (`reason` says why).
            PermissionDeniedError: When `egress` or `secrets` ask for more than
                the tool or this identity may have (the message names the rule).
            EgressUnavailableError: When `egress` or `secrets` are asked of a
                daemon without egress configured.
            TransportError: When the RPC fails or ends without a result.
        """
        return self._router.run(
            self._plan_call(tool, args, tool_timeout_s=tool_timeout_s, call_id=call_id,
                            session_id=session_id, timeout=timeout, egress=egress,
                            secrets=secrets)
        )  # fmt: skip

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> Generator[Output | ToolResult, None, None]:
        """Runs a tool and yields its output as it arrives, then its result.

        Arguments are checked when `stream` is called, not at the first `next()`.

        Closing the iterator before the result (`break`, `.close()`, garbage
        collection) cancels the RPC only: the call keeps running on the daemon.
        To stop it, pass a `call_id` and call `cancel(call_id)`; to get its
        outcome later, `get_call(call_id)`.

        Args:
            tool: The tool's name.
            args: The tool's arguments (a JSON-serialisable dict); None means {}.
            tool_timeout_s: How long the tool may run, in seconds; None means
                the tool's default. As for `call`.
            call_id: An idempotency key; None lets the SDK make one.
            session_id: Run in this session; None means a fresh sandbox.
            timeout: Deprecated: the old name of `tool_timeout_s`.
            egress: What the sandbox may reach; as for `call`.
            secrets: Secrets the call holds; as for `call`.

        Returns:
            An iterator of `Output` chunks in order, and the `ToolResult` last.

        Raises:
            TypeError, InvalidRequestError, BadTimeoutError: As for `call`, at once.
            TooljailError: As for `call`, from the iterator.
        """
        return self._router.stream(
            self._plan_stream(tool, args, tool_timeout_s=tool_timeout_s, call_id=call_id,
                              session_id=session_id, timeout=timeout, egress=egress,
                              secrets=secrets)
        )  # fmt: skip

    def attach(
        self, call_id: str, *, from_seq: int = 0
    ) -> Generator[Output | ToolResult, None, None]:
        """Follows a call the daemon knows: its output from `from_seq` on, then its result.

        For a caller that lost its stream: pass the last `Output.seq` it saw + 1,
        and nothing is missing and nothing comes twice (while the daemon still
        keeps the chunks; an `Output` of stream NOTICE says when some are gone).
        It follows the call to its real end, past a timeout its caller heard.

        Raises:
            CallNotFoundError: When the daemon does not know the call.
            TooljailError: As for `stream`.
        """
        return self._router.stream(self._plan_attach(call_id, from_seq))

    def get_call(self, call_id: str) -> CallInfo:
        """What the daemon knows of a call: its state and, once ended, its result.

        Raises:
            CallNotFoundError: When the daemon does not remember the call.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_get_call(call_id))

    def cancel(self, call_id: str) -> CallState:
        """Stops a queued or running call; effects already done stay done.

        Returns:
            The call's state after the cancel was handled (a finished call keeps
            its state).

        Raises:
            CallNotFoundError: When the daemon does not remember the call.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_cancel(call_id))

    def approve(self, call_id: str) -> CallInfo:
        """Approves a call that waits for approval: it runs.

        Only an identity whose policy says `approver = true` may.

        Returns:
            The call's state after the decision.

        Raises:
            CallNotFoundError: When the daemon does not know the call.
            NotAwaitingApprovalError: When the call does not wait for approval.
            PermissionDeniedError: When this identity may not approve.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_approve(call_id, True))

    def deny(self, call_id: str, reason: str = "") -> CallInfo:
        """Denies a call that waits for approval: it ends with effect none,
        its message carrying `reason` (for the model to act on). As `approve`."""
        return self._router.run(self._plan_approve(call_id, False, reason))

    # --- sessions and workspace files ---

    def session(self, **options: Unpack[SessionOptions]) -> Session:
        """Opens a session now: a sandbox kept for a sequence of calls.

        Use it in a `with` block (closed at its end), or close it yourself.
        Each bound may only lower the daemon's own (its config): None (or 0)
        takes the daemon's. `session.info` says which bounds are in force.

        Not retried, not even when the daemon cannot be reached: creating a
        session is not idempotent, and a retry after a dropped answer could
        open a second session that nobody closes (it would end only at its
        idle TTL). Catch `DaemonUnavailableError` and call again if you wish.

        Args:
            idle_ttl_s: Seconds without a call after which the session closes.
            max_lifetime_s: Seconds after creation at which it closes, busy or not.
            memory_bytes: Memory of the whole session (processes, /tmp, workspace).
            pids: Processes and threads in the whole session.
            cpus: CPU cores the session may use at once.
            workspace_bytes: Size of the workspace directory.
            keep_processes: Processes a call starts keep running after the call
                (servers, background jobs) until the session ends; by default
                they are killed when the call ends.
            egress: What the session may reach through the daemon's egress
                proxy (rules as for `call`), within this identity's allowance;
                `session.set_egress(...)` changes them while it lives. None:
                no network.
            secrets: Names of secrets the session holds for its life (as for
                `call`); their placeholders are in its environment.

        Returns:
            The open `Session`; `session.info` holds the bounds in force.

        Raises:
            TypeError: When an option has the wrong type.
            InvalidRequestError: When an option is negative or not finite (or
                the daemon refuses it, e.g. an egress rule it cannot parse).
            PermissionDeniedError: When `egress` or `secrets` ask for more than
                this identity may have.
            EgressUnavailableError: When they are asked of a daemon without egress.
            OverloadedError: When the daemon (or this client) has as many
                sessions as it allows; see `retry_after_s`.
            ShuttingDownError: When the daemon is draining.
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        request = create_session_request(**options)
        return Session(self, self._router.run(self._plan_open_session(request)))

    def set_session_egress(self, session_id: str, rules: Sequence[str]) -> SessionInfo:
        """Replaces the egress rules of an open session of this client's.

        Connections the session opens from the answer on are decided by the new
        rules (open ones are kept); an empty list cuts it off the network.
        Retried like `call` (setting the same rules twice is harmless).

        Returns:
            The session as it is now (`egress` holds the new rules).

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When a rule is empty or cannot be parsed (the
                message names it).
            PermissionDeniedError: When a rule asks for more than this
                identity may reach (the message names it).
            EgressUnavailableError: When the daemon has no egress configured.
            SessionNotFoundError: When no session of this client has that id.
            SessionEndedError: When the session has ended.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_set_session_egress(session_id, rules))

    def list_sessions(self, *, all_clients: bool = False) -> list[SessionInfo]:
        """The open sessions of this client (its host and process), or of every client.

        Raises:
            TypeError: When `all_clients` is not a bool.
            TransportError: When the RPC fails (DaemonUnavailableError: no daemon).
        """
        return self._router.run(self._plan_list_sessions(all_clients))

    def close_session(self, session_id: str) -> SessionInfo:
        """Ends a session: its sandbox, interpreter and workspace are destroyed.

        Closing a session that already ended is not an error: the answer says
        how it ended. Retried like `call` (closing twice is harmless).

        Returns:
            The session as it ended (`state` CLOSED, `end_reason`).

        Raises:
            TypeError: When the id is not a str.
            InvalidRequestError: When the id is empty.
            SessionNotFoundError: When the daemon never knew the session.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_close_session(session_id))

    def upload_file(self, session_id: str, path: str, data: bytes | bytearray | memoryview) -> int:
        """Writes `data` to `path` in a session's workspace, replacing any file there.

        The bytes stream in chunks of 1 MiB, so a file larger than the daemon's
        request limit fits (the workspace quota bounds it). Retried
        like `call`, by sending the whole file again: writing the same bytes to
        the same path twice leaves the same file.

        Args:
            session_id: The session.
            path: Relative to the workspace.
            data: The file's content (bytes, bytearray or memoryview).

        Returns:
            The size in bytes of the file written.

        Raises:
            TypeError: When an argument has the wrong type (a str `data` too:
                encode it).
            InvalidRequestError: When the session id is empty.
            InvalidPathError: When the path is empty, absolute, leaves the
                workspace or names a directory.
            WorkspaceFullError: When the file would pass the workspace quota.
            SessionNotFoundError, SessionEndedError: As for `call`.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_upload_file(session_id, path, data))

    def download_file(self, session_id: str, path: str) -> bytes:
        """The content of `path` in a session's workspace, gathered from its chunks.

        Retried like `call` (reading again is harmless), from the start.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When the session id is empty.
            InvalidPathError: When the path is empty, absolute, leaves the
                workspace or names a directory.
            WorkspaceFileNotFoundError: When there is no such file.
            SessionNotFoundError, SessionEndedError: As for `call`.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_download_file(session_id, path))

    # --- a terminal and forwarded ports (issue 24; tooljail._terminal, tooljail._forward) ---

    def terminal(
        self,
        session_id: str,
        *,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Terminal:
        """Opens a shell on a PTY in a session: a `Terminal` (a context manager).

        Args:
            session_id: The session.
            rows: The window's rows; None: 24.
            cols: The window's columns; None: 80.
            argv: The program; None: `bash -l` (`sh -l` where there is no bash).
            env: Added to the session's environment; TERM defaults to xterm-256color.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When the session id is empty or a size is out of range.
            PermissionDeniedError: When this identity's commands are allow-listed
                (a shell cannot be checked).
            SessionNotFoundError, SessionEndedError: As for `call`.
            TransportError: When the RPC fails.
        """
        first = open_request(session_id, rows, cols, argv, env)
        stub, metadata, map_error = session_stream_target(self, session_id)
        return Terminal(stub, metadata, map_error, first)

    def forward(self, session_id: str, port: int, *, local_port: int = 0) -> Forward:
        """Tunnels a local port to `port` on a session's loopback: a `Forward`.

        Each TCP connection to `Forward.address` ("127.0.0.1:PORT") reaches
        127.0.0.1:`port` inside the session. Close it (or leave its `with`
        block) to close the listener and its connections.

        Args:
            session_id: The session.
            port: The port a server listens on in the session (1-65535).
            local_port: The local port; 0 picks a free one.

        Raises:
            PortUnreachableError: When nothing listens on `port` in the session
                (checked once at opening), or it is outside 1-65535.
            SessionNotFoundError, SessionEndedError: As for `call`.
            OSError: When `local_port` cannot be bound.
        """
        session_id, port, local_port = check_ports(session_id, port, local_port)
        stub, metadata, map_error = session_stream_target(self, session_id)
        return Forward(stub, metadata, map_error, session_id, port, local_port)

    # --- processes of a session (see `tooljail._processes`) ---

    def _process_rpc(self, method: str, request: Any, *, deadline: bool = True) -> Any:
        return self._router.run(self._plan_process(method, request, deadline=deadline))

    def _process_output(
        self, request: pb.ReadProcessOutputRequest
    ) -> Generator[pb.ProcessOutput, None, None]:
        """A process's output stream, read here (closing it cancels the RPC)."""
        messages, _ = self._server_stream("ReadProcessOutput", request, deadline=not request.follow)
        yield from messages

    def _watch_events(
        self, request: pb.WatchWorkspaceRequest
    ) -> tuple[Generator[pb.WorkspaceEvent, None, None], Callable[[], object]]:
        """A session's workspace events, read here, and what cancels the RPC (from
        any thread; closing the generator cancels it too)."""
        return self._server_stream("WatchWorkspace", request, deadline=False)

    def _server_stream(
        self,
        method: str,
        request: pb.ReadProcessOutputRequest | pb.WatchWorkspaceRequest,
        *,
        deadline: bool,
    ) -> tuple[Generator[Any, None, None], Callable[[], object]]:
        """A server stream of the session's daemon (pinned as the session is):
        its messages, errors mapped, the RPC cancelled once they end; and what
        cancels it."""
        daemon = self._router.run(self._plan_process_daemon(request))
        call = self._link.rpc(method, request, deadline=deadline).start(daemon.stub)

        def messages() -> Generator[Any, None, None]:
            try:
                yield from call
            except grpc.RpcError as e:
                raise self._router.map_error(daemon, e) from e
            finally:
                call.cancel()

        return messages(), call.cancel

    # --- artifacts ---

    def get_artifact(self, artifact_id: str) -> bytes:
        """The bytes of an artifact this client's calls made (`ToolResult.artifacts`).

        Streamed from the daemon in chunks and joined in memory; the client's
        `rpc_timeout_s` bounds the whole read. Retried like `call` (reading again is
        harmless), from the start.

        Raises:
            TypeError: When the id is not a str.
            InvalidRequestError: When the id is empty.
            ArtifactNotFoundError: When no artifact of that id is this client's
                (another client's is not found either).
            ArtifactGoneError: When it was this client's and is gone: `reason`
                is "evicted", "expired" or "deleted".
            TransportError: When the RPC fails or the stream breaks off.
        """
        return self._router.run(self._plan_get_artifact(artifact_id))

    def list_artifacts(
        self, *, call_id: str | None = None, session_id: str | None = None
    ) -> list[ArtifactInfo]:
        """The artifacts this client's calls made and the daemon still keeps, newest first.

        The daemon answers in pages (ListArtifacts' `page_token`); this reads
        them all, from each daemon.

        Args:
            call_id: Only those of this call; None: of any.
            session_id: Only those of calls in this session; None: of any.

        Raises:
            TypeError: When an id is not a str.
            InvalidRequestError: When an id is empty.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_list_artifacts(call_id, session_id))

    def delete_artifact(self, artifact_id: str) -> bool:
        """Deletes an artifact of this client's; reading it later says it was deleted.

        Retried like `call` (deleting twice is harmless).

        Returns:
            True when it was deleted now; False when it was gone already.

        Raises:
            TypeError: When the id is not a str.
            InvalidRequestError: When the id is empty.
            ArtifactNotFoundError: When no artifact of that id is this client's.
            TransportError: When the RPC fails.
        """
        return self._router.run(self._plan_delete_artifact(artifact_id))
