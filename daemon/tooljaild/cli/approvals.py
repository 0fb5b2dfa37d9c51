"""`tooljail approve` and `tooljail deny`: decide a call that awaits approval.

A call awaiting approval (state `awaiting_approval`) waits until an approver
lets it run or refuses it; the reason given with a refusal is what the model
that made the call sees. Both print the call's
state afterwards. Exit codes as in `tooljail.cli`: 2 for bad usage or a
refusal, 3 when no daemon answers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tooljaild.cli.common import EXIT_OK, connect, refused

__all__ = ["add_parsers", "run"]


def add_parsers(sub: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `approve` and `deny` to the `tooljail` parser's subcommands.

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


def run(args: argparse.Namespace) -> int:
    """`tooljail approve|deny CALL_ID`: prints the call's state afterwards."""
    from tooljail import TooljailError

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
