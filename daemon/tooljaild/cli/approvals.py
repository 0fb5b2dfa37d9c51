"""`tooljail approve`, `tooljail deny`, `tooljail approvals ls|watch`: the approval queue.

A call awaiting approval (state `awaiting_approval`) waits until an approver
lets it run or refuses it; the reason given with a refusal is what the model
that made the call sees. `approve` and `deny` print the call's state
afterwards. `approvals ls` prints the calls waiting that this approver may
decide (a table: call id, tool, client, received (UTC), arguments in short;
`--json` for their whole `CallInfo`); `approvals watch` prints one line per
event as it comes (`--json`: one JSON object per line) until Ctrl-C (exit 0)
or the daemon stops. Exit codes as in `tooljail.cli`: 2 for bad usage or a
refusal, 3 when no daemon answers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

from tooljaild.cli.common import EXIT_OK, connect, refused, with_client

__all__ = ["add_parsers", "run"]

ARGUMENTS_WIDTH = 60
"""How much of a call's arguments the table shows (`--json` shows them whole)."""


def add_parsers(sub: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `approve`, `deny` and `approvals` to the `tooljail` parser's subcommands.

    Args:
        sub: The subparsers of the `tooljail` parser.
        target: Adds the `--target` option to a parser.
    """
    approve = sub.add_parser("approve", help="let a call awaiting approval run")
    target(approve)
    approve.add_argument("call_id")
    deny = sub.add_parser("deny", help="refuse a call awaiting approval (it does not run)")
    target(deny)
    deny.add_argument("call_id")
    deny.add_argument("--reason", default="", help="why: the model that made the call sees it")
    approvals = sub.add_parser("approvals", help="the calls awaiting approval (for approvers)")
    actions = approvals.add_subparsers(dest="approvals_command", required=True, metavar="ACTION")
    ls = actions.add_parser("ls", help="list the calls waiting that you may decide, oldest first")
    watch = actions.add_parser(
        "watch", help="print each request and decision as it happens (Ctrl-C ends it)"
    )
    for action in (ls, watch):
        target(action)
        action.add_argument("--json", action="store_true", help="print JSON (one per line)")


def run(args: argparse.Namespace) -> int:
    """`tooljail approve|deny CALL_ID` (prints the call's state afterwards), or
    `tooljail approvals ls|watch`."""
    from tooljail import TooljailError

    if args.command == "approvals":
        act = _ls if args.approvals_command == "ls" else _watch
        return with_client(args, act)
    try:
        with connect(args) as client:
            if args.command == "approve":
                info = client.approve(args.call_id)
            else:
                info = client.deny(args.call_id, args.reason)
    except TooljailError as exc:
        return refused(exc)
    print(info.state.value)
    return EXIT_OK


def _ls(client: Any, args: argparse.Namespace) -> int:
    calls = client.list_approvals()
    if args.json:
        print(json.dumps([json.loads(c.model_dump_json()) for c in calls], indent=2))
        return EXIT_OK
    if not calls:
        print("no calls await your approval", file=sys.stderr)
        return EXIT_OK
    rows = [("CALL ID", "TOOL", "CLIENT", "RECEIVED (UTC)", "ARGUMENTS")]
    rows += [(c.call_id, c.tool, c.client_name, _when(c), _short(c)) for c in calls]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join(cells), row[4])
    return EXIT_OK


def _watch(client: Any, args: argparse.Namespace) -> int:
    # Ctrl-C closes the watch: the iteration then ends, and the command exits 0.
    watch = client.watch_approvals()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: watch.close())
    try:
        with watch:
            for event in watch:
                print(_event_line(event, as_json=args.json), flush=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_OK


def _event_line(event: Any, *, as_json: bool) -> str:
    if as_json:
        return str(event.model_dump_json())
    call = event.call
    # A request at its time of arrival; a decision at its end, or now (approved: queued).
    when = _when(call) if event.kind.value == "requested" else _ended(call)
    line = f"{when}  {event.kind.value:<9}  {call.call_id}  {call.tool}  {call.client_name}"
    if event.kind.value == "requested":
        return f"{line}  {_short(call)}"
    outcome = call.state.value
    if call.result is not None and call.result.message:
        outcome += f": {call.result.message[:ARGUMENTS_WIDTH]}"
    return f"{line}  -> {outcome}"


def _when(call: Any) -> str:
    received = call.received_at
    return "-" if received is None else str(received.strftime("%Y-%m-%d %H:%M:%S"))


def _ended(call: Any) -> str:
    ended = call.ended_at or datetime.datetime.now(datetime.UTC)
    return str(ended.strftime("%Y-%m-%d %H:%M:%S"))


def _short(call: Any) -> str:
    """The arguments on one line, cut to `ARGUMENTS_WIDTH` characters."""
    text = str(call.arguments_json).replace("\n", " ")
    if len(text) > ARGUMENTS_WIDTH or call.arguments_truncated:
        return text[: ARGUMENTS_WIDTH - 3] + "..."
    return text
