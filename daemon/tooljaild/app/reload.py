"""SIGHUP (`systemctl reload`): re-read the config file and the tool directories.

What changes live, and why only that:

- the tools: the same `tools_dirs` are loaded again (in a sandbox, as at start);
  a new tool is served, a removed one no longer listed or callable, a changed
  one takes its new code and description. Calls already admitted keep the tool
  they were admitted with, and their sandbox: no call is dropped or changed.
- `log_level`; the timeouts (`default_timeout_s`, `min_timeout_s`,
  `max_timeout_s`); the per-call limits of `[limits]` (rlimits, output caps);
  `shutdown_grace_s`; `remembered_calls`: read per call or per event, they
  apply from the next call on.
- the whole `[journal]` table (`durability`, `keep_days`, `max_rows`,
  `max_session_rows`, `tooljaild.app.journal.configure`): the bounds from the
  next prune, the durability from the next call admitted.
- the identities of `[auth] tokens_file`: the file (the one in force) is read
  again, and its identities and their policy (tools, approval, approver,
  limits) decide every request from then on: a removed identity's token is
  refused, a new one's accepted, a changed limit applies to its next call or
  session. Calls already running keep running under the identity they were
  admitted with (requests are identified once, on arrival); calls that have
  not started (waiting for an approver, their turn or a slot) of an identity
  removed, or no longer allowed their tool, end without running
  (`CallManager.revoke`, through `on_identities`): an approver's later yes
  must not run what the operator has just revoked.

Everything else needs a restart, and a reload says so by name (never by value:
some tables hold secrets) and keeps the running value: what the daemon is
built around at start (`listen`, TLS, the socket's owner and mode, the state
directory, backends, isolation, pools and their sandbox-wide limits, which
are part of a warm sandbox, the queue bounds, sessions, artifacts, storage,
metrics, the other `[auth]` keys) or what sandboxes see mounted (`tools_dirs`
and `files_dirs` themselves). `[auth] tokens_file` itself is one of them:
setting or removing it turns authentication on or off, which a reload never
does (the gate and the check that TCP beyond loopback is guarded are built
with the listener; a reload must never open the daemon), and a new path is
a deployment's change (a mount, a unit's credential), read at the restart.
The `[tls]` files are read into the server's credentials at start: a reload
compares them with the files on disk and says that replaced ones (a
certificate rotation) need a restart, and that a key others could read or
change (tooljaild.auth.secret_files) would stop one.

A reload that cannot read the config keeps every setting; one whose tools
cannot be loaded keeps the tools it served; one whose tokens file cannot be
used (missing, unreadable, not TOML, a bad hash or policy, or readable or
writable by others: tooljaild.auth.secret_files) keeps the identities in
force and logs why, naming the file (never a token or hash).
Whatever it kept is listed in `Reloader.kept`, which the daemon's STATUS line
repeats. Either way the daemon serves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tooljail.errors import TooljailError
from tooljaild.app.pools import SANDBOX_LIMITS
from tooljaild.auth.policy import Identities, IdentityChanges, PolicyError, load_identities
from tooljaild.auth.secret_files import ExposedSecretError
from tooljaild.edge.transport import ListenerSecurity, tls_digest
from tooljaild.settings.config import Settings
from tooljaild.settings.journal import JournalSettings
from tooljaild.settings.sandbox import Limits
from tooljaild.tools.registry import Registry

__all__ = ["LIVE_SETTINGS", "Reloader", "SettingsChange", "compare"]

log = logging.getLogger(__name__)

LIVE_SETTINGS = frozenset(
    {
        "log_level",
        "default_timeout_s",
        "min_timeout_s",
        "max_timeout_s",
        "shutdown_grace_s",
        "remembered_calls",
    }
    | {f"limits.{name}" for name in Limits.model_fields}
    - {f"limits.{name}" for name in SANDBOX_LIMITS}
    | {f"journal.{name}" for name in JournalSettings.model_fields}
)
"""Dotted setting names a reload applies to the running daemon (see the module doc)."""

LIVE_TABLES = ("egress", "secrets", "packages")
ALWAYS_LIVE_TABLES = ("journal",)
"""Tables whose every key is live: a reload that changes one applies the table whole."""
"""Tables a reload applies whole, when the daemon has `[egress]` before and after
(`Reloader` reloads the egress policy: new calls and sessions get it). Adding
or removing `[egress]` needs a restart: each sandbox is made with its egress
directory, or without."""


def _live(key: str, egress_kept: bool) -> bool:
    if key in LIVE_SETTINGS:
        return True
    return egress_kept and key.split(".", 1)[0] in LIVE_TABLES


@dataclass(frozen=True)
class SettingsChange:
    """What differs between the running settings and the re-read ones.

    Attributes:
        live: Dotted names applied now.
        restart: Dotted names that keep their running value until a restart.
        settings: The settings to run with: the running ones with `live` applied.
    """

    live: tuple[str, ...]
    restart: tuple[str, ...]
    settings: Settings


def compare(running: Settings, read: Settings) -> SettingsChange:
    """Split the differences of `read` from `running` into live and restart-needing ones."""
    old, new = _flatten(running.model_dump(mode="json")), _flatten(read.model_dump(mode="json"))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    egress_kept = running.egress is not None and read.egress is not None
    live = tuple(k for k in changed if _live(k, egress_kept))
    restart = tuple(k for k in changed if not _live(k, egress_kept))
    top = {k: getattr(read, k) for k in live if "." not in k}
    for table in LIVE_TABLES + ALWAYS_LIVE_TABLES:
        if any(k.split(".", 1)[0] == table for k in live):
            top[table] = getattr(read, table)
    names = [k.removeprefix("limits.") for k in live if k.startswith("limits.")]
    limits = {name: getattr(read.limits, name) for name in names}
    if limits:
        top["limits"] = running.limits.model_copy(update=limits)
    # No re-validation needed: the timeouts all come from `read`, checked together.
    return SettingsChange(live, restart, running.model_copy(update=top))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class Reloader:
    """Re-reads settings and tools on request, one reload at a time.

    Args:
        running: The settings in force now.
        read_settings: Reads the config again (file, environment, flags);
            raises TooljailError (`ConfigError`) when it cannot be used.
        load_tools: Loads the tool directories with the given settings.
        apply: Puts settings and registry in force for calls admitted from now on.
        registry: The registry in force now.
        security: The listener's security as built at start (its authenticator
            takes the tokens file's new identities); None: the daemon does not
            listen yet, or a caller without one (nothing of `[auth]` reloads).
        on_identities: Told the new identities once they are in force (the call
            manager stops the calls of revoked ones that have not started).
        reload_egress: Puts the re-read `[egress]` and secrets file in force for
            new calls and sessions; raises TooljailError (naming what) when they
            cannot be used, and the running ones stay.
    """

    def __init__(
        self,
        *,
        running: Callable[[], Settings],
        read_settings: Callable[[], Settings],
        load_tools: Callable[[Settings], Awaitable[Registry]],
        apply: Callable[[Settings, Registry], None],
        registry: Callable[[], Registry],
        security: Callable[[], ListenerSecurity | None] = lambda: None,
        on_identities: Callable[[Identities], None] = lambda _identities: None,
        reload_egress: Callable[[Settings], Awaitable[None]] | None = None,
    ) -> None:
        self._reload_egress = reload_egress
        self._running = running
        self._read = read_settings
        self._load_tools = load_tools
        self._apply = apply
        self._registry = registry
        self._security = security
        self._on_identities = on_identities
        self.kept: tuple[str, ...] = ()
        """What the last reload could not use and kept as it was running, in
        order ("the configuration", "the tokens file", "the tools"); () when
        all was used (or before any reload)."""

    async def reload(self) -> bool:
        """Re-read, apply what can change live, log what changed and what needs a restart.

        Returns:
            Whether everything re-read was applied (False: the config, the
            tokens file or the tools could not be used, and the running ones
            stay; `kept` says which).
        """
        log.info("reload: re-reading the configuration, the tokens file and the tool directories")
        running, kept = self._running(), []
        try:
            change = compare(running, self._read())
        except TooljailError as exc:
            log.error("reload: configuration kept, it cannot be used: %s", exc)
            change = SettingsChange((), (), running)
            kept.append("the configuration")
        settings = change.settings
        # Before the tools, which take seconds: a revoked token is refused sooner.
        identities, why = None, ""
        try:
            identities = await self._reload_identities(settings)
        except PolicyError as exc:  # it names the file and the entry, never a token or hash
            why = str(exc)
        except Exception as exc:  # a bug; its text might quote the file: only its type
            why = f"the tokens file {settings.auth.tokens_file}: {type(exc).__name__}"
        if why:
            log.error(
                "reload: identities kept, the tokens file cannot be used "
                "(a restart with it would fail too): %s",
                why,
                extra={"tokens_file": str(settings.auth.tokens_file)},
            )
            kept.append("the tokens file")
        if self._reload_egress is not None:
            settings = await self._egress(running, settings, kept)
        old_registry = registry = self._registry()
        try:
            registry = await self._load_tools(settings)
        except Exception as exc:  # any failure keeps the tools served
            log.error("reload: tools kept, they cannot be loaded: %s", exc, exc_info=True)
            kept.append("the tools")
        self._apply(settings, registry)
        if "log_level" in change.live:
            set_log_level(settings.log_level)
        _log_outcome(change, running, old_registry, registry, identities)
        await self._check_tls_files(settings)
        self.kept = tuple(kept)
        return not kept

    async def _egress(self, running: Settings, settings: Settings, kept: list[str]) -> Settings:
        """Put the re-read egress policy in force; on failure keep the running one.

        Returns:
            `settings`, with the running `[egress]` and `[secrets]` when the new
            ones cannot be used (and "the egress policy" added to `kept`).
        """
        assert self._reload_egress is not None
        try:
            await self._reload_egress(settings)
        except TooljailError as exc:  # it names the rule, file or secret; never a value
            why = exc.message
        except Exception as exc:  # a bug; its text might quote a file: only its type
            why = f"{type(exc).__name__}"
        else:
            return settings
        log.error("reload: egress policy kept, the new one cannot be used: %s", why)
        kept.append("the egress policy")
        return settings.model_copy(update={"egress": running.egress, "secrets": running.secrets})

    async def _reload_identities(self, settings: Settings) -> IdentityChanges | None:
        """Read the tokens file in force again and identify new requests by it.

        Returns:
            What changed, by identity name; None: no tokens file is in force.

        Raises:
            PolicyError: The file cannot be used; the identities in force stay.
        """
        security, path = self._security(), settings.auth.tokens_file
        if security is None or path is None or security.authenticator.identities is None:
            return None
        identities = await asyncio.to_thread(load_identities, path)
        changed = security.authenticator.replace_identities(identities)
        self._on_identities(identities)
        return changed

    async def _check_tls_files(self, settings: Settings) -> None:
        """Warn when the `[tls]` files on disk are not the ones being served."""
        security = self._security()
        if security is None or security.tls_digest is None:
            return
        try:
            on_disk = await asyncio.to_thread(tls_digest, settings.tls)
        except ExposedSecretError as exc:
            log.error(
                "reload: the certificates read at start are still served, but a restart "
                "would fail: %s",
                exc,
            )
            return
        except OSError as exc:
            log.warning(
                "reload: cannot read the [tls] file %s (%s): the certificates read at start "
                "are still served, but a restart would fail",
                exc.filename,
                exc.strerror or exc,
            )
            return
        if on_disk != security.tls_digest:
            log.warning(
                "reload: the [tls] files changed on disk; the certificates read at start are "
                "served until a restart (systemctl restart tooljail)",
                extra={"settings_need_restart": ["tls files"]},
            )


def set_log_level(level: str) -> None:
    """The root logger's level, grpc's kept at WARNING or above (as `setup_logging`)."""
    root = logging.getLogger()
    root.setLevel(level)
    logging.getLogger("grpc").setLevel(max(logging.WARNING, root.level))


def _log_outcome(
    change: SettingsChange,
    running: Settings,
    old: Registry,
    new: Registry,
    identities: IdentityChanges | None,
) -> None:
    before, after = {t.name for t in old.tools()}, {t.name for t in new.tools()}
    was, now = (
        _flatten(running.model_dump(mode="json")),
        _flatten(change.settings.model_dump(mode="json")),
    )
    extra: dict[str, Any] = {
        "tools_added": sorted(after - before),
        "tools_removed": sorted(before - after),
        "tools": len(after),
        "settings_applied": {k: [was.get(k), now.get(k)] for k in change.live},
    }
    if identities is not None:  # by name only: a changed token is a changed identity
        extra |= {
            "identities_added": list(identities.added),
            "identities_removed": list(identities.removed),
            "identities_changed": list(identities.changed),
        }
    log.info("reload: done", extra=extra)
    if change.restart:
        log.warning(
            "reload: these settings changed but take effect only after a restart "
            "(systemctl restart tooljail): %s",
            ", ".join(change.restart),
            extra={"settings_need_restart": list(change.restart)},
        )
