"""Talking to systemd (`Type=notify`): readiness, status, reloads, stopping, the watchdog.

The protocol is sd_notify(3): newline-separated `KEY=VALUE` fields in one
datagram to the Unix socket named by `$NOTIFY_SOCKET` (a leading "@" means the
abstract namespace). Without `$NOTIFY_SOCKET` (not under systemd) every method
does nothing, so the daemon calls them unconditionally.

What the daemon says, and when (see `Daemon`):

- `STATUS=...` at each step of starting, so `systemctl status` shows what a
  slow start is waiting for;
- `READY=1` only once the socket listens and the pools are warm: a unit
  ordered after ours (or `systemctl start`, which waits) sees a daemon that
  answers at once;
- `RELOADING=1` (with `MONOTONIC_USEC`, as `Type=notify-reload` wants) when
  SIGHUP's reload begins and `READY=1` when it is over;
- `STOPPING=1` when SIGTERM's drain begins;
- `WATCHDOG=1` every half of `$WATCHDOG_USEC`, from a task on the event loop:
  a loop stuck in blocking code stops sending, and systemd kills and restarts
  the daemon (`WatchdogSec=` in the unit). A thread would keep sending while
  the loop that serves every call is frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """The daemon's side of sd_notify, read from the environment once.

    Args:
        environ: Where `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` come
            from (tests pass their own).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        if address is not None and address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address
        self.watchdog_interval_s = _watchdog_interval(env)
        """Seconds between two WATCHDOG=1 (half of WATCHDOG_USEC); None: no watchdog."""

    @property
    def enabled(self) -> bool:
        """Whether anyone listens (systemd gave us a NOTIFY_SOCKET)."""
        return self._address is not None

    def send(self, *fields: str) -> bool:
        """Send `fields` ("KEY=VALUE") in one datagram; never raises.

        Returns:
            Whether it was sent (False: not under systemd, or the socket refused it;
            a daemon must not fail because its supervisor went away).
        """
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto("\n".join(fields).encode(), self._address)
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False
        return True

    def status(self, text: str) -> bool:
        """What the daemon is doing now (`systemctl status` shows it)."""
        return self.send(f"STATUS={_one_line(text)}")

    def ready(self, text: str) -> bool:
        """Serving: the socket listens and the pools are warm (or a reload is over)."""
        return self.send("READY=1", f"STATUS={_one_line(text)}")

    def reloading(self) -> bool:
        """A reload begins; `ready` ends it."""
        # MONOTONIC_USEC lets Type=notify-reload (systemd 253+) match this message to
        # its reload request; plain Type=notify ignores it.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading")

    def stopping(self) -> bool:
        """The drain begins (SIGTERM)."""
        return self.send("STOPPING=1", "STATUS=draining: finishing the calls running")

    async def keep_alive(self) -> None:
        """Send WATCHDOG=1 every `watchdog_interval_s` until cancelled; returns at once
        without a watchdog.

        Run it as a task on the daemon's event loop, and only there (see the module doc).
        """
        interval = self.watchdog_interval_s
        if interval is None or not self.enabled:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(interval)


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; None when not for us."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (we were started by a wrapper)
    with contextlib.suppress(ValueError):
        usec = int(raw)
        if usec > 0:
            return usec / 2_000_000
    log.warning("ignoring WATCHDOG_USEC=%r: not a positive number of microseconds", raw)
    return None


def _one_line(text: str) -> str:
    # A newline would start another field of the datagram.
    return " ".join(text.split())
