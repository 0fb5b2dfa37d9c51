"""`tooljail serve` under a stand-in for systemd: the notify protocol, SIGHUP's reload,
SIGTERM's drain, and the unit file itself (`systemd-analyze verify`).

The test listens on the datagram socket named by NOTIFY_SOCKET, as systemd does.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import IN_CI, spawn_daemon, wait_serving
from tooljail import Client
from tooljail.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "tooljail.service"
SAMPLE_CONFIG = ROOT / "deploy" / "systemd" / "tooljail.toml"

FIRST_TOOL = '''
from tooljail import tool


@tool
def first() -> str:
    """The tool served from the start."""
    return "first"
'''

SECOND_TOOL = '''
from tooljail import tool


@tool
def second() -> str:
    """A tool added while the daemon runs."""
    return "second"
'''


class Systemd:
    """The notify socket's end: every datagram the daemon sent, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def next(self, key: str, timeout: float = 60.0) -> dict[str, str]:
        """The next message with `key` (earlier ones are kept in `messages`)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            fields = dict(line.split("=", 1) for line in data.split("\n"))
            self.messages.append(fields)
            if key in fields:
                return fields
        raise AssertionError(f"no {key} within {timeout}s; got {self.messages}")

    def drain(self) -> None:
        """Read every message already sent (into `messages`), waiting for none."""
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    data = self.sock.recv(4096).decode()
                except BlockingIOError:
                    return
                self.messages.append(dict(line.split("=", 1) for line in data.split("\n")))
        finally:
            self.sock.setblocking(True)

    def sent(self, key: str) -> list[dict[str, str]]:
        return [m for m in self.messages if key in m]


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[Systemd]:
    stand_in = Systemd(tmp_path / "notify")
    with stand_in.sock:
        yield stand_in


def health_status(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2.0
        )
    return int(reply.status)


def write_config(path: Path, tools: Path, **values: str) -> None:
    lines = [f'tools_dirs = ["{tools}"]', *(f"{k} = {v}" for k, v in values.items())]
    path.write_text("\n".join(lines) + "\n")


def test_ready_status_watchdog_reload_with_calls_running_and_stopping(
    tmp_path_factory: pytest.TempPathFactory, systemd: Systemd
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tools = base / "tools"
    tools.mkdir()
    (tools / "first.py").write_text(FIRST_TOOL)
    tools.chmod(0o755)
    config = base / "tooljail.toml"
    write_config(config, tools, log_level='"INFO"', max_queue="100")
    env = {"NOTIFY_SOCKET": str(systemd.path), "WATCHDOG_USEC": "400000"}
    process, target, base = spawn_daemon(base, "--config", str(config), env=env)
    log = base / "daemon.log"
    try:
        ready = systemd.next("READY")
        # READY=1 means it: at that moment the socket answers and says SERVING.
        assert health_status(target) == health_pb2.HealthCheckResponse.SERVING
        assert ready["STATUS"].startswith("serving ")
        statuses = [m["STATUS"] for m in systemd.sent("STATUS")]
        assert "loading the tools" in statuses and "warming the sandbox pools" in statuses
        assert statuses.index("loading the tools") < len(statuses) - 1

        # WATCHDOG=1 every 0.2s (half of WATCHDOG_USEC), from the event loop:
        # at least 3 in the second after READY (counted from there, not from the
        # start, whose length varies with the machine's load).
        before = len(systemd.sent("WATCHDOG"))
        time.sleep(1.0)
        systemd.drain()
        assert len(systemd.sent("WATCHDOG")) - before >= 3, systemd.messages

        with Client(target) as client, ThreadPoolExecutor(4) as pool:
            assert {t.name for t in client.list_tools()} >= {"first"}
            code = "import time; time.sleep(3); print('finished')"
            running = [
                pool.submit(client.call, "execute_python_code", {"code": code}) for _ in range(3)
            ]
            time.sleep(0.8)  # they are running (or queued) when the reload comes
            (tools / "second.py").write_text(SECOND_TOOL)
            write_config(config, tools, log_level='"DEBUG"', max_queue="50")
            process.send_signal(signal.SIGHUP)
            reloading = systemd.next("RELOADING")
            assert int(reloading["MONOTONIC_USEC"]) > 0
            after = systemd.next("READY")
            assert after["STATUS"].startswith("serving ")
            assert not any(f.done() for f in running), "the reload waited for the calls"
            names = {t.name for t in client.list_tools()}
            assert {"first", "second"} <= names
            assert client.call("second", {}).data == "second"
            for future in running:  # none dropped
                result = future.result(timeout=30)
                assert result.ok, result
                assert result.data["stdout"] == "finished\n"
        text = log.read_text()
        assert "reload: done" in text
        # The queue's bound needs a restart, and the log says so by name.
        assert "take effect only after a restart" in text and '"max_queue"' in text
        assert '"settings_applied": {"log_level": ["INFO", "DEBUG"]}' in text

        process.send_signal(signal.SIGTERM)
        stopping = systemd.next("STOPPING", timeout=30)
        assert stopping["STOPPING"] == "1"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_without_notify_socket_sighup_still_reloads(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tools = base / "tools"
    tools.mkdir()
    tools.chmod(0o755)
    # Not under systemd (an empty NOTIFY_SOCKET is none): the reload is the same.
    process, target, base = spawn_daemon(
        base, "--tools-dir", str(tools), env={"NOTIFY_SOCKET": ""}, pool_size=1
    )
    try:
        wait_serving(target, process, base / "daemon.log")
        (tools / "second.py").write_text(SECOND_TOOL)
        process.send_signal(signal.SIGHUP)
        with Client(target) as client:
            deadline = time.monotonic() + 30
            while "second" not in {t.name for t in client.list_tools()}:
                assert time.monotonic() < deadline, (base / "daemon.log").read_text()
                assert process.poll() is None, "SIGHUP must not kill the daemon"
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if IN_CI:
            pytest.fail("systemd-analyze is missing: apt-get install systemd")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return found


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    # verify checks that ExecStart exists: point it at this checkout's command.
    tooljail = Path(sys.executable).parent / "tooljail"
    assert tooljail.exists()
    unit = tmp_path / "tooljail.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/tooljail", str(tooljail)))
    proc = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
    )
    # verify exits 0 on an unknown key or a bad value, and only says so: no word is allowed.
    complaints = [
        line for line in (proc.stdout + proc.stderr).splitlines() if "tooljail.service" in line
    ]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit = tmp_path / "tooljail.service"
    unit.write_text(
        textwrap.dedent("""\
        [Service]
        Type=notify
        WatchdogSecs=30s
        ExecStart=/bin/true
        """)
    )
    proc = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert "WatchdogSecs" in proc.stdout + proc.stderr


def test_the_unit_says_what_the_issue_asks() -> None:
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=",
        "ExecReload=/bin/sh -c 'kill -HUP \"${MAINPID}\"'",
        "UMask=0077",
        "RuntimeDirectory=tooljail",
        "StateDirectory=tooljail",
        "Delegate=yes",
        "OOMPolicy=continue",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ):
        assert f"\n{line}" in text, line
    left_out = text.split("Hardening: left out", 1)[1]
    for directive in ("ProtectKernelTunables=", "ProtectControlGroups=", "SystemCallFilter="):
        assert directive in left_out


def test_the_reload_command_needs_nothing_but_the_shell(tmp_path: Path) -> None:
    """ExecReload= as systemd runs it ($MAINPID in its environment), where no
    `kill` program exists (procps is not installed on a minimal Debian)."""
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("ExecReload="))
    argv = shlex.split(line.removeprefix("ExecReload="))
    assert argv[0] == "/bin/sh", argv
    hup, ready = tmp_path / "hup", tmp_path / "ready"
    script = f"trap 'echo hup > {hup}; exit 0' HUP; : > {ready}; while :; do sleep 0.05; done"
    target = subprocess.Popen(["/bin/sh", "-c", script])
    try:
        wait_for(ready.exists, 10)  # the trap is set
        empty = tmp_path / "bin"
        empty.mkdir()
        proc = subprocess.run(
            argv,
            env={"MAINPID": str(target.pid), "PATH": str(empty)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert target.wait(10) == 0 and hup.read_text() == "hup\n"
    finally:
        if target.poll() is None:
            target.kill()
            target.wait(10)


def test_the_sample_config_is_valid(tmp_path: Path) -> None:
    from tooljaild.settings.config import load_settings

    settings = load_settings(SAMPLE_CONFIG)
    assert settings.listen == "unix:///run/tooljail/tooljail.sock"
    assert settings.socket_group == "tooljail"
    assert str(settings.state_dir) == "/var/lib/tooljail"
