"""The `[egress]`, `[egress.hosts]`, `[secrets]` and `[packages]` tables of the config.

Plain data, checked as it is read: a bad rule, hosts entry or index URL is
refused at start and at reload, by name. Files (`ca_file`, the secrets file)
are read by `tooljaild.egress.policy.EgressCeiling.from_settings`.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tooljaild.settings.egress_rules import (
    Rule,
    normalize_host,
    parse_address,
    parse_deny_rules,
    parse_host_key,
    parse_rules,
)

__all__ = ["EgressSettings", "PackagesSettings", "SecretsSettings", "index_host"]


class EgressSettings(BaseModel):
    """`[egress]`: what sandboxes may reach at most. No section: no network at all."""

    model_config = ConfigDict(extra="forbid")

    allow: list[str] = Field(default_factory=list)
    """The ceiling: egress rules ("api.example.com", "*.githubusercontent.com",
    "pypi.org:443", "10.0.0.5:8080"; default ports 80 and 443). Identities, tools,
    sessions and calls may each narrow it, never widen it; one that asks for
    nothing gets no network. See docs/egress.md."""
    deny: list[str] = Field(default_factory=list)
    """Rules refused whatever any level allows (a rule without ports here denies
    every port of its host)."""
    ca_file: Path | None = None
    """Extra CA certificates (PEM) the proxy trusts for upstream TLS, besides the
    system's roots (an internal CA). It must be readable at start."""
    hosts: dict[str, str] = Field(default_factory=dict)
    """`[egress.hosts]`: "name" or "name:port" -> "address:port" the proxy connects
    to instead of resolving the name (a mirror, a local stand-in). A mapped
    address counts as named: the private-address refusal does not apply to it;
    the name must still be allowed."""

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str]) -> list[str]:
        parse_rules(v, "allow")
        return v

    @field_validator("deny")
    @classmethod
    def _deny(cls, v: list[str]) -> list[str]:
        parse_deny_rules(v, "deny")
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: dict[str, str]) -> dict[str, str]:
        seen: set[tuple[str, int | None]] = set()
        for key, value in v.items():
            try:
                name = parse_host_key(key)
                parse_address(value)
            except ValueError as e:
                raise ValueError(f"hosts {key!r}: {e}") from None
            if name in seen:
                raise ValueError(f"hosts {key!r}: the same name is mapped twice")
            seen.add(name)
        return v

    def allow_rules(self) -> tuple[Rule, ...]:
        return parse_rules(self.allow, "[egress] allow")

    def deny_rules(self) -> tuple[Rule, ...]:
        return parse_deny_rules(self.deny, "[egress] deny")

    def allows(self, host: str, port: int) -> bool:
        """Whether the ceiling lets `host`:`port` through (allowed and not denied)."""
        name = normalize_host(host)
        if any(r.port_matches(port) and r.host_matches(name) for r in self.deny_rules()):
            return False
        return any(r.port_matches(port) and r.host_matches(name) for r in self.allow_rules())


class SecretsSettings(BaseModel):
    """`[secrets]`: values the egress proxy sends to their hosts; sandboxes see placeholders."""

    model_config = ConfigDict(extra="forbid")

    file: Path | None = None
    """A TOML file (mode 0600, owned by the daemon's user, like the tokens file),
    one table per secret: `[NEWS_API_KEY] value = "..." hosts = ["api.example.com"]`.
    Its hosts must lie within [egress] allow. A reload (SIGHUP) reads it again
    (a bad file keeps the old secrets). None: no secrets."""


def index_host(url: str) -> tuple[str, int]:
    """(host, port) of a package index URL (http or https).

    Raises:
        ValueError: Naming the URL and what is wrong.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"{url!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r}: a package index URL starts with https:// or http://")
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host")
    if parts.username or parts.password:
        raise ValueError(f"{url!r}: credentials do not belong in the URL; use [secrets]")
    return normalize_host(parts.hostname), port or (443 if parts.scheme == "https" else 80)


class PackagesSettings(BaseModel):
    """`[packages]`: the package index `pip install` inside sandboxes uses."""

    model_config = ConfigDict(extra="forbid")

    index_url: str | None = None
    """The index pip uses (PIP_INDEX_URL), e.g. "https://pypi.org/simple"; its
    host must be allowed by [egress] allow. None: pip's own default."""
    extra_index_urls: list[str] = Field(default_factory=list)
    """More indexes (PIP_EXTRA_INDEX_URL); each host must be allowed by [egress] allow."""
    # --- helper PACKAGES (issue 23, part 3): the daemon's package cache.
    cache_max_bytes: int = Field(default=2 * 1024**3, ge=0)
    """The most the daemon's cache of package files (wheels, sdists, under
    <state_dir>/egress/packages) may hold, least recently used first out; 0: no
    cache (every install goes to the index, and repeats are not faster)."""

    @field_validator("index_url")
    @classmethod
    def _index(cls, v: str | None) -> str | None:
        if v is not None:
            index_host(v)
        return v

    @field_validator("extra_index_urls")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for url in v:
            index_host(url)
        return v

    def urls(self) -> list[str]:
        """Every index URL, the main one first."""
        return ([self.index_url] if self.index_url else []) + list(self.extra_index_urls)

    def hosts(self) -> list[tuple[str, int]]:
        """(host, port) of every index, the main one first, without repeats."""
        return list(dict.fromkeys(index_host(url) for url in self.urls()))
