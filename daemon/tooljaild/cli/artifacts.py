"""`tooljail artifacts`: list, read and delete what calls made.

An artifact belongs to the client whose call made it, and a client is a name
(`tooljail-client`): by default "<host>/<pid>", so a fresh command line process
owns none. To read an agent's artifacts, name the agent's client with
`--client NAME` (or TOOLJAIL_CLIENT), as the agent did with
`Client(client_name=...)` or `tooljail call --client NAME`. The name is not
authenticated (until the daemon has tokens): the artifact id, 128 random bits
only the call's result names, is what keeps an artifact private.

Exit codes as in `tooljail.cli`: 2 for bad usage or a refusal (an artifact not
found, or gone: its reason in brackets), 3 when no daemon answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tooljaild.cli.common import EXIT_OK, with_client
from tooljaild.cli.sessions import _bytes, _seconds, _write_out

if TYPE_CHECKING:
    from tooljail import Client

__all__ = ["add_parser", "client_option", "run"]


def client_option(parser: argparse.ArgumentParser) -> None:
    """Adds `--client NAME` to a command that talks to the daemon."""
    parser.add_argument(
        "--client",
        metavar="NAME",
        help="the client name to go by (default: $TOOLJAIL_CLIENT, else this host/pid): "
        "artifacts belong to the client whose call made them; not authenticated",
    )


def add_parser(sub: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `artifacts` and its actions to the `tooljail` parser's subcommands.

    Args:
        sub: The subparsers of the `tooljail` parser.
        target: Adds the `--target` option to a parser.
    """
    artifacts = sub.add_parser(
        "artifacts",
        help="list, read and delete the artifacts calls made",
        description="Artifacts are what calls made: whole outputs, offloaded results, "
        "files, figures. Each belongs to the client whose call made it: name that "
        "client with --client (e.g. the name given to `tooljail call --client`).",
    )
    actions = artifacts.add_subparsers(dest="artifacts_command", required=True, metavar="ACTION")

    def action(name: str, help_: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help_)
        target(parser)
        client_option(parser)
        return parser

    listing = action("ls", "list the client's artifacts, newest first")
    listing.add_argument("--call", metavar="ID", help="only those of this call")
    listing.add_argument("--session", metavar="ID", help="only those of this session")
    listing.add_argument("--json", action="store_true", help="print JSON")

    getting = action("get", "write an artifact's bytes to stdout or a file")
    getting.add_argument("artifact_id", metavar="ID")
    getting.add_argument("-o", "--output", metavar="FILE", help="write it here (default: stdout)")

    removing = action("rm", "delete an artifact")
    removing.add_argument("artifact_id", metavar="ID")


def run(args: argparse.Namespace) -> int:
    """Runs a `tooljail artifacts` action; returns the exit status."""
    act: Callable[[Client, argparse.Namespace], int] = {
        "ls": _ls,
        "get": _get,
        "rm": _rm,
    }[args.artifacts_command]
    return with_client(args, act)


def _ls(client: Client, args: argparse.Namespace) -> int:
    artifacts = client.list_artifacts(call_id=args.call, session_id=args.session)
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in artifacts], indent=2))
        return EXIT_OK
    now = time.time()
    print(f"{'ARTIFACT':32}  {'SIZE':>6} {'AGE':>6}  {'SOURCE':8} {'MIME':24} {'CALL':32}  NAME")
    for a in artifacts:
        # Every text field as the daemon sent it, but escaped: a name is the
        # sandbox's words, and a control sequence in it must not drive the terminal.
        print(
            f"{_shown(a.artifact_id):32}  {_bytes(a.size_bytes):>6} "
            f"{_seconds(now - a.created_unix):>6}  {_shown(a.source):8} "
            f"{_shown(a.mime_type):24} {_shown(a.call_id) or '-':32}  {_shown(a.name)}"
        )
    if not artifacts:
        print(
            f"no artifacts of client {client.client_name!r} (an agent's: --client NAME, "
            "the name its calls were made under)",
            file=sys.stderr,
        )
    return EXIT_OK


def _shown(text: str) -> str:
    """`text` with each control character (C0, C1, DEL, Unicode format and line
    separators) escaped, as the store keeps names (`safe_name`)."""
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")
        else c
        for c in text
    )


def _get(client: Client, args: argparse.Namespace) -> int:
    return _write_out(client.get_artifact(args.artifact_id), args.output)


def _rm(client: Client, args: argparse.Namespace) -> int:
    # One word on stdout, for scripts: deleting twice is no error.
    print("deleted" if client.delete_artifact(args.artifact_id) else "already gone")
    return EXIT_OK
