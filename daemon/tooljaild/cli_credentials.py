"""The client commands' `--token` and `--tls-*` options (imports nothing of the daemon).

Each option left out falls back to its environment variable in the SDK
(`TOOLJAIL_TOKEN`, `TOOLJAIL_TLS_CA`, `TOOLJAIL_TLS_CERT`, `TOOLJAIL_TLS_KEY`):
a token on the command line is visible to other users in the process list,
so the environment is the better place for it.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_credential_options", "credential_arguments"]


def add_credential_options(parser: argparse.ArgumentParser) -> None:
    """Adds `--token`, `--tls-ca`, `--tls-cert` and `--tls-key` to a client command."""
    parser.add_argument(
        "--token",
        help="bearer token for a daemon with a tokens file (default: $TOOLJAIL_TOKEN; "
        "prefer the variable: arguments are visible in the process list)",
    )
    parser.add_argument(
        "--tls-ca", help="CA file (PEM) verifying the daemon's TLS certificate; use TLS "
        "(default: $TOOLJAIL_TLS_CA)",
    )  # fmt: skip
    parser.add_argument(
        "--tls-cert", help="client certificate (PEM) for mTLS (default: $TOOLJAIL_TLS_CERT)"
    )
    parser.add_argument(
        "--tls-key", help="the client certificate's key (PEM) (default: $TOOLJAIL_TLS_KEY)"
    )


def credential_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The `Client` keyword arguments those options give (None: the SDK's default)."""
    return {
        "token": getattr(args, "token", None),
        "tls_ca_file": getattr(args, "tls_ca", None),
        "tls_cert_file": getattr(args, "tls_cert", None),
        "tls_key_file": getattr(args, "tls_key", None),
    }
