"""The daemon's `[egress]`: its directory, its CA, its one proxy, and its reload.

Without an `[egress]` section nothing here runs: no directory, no CA, no
proxy thread, and `Daemon.egress` stays None (every sandbox has no network, as
before egress existed). With one, `DaemonEgress.start`, before the pools warm:

- builds the ceiling (`EgressCeiling.from_settings`: `[egress]`, the secrets
  file) and checks the tokens file's identities against it; a bad rule, hosts
  entry, secrets file or identity refuses the start, by name;
- makes `<state_dir>/egress/` (0711), the interception CA in
  `<state_dir>/egress/ca/` (key 0600), and the bundle sandboxes trust
  (`<state_dir>/egress/ca-bundle.pem`: the system's roots and that CA);
- starts ONE `EgressProxy` (its own thread and loop, never the gRPC loop),
  whose denials count in the `tooljail_egress_denials_total` metric.

A reload (`reload`) re-reads `[egress]` (rules, hosts map, `ca_file`) and the
secrets file; a new ceiling that cannot be used (a bad secrets file, an
identity beyond it) keeps the old one, and says why. Calls and sessions
admitted before keep the policy they were given (their gates hold it); new
ones get the new ceiling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import cast

from tooljail.errors import TooljailError
from tooljaild.app.errors import DaemonError
from tooljaild.auth.policy import Identity
from tooljaild.edge.transport import ListenerSecurity
from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.package_cache import PackageCache
from tooljaild.egress.policy import EgressCeiling
from tooljaild.egress.proxy import EgressProxy, PackageCacheLike
from tooljaild.egress.service import EgressService
from tooljaild.egress.tls import InterceptCA, write_bundle
from tooljaild.sandbox.file_modes import make_dirs
from tooljaild.settings.config import Settings
from tooljaild.settings.egress import EgressSettings, index_host

__all__ = ["EGRESS_DIR", "EGRESS_DIR_MODE", "DaemonEgress", "ceiling_of", "identities_of"]

log = logging.getLogger("tooljaild.egress")

EGRESS_DIR = "egress"
"""Under the state directory: the CA, the bundle, and each sandbox's gate directory."""

EGRESS_DIR_MODE = 0o711
"""Passable, not listable (as the state directory): each sandbox's directory below
it is reached by its unguessable name (egress/dirs.py); the CA's key is in
`ca/`, which is the daemon's alone (0700)."""


def identities_of(security: ListenerSecurity | None) -> tuple[Identity, ...]:
    """The tokens file's identities in force (none without one)."""
    found = None if security is None else security.authenticator.identities
    return () if found is None else tuple(found.by_name.values())


def ceiling_of(settings: Settings, identities: Iterable[Identity] = ()) -> EgressCeiling:
    """The ceiling of `settings`, checked against the tokens file's `identities`.

    Reads the secrets file: call it off the event loop.

    Raises:
        TooljailError: (`ConfigError`) naming the key, file, secret or identity at fault.
    """
    ceiling = EgressCeiling.from_settings(settings)
    ceiling.check_identities(identities)
    return ceiling


class DaemonEgress:
    """`[egress]` for the daemon's life: the ceiling, the CA, the proxy, the service.

    Made by `start`. `on_denial` is told each refusal's reason, on the proxy's
    thread (the daemon points it at its metrics once they are served).
    """

    def __init__(
        self,
        settings: Settings,
        egress: EgressSettings,
        prepared: tuple[EgressCeiling, InterceptCA, Path, PackageCache | None],
    ) -> None:
        ceiling, ca, self.directory, self.cache = prepared
        self.bundle = self.directory / "ca-bundle.pem"
        self.on_denial: Callable[[str], None] = lambda _reason: None
        self.proxy = EgressProxy(
            hosts=HostsMap.parse(egress.hosts),
            upstream_ca_file=egress.ca_file,
            ca=ca,
            # PackageCache is what the proxy's protocol describes; their
            # signatures differ in detail (commit's answer), told to the lead.
            cache=cast("PackageCacheLike | None", self.cache),
            on_denial=lambda reason: self.on_denial(reason),
        )
        self.service = EgressService(
            ceiling,
            self.proxy,
            packages=settings.packages,
            max_connections=settings.limits.max_egress_connections,
        )

    @classmethod
    async def start(
        cls,
        settings: Settings,
        *,
        identities: Iterable[Identity] = (),
    ) -> DaemonEgress | None:
        """Start egress for `settings`; None when it has no `[egress]` section.

        Args:
            identities: The tokens file's identities (checked against the ceiling).

        Raises:
            DaemonError: The ceiling, the CA or the proxy cannot be made; the
                message names what (never a secret's value).
        """
        egress = settings.egress
        if egress is None:
            return None
        try:
            prepared = await asyncio.to_thread(_prepare, settings, tuple(identities))
        except TooljailError as exc:
            raise DaemonError(f"egress: {exc.message}") from None
        except (OSError, ValueError) as exc:
            where = settings.state_dir / EGRESS_DIR
            raise DaemonError(f"egress: cannot prepare {where}: {exc}") from exc
        made = cls(settings, egress, prepared)
        made.proxy.start()
        log.info(
            "egress proxy started",
            extra={
                "allow": egress.allow,
                "deny": egress.deny,
                "hosts": sorted(egress.hosts),
                "secrets": sorted(prepared[0].secrets),  # names only
            },
        )
        return made

    async def reload(self, settings: Settings, identities: Iterable[Identity] = ()) -> None:
        """Use `settings`' `[egress]` and secrets file for new calls and sessions.

        Gates open now keep their policy (a running call's, a session's until
        its next SetSessionEgress); the hosts map and upstream trust apply to
        new connections.

        Raises:
            TooljailError: The new ceiling cannot be used (named); the old one stays.
        """
        egress = settings.egress
        if egress is None:  # turning egress off needs a restart (the sandboxes' dirs)
            return
        identities = tuple(identities)
        ceiling = await asyncio.to_thread(ceiling_of, settings, identities)
        hosts = HostsMap.parse(egress.hosts)
        self.service.ceiling = ceiling
        self.service.packages = settings.packages
        self.proxy.reconfigure(hosts=hosts, upstream_ca_file=egress.ca_file)
        log.info(
            "egress reloaded",
            extra={"allow": egress.allow, "deny": egress.deny, "secrets": sorted(ceiling.secrets)},
        )

    def stop(self) -> None:
        """Stop the proxy: every gate and connection closes (idempotent)."""
        self.proxy.stop()


def _prepare(
    settings: Settings, identities: tuple[Identity, ...]
) -> tuple[EgressCeiling, InterceptCA, Path, PackageCache | None]:
    """The ceiling, the CA, the egress directory and the package cache
    (blocking: on a thread)."""
    ceiling = ceiling_of(settings, identities)
    directory = settings.state_dir / EGRESS_DIR
    make_dirs(directory, EGRESS_DIR_MODE)
    directory.chmod(EGRESS_DIR_MODE)
    ca = InterceptCA.load_or_create(directory / "ca")
    write_bundle(ca, directory / "ca-bundle.pem")
    urls = settings.packages.urls()
    cache = None
    if urls and settings.packages.cache_max_bytes > 0:
        hosts = {index_host(url)[0] for url in urls}
        cache = PackageCache(directory / "packages", hosts, settings.packages.cache_max_bytes)
    return ceiling, ca, directory, cache
