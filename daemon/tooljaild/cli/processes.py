"""`tooljail sessions ps|logs|kill`: a session's background processes.

`ps ID` lists them; `logs ID PROCESS_ID` prints what is kept of one's output
(stdout and stderr as they came), and with `-f` follows it live until it ends
or Ctrl-C, which ends the follow cleanly and says where to pick up
(`--offset`): nothing is missed or printed twice from there. `kill ID
PROCESS_ID` stops one (TERM, then KILL after a grace), or sends it one signal.

Exit codes as in `tooljail.cli`: 2 for a refusal (an unknown session or
process), 3 when no daemon answers.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tooljaild.cli.common import EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from tooljail import Client
    from tooljail.types import ProcessInfo

__all__ = ["ACTIONS", "add_parsers"]


def add_parsers(actions: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `ps`, `logs` and `kill` to `tooljail sessions`'s actions."""
    ps = actions.add_parser("ps", help="list a session's background processes")
    target(ps)
    ps.add_argument("session_id", metavar="ID")
    ps.add_argument("--json", action="store_true", help="print JSON")

    logs = actions.add_parser(
        "logs",
        help="print a background process's output (-f: follow it)",
        description="Print a background process's output, stdout and stderr as they came. "
        "With -f, follow it live until it ends; Ctrl-C stops following and prints the "
        "offset to go on from (--offset).",
    )
    target(logs)
    logs.add_argument("session_id", metavar="ID")
    logs.add_argument("process_id", metavar="PROCESS_ID")
    logs.add_argument("-f", "--follow", action="store_true", help="follow it live")
    logs.add_argument(
        "--offset", type=int, default=0, metavar="N", help="start at this byte of its output"
    )
    logs.add_argument(
        "--stream", choices=("both", "stdout", "stderr"), default="both", help="which output"
    )

    kill = actions.add_parser(
        "kill",
        help="stop a background process (TERM, then KILL), or send it a signal",
    )
    target(kill)
    kill.add_argument("session_id", metavar="ID")
    kill.add_argument("process_id", metavar="PROCESS_ID")
    kill.add_argument(
        "--signal", metavar="NAME", help="send only this signal (TERM, INT, HUP, KILL, 9...)"
    )
    kill.add_argument(
        "--grace", type=float, default=5.0, metavar="S", help="seconds from TERM to KILL"
    )


def _ps(client: Client, args: argparse.Namespace) -> int:
    from tooljail import Processes

    processes = Processes(client, args.session_id).list()
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in processes], indent=2))
        return EXIT_OK
    print(f"{'PROCESS':14} {'PID':>6} {'STATE':8} {'EXIT':>5} {'CPU':>7} {'MEM':>7} "
          f"{'OUTPUT':>8} {'AGE':>6}  COMMAND")  # fmt: skip
    now = time.time()
    for p in processes:
        print(
            f"{p.process_id:14} {p.pid:>6} {p.state.value:8} {_exit(p):>5} {p.cpu_s:>6.1f}s "
            f"{_size(p.memory_bytes):>7} {_size(p.output_bytes):>8} "
            f"{_age(now - p.started_unix):>6}  {(p.name + ': ') if p.name else ''}{p.command}"
        )
    if not processes:
        print("no background processes", file=sys.stderr)
    return EXIT_OK


def _logs(client: Client, args: argparse.Namespace) -> int:
    from tooljail import Processes

    if args.offset < 0:
        print("tooljail: --offset must be 0 or more", file=sys.stderr)
        return EXIT_USAGE
    processes = Processes(client, args.session_id)
    out = sys.stdout.buffer
    if not args.follow:
        page = processes.read(args.process_id, args.offset, stream=args.stream)
        out.write(page.data)
        out.flush()
        if page.skipped:
            print(f"tooljail: {page.skipped} bytes are no longer kept", file=sys.stderr)
        return EXIT_OK
    offset = args.offset
    follow = processes.follow(args.process_id, offset, stream=args.stream)
    # Ctrl-C between a chunk's write and its offset's update would print an
    # offset that repeats bytes: the interrupt waits for the pair to be done.
    state = {"writing": False, "stop": False}

    def interrupt(signum: int, frame: Any) -> None:
        state["stop"] = True
        if not state["writing"]:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        for chunk in follow:
            state["writing"] = True
            out.write(chunk.data)
            out.flush()
            offset = chunk.next_offset
            state["writing"] = False
            if state["stop"]:
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        follow.close()  # ends the RPC
        print(f"\nstopped following at offset {offset} (--offset {offset} goes on from there)",
              file=sys.stderr)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_OK


def _kill(client: Client, args: argparse.Namespace) -> int:
    from tooljail import Processes

    processes = Processes(client, args.session_id)
    if args.signal is None:
        info = processes.stop(args.process_id, grace_s=args.grace)
    else:
        signum = _signal(args.signal)
        if signum is None:
            print(f"tooljail: not a signal: {args.signal!r} (e.g. TERM, INT, 9)", file=sys.stderr)
            return EXIT_USAGE
        info = processes.signal(args.process_id, signum)
    print(info.state.value)
    print(f"process {info.process_id}: {info.state.value} {_exit(info)}".rstrip(), file=sys.stderr)
    return EXIT_OK


ACTIONS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "ps": _ps,
    "logs": _logs,
    "kill": _kill,
}
"""Each action's function, by name (`tooljail.cli.sessions.run` dispatches)."""


def _signal(text: str) -> int | None:
    if text.isdigit():
        return int(text)
    name = text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()
    found = getattr(signal.Signals, name, None)
    return None if found is None else int(found)


def _exit(p: ProcessInfo) -> str:
    if p.exit_code is not None:
        return str(p.exit_code)
    return f"sig{p.signal}" if p.signal else "-"


def _age(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size:
            return f"{s / size:.0f}{unit}"
    return f"{max(0.0, s):.0f}s"


def _size(n: int) -> str:
    for unit, size in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n}B"
