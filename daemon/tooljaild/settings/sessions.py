"""The `[sessions]` table: how many sessions a daemon keeps, and for how long."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SessionSettings(BaseModel):
    """Bounds of sessions on this daemon (`[sessions]` in the config file).

    A session holds a sandbox (its interpreter, its workspace and every limit of
    the `[limits]` table) from its creation to its close, so these bound what
    sessions may hold of the host at once and for how long. A session may ask
    for lower bounds (`CreateSession`'s options), never higher ones.
    """

    model_config = ConfigDict(extra="forbid")

    max_sessions: int = Field(default=64, ge=0)
    """Sessions open at once on this daemon; past it CreateSession gets
    RESOURCE_EXHAUSTED with a retry hint. 0 disables sessions."""
    max_sessions_per_client: int = Field(default=16, ge=1)
    """Sessions one client (agent host) may hold open at once."""
    idle_ttl_s: float = Field(default=900.0, gt=0)
    """A session without a call for this long is closed (reason "idle_ttl")."""
    max_lifetime_s: float = Field(default=4 * 3600.0, gt=0)
    """A session is closed this long after its creation, busy or not (reason
    "max_lifetime"); a call running then ends cancelled."""
    max_queued_calls: int = Field(default=16, ge=0)
    """Calls that may wait for their turn in one session (its calls run one at a
    time, in order); past it a call gets RESOURCE_EXHAUSTED."""
    interrupt_grace_s: float = Field(default=2.0, gt=0, le=60)
    """After a session call's timeout (or cancel) every process it started is
    killed at once and its code gets a KeyboardInterrupt; if it has not stopped
    this long after, the interpreter is restarted (its variables are lost, its
    workspace files kept). Code that ignores or blocks SIGINT gets no grace."""
    reset_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """How long a restart of the interpreter may take before the whole session
    is destroyed instead (reason "sandbox_died")."""
    idle_output_bytes_per_s: int = Field(default=65536, ge=0)
    """Output written in a session between its calls (by processes it keeps,
    by threads of calls that ended) is nobody's: it is dropped inside the
    sandbox, counted, and never reaches the daemon. Past this many bytes a
    second it is not even read: its writers wait on a full pipe until the next
    call starts. 0: nothing is read between calls."""
    remembered_ended: int = Field(default=10_000, ge=0)
    """Ended sessions kept in memory to say why they ended; older ones are
    answered from the journal."""
    max_transfers: int = Field(default=32, ge=1)
    """Uploads and downloads (`UploadFile`, `DownloadFile`) in progress at once on
    this daemon; past it a new one gets RESOURCE_EXHAUSTED with a retry hint."""
    max_transfers_per_client: int = Field(default=8, ge=1)
    """Uploads and downloads one client (identity) may have in progress at once."""
    max_transfers_per_session: int = Field(default=2, ge=1)
    """Uploads and downloads one session may have in progress at once (its file
    operations take its turn one at a time anyway)."""
    transfer_idle_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """An upload that sends no chunk, or a download whose client reads none, for
    this long is ended (INVALID_ARGUMENT, saying so) and frees its place."""
    upload_min_chunk_bytes: int = Field(default=64 * 1024, ge=0)
    """Past an upload's first 1,024 chunks, its chunks must average at least this
    many bytes (each chunk costs the daemon CPU of its own, whatever its size);
    0: no bound."""

    max_processes: int = Field(default=32, ge=0, le=4096)
    """Background processes (`StartProcess`, `start_process`) one session may run at
    once; past it starting one gets RESOURCE_EXHAUSTED. As many ended ones are
    kept for reading their output, the oldest forgotten first. 0: none."""
    max_watches: int = Field(default=8, ge=0, le=128)
    """Workspace watches (`WatchWorkspace`, `session.watch`) one session may hold
    open at once, each an inotify instance of the sandbox's user; past it a
    watch gets RESOURCE_EXHAUSTED. 0: no watches."""
    watch_max_dirs: int = Field(default=4096, ge=1, le=65536)
    """Directories the watches of one session may watch together (a recursive
    watch watches each directory below); a watch of a tree past it is refused,
    and a directory made later past it is not watched (a `dropped` event says so)."""
    process_output_ring_bytes: int = Field(default=1024 * 1024, ge=4096, le=256 * 1024**2)
    """Output of one background process kept in the daemon's memory (the newest
    bytes). Past it the whole output is written to an artifact of the session's
    client (within `[artifacts]` quotas), so every offset stays readable."""
    process_output_memory_bytes: int = Field(default=256 * 1024**2, ge=1024**2)
    """Output of every background process of the daemon kept in memory, together.
    Past it, a process that writes keeps only the newest
    `MIN_RING_BYTES` (16 KiB) in memory; what its ring lets go is read from its
    artifact. Bounds what sessions x processes x rings could otherwise hold."""

    @model_validator(mode="after")
    def _bounds(self) -> SessionSettings:
        if self.max_sessions and self.max_sessions_per_client > self.max_sessions:
            self.max_sessions_per_client = self.max_sessions
        self.max_transfers_per_client = min(self.max_transfers_per_client, self.max_transfers)
        self.max_transfers_per_session = min(
            self.max_transfers_per_session, self.max_transfers_per_client
        )
        return self
