"""The `tooljail` command: serve, tools, call, get, cancel, calls, approve, deny,
approvals, sessions, artifacts, doctor, images, demo, mcp.

Exit codes: 0 success; 1 the tool failed (error, timeout, cancelled, lost), or an
image build failed; 2 bad usage, a request the daemon refused, or a daemon command
(`serve`, `doctor`, `images`, `demo`, `tools --check`) where only the SDK is
installed; 3 no daemon (or, for `images` and `serve --backend docker`, no Docker
engine) answers.

The parser and `main` live here; the handlers, one module per command group:
`serve` (serve, demo), `calls` (tools, call, get, cancel), `history` (calls
ls, calls show), `host` (doctor, images), `sessions`, `artifacts`, `approvals`,
`mcp`; what they share is in `common`. Handlers import lazily: `tooljail call`
must not pay for the daemon's modules, and `pip install tooljail` (no extras) has only the SDK's
dependencies: at module level these import the standard library, the SDK,
pydantic and modules of tooljaild that import nothing more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tooljaild.cli import approvals as cli_approvals
from tooljaild.cli import artifacts as cli_artifacts
from tooljaild.cli import calls, host, serve
from tooljaild.cli import history as cli_history
from tooljaild.cli import mcp as cli_mcp
from tooljaild.cli import sessions as cli_sessions
from tooljaild.cli.common import (
    EXIT_OK,
    EXIT_TOOL_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Exit,
    egress_arguments,
)
from tooljaild.cli.credentials import add_credential_options
from tooljaild.cli.extras import MissingExtraError, require_extra
from tooljaild.settings.sandbox import KINDS

__all__ = ["EXIT_OK", "EXIT_TOOL_FAILED", "EXIT_UNAVAILABLE", "EXIT_USAGE", "main"]

_DAEMON_COMMANDS = frozenset({"serve", "doctor", "images", "demo"})
"""The commands that need `pip install 'tooljail[daemon]'` (and `tools --check`)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tooljail",
        description="Run AI agents' tool calls in sandboxes, served over gRPC.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", type=Path, help="TOML config file (also $TOOLJAIL_CONFIG)")
    serve.add_argument("--listen", help="unix:///path/to.sock (default) or HOST:PORT")
    serve.add_argument(
        "--daemon-id",
        help="this daemon's name for clients (default: HOSTNAME:PORT or HOSTNAME:SOCKET)",
    )
    serve.add_argument(
        "--tools-dir",
        type=Path,
        action="append",
        dest="tools_dirs",
        help="directory of user tool files (repeatable)",
    )
    serve.add_argument(
        "--files-dir",
        type=Path,
        action="append",
        dest="files_dirs",
        help="directory execute_python_file may run files from (repeatable)",
    )
    serve.add_argument("--state-dir", type=Path, help="where state and workspaces live")
    serve.add_argument("--pool-size", type=int, help="sandboxes kept ready (0: none)")
    serve.add_argument(
        "--backend",
        choices=KINDS,
        help="where tools run unless their sandbox profile says otherwise: process "
        "(default) or docker (containers of docker.image; needs a Docker engine)",
    )
    serve.add_argument("--max-concurrent", type=int, help="calls running at once")
    serve.add_argument(
        "--max-queue", type=int, help="calls waiting for a slot; past it: RESOURCE_EXHAUSTED"
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics at /metrics here"
    )
    serve.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve gRPC health checks alone here, in plaintext (for probes without TLS)",
    )
    serve.add_argument(
        "--isolation",
        choices=["strict", "best-effort", "none"],
        help="strict: refuse to start without every isolation feature; "
        "best-effort (default): use what the host has; none: no namespaces",
    )

    def target(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--target", help="daemon address (default: $TOOLJAIL_TARGET or the default Unix socket)"
        )
        add_credential_options(sp)

    tools = sub.add_parser("tools", help="list the daemon's tools, or check tool files")
    target(tools)
    tools.add_argument(
        "--check",
        action="store_true",
        help="load tool files here (in a sandbox) and report problems",
    )
    tools.add_argument(
        "--tools-dir",
        type=Path,
        action="append",
        dest="tools_dirs",
        help="with --check: directory to check (repeatable; default: config)",
    )
    tools.add_argument("--config", type=Path, help="with --check: config file with tools_dirs")
    tools.add_argument("--json", action="store_true", help="print JSON")

    call = sub.add_parser("call", help="call a tool and stream its output")
    target(call)
    call.add_argument("tool")
    call.add_argument(
        "arguments",
        nargs="?",
        default="{}",
        help="the arguments as a JSON object, or - to read them from stdin",
    )
    call.add_argument("--timeout", type=float, help="seconds before the call times out")
    call.add_argument("--call-id", help="idempotency key for this call")
    call.add_argument("--session", metavar="ID", help="run in this session (tooljail sessions)")
    egress_arguments(call, "the call's sandbox")
    call.add_argument("--json", action="store_true", help="print the final result as JSON")

    get = sub.add_parser("get", help="show a call's state and result")
    target(get)
    get.add_argument("call_id")

    cancel = sub.add_parser("cancel", help="cancel a call")
    target(cancel)
    cancel.add_argument("call_id")

    cli_history.add_parser(sub, target)
    cli_approvals.add_parsers(sub, target)
    cli_sessions.add_parser(sub, target)
    cli_artifacts.add_parser(sub, target)
    cli_artifacts.client_option(call)
    cli_mcp.add_parser(sub, target)

    doctor = sub.add_parser("doctor", help="report what this host provides for sandboxes")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--config", type=Path, help="config file (sandbox settings)")
    doctor.add_argument(
        "--isolation",
        choices=["strict", "best-effort", "none"],
        help="the level to check for; strict exits 1 when a feature is missing",
    )

    images = sub.add_parser("images", help="build and list the docker backend's sandbox images")
    images_sub = images.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = images_sub.add_parser(
        "build",
        help="build sandbox images (offline too); does nothing for a current one",
    )
    build.add_argument("name", nargs="?", help="the image, e.g. python (default: every image)")
    build.add_argument(
        "--scientific",
        action="store_true",
        help="the variant with numpy, pandas, matplotlib, scipy",
    )
    build.add_argument(
        "--force", action="store_true", help="build even when current, without the build cache"
    )
    listing = images_sub.add_parser("list", help="each image's tag, status and size")
    listing.add_argument("--json", action="store_true", help="print JSON")

    demo = sub.add_parser("demo", help="start a daemon, make one real tool call, stop it")
    demo.add_argument(
        "--code",
        default="import sys, platform\n"
        "print(f'6 x 7 = {6 * 7}, from Python {platform.python_version()} "
        "in a tooljail sandbox')",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {
        "serve": serve.serve,
        "tools": calls.tools,
        "call": calls.call,
        "get": calls.get,
        "cancel": calls.cancel,
        "calls": cli_history.run,
        "approve": cli_approvals.run,
        "deny": cli_approvals.run,
        "approvals": cli_approvals.run,
        "sessions": cli_sessions.run,
        "artifacts": cli_artifacts.run,
        "doctor": host.doctor,
        "images": host.images,
        "demo": serve.demo,
        "mcp": cli_mcp.run,
    }[args.command]
    try:
        if args.command in _DAEMON_COMMANDS or (args.command == "tools" and args.check):
            require_extra("daemon")
        return handler(args)
    except MissingExtraError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exit as exit_:
        return exit_.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
