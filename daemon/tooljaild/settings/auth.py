"""The `[auth]` and `[tls]` tables of the daemon's config."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AuthSettings(BaseModel):
    """`[auth]`: bearer tokens and per-identity policy."""

    model_config = ConfigDict(extra="forbid")

    tokens_file: Path | None = None
    """A TOML file of identities (`[identities.NAME]` with `token_sha256`, `tools`,
    `approval`, `approver`, limits, `egress`, `secrets`; see tooljaild.auth.policy).
    Set: every request needs a valid token (or a client certificate naming an identity); None: no
    tokens, the socket's permissions are the boundary. A reload (SIGHUP) reads
    the file again: its identities apply to every new request (a bad file keeps
    the old ones, and the log says why). Changing this path, or setting or
    removing it, needs a restart."""
    approval_timeout_s: float = Field(default=300.0, gt=0)
    """How long a call that needs approval waits for a decision before it ends,
    with effect none. Needs a restart to change."""
    operator_uids: list[int] = Field(default_factory=list)
    """Without tokens, on the Unix socket, uids that may reach every caller's calls,
    sessions and artifacts, besides root and the daemon's own uid (numbers:
    `id -u NAME`). Every other uid is its own identity ("uid:N"): it sees and
    touches only its own work, and the per-client bounds count for it as a whole.
    Needs a restart to change."""
    max_calls_awaiting_approval: int = Field(default=16, ge=1)
    """Calls one identity may have waiting for approval (or approved and waiting
    for room in its share) at once; past it its next such call is refused
    (RESOURCE_EXHAUSTED). Waiting calls hold no sandbox and do not count against
    the running and queued calls' bounds, so they cannot crowd others out.
    Needs a restart to change."""
    max_reason_chars: int = Field(default=1000, ge=1)
    """The longest reason an approver may give with a decision (INVALID_ARGUMENT
    past it). Needs a restart to change."""
    max_approval_watchers: int = Field(default=64, ge=0)
    """`WatchApprovals` streams open at once, in all (`tooljail approvals watch`,
    an approver UI); past it a new one is refused (RESOURCE_EXHAUSTED with a
    retry hint). 0: no watches. Needs a restart to change."""
    max_approval_watchers_per_identity: int = Field(default=4, ge=1)
    """`WatchApprovals` streams one approver may hold open at once; past it its
    next is refused (RESOURCE_EXHAUSTED), and no other approver's is. Needs a
    restart to change."""
    approval_watch_buffer_bytes: int = Field(default=1024 * 1024, ge=64 * 1024)
    """Events (their size, about their arguments' bytes) waiting to be sent to one
    `WatchApprovals` stream whose reader is slower than the approval queue; past
    it the daemon drops that watcher's backlog and ends its stream with
    RESOURCE_EXHAUSTED, telling it to watch again (its first events are then the
    calls waiting at that moment). A reader that never reads holds no more than
    this. Needs a restart to change."""


class TlsSettings(BaseModel):
    """`[tls]`: serve TCP with TLS, and optionally require client certificates.

    The files are read at start: replaced certificates (a rotation) are served
    after a restart; a reload (SIGHUP) logs that they changed and need one.
    """

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = None
    """The server's certificate chain (PEM). With `key_file`: TCP is served with TLS.
    The `[tls]` files are read at start: replaced ones are served after a restart
    (a reload logs that they changed)."""
    key_file: Path | None = None
    """The server's private key (PEM)."""
    client_ca_file: Path | None = None
    """CA certificates (PEM) client certificates must chain to: set, every client
    needs one (mTLS), and its subject's common name names its identity."""

    @model_validator(mode="after")
    def _pairs(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("[tls] needs both cert_file and key_file, or neither")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("[tls] client_ca_file needs cert_file and key_file")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None
