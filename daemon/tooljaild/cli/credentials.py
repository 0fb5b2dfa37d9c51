"""The client commands' `--token` and `--tls-*` options (imports nothing of the daemon).

Each option left out falls back to its environment variable in the SDK
(`TOOLJAIL_TOKEN`, `TOOLJAIL_TLS_CA`, `TOOLJAIL_TLS_CERT`, `TOOLJAIL_TLS_KEY`):
a token on the command line is visible to other users in the process list,
so the environment is the better place for it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_credential_options", "credential_arguments", "export_credentials"]


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


ENV_BY_ARGUMENT = {
    "token": "TOOLJAIL_TOKEN",
    "tls_ca_file": "TOOLJAIL_TLS_CA",
    "tls_cert_file": "TOOLJAIL_TLS_CERT",
    "tls_key_file": "TOOLJAIL_TLS_KEY",
}


def export_credentials(args: argparse.Namespace) -> None:
    """Puts the options given into this process's environment, for a command whose
    clients are made deeper down (`tooljail mcp`): the SDK reads them there."""
    for argument, value in credential_arguments(args).items():
        if value is not None:
            os.environ[ENV_BY_ARGUMENT[argument]] = str(value)
