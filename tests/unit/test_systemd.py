"""The sd_notify side of the daemon, against a datagram socket this test listens on."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tooljaild.app.systemd import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket where systemd's would be, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    with sock:
        yield sock, str(path)


def received(sock: socket.socket) -> dict[str, str]:
    """One datagram, as its KEY=VALUE fields."""
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def drain(sock: socket.socket) -> list[str]:
    """Every datagram waiting now."""
    sock.setblocking(False)
    messages = []
    try:
        while True:
            messages.append(sock.recv(4096).decode())
    except BlockingIOError:
        return messages
    finally:
        sock.setblocking(True)
        sock.settimeout(2.0)


def test_each_state_is_one_datagram_of_fields(listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    notifier = Notifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled

    assert notifier.status("loading the tools")
    assert received(sock) == {"STATUS": "loading the tools"}
    assert notifier.ready("serving 3 tools\non x")  # a newline would start a new field
    assert received(sock) == {"READY": "1", "STATUS": "serving 3 tools on x"}
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading()
    fields = received(sock)
    assert fields["RELOADING"] == "1"
    # Type=notify-reload matches the message to its request by this clock.
    assert before <= int(fields["MONOTONIC_USEC"]) <= before + 5_000_000
    assert notifier.stopping()
    assert received(sock)["STOPPING"] == "1"


def test_an_abstract_socket_address_starts_with_at() -> None:
    name = f"tooljail-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2.0)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).status("hello")
        assert received(sock) == {"STATUS": "hello"}


def test_without_systemd_nothing_is_sent_and_nothing_fails(tmp_path: Path) -> None:
    quiet = Notifier({})
    assert not quiet.enabled
    assert not quiet.ready("serving")
    assert quiet.watchdog_interval_s is None
    # systemd gone (its socket removed): the daemon carries on.
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not gone.stopping()


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # another process's
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval_is_half_of_watchdog_usec(
    env: dict[str, str], interval: float | None
) -> None:
    assert Notifier({"NOTIFY_SOCKET": "/x", **env}).watchdog_interval_s == interval


def test_the_watchdog_is_fed_from_the_event_loop_and_starves_when_it_is_stuck(
    listener: tuple[socket.socket, str],
) -> None:
    sock, address = listener
    notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "100000"})
    assert notifier.watchdog_interval_s == 0.05

    async def scenario() -> tuple[list[str], list[str]]:
        task = asyncio.create_task(notifier.keep_alive())
        await asyncio.sleep(0.5)
        alive = drain(sock)
        time.sleep(0.5)  # noqa: ASYNC251 - the point: a loop stuck in blocking code
        stuck = drain(sock)
        task.cancel()
        return alive, stuck

    alive, stuck = asyncio.run(scenario())
    assert set(alive) == {"WATCHDOG=1"}
    assert len(alive) >= 4
    # At most the one sent before the loop froze; a thread would have sent ~10.
    assert len(stuck) <= 1


def test_keep_alive_returns_at_once_without_a_watchdog(
    listener: tuple[socket.socket, str],
) -> None:
    sock, address = listener
    asyncio.run(asyncio.wait_for(Notifier({"NOTIFY_SOCKET": address}).keep_alive(), 1.0))
    assert drain(sock) == []


async def test_a_reload_while_stopping_says_nothing_to_systemd(
    listener: tuple[socket.socket, str], tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from tooljaild.app.daemon import Daemon
    from tooljaild.settings.config import Settings

    sock, address = listener
    daemon = Daemon(Settings(state_dir=tmp_path), notifier=Notifier({"NOTIFY_SOCKET": address}))
    assert not await daemon.reload()  # not serving yet
    daemon.manager = SimpleNamespace(draining=True)  # type: ignore[assignment]
    # READY=1 after STOPPING=1 would tell systemd a stopping daemon serves again.
    assert not await daemon.reload()
    assert drain(sock) == []
