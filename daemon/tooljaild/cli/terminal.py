"""`tooljail sessions shell ID` and `tooljail sessions port-forward ID LOCAL:REMOTE`.

`shell` opens a terminal in a session in the user's own terminal, as
`docker exec -it` does: stdin goes raw (when it is a terminal) so every key,
Ctrl-C included, is a byte for the session's shell; the window size is the
user's at the start and follows it (SIGWINCH); the shell's exit ends the
command with its exit status (128 + N when signal N ended it), and the
user's terminal mode is restored on every way out (an error, a signal that
Python turns into an exception, the shell's end).

`port-forward` listens on 127.0.0.1:LOCAL and tunnels each connection to
REMOTE on the session's own loopback (`Client.forward`) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tooljaild.cli.common import EXIT_OK

__all__ = ["ACTIONS", "add_parsers", "parse_ports"]

DEFAULT_WINDOW = (24, 80)
"""Rows and columns when the user's terminal does not say (output is not a terminal)."""


def add_parsers(actions: Any, target: Callable[[argparse.ArgumentParser], None]) -> None:
    """Adds `shell` and `port-forward` to `tooljail sessions`' actions."""
    shell = actions.add_parser(
        "shell",
        help="open an interactive shell in a session (as `docker exec -it`)",
        description="A terminal in the session: raw keys (Ctrl-C goes to the session), "
        "the window's size, and the shell's exit status as this command's.",
    )
    target(shell)
    shell.add_argument("session_id", metavar="ID")
    shell.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="COMMAND",
        help="the program to run on the terminal (default: bash -l, or sh -l)",
    )
    forward = actions.add_parser(
        "port-forward",
        help="reach a port of a session's loopback from 127.0.0.1 (as `kubectl port-forward`)",
        description="Listens on 127.0.0.1:LOCAL and tunnels each connection to REMOTE on "
        "the session's own loopback, until Ctrl-C.",
    )
    target(forward)
    forward.add_argument("session_id", metavar="ID")
    forward.add_argument(
        "ports",
        type=parse_ports,
        metavar="[LOCAL:]REMOTE",
        help="e.g. 8080:8000; one number is the same port on both sides; LOCAL 0 picks one",
    )


def parse_ports(text: str) -> tuple[int, int]:
    """(local, remote) of "LOCAL:REMOTE" or "PORT" (an argparse type)."""
    local, _, remote = text.rpartition(":")
    try:
        ports = (int(local or remote), int(remote))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not ports: {text!r} (LOCAL:REMOTE, e.g. 8080:8000, or one port)"
        ) from None
    if not (0 <= ports[0] <= 65535 and 1 <= ports[1] <= 65535):
        raise argparse.ArgumentTypeError(
            f"ports out of range in {text!r}: LOCAL 0-65535 (0: any free), REMOTE 1-65535"
        )
    return ports


def _window(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_WINDOW
    return (size.lines or DEFAULT_WINDOW[0], size.columns or DEFAULT_WINDOW[1])


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[bool]:
    """`fd` in raw mode while inside (when it is a terminal); restored on every exit.

    Yields:
        Whether `fd` is a terminal (and so went raw).
    """
    if not os.isatty(fd):
        yield False
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # keys typed ahead are kept, not flushed
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _send_keys(fd: int, term: Any, is_tty: bool) -> None:
    """Stdin to the terminal, as it comes; at its end (a pipe), an EOF key (Ctrl-D)."""
    from tooljail import TooljailError

    with contextlib.suppress(OSError, TooljailError):
        while data := os.read(fd, 4096):
            term.write(data)
        if not is_tty:
            term.write(b"\x04")


def _shell(client: Any, args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    rows, cols = _window(stdout if os.isatty(stdout) else stdin)
    with client.terminal(args.session_id, rows=rows, cols=cols, argv=args.argv or None) as term:
        previous = None
        with raw_mode(stdin) as is_tty:
            if is_tty and threading.current_thread() is threading.main_thread():

                def on_winch(signum: int, frame: object) -> None:
                    with contextlib.suppress(TooljailError):
                        term.resize(*_window(stdin))

                previous = signal.signal(signal.SIGWINCH, on_winch)
            try:
                keys = threading.Thread(
                    target=_send_keys, args=(stdin, term, is_tty), name="keys", daemon=True
                )
                keys.start()
                while True:
                    try:
                        data = term.read(timeout=0.5)
                    except TimeoutError:
                        continue  # (a wake-up for signal handlers)
                    if not data:
                        break
                    _write_all(stdout, data)
            finally:
                if previous is not None:
                    signal.signal(signal.SIGWINCH, previous)
    code = term.exit_code
    return EXIT_OK if code is None else code


def _port_forward(client: Any, args: argparse.Namespace) -> int:
    local, remote = args.ports
    with client.forward(args.session_id, remote, local_port=local) as forward:
        print(
            f"Forwarding from {forward.address} -> port {remote} in session "
            f"{args.session_id} (Ctrl-C to stop)",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return EXIT_OK


ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "shell": _shell,
    "port-forward": _port_forward,
}
"""`tooljail sessions` actions of this module, by name."""
