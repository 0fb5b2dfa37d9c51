"""`tooljail sessions`: open, list and close sessions, and move workspace files.

A command line process owns no session: `open` prints the id and exits, the
session lives on in the daemon until `close`, its idle TTL or its maximum
lifetime, and any later process names it by id (`tooljail call --session ID`).
So `ls` shows every client's sessions, an operator's view: the SDK lists only
its own process's by default, which for a fresh CLI process is always none.

Exit codes as in `tooljail.cli`: 2 for bad usage or a refusal (a session that
ended, or was never known; a path outside the workspace; a full daemon), 3
when no daemon answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tooljaild.cli import processes, terminal
from tooljaild.cli.common import EXIT_OK, EXIT_USAGE, egress_arguments, with_client

if TYPE_CHECKING:
    from tooljail import Client, SessionInfo

__all__ = ["add_parser", "run"]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _size(text: str) -> int:
    """A byte count such as 1048576, 512M, 2G or 64KiB (binary units)."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1] if raw and raw[-1] in _UNITS else ""
    try:
        value = float(raw[: len(raw) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (bytes, or with K, M, G or T, e.g. 512M)"
        ) from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (0 or more)")
    return int(value * _UNITS[unit])


def _non_negative(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: `kind`, 0 or more and finite (0 takes the daemon's bound)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
        return value

    return parse


def add_parser(
    sub: Any,
    target: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Adds `sessions` and its actions to the `tooljail` parser's subcommands.

    Args:
        sub: The subparsers of the `tooljail` parser.
        target: Adds the `--target` option to a parser.
    """
    sessions = sub.add_parser(
        "sessions",
        help="open, list and close sessions; upload and download their files",
        description="A session keeps a Python interpreter and a workspace across calls: "
        "open one, run calls in it with `tooljail call --session ID`, close it.",
    )
    actions = sessions.add_subparsers(dest="sessions_command", required=True, metavar="ACTION")

    opening = actions.add_parser(
        "open",
        help="open a session and print its id",
        description="Open a session and print its id (only the id, so "
        "`S=$(tooljail sessions open)` works). It lives until closed, until its idle "
        "TTL passes without a call, or its maximum lifetime. A bound may only lower "
        "the daemon's own; 0 or none takes the daemon's.",
    )
    target(opening)
    opening.add_argument(
        "--idle-ttl", type=_non_negative(float), metavar="S", help="seconds without a call"
    )
    opening.add_argument(
        "--max-lifetime", type=_non_negative(float), metavar="S", help="seconds in all"
    )
    opening.add_argument(
        "--memory", type=_size, metavar="BYTES", help="memory of the whole session, e.g. 512M"
    )
    opening.add_argument("--pids", type=_non_negative(int), metavar="N", help="processes")
    opening.add_argument("--cpus", type=_non_negative(float), metavar="X", help="CPU cores")
    opening.add_argument(
        "--workspace", type=_size, metavar="BYTES", help="workspace quota, e.g. 100M"
    )
    opening.add_argument(
        "--keep-processes",
        action="store_true",
        help="processes a call starts outlive the call (until the session ends)",
    )
    egress_arguments(opening, "the session")
    opening.add_argument("--json", action="store_true", help="print the session as JSON")

    listing = actions.add_parser(
        "ls",
        help="list the open sessions of every client",
        description="List the open sessions of every client of the daemon (an operator's "
        "view: a command line process owns none, its sessions outlive it).",
    )
    target(listing)
    listing.add_argument(
        "--all", action="store_true", help="every client's sessions (the default; no effect)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")

    closing = actions.add_parser("close", help="close a session and print how it ended")
    target(closing)
    closing.add_argument("session_id", metavar="ID")
    closing.add_argument("--json", action="store_true", help="print the session as JSON")

    upload = actions.add_parser(
        "upload",
        help="write a local file (or stdin) to a path in a session's workspace",
    )
    target(upload)
    upload.add_argument("session_id", metavar="ID")
    upload.add_argument("path", metavar="PATH", help="relative to the workspace")
    upload.add_argument(
        "local", nargs="?", default="-", metavar="LOCAL_FILE", help="the file, or - for stdin"
    )

    download = actions.add_parser(
        "download", help="copy a file of a session's workspace to stdout or a local file"
    )
    target(download)
    download.add_argument("session_id", metavar="ID")
    download.add_argument("path", metavar="PATH", help="relative to the workspace")
    download.add_argument(
        "-o", "--output", metavar="LOCAL_FILE", help="write it here (default: stdout)"
    )

    # A terminal and forwarded ports (issue 24): shell, port-forward.
    terminal.add_parsers(actions, target)

    # Background processes (issue 24): ps, logs, kill.
    processes.add_parsers(actions, target)


def run(args: argparse.Namespace) -> int:
    """Runs a `tooljail sessions` action; returns the exit status."""
    action: Callable[[Client, argparse.Namespace], int] = {
        "open": _open,
        "ls": _ls,
        "close": _close,
        "upload": _upload,
        "download": _download,
        **terminal.ACTIONS,
        **processes.ACTIONS,
    }[args.sessions_command]
    return with_client(args, action)


def _open(client: Client, args: argparse.Namespace) -> int:
    session = client.session(
        idle_ttl_s=args.idle_ttl,
        max_lifetime_s=args.max_lifetime,
        memory_bytes=args.memory,
        pids=args.pids,
        cpus=args.cpus,
        workspace_bytes=args.workspace,
        keep_processes=args.keep_processes,
        egress=args.egress,
        secrets=args.secret,
    )
    # Not closed here: the session is the point of the command, and it outlives
    # this process (nothing closes a session when its client goes away).
    info = session.info
    print(info.model_dump_json(indent=2) if args.json else info.session_id)
    until = [f"`tooljail sessions close {info.session_id}`"]
    if info.idle_ttl_s:
        until.append(f"{_seconds(info.idle_ttl_s)} without a call (its idle TTL)")
    if info.max_lifetime_s:
        until.append(f"{_seconds(info.max_lifetime_s)} after it opened (its maximum lifetime)")
    print(f"session {info.session_id} lives until {' or '.join(until)}", file=sys.stderr)
    return EXIT_OK


def _ls(client: Client, args: argparse.Namespace) -> int:
    sessions = client.list_sessions(all_clients=True)
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in sessions], indent=2))
        return EXIT_OK
    now = time.time()
    print(
        f"{'SESSION':32}  {'AGE':>7} {'IDLE':>7} {'CALLS':>6} {'QUEUED':>6} {'RESETS':>6}  LIMITS"
    )
    for s in sorted(sessions, key=lambda s: s.created_unix):
        print(
            f"{s.session_id:32}  {_seconds(now - s.created_unix):>7} "
            f"{_seconds(now - s.last_used_unix):>7} {s.calls:>6} {s.queued:>6} "
            f"{s.resets:>6}  {_limits(s)}"
        )
    if not sessions:
        print("no open sessions", file=sys.stderr)
    return EXIT_OK


def _close(client: Client, args: argparse.Namespace) -> int:
    info = client.close_session(args.session_id)
    if args.json:
        print(info.model_dump_json(indent=2))
    else:
        # The end reason alone on stdout, as `cancel` prints the state: "closed",
        # or how it had ended before ("idle_ttl", "daemon_restart", ...).
        print(info.end_reason or info.state.value)
        # The counts only when the daemon still held them: closing a session that
        # had already ended answers with its id, state and reason alone.
        counts = (
            f" after {info.calls} calls, {info.resets} interpreter restarts"
            if info.created_unix
            else ""
        )
        reason = info.end_reason or "no reason given"
        print(f"session {info.session_id} ended ({reason}){counts}", file=sys.stderr)
    return EXIT_OK


def _upload(client: Client, args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.buffer.read() if args.local == "-" else Path(args.local).read_bytes()
    except OSError as exc:
        print(f"tooljail: cannot read {args.local}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    size = client.upload_file(args.session_id, args.path, data)
    print(f"wrote {size} bytes to {args.path} in session {args.session_id}", file=sys.stderr)
    return EXIT_OK


def _download(client: Client, args: argparse.Namespace) -> int:
    return _write_out(client.download_file(args.session_id, args.path), args.output)


def _write_out(data: bytes, output: str | None) -> int:
    """`data` to stdout (None or "-"), binary-safe, or to the file `output`."""
    if output is None or output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return EXIT_OK
    try:
        Path(output).write_bytes(data)
    except OSError as exc:
        print(f"tooljail: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {len(data)} bytes to {output}", file=sys.stderr)
    return EXIT_OK


def _seconds(s: float) -> str:
    """A duration for a person: 45s, 12m, 3h, 2d; "-" for none (no bound)."""
    if s <= 0:
        return "-" if s == 0 else "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size:
            return f"{s / size:.0f}{unit}"
    return f"{s:.0f}s"


def _bytes(n: int) -> str:
    """A size for a person, in binary units: 512M, 1.5G, 100K."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.3g}{unit}"
    return f"{n}B"


def _limits(s: SessionInfo) -> str:
    """The bounds in force for session `s`, those it has (0 means none)."""
    parts = [
        f"mem={_bytes(s.memory_bytes)}" if s.memory_bytes else "",
        f"pids={s.pids}" if s.pids else "",
        f"cpus={s.cpus:g}" if s.cpus else "",
        f"ws={_bytes(s.workspace_bytes)}" if s.workspace_bytes else "",
        f"ttl={_seconds(s.idle_ttl_s)}" if s.idle_ttl_s else "",
        f"life={_seconds(s.max_lifetime_s)}" if s.max_lifetime_s else "",
        "keep-processes" if s.keep_processes else "",
    ]
    return " ".join(p for p in parts if p) or "-"
