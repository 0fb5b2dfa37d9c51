"""`[egress.hosts]`: where the proxy connects for a name, instead of resolving it.

    [egress.hosts]
    "pypi.internal" = "10.0.0.5:8080"          # the name, on any port
    "api.example.com:443" = "127.0.0.1:8443"   # the name on that port only

Code in the sandbox keeps the real URL; the proxy connects to the mapped
address. An address mapped here counts as named by the operator: the proxy's
refusal of private and loopback addresses does not apply to it (the name
itself must still be allowed by the sandbox's policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tooljaild.settings.config import ConfigError
from tooljaild.settings.egress_rules import normalize_host, parse_address, parse_host_key

if TYPE_CHECKING:
    from tooljaild.settings.egress import EgressSettings

__all__ = ["HostsMap"]


class HostsMap:
    """Names (or name and port) mapped to the address and port to connect to."""

    def __init__(self, entries: Mapping[tuple[str, int | None], tuple[str, int]] | None = None):
        self._entries: dict[tuple[str, int | None], tuple[str, int]] = dict(entries or {})

    @classmethod
    def parse(cls, table: Mapping[str, str], where: str = "[egress.hosts]") -> HostsMap:
        """A map from its table ({"name[:port]": "address:port"}).

        Raises:
            ConfigError: Naming the key at fault and what is wrong.
        """
        entries: dict[tuple[str, int | None], tuple[str, int]] = {}
        for key, value in table.items():
            try:
                name, port = parse_host_key(key)
                if not isinstance(value, str):
                    raise ValueError(f"{key!r}: the value is a string, address:port")
                address = parse_address(value)
            except ValueError as e:
                raise ConfigError(f"{where} {key!r}: {e}") from None
            if (name, port) in entries:
                raise ConfigError(f"{where} {key!r}: the same name is mapped twice")
            entries[(name, port)] = address
        return cls(entries)

    @classmethod
    def from_settings(cls, egress: EgressSettings | None) -> HostsMap:
        """The map of `[egress.hosts]`; empty without `[egress]`.

        Raises:
            ConfigError: Naming the key at fault (settings built from a file are
                checked already; this catches ones built otherwise).
        """
        return cls() if egress is None else cls.parse(egress.hosts)

    def lookup(self, name: str, port: int) -> tuple[str, int] | None:
        """Where to connect for `name`:`port`: the "name:port" entry, else the
        "name" entry, else None (resolve the name)."""
        host = normalize_host(name)
        return self._entries.get((host, port)) or self._entries.get((host, None))

    def addresses(self) -> frozenset[str]:
        """Every address mapped to (each counts as named by the operator)."""
        return frozenset(address for address, _ in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostsMap) and self._entries == other._entries

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HostsMap({len(self._entries)} entries)"
