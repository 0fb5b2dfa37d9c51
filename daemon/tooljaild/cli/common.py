"""What the command's modules share: exit codes, early exit, settings, a client, refusals.

At module level only the standard library and the SDK's credentials options, so
that `tooljail call` stays cheap and works with only the SDK installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tooljaild.cli.credentials import credential_arguments

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings

__all__ = [
    "EXIT_OK",
    "EXIT_TOOL_FAILED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "Exit",
    "connect",
    "egress_arguments",
    "load_settings_or_exit",
    "refused",
    "with_client",
]

EXIT_OK, EXIT_TOOL_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class Exit(SystemExit):
    """Ends a command early with its exit status, after saying why on stderr.

    A SystemExit, not an error of the tree: nothing went wrong in tooljail, and
    outside `main` it ends the program with that status as `sys.exit` would.
    """

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code: int = code


def egress_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """`--egress RULE` and `--secret NAME`, each repeatable (docs/egress.md)."""
    parser.add_argument(
        "--egress",
        action="append",
        metavar="RULE",
        help=f"a host {what} may reach, e.g. api.example.com or *.example.org:443 "
        "(repeat for more; within the daemon's [egress] and your identity's)",
    )
    parser.add_argument(
        "--secret",
        action="append",
        metavar="NAME",
        help=f"a secret {what} holds: a placeholder in its environment that the "
        "proxy swaps for the value, only toward the secret's hosts (repeatable)",
    )


def load_settings_or_exit(config: Path | None, **overrides: Any) -> Settings:
    """The daemon's settings from the config file, the environment and `overrides`.

    Raises:
        Exit: With EXIT_USAGE, after naming what is wrong, when they are invalid.
    """
    from tooljaild.settings.config import ConfigError, load_settings

    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        raise Exit(EXIT_USAGE) from exc


def connect(args: argparse.Namespace) -> Any:
    from tooljail import Client

    # --client where the command has it; else the SDK's default ($TOOLJAIL_CLIENT).
    return Client(
        args.target, client_name=getattr(args, "client", None), **credential_arguments(args)
    )


def with_client(args: argparse.Namespace, act: Callable[[Any, argparse.Namespace], int]) -> int:
    """`act(client, args)` on a client of `args`'s daemon; a refusal's exit status if refused."""
    from tooljail import TooljailError

    try:
        with connect(args) as client:
            status: int = act(client, args)
    except TooljailError as exc:
        return refused(exc)
    return status


def refused(exc: Exception) -> int:
    """Exit 3 when no daemon could be reached; 2 when it refused the request."""
    from tooljail import (
        ArtifactGoneError,
        DaemonUnavailableError,
        JournalUnavailableError,
        SessionEndedError,
        TransportError,
    )

    # The reason in a word too ("closed", "idle_ttl", "daemon_restart"), for scripts.
    why = ""
    if isinstance(exc, SessionEndedError | ArtifactGoneError) and exc.reason:
        why = f" [reason: {exc.reason}]"
    print(f"tooljail: {exc}{why}", file=sys.stderr)
    if isinstance(exc, (DaemonUnavailableError, JournalUnavailableError)) or (
        isinstance(exc, TransportError) and exc.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    ):
        return EXIT_UNAVAILABLE
    return EXIT_USAGE
