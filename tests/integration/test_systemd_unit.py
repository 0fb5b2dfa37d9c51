"""deploy/systemd/tooljail.service under a real systemd: pid 1 of a Docker container.

The container is a Debian bookworm root made by debootstrap (systemd, bubblewrap,
python3), imported once per machine as `tooljail/systemd-test:<recipe hash>` and
reused by later runs; the checkout and its interpreter are bind-mounted at
their own paths, read-only. What runs is the unit as shipped, with two
drop-in changes only: ExecStart names this checkout's `tooljail`,
ProtectHome=read-only instead of yes, since that interpreter lives under /root, and
PrivateTmp=no when the checkout itself is under /tmp.

The container does not mask parts of /proc (systempaths=unconfined): Docker's
masks would make the kernel refuse bubblewrap a fresh /proc, as the unit's
left-out Protect* directives would. So the sandboxes run with every isolation
feature (namespaces, seccomp, the unprivileged uid) under the unit's hardening.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import docker_problem

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = "systemd,systemd-sysv,dbus,bubblewrap,python3,procps"
IMAGE = "tooljail/systemd-test:" + hashlib.sha256(f"bookworm {PACKAGES}".encode()).hexdigest()[:12]
PYTHON_PREFIX = Path(sys.base_prefix)
TOOLJAIL = Path(sys.executable).parent / "tooljail"

FIRST = '''from tooljail import tool


@tool
def first() -> str:
    """Served from the start."""
    return "first"
'''
SECOND = FIRST.replace("first", "second").replace("Served from the start", "Added by reload")


def _run(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _image() -> str:
    """The systemd image, built once (debootstrap, then docker import) if missing."""
    if _run("docker", "image", "inspect", IMAGE, check=False).returncode == 0:
        return IMAGE
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        pytest.skip("debootstrap is not installed (apt-get install debootstrap)")
    work = Path(
        subprocess.check_output(
            ["mktemp", "-d", "/var/tmp/tooljail-rootfs.XXXXXX"], text=True
        ).strip()
    )
    try:
        _run(
            debootstrap, "--variant=minbase", f"--include={PACKAGES}", "bookworm",
            str(work / "root"), "http://deb.debian.org/debian", timeout=900,
        )  # fmt: skip
        # The pipe is ours to close (warnings are errors, and an unclosed one is
        # a ResourceWarning), and tar's own exit code counts as docker's does.
        with subprocess.Popen(
            ["tar", "-C", str(work / "root"), "-c", "."], stdout=subprocess.PIPE
        ) as tar:
            assert tar.stdout is not None
            subprocess.run(
                ["docker", "import", "-", IMAGE], stdin=tar.stdout, check=True, timeout=300
            )
            tar.stdout.close()
            if tar.wait(60) != 0:
                raise AssertionError(f"tar of the systemd root exited {tar.returncode}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return IMAGE


class Machine:
    """The container: run commands in it as root."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str, *, timeout: float = 120, check: bool = True) -> str:
        return _run(
            "docker", "exec", self.name, "sh", "-c", script, timeout=timeout, check=check
        ).stdout

    def put(self, path: str, text: str) -> None:
        """Write `text` to `path` in the container."""
        argv = ["docker", "exec", "-i", self.name, "sh", "-c", f"cat > {path}"]
        subprocess.run(argv, input=text, text=True, check=True, timeout=60)

    def background(self, script: str) -> None:
        _run("docker", "exec", "-d", self.name, "sh", "-c", script)

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show -p {','.join(props)} tooljail")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait(self, script: str, timeout: float = 60) -> str:
        """Run `script` until it succeeds; its output."""
        deadline = time.monotonic() + timeout
        while True:
            proc = _run("docker", "exec", self.name, "sh", "-c", script, check=False)
            if proc.returncode == 0:
                return proc.stdout
            if time.monotonic() > deadline:
                journal = self.sh("journalctl -u tooljail --no-pager | tail -30", check=False)
                raise AssertionError(f"{script!r} failed:\n{proc.stdout}{proc.stderr}\n{journal}")
            time.sleep(0.3)


@pytest.fixture(scope="module")
def machine() -> Iterator[Machine]:
    problem = docker_problem()
    if problem is not None:
        pytest.skip(problem)
    image = _image()
    name = f"tooljail-systemd-{int(time.time() * 1000)}"
    _run(
        "docker", "run", "-d", "--name", name, "--cap-add", "SYS_ADMIN",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined",
        "--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "-e", "container=docker", "-v", f"{ROOT}:{ROOT}:ro",
        "-v", f"{PYTHON_PREFIX}:{PYTHON_PREFIX}:ro", image, "/lib/systemd/systemd",
    )  # fmt: skip
    box = Machine(name)
    try:
        # "degraded" is fine (units a container cannot run); "starting" is not yet.
        box.wait("! systemctl is-system-running --wait | grep -q starting")
        box.sh(
            # No procps' kill, as on a minimal Debian: `systemctl reload` must not need it.
            "set -e; rm -f /usr/bin/kill /bin/kill; groupadd --system tooljail; chmod 711 /root; "
            "mkdir -p /etc/tooljail/tools /etc/systemd/system/tooljail.service.d; "
            f"cp {ROOT}/deploy/systemd/tooljail.toml /etc/tooljail/tooljail.toml"
        )
        unit = (ROOT / "deploy/systemd/tooljail.service").read_text()
        box.put(
            "/etc/systemd/system/tooljail.service",
            unit.replace("/usr/local/bin/tooljail", str(TOOLJAIL)),
        )
        # The unit's PrivateTmp=yes would hide a checkout under /tmp (a CI clone's
        # place) from the service, its `tooljail` included: the drop-in lets it see it.
        private_tmp = "PrivateTmp=no\n" if ROOT.is_relative_to("/tmp") else ""
        box.put(
            "/etc/systemd/system/tooljail.service.d/test.conf",
            "[Service]\nProtectHome=read-only\n" + private_tmp,
        )
        box.put("/etc/tooljail/tools/first.py", FIRST)
        box.sh("systemctl daemon-reload")
        yield box
    finally:
        _run("docker", "rm", "-f", name, check=False)


def call_in_background(box: Machine, out: str, seconds: float) -> None:
    """Start a call of `seconds` (its id: `out`'s name), and wait until the daemon runs it."""
    code = json.dumps({"code": f'import time; time.sleep({seconds}); print("finished")'})
    call_id = Path(out).stem
    box.background(
        f"{TOOLJAIL} call --call-id {call_id} --json execute_python_code '{code}' "
        f"> {out}.tmp 2>{out}.err; mv {out}.tmp {out}"
    )
    box.wait(f'{TOOLJAIL} get {call_id} | grep -q \'"state": "running"\'')


def finished_ok(box: Machine, out: str, timeout: float = 60) -> dict[str, object]:
    text = box.wait(f"cat {out}", timeout=timeout)
    # The call's output streams first, then its result as JSON.
    start = text.find("{\n")
    assert start >= 0, text + box.sh(f"cat {out}.err", check=False)
    result = json.loads(text[start:])
    assert result["status"] == "success", result
    assert result["data"]["stdout"] == "finished\n", result
    return result


def test_start_reload_and_stop_with_calls_running(machine: Machine) -> None:
    box = machine
    # `systemctl start` returns once READY=1 came: the socket answers at once.
    box.sh("systemctl start tooljail", timeout=180)
    state = box.show("ActiveState", "StatusText", "MainPID", "NRestarts")
    assert state["ActiveState"] == "active", box.sh("journalctl -u tooljail --no-pager | tail -30")
    assert state["StatusText"].startswith("serving ")
    tools = box.sh(f"{TOOLJAIL} tools --json")
    assert "first" in tools
    # The hardening leaves the sandboxes whole: bubblewrap and its seccomp filter work.
    journal = box.sh("journalctl -u tooljail --no-pager")
    assert '"namespaces (bubblewrap)": "active"' in journal, journal
    assert '"seccomp filter": "active"' in journal, journal
    hostname = json.dumps({"code": "import socket; print(socket.gethostname())"})
    assert box.sh(f"{TOOLJAIL} call execute_python_code '{hostname}'").startswith("tooljail\n")

    # Reload with calls running: none dropped, the new tool appears, same process.
    for i in range(2):
        call_in_background(box, f"/tmp/reload{i}.json", 15)
    still = "test ! -e /tmp/reload0.json && test ! -e /tmp/reload1.json"
    assert not _run("docker", "exec", box.name, "sh", "-c", still, check=False).returncode, box.sh(
        "cat /tmp/reload*", check=False
    )
    box.put("/etc/tooljail/tools/second.py", SECOND)
    box.sh("systemctl reload tooljail")
    box.wait(f"{TOOLJAIL} tools --json | grep -q second", timeout=60)
    assert box.show("MainPID")["MainPID"] == state["MainPID"]
    for i in range(2):
        finished_ok(box, f"/tmp/reload{i}.json")
    log = box.sh("journalctl -u tooljail --no-pager")
    assert "reload: done" in log

    # Stop with a call running: the drain lets it finish and answers it.
    call_in_background(box, "/tmp/stop.json", 3)
    box.sh("systemctl stop tooljail", timeout=120)
    finished_ok(box, "/tmp/stop.json", timeout=10)
    assert box.show("ActiveState")["ActiveState"] == "inactive"
    assert '"msg": "stopped"' in box.sh("journalctl -u tooljail --no-pager")


def replaced(box: Machine, old_pid: str) -> bool:
    """Whether another daemon than `old_pid` is active."""
    now = box.show("MainPID", "ActiveState")
    return now["ActiveState"] == "active" and now["MainPID"] not in ("0", old_pid)


def test_a_frozen_daemon_is_restarted_by_the_watchdog_and_its_calls_come_back_lost(
    machine: Machine,
) -> None:
    box = machine
    # A short watchdog, and SIGKILL soon after its SIGABRT (a stopped process
    # cannot act on SIGABRT), so the test takes seconds, not minutes.
    box.put(
        "/etc/systemd/system/tooljail.service.d/watchdog.conf",
        "[Service]\nWatchdogSec=4s\nTimeoutAbortSec=2s\n",
    )
    box.sh("systemctl daemon-reload && systemctl restart tooljail", timeout=180)
    try:
        before = box.show("MainPID", "NRestarts")
        time.sleep(6)  # longer than WatchdogSec: a live loop keeps it fed
        assert box.show("MainPID") == {"MainPID": before["MainPID"]}
        call_in_background(box, "/tmp/frozen.json", 60)
        box.sh(f"kill -STOP {before['MainPID']}")  # the event loop, and all else, frozen
        deadline = time.monotonic() + 90
        # A new daemon, active: systemd killed the frozen one and started another.
        while not replaced(box, before["MainPID"]):
            assert time.monotonic() < deadline, box.sh("journalctl -u tooljail --no-pager")
            time.sleep(0.5)
        assert int(box.show("NRestarts")["NRestarts"]) > int(before["NRestarts"])
        info = json.loads(box.sh(f"{TOOLJAIL} get frozen"))
        assert info["state"] == "lost", info
        assert info["result"]["effect"] == "unknown", info
        assert "watchdog" in box.sh("journalctl -u tooljail --no-pager").lower()
    finally:
        box.sh(
            "rm -f /etc/systemd/system/tooljail.service.d/watchdog.conf; systemctl daemon-reload"
        )
        box.sh("systemctl stop tooljail", timeout=120, check=False)
