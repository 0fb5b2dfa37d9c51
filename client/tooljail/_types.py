"""Result and event types shared by the SDK and the daemon.

These are plain pydantic models with no I/O: the daemon builds them from what a
sandbox reports, the wire carries them as protobuf, and the SDK hands them to
agent code.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class CallStatus(enum.StrEnum):
    """How a call ended, as its caller sees it."""

    SUCCESS = "success"
    PARTIAL = "partial"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"


class Effect(enum.StrEnum):
    """Whether the tool's effects happened."""

    NONE = "none"
    """The tool did not run (bad input, cancelled while queued)."""
    APPLIED = "applied"
    """The tool ran to its end."""
    UNKNOWN = "unknown"
    """The tool may or may not have done what it does: check before retrying."""


class CallState(enum.StrEnum):
    """Where a call is in its life."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"
    AWAITING_APPROVAL = "awaiting_approval"
    """Admitted and waiting for an approver's decision; it has not run."""

    @property
    def finished(self) -> bool:
        return self not in (CallState.QUEUED, CallState.RUNNING, CallState.AWAITING_APPROVAL)


class StreamKind(enum.StrEnum):
    """Which stream an output chunk came from."""

    STDOUT = "stdout"
    STDERR = "stderr"
    YIELD = "yield"
    """One value yielded by a generator tool, as JSON text."""
    NOTICE = "notice"
    """A note from the daemon, e.g. that chunks were dropped for a slow reader."""


TIMEOUT_MESSAGE = (
    "The call timed out after {timeout:g}s. It may still take effect: check with the "
    "call_status tool (call_id '{call_id}') whether it did before calling it again."
)
"""A timed-out call's message; formatted with `timeout` (seconds) and `call_id`."""


class ToolError(BaseModel):
    """What went wrong inside a tool: an exception or a termination reason."""

    model_config = ConfigDict(frozen=True)

    type: str
    """The exception's class name, or a reason such as "ExitCode", "Signal", "Timeout"."""
    message: str = ""
    traceback: str = ""


class Output(BaseModel):
    """One chunk of a call's output, in order."""

    model_config = ConfigDict(frozen=True)

    seq: int
    """Increases by one per chunk of a call, from 1; 0 on `notice` chunks (the daemon's)."""
    stream: StreamKind
    data: str
    """The chunk as text (UTF-8, undecodable bytes replaced)."""

    def value(self) -> Any:
        """The yielded value of a `yield` chunk, decoded from JSON.

        Raises:
            ValueError: When this chunk is not a yielded value.
        """
        if self.stream is not StreamKind.YIELD:
            raise ValueError(f"a {self.stream.value} chunk carries text, not a value")
        return json.loads(self.data)


class ArtifactRef(BaseModel):
    """An artifact a result names: read it with `Client.get_artifact(artifact_id)`."""

    model_config = ConfigDict(frozen=True)

    artifact_id: str
    name: str = ""
    mime_type: str = "application/octet-stream"
    size_bytes: int = 0


class ArtifactInfo(ArtifactRef):
    """An artifact as `Client.list_artifacts` describes it."""

    call_id: str = ""
    session_id: str = ""
    created_unix: float = 0.0
    source: str = ""
    """"output", "result", "outputs", "figure" or "display"."""
    tool: str = ""


class Usage(BaseModel):
    """What one call used: from its sandbox's cgroup where it has one, else rusage.

    A call in a session reports its own usage, from its request to its end
    (also when a timeout interrupted it or reset the session's interpreter),
    never the session's so far. A tool that runs in the daemon itself, without
    a sandbox (the artifact tools), reports `wall_s` and `output_bytes`, and 0
    for `cpu_s` and `memory_peak_bytes`: nothing of the sandbox's was used.
    """

    model_config = ConfigDict(frozen=True)

    cpu_s: float = 0.0
    """CPU seconds, user and system, of the call's processes: every process of
    the sandbox where it has a cgroup, else the tool's process and the children
    it waited for. 0 for an in-daemon tool."""
    memory_peak_bytes: int = 0
    """The most memory in use at once during the call; 0 when unknown (and for
    an in-daemon tool). With a cgroup, the whole sandbox's. In a session with a
    cgroup v1, the cgroup's peak is reset at each call's start; with cgroup v2
    (whose peak cannot be reset) or no cgroup, it is the session interpreter's
    resident peak during the call (not counting processes it started), or,
    on a kernel that cannot reset that either, its peak since the interpreter
    started."""
    wall_s: float = 0.0
    """Seconds from the call's start to its end."""
    output_bytes: int = 0
    """Bytes written to stdout and stderr, kept or not."""
    net_connections: int = 0
    """Connections the call's sandbox opened through the daemon's egress proxy
    (refused ones included); 0 without egress."""
    net_bytes_out: int = 0
    """Bytes sent out through the egress proxy (to the upstream hosts)."""
    net_bytes_in: int = 0
    """Bytes received through the egress proxy (from the upstream hosts)."""


class EgressDenial(BaseModel):
    """A connection the daemon's egress proxy refused during a call.

    Repeats of the same (host, port, reason) are one entry with a `count`; a
    result lists at most 64 entries.
    """

    model_config = ConfigDict(frozen=True)

    host: str
    """The host asked for, as the sandbox named it (a name or an address)."""
    port: int = 0
    reason: str = ""
    """Why: "not_allowed", "deny_rule", "port_not_allowed", "ip_literal",
    "private_address", "resolve_failed", "sni_mismatch", "host_mismatch",
    "secret_leak", "connection_limit", "bad_request" or "no_egress"."""
    rule: str = ""
    """The rule that refused it, as written, when one did ("evil.example.com")."""
    count: int = 1
    """Times it was refused."""


class ProcessState(enum.StrEnum):
    """Where a session's background process stands."""

    RUNNING = "running"
    EXITED = "exited"
    """It ended by itself: `exit_code`, or `signal` when a signal ended it."""
    KILLED = "killed"
    """Its session ended or was reset (or its sandbox died) while it ran."""


class WorkspaceEventKind(enum.StrEnum):
    """What happened to a workspace entry (`session.watch`)."""

    CREATED = "created"
    MODIFIED = "modified"
    """Written to (writes in a row are merged into one event)."""
    DELETED = "deleted"
    """Deleted, or moved out of the watched directory."""
    MOVED = "moved"
    """Renamed within the watch: `path` is the new path, `old_path` the former."""
    DROPPED = "dropped"
    """Events were lost here (`dropped` is True): list the directory again."""


class WorkspaceEvent(BaseModel):
    """One change in a watched workspace directory (`session.watch`)."""

    model_config = ConfigDict(frozen=True)

    kind: WorkspaceEventKind
    path: str = ""
    """Relative to the workspace."""
    is_dir: bool = False
    old_path: str = ""
    """A move's former path."""
    dropped: bool = False
    """Events were lost here (the reader fell behind): what it knows may be stale."""
    dropped_hint: str = ""
    """What was lost and why."""


class ProcessInfo(BaseModel):
    """A background process of a session (`session.processes`), as the daemon reports it."""

    model_config = ConfigDict(frozen=True)

    process_id: str
    session_id: str = ""
    name: str = ""
    command: str = ""
    """The command line (an argv joined, quoted where needed)."""
    pid: int = 0
    """Its pid inside the sandbox."""
    state: ProcessState = ProcessState.RUNNING
    exit_code: int | None = None
    """Set once it exited by itself."""
    signal: int = 0
    """The signal that ended it; 0 if none."""
    started_unix: float = 0.0
    ended_unix: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of it and its children, as last measured."""
    memory_bytes: int = 0
    """Resident memory of it and its children, as last measured."""
    output_bytes: int = 0
    """Output so far, stdout and stderr together: the end of its offsets."""
    ring_start: int = 0
    """Where the kept ring starts: offsets below it come from `output_artifact_id`."""
    output_artifact_id: str = ""
    """The whole output, once it outgrew the ring (read it with `get_artifact`)."""
    terminal: bool = False
    """It runs on a PTY (a terminal's shell)."""

    @property
    def running(self) -> bool:
        return self.state is ProcessState.RUNNING


class ToolResult(BaseModel):
    """The one final outcome of a call."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    status: CallStatus
    data: Any = None
    """The tool's data: for the Python tools {"stdout", "stderr", "exit_code"}."""
    message: str = ""
    """A sentence a model can act on."""
    error: ToolError | None = None
    effect: Effect = Effect.UNKNOWN
    still_running: bool = False
    """True when the call timed out for its caller but keeps running detached."""
    truncated: bool = False
    """True when output past the per-call cap was dropped from `data`."""
    duration_s: float = 0.0
    tool: str = ""
    output_bytes: int = 0
    """Bytes the tool wrote to stdout and stderr, kept or not."""
    session_id: str = ""
    """The session the call ran in; "" outside a session."""
    session_reset: bool = False
    """The session's interpreter was restarted during (or, unnoticed, before) this
    call: its variables, imports and open objects are gone; its files are kept."""
    artifacts: tuple[ArtifactRef, ...] = ()
    """What the call made, in order (whole output, offloaded result, files of its
    outputs directory, figures): read each with `Client.get_artifact`."""
    usage: Usage | None = None
    """What the call used; None when the daemon could not measure it."""
    daemon_id: str = ""
    """The daemon that holds the call (its `daemon_id` setting); "" from an old
    daemon that does not say. Over many daemons, `get_call`, `attach`, `cancel`
    and the call's artifacts go to this one."""
    egress_denied: tuple[EgressDenial, ...] = ()
    """Connections the egress proxy refused during the call, each with why:
    what a model reads to know that a host is out of reach (not down)."""
    processes_ended: tuple[ProcessInfo, ...] = ()
    """Background processes of the session that ended with this call: a reset
    of the session's interpreter (a timeout it did not survive, a crash) ends them."""
    arguments_sha256: str = ""
    """SHA-256 (hex) of the call's arguments as canonical JSON
    (`tooljail.common.arguments_sha256`); "" from a daemon that does not say."""
    cached: bool = False
    """This is an earlier call's success, given again by the tool's cache
    (`@tool(cache_s=...)`) without running the tool: `cached_from` names it."""
    cached_from: str = ""
    """The call whose result this is, when `cached`."""

    @property
    def ok(self) -> bool:
        return self.status is CallStatus.SUCCESS

    def to_model_text(self) -> str:
        """The result as one text for a model's tool message."""
        parts: list[str] = []
        if self.message:
            parts.append(self.message)
        if self.data is not None:
            parts.append(self.data if isinstance(self.data, str) else json.dumps(self.data))
        if self.error is not None:
            parts.append(f"{self.error.type}: {self.error.message}".rstrip(": "))
        return "\n".join(parts) if parts else self.status.value


class ToolInfo(BaseModel):
    """A tool as the daemon serves it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = 180.0
    max_timeout_s: float = 1000.0
    kill_after_s: float = 0.0
    idempotent: bool = False
    streaming: bool = False
    source: str = "builtin"
    egress: tuple[str, ...] = ()
    """The egress rules the tool asks for; () means its calls have no network."""
    secrets: tuple[str, ...] = ()
    """The names of the secrets its calls hold (never the values)."""
    cache_s: float = 0.0
    """Seconds a success is given again to the same caller asking with the same
    arguments, without running the tool (`@tool(cache_s=...)`); 0: never."""

    def openai_schema(self) -> dict[str, Any]:
        """This tool as an OpenAI function-calling tool definition."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema or {"type": "object", "properties": {}},
            },
        }


class Diagnostic(BaseModel):
    """A problem found while loading user tools."""

    model_config = ConfigDict(frozen=True)

    severity: str
    """"error" (the tool is not served) or "warning"."""
    code: str
    message: str
    file: str = ""
    tool: str = ""


class SessionState(enum.StrEnum):
    """Whether a session can still run calls."""

    OPEN = "open"
    CLOSED = "closed"


class SessionInfo(BaseModel):
    """A session as the daemon reports it (`CreateSession`, `ListSessions`, `CloseSession`)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    state: SessionState = SessionState.OPEN
    end_reason: str = ""
    """Why a closed session ended ("closed", "idle_ttl", "max_lifetime",
    "sandbox_died", "shutdown", "daemon_restart"; "daemon_lost" from a client
    over many daemons whose daemon was lost); "" while open."""
    sandbox_id: str = ""
    created_unix: float = 0.0
    last_used_unix: float = 0.0
    idle_ttl_s: float = 0.0
    max_lifetime_s: float = 0.0
    memory_bytes: int = 0
    pids: int = 0
    cpus: float = 0.0
    workspace_bytes: int = 0
    keep_processes: bool = False
    calls: int = 0
    queued: int = 0
    resets: int = 0
    """Times its interpreter was restarted (timeouts it did not survive, crashes)."""
    daemon_id: str = ""
    """The daemon that holds the session; "" from an old daemon that does not say."""
    egress: tuple[str, ...] = ()
    """The session's egress rules now (`set_egress` changes them); () = no network."""
    secrets: tuple[str, ...] = ()
    """The names of the secrets the session holds (never their values)."""
