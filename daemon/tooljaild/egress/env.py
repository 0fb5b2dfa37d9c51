"""The environment a sandbox with egress gets: every common client pointed at the relay.

Inside the sandbox the runner's relay listens on 127.0.0.1:`RELAY_PORT` (the
sandbox's own loopback: runner/_egress.py) and hands each connection to the
daemon's proxy. `egress_env` is what makes `requests`, `httpx`, `urllib`,
`pip`, `curl` and node use it unchanged, trust the daemon's CA (when it
intercepts TLS), and see each held secret's placeholder (never its value).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["CA_BUNDLE", "INSIDE_DIR", "PROXY_URL", "RELAY_PORT", "egress_env"]

RELAY_PORT = 3128
"""Where the relay listens, on the sandbox's own loopback."""
INSIDE_DIR = "/run/tooljail"
"""Where a sandbox sees its egress directory (read-only): proxy.sock, ca.pem."""
CA_BUNDLE = f"{INSIDE_DIR}/ca.pem"
"""The CA bundle the sandbox trusts: the system's roots and the daemon's CA."""
PROXY_URL = f"http://127.0.0.1:{RELAY_PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"

_PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
_CA_NAMES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")
_NODE_CA = "NODE_EXTRA_CA_CERTS"


class _Secret(Protocol):
    """What the environment needs of a held secret (egress.policy.HeldSecret)."""

    @property
    def name(self) -> str: ...
    @property
    def placeholder(self) -> str: ...


class _Policy(Protocol):
    """What the environment needs of a policy (egress.policy.EgressPolicy)."""

    @property
    def secrets(self) -> Sequence[_Secret]: ...


class _Packages(Protocol):
    """What the environment needs of the package settings (settings.egress.PackagesSettings)."""

    @property
    def index_url(self) -> str: ...
    @property
    def extra_index_urls(self) -> Iterable[str]: ...


def egress_env(policy: _Policy, packages: _Packages | None) -> dict[str, str]:
    """The variables a sandbox under `policy` gets on top of its scrubbed environment.

    Args:
        policy: The sandbox's egress policy: each held secret's NAME is set to
            its placeholder (the proxy swaps it on the way to its hosts).
        packages: The daemon's package index settings (PIP_INDEX_URL and
            PIP_EXTRA_INDEX_URL); None: pip's defaults.

    Returns:
        Proxy variables (both cases: some clients read only one), NO_PROXY for
        the sandbox's own loopback, the CA bundle for every common client, the
        placeholders and pip's index settings.
    """
    env: dict[str, str] = {}
    for name in _PROXY_NAMES:
        env[name] = env[name.lower()] = PROXY_URL
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    for name in (*_CA_NAMES, _NODE_CA):
        env[name] = CA_BUNDLE
    if packages is not None:
        if packages.index_url:
            env["PIP_INDEX_URL"] = packages.index_url
        extra = " ".join(packages.extra_index_urls)
        if extra:
            env["PIP_EXTRA_INDEX_URL"] = extra
    for secret in policy.secrets:
        env[secret.name] = secret.placeholder
    return env
