"""`tooljail mcp`: serve the daemon's tools to MCP clients, over stdio or HTTP.

The bridge is `tooljail.integrations.mcp_server` (the `mcp` extra); this module
only parses its options and maps its failures to exit codes as in
`tooljail.cli`: 2 for bad usage (the extra missing, a bad address, no token
for `--listen`, a listener off loopback without TLS) or a refusal, 3 when no
daemon answers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from tooljaild.cli.common import EXIT_OK, EXIT_USAGE, refused
from tooljaild.cli.credentials import export_credentials

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `mcp` to the `tooljail` parser's subcommands.

    Args:
        sub: The subparsers of the `tooljail` parser.
        target: Adds the `--target` option to a parser.
    """
    mcp = sub.add_parser("mcp", help="serve the daemon's tools as an MCP server (stdio or HTTP)")
    target(mcp)
    mcp.add_argument("--listen", metavar="HOST:PORT", help="serve streamable HTTP at /mcp here")
    mcp.add_argument("--stateful", action="store_true", help="one tooljail session per MCP client")
    mcp.add_argument("--tools", help="the tools to serve, comma-separated (default: all)")
    # No option takes the token itself: a command line is every local user's to read.
    mcp.add_argument(
        "--token-file",
        metavar="PATH",
        help="with --listen: the bearer token every request must bear, in a file only you "
        "can read (default: $TOOLJAIL_MCP_TOKEN; one of them is required)",
    )
    mcp.add_argument(
        "--tls-cert-file", metavar="PATH", help="with --listen: serve HTTPS with this certificate"
    )
    mcp.add_argument(
        "--tls-key-file",
        metavar="PATH",
        help="with --listen: its private key (TLS is required off loopback)",
    )


def run(args: argparse.Namespace) -> int:
    """`mcp`: the daemon's tools to MCP clients (tooljail.integrations.mcp_server)."""
    from tooljail import TooljailError

    try:
        from tooljail.integrations import mcp_server
    except ImportError as exc:  # the `mcp` extra is not installed: the message names it
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    names = [n.strip() for n in args.tools.split(",") if n.strip()] if args.tools else None
    export_credentials(args)  # the bridge's clients are made inside mcp_server

    def ready(url: str) -> None:  # stderr: over stdio, stdout is the MCP client's
        print(f"tooljail: serving MCP over streamable HTTP at {url}", file=sys.stderr, flush=True)

    try:
        mcp_server.main(
            args.target,
            listen=args.listen,
            names=names,
            stateful=args.stateful,
            on_ready=ready,
            token_file=args.token_file,
            tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_key_file,
        )
    except TooljailError as exc:
        return refused(exc)
    except (ValueError, OSError) as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK
