"""`tooljail calls ls` and `tooljail calls show ID`: the daemon's call history,
through the SDK (`Client.list_calls`, `Client.get_call`), for a person or as JSON.

Times are printed in UTC. `--since`/`--until` take ISO 8601 (a time without an
offset is UTC) or a span back from now: `90s`, `15m`, `1h`, `2d`, `1w`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tooljaild.cli.common import EXIT_OK, with_client

if TYPE_CHECKING:
    from tooljail import CallInfo, Client

__all__ = ["add_parser", "parse_when", "run"]

_SPAN = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_STATUSES = ("success", "partial", "error", "timeout", "cancelled", "lost")


def parse_when(text: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """A time given on the command line: ISO 8601 (naive: UTC) or a span ago ("2h").

    Raises:
        argparse.ArgumentTypeError: Neither.
    """
    span = _SPAN.fullmatch(text.strip())
    if span is not None:
        now = now or datetime.datetime.now(datetime.UTC)
        return now - datetime.timedelta(seconds=float(span.group(1)) * _UNIT_S[span.group(2)])
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time (2026-12-01T09:00:00Z) nor a span "
            "back from now (90s, 15m, 1h, 2d, 1w)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"the limit is 1..1000, not {value}")
    return value


def add_parser(sub: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """`tooljail calls ls` and `tooljail calls show ID`."""
    calls = sub.add_parser("calls", help="list the daemon's calls, or show one")
    actions = calls.add_subparsers(dest="calls_command", required=True, metavar="ACTION")
    ls = actions.add_parser(
        "ls",
        help="list calls, newest first (yours; an approver's or the operator's: everyone's)",
    )
    target(ls)
    ls.add_argument("--tool", help="only calls of this tool")
    ls.add_argument("--session", metavar="ID", help="only calls in this session")
    ls.add_argument("--status", choices=_STATUSES, help="only calls that ended so")
    ls.add_argument(
        "--since", type=parse_when, metavar="WHEN", help="received at or after: ISO 8601 or 1h/2d"
    )
    ls.add_argument("--until", type=parse_when, metavar="WHEN", help="received before (as --since)")
    running = ls.add_mutually_exclusive_group()
    running.add_argument(
        "--running", dest="running", action="store_const", const=True, help="only unfinished calls"
    )
    running.add_argument(
        "--ended", dest="running", action="store_const", const=False, help="only ended calls"
    )
    ls.add_argument(
        "--client",
        dest="client_filter",
        metavar="NAME",
        help="only this client's calls (an approver or the operator may name any)",
    )
    ls.add_argument("--limit", type=_limit, default=50, help="calls per page, 1..1000 (50)")
    ls.add_argument("--cursor", help="the page after this one (printed below a page)")
    ls.add_argument("--all", action="store_true", help="every page, not only the first")
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="show everything the daemon knows of a call")
    target(show)
    show.add_argument("call_id")
    show.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    act = {"ls": _ls, "show": _show}[args.calls_command]
    return with_client(args, act)


def _ls(client: Client, args: argparse.Namespace) -> int:
    filters: dict[str, Any] = {
        "tool": args.tool,
        "session_id": args.session,
        "status": args.status,
        "since": args.since,
        "until": args.until,
        "running": args.running,
        "client_name": args.client_filter,
        "limit": args.limit,
    }
    cursor = args.cursor
    calls: list[CallInfo] = []
    while True:
        page = client.list_calls(**filters, cursor=cursor)
        if not args.json:
            _table(page.calls, header=not calls)
        calls.extend(page.calls)
        cursor = page.next_cursor
        if not (args.all and cursor):
            break
    if args.json:
        body = {"calls": [c.model_dump(mode="json") for c in calls], "next_cursor": cursor}
        print(json.dumps(body, indent=2))
    elif cursor:
        print(f"more: tooljail calls ls --cursor {cursor} (or --all)", file=sys.stderr)
    elif not calls:
        print("no calls", file=sys.stderr)
    return EXIT_OK


def _table(calls: tuple[CallInfo, ...], *, header: bool) -> None:
    if header and calls:
        print(f"{'CALL':34} {'TOOL':24} {'STATE/STATUS':22} {'CLIENT':20} {'RECEIVED':20} DURATION")
    for c in calls:
        # An ended call's status says more than its state (partial, error...);
        # an unfinished one's state (queued, awaiting_approval, running).
        state = c.state.value if c.result is None else c.result.status.value
        if c.result is not None and c.result.still_running:
            state += " (running on)"
        print(
            f"{c.call_id:34} {c.tool:24} {state:22} {c.client_name or '-':20} "
            f"{_when(c.received_at):20} {_duration(c)}"
        )


def _when(moment: datetime.datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(c: CallInfo) -> str:
    """How long it ran (or has run, with "+"), from its start or else its arrival."""
    begin = c.started_at or c.received_at
    if begin is None:
        return "-"
    if c.ended_at is None:
        return f"{(datetime.datetime.now(datetime.UTC) - begin).total_seconds():.1f}s+"
    return f"{(c.ended_at - begin).total_seconds():.3f}s"


def _show(client: Client, args: argparse.Namespace) -> int:
    info = client.get_call(args.call_id)
    if args.json:
        print(info.model_dump_json(indent=2))
        return EXIT_OK
    for line in describe(info):
        print(line)
    return EXIT_OK


def describe(c: CallInfo) -> list[str]:
    """The lines `calls show` prints for a person."""
    lines = [
        f"call       {c.call_id}",
        f"tool       {c.tool}",
        f"state      {c.state.value}",
        f"client     {c.client_name or '-'}",
        f"session    {c.session_id or '-'}",
        f"daemon     {c.daemon_id or '-'}",
        f"sandbox    {c.sandbox_id or '-'}",
        f"timeout    {c.timeout_s:g}s",
        f"received   {_when(c.received_at)}",
        f"started    {_when(c.started_at)}",
        f"ended      {_when(c.ended_at)}   ({_duration(c)})",
        f"arguments  {c.arguments_bytes:,} bytes, sha256 {c.arguments_sha256 or '-'}",
    ]
    arguments = c.arguments
    if arguments is not None:
        lines += ["  " + line for line in json.dumps(arguments, indent=2).splitlines()]
    elif c.arguments_json:
        lines += [f"  {c.arguments_json[:2000]}", f"  ({c.arguments_note})"]
    r = c.result
    if r is None:
        lines.append("result     none yet: the call has not ended")
        return lines
    lines.append(f"result     {r.status.value}, effect {r.effect.value}")
    if r.still_running:
        lines.append("           still running, detached (its end will be recorded)")
    if r.cached:
        lines.append(f"           cached: the result of call {r.cached_from}")
    if r.message:
        lines.append(f"message    {r.message}")
    if r.error is not None:
        lines.append(f"error      {r.error.type}: {r.error.message}")
    if r.usage is not None:
        u = r.usage
        lines.append(
            f"usage      wall {u.wall_s:.3f}s, cpu {u.cpu_s:.3f}s, "
            f"memory peak {u.memory_peak_bytes:,} bytes"
        )
    if r.truncated:
        lines.append(f"output     cut: {r.output_bytes:,} bytes were written")
    for a in r.artifacts:
        lines.append(f"artifact   {a.artifact_id}  {a.name}  {a.size_bytes:,} bytes")
    if r.data is not None:
        text = r.data if isinstance(r.data, str) else json.dumps(r.data, indent=2)
        lines.append("data")
        lines += ["  " + line for line in text[:4000].splitlines()]
        if len(text) > 4000:
            lines.append(f"  ... ({len(text) - 4000:,} more characters: --json prints all)")
    return lines
