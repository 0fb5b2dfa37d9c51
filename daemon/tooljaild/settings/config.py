"""The daemon's settings: defaults, a TOML file, environment, then flags.

Precedence, highest first: command-line flags, `TOOLJAIL_*` environment
variables (nested with `__`, e.g. `TOOLJAIL_LIMITS__CPU_S=30`), the TOML file
given by `--config` (or `TOOLJAIL_CONFIG`), the defaults below.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tooljail.common import default_socket_path
from tooljail.errors import TooljailError
from tooljaild.settings.artifacts import ArtifactSettings
from tooljaild.settings.auth import AuthSettings, TlsSettings
from tooljaild.settings.commands import CommandsSettings
from tooljaild.settings.egress import (
    EgressSettings,
    PackagesSettings,
    SecretsSettings,
    index_host,
)
from tooljaild.settings.journal import DEPRECATED_KEYS, JournalSettings, fold_deprecated
from tooljaild.settings.sandbox import BackendKind, BackendSettings, Limits
from tooljaild.settings.sessions import SessionSettings
from tooljaild.settings.storage import StorageSettings

Backend = BackendKind
"""The sandbox backends a tool can run in (the keys of `sandbox.backends.BACKENDS`)."""


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/tooljail")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tooljail"


class Settings(BaseSettings, BackendSettings):
    """Everything an operator can set.

    `backend` and each backend's table (`[sandbox]`, `[docker]`) come from
    `BackendSettings`, next to the backend table: a new backend adds its own there.
    """

    model_config = SettingsConfigDict(
        env_prefix="TOOLJAIL_", env_nested_delimiter="__", extra="forbid"
    )
    _deprecated_keys: tuple[str, ...] = PrivateAttr(default=())
    """Deprecated keys this config set (see `deprecated_keys`)."""

    listen: str = Field(default_factory=lambda: f"unix://{default_socket_path()}")
    """Where to serve: "unix:///path/to.sock" (mode 0660) or "HOST:PORT"."""
    daemon_id: str = ""
    """This daemon's name, which every result, call and session it sends carries
    and a client routing over many daemons knows it by: stable across restarts,
    unique among those daemons (1..128 printable characters, no whitespace).
    Empty: "<hostname>:<port>" on TCP, "<hostname>:<socket path>" on a Unix
    socket (in a Kubernetes pod the hostname is the pod's name)."""
    allow_insecure_tcp: bool = False
    """Serve TCP on a non-loopback address without TLS and authentication ([tls]
    with [auth] tokens_file or [tls] client_ca_file is the safe way)."""
    socket_owner: str | None = None
    """The Unix socket's owner (a user name or uid), set before it accepts
    anything; None: the daemon's user."""
    socket_group: str | None = None
    """The Unix socket's group (a group name or gid); None: the daemon's group."""
    socket_mode: str = "0660"
    """The Unix socket's mode, in octal."""
    socket_max_connections: int = Field(default=512, ge=1)
    """Connections open at once on the Unix socket, in all; past it a new one is
    closed at once (the daemon relays each to learn its caller's uid: it costs
    three file descriptors)."""
    socket_max_connections_per_uid: int = Field(default=128, ge=1)
    """Connections open at once on the Unix socket from one uid; past it that uid's
    new connection is closed at once (so no uid can take every connection)."""
    metrics_listen: str | None = None
    """Serve Prometheus metrics at http://HOST:PORT/metrics; None: not served."""
    health_listen: str | None = None
    """Serve gRPC health checking alone (grpc.health.v1, SERVING or NOT_SERVING,
    nothing else) in plaintext on HOST:PORT, for probes that speak no TLS, such as
    the kubelet's native `grpc:` probe; None: health is served on `listen` only."""
    health_max_watches: int = Field(default=64, ge=1)
    """Health `Watch` streams (open to anyone, like every health check) held open
    at once, on `listen` and `health_listen` together; past it a new one gets
    RESOURCE_EXHAUSTED. `Check`, what probes use, is not bounded."""
    health_max_watches_per_peer: int = Field(default=8, ge=1)
    """Health `Watch` streams one peer (a TCP host, or a uid on the Unix socket)
    holds open at once; past it its new one gets RESOURCE_EXHAUSTED."""
    tls: TlsSettings = Field(default_factory=TlsSettings)
    """TCP with TLS, and client certificates (`[tls]`)."""
    auth: AuthSettings = Field(default_factory=AuthSettings)
    """Bearer tokens, identities and their policy (`[auth]`)."""
    tools_dirs: list[Path] = Field(default_factory=list)
    """Directories whose *.py files define user tools (relative: to the daemon's
    working directory at start)."""
    files_dirs: list[Path] = Field(default_factory=list)
    """Directories execute_python_file may run files from (read in place; relative:
    to the daemon's working directory at start)."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """Where the daemon keeps its state; call workspaces live below it."""
    default_timeout_s: float = Field(default=180.0, ge=1)
    """Timeout of a call when neither the tool nor the caller sets one."""
    max_timeout_s: float = Field(default=1000.0, ge=1)
    """The largest timeout any call may have."""
    min_timeout_s: float = Field(default=1.0, gt=0)
    """The smallest timeout a caller may ask for."""
    limits: Limits = Field(default_factory=Limits)
    """Per-sandbox resource limits (tools may lower them)."""
    isolation: Literal["strict", "best-effort", "none"] = "best-effort"
    """strict: refuse to start unless every isolation feature is active; best-effort:
    use what the host has and say what is missing; none: no namespaces."""
    pool_size: int = Field(default=4, ge=0, le=256)
    """Started sandboxes kept ready; 0 starts one per call."""
    pool_idle_ttl_s: float = Field(default=300.0, gt=0)
    """A ready sandbox unused this long may be let go (down to one)."""
    max_concurrent: int = Field(default=32, ge=1)
    """Calls running at once; more wait in the queue."""
    max_queue: int = Field(default=256, ge=0)
    """Calls waiting for a slot; past it new calls get RESOURCE_EXHAUSTED."""
    max_calls_per_client: int = Field(default=0, ge=0)
    """Running and queued calls one client (agent host) may hold at once; 0: half
    of max_concurrent + max_queue (at least max_concurrent + 1). Past it that
    client gets RESOURCE_EXHAUSTED."""
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """The largest request message accepted (code, arguments)."""
    list_calls_max_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    """The most bytes of calls (their arguments and results as the journal keeps
    them) one ListCalls page carries: past it the page ends early, and its
    next_cursor goes on from there. It bounds what a page costs the daemon's
    memory and event loop, whatever outputs the calls made (one call is always
    shown, whatever its size)."""
    max_argument_values: int = Field(default=20_000, ge=16)
    """The most values (object members and array elements, at any depth) a call's
    arguments may hold; past it the call is refused (INVALID_ARGUMENT) before its
    arguments are decoded: decoding and checking cost grows with the values."""
    max_argument_depth: int = Field(default=64, ge=2, le=500)
    """How deeply a call's arguments may nest objects and arrays."""
    max_in_daemon_calls: int = Field(default=8, ge=1)
    """Calls of in-daemon tools (the artifact tools, upload_file) running at once;
    more wait for their turn. Each still counts as a call against the daemon's
    bound (max_concurrent + max_queue) and its client's share. call_status takes
    none of these and is refused by neither: it answers at once."""
    event_buffer_bytes: int = Field(default=1024 * 1024, ge=4096)
    """Output kept per call for slow readers and re-attach; older chunks are dropped."""
    remembered_calls: int = Field(default=1000, ge=1)
    """Finished calls kept in memory; older ones are answered from the journal."""
    journal: JournalSettings = Field(default_factory=JournalSettings)
    """The call journal's durability and retention (`[journal]`, docs/journal.md);
    a reload applies every key of it."""
    journal_max_age_s: float | None = Field(default=None, gt=0)
    """Deprecated: use `[journal] keep_days` (in days). Still read (in seconds),
    with a warning at start; setting both to different values is an error."""
    journal_max_rows: int | None = Field(default=None, ge=100)
    """Deprecated: use `[journal] max_rows`. Still read, with a warning at start."""
    journal_max_session_rows: int | None = Field(default=None, ge=10)
    """Deprecated: use `[journal] max_session_rows`. Still read, with a warning at start."""
    artifacts: ArtifactSettings = Field(default_factory=ArtifactSettings)
    """The artifact store's bounds and when results are offloaded (`[artifacts]`)."""
    sessions: SessionSettings = Field(default_factory=SessionSettings)
    """Sessions: how many, per client, idle TTL, lifetime (`[sessions]`)."""
    storage: StorageSettings = Field(default_factory=StorageSettings)
    """Object storage for upload_file (`[storage]`); no bucket: none."""
    egress: EgressSettings | None = None
    """What sandboxes may reach outside, through the daemon's egress proxy
    (`[egress]`, `[egress.hosts]`; see docs/egress.md). No section: no sandbox has
    any network, as without this feature."""
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    """Secrets the egress proxy swaps in on the way to their hosts (`[secrets]`)."""
    packages: PackagesSettings = Field(default_factory=PackagesSettings)
    """The package index pip uses inside sandboxes (`[packages]`)."""
    commands: CommandsSettings = Field(default_factory=CommandsSettings)
    """Which programs commands may start (`[commands]`: run_command,
    start_process; see docs/commands.md). No list: every command runs."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On SIGTERM: how long running calls may take to finish before they are stopped."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""

    @field_validator("tools_dirs", "files_dirs")
    @classmethod
    def _absolute(cls, v: list[Path]) -> list[Path]:
        # Made absolute here, once: sandboxes see these directories at the same
        # path, but run with another working directory (their workspace).
        return [p.expanduser().absolute() for p in v]

    @field_validator("daemon_id")
    @classmethod
    def _daemon_id(cls, v: str) -> str:
        # Printable and without whitespace: it is shown in messages and logs, and a
        # client compares it byte for byte.
        if v and not (len(v) <= 128 and v.isprintable() and not any(c.isspace() for c in v)):
            raise ValueError("daemon_id must be 1..128 printable characters, without whitespace")
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("log_level must be DEBUG, INFO, WARNING or ERROR")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> Settings:
        if not self.min_timeout_s <= self.default_timeout_s <= self.max_timeout_s:
            raise ValueError("need min_timeout_s <= default_timeout_s <= max_timeout_s")
        self._check_package_hosts()
        self._fold_journal_keys()
        return self

    def _fold_journal_keys(self) -> None:
        # The old top-level keys end up in `[journal]` and are cleared: one value
        # in force, which a reload compares (and applies) under its new name.
        old = {key: getattr(self, key) for key in DEPRECATED_KEYS}
        self.journal, used = fold_deprecated(self.journal, old)
        for key in used:
            setattr(self, key, None)
        self._deprecated_keys = self._deprecated_keys + tuple(used)

    def _check_package_hosts(self) -> None:
        # An index the ceiling refuses would make every `pip install` fail later,
        # in a sandbox, with a 403: say so at start instead, naming the URL.
        for url in self.packages.urls():
            if self.egress is None:
                raise ValueError(
                    f"packages: index {url} needs an [egress] section whose allow lets its host in"
                )
            host, port = index_host(url)
            if not self.egress.allows(host, port):
                raise ValueError(
                    f"packages: index {url}: {host}:{port} is not allowed by [egress] "
                    "allow (or is denied by [egress] deny)"
                )

    @property
    def deprecated_keys(self) -> tuple[str, ...]:
        """The deprecated keys the config set, for the daemon to warn about at start."""
        return self._deprecated_keys

    def per_client_limit(self) -> int:
        """Running and queued calls one client may hold (see max_calls_per_client)."""
        if self.max_calls_per_client:
            return self.max_calls_per_client
        total = self.max_concurrent + self.max_queue
        # Half of the bound, but never so little that one client cannot queue a call.
        return min(total, max(self.max_concurrent + 1, total // 2))

    @property
    def workspace_root(self) -> Path:
        return self.state_dir / "workspaces"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML source reads model_config["toml_file"]: None (no file) here,
        # set on the subclass load_settings() makes for a given file.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


class ConfigError(TooljailError):
    """The configuration cannot be used; the message says what to fix."""


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings from a TOML file, the environment and explicit overrides.

    Args:
        config_file: A TOML file; None means $TOOLJAIL_CONFIG, or no file.
        overrides: Values from command-line flags (None values are ignored).

    Raises:
        ConfigError: When the file is missing or unreadable, or a value is invalid.
    """
    import tomllib

    from pydantic import ValidationError

    path = config_file or (
        Path(os.environ["TOOLJAIL_CONFIG"]) if os.environ.get("TOOLJAIL_CONFIG") else None
    )
    if path is not None:
        try:
            tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    clean = {k: v for k, v in overrides.items() if v is not None}

    class FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    try:
        return FileSettings(**clean)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        where = f" (file {path})" if path else ""
        raise ConfigError(f"invalid configuration{where}: {problems}") from exc
