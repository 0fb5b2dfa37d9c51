"""Helpers for the security suite: one daemon per module with a canary secret in
its environment, and short ways to run model-written attack code through it.

Attack code reports what it managed to do on lines `REPORT {json}`; `report()`
reads the last one. Tests then check from the host side that the effect did not
happen (no file outside, no connection accepted, no process left, ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import RunningDaemon, spawn_daemon, wait_serving
from tooljail import Client, Output, ToolResult

MiB = 2**20
GiB = 2**30

# The host's pid namespace, as the test sees it: attack code compares its own to
# it before doing anything that would hurt the host if it were not contained.
HOST_PID_NS = os.readlink("/proc/self/ns/pid")


@dataclass
class SecurityDaemon(RunningDaemon):
    """A running daemon whose environment holds `canary`."""

    canary: str = ""
    env: dict[str, str] = field(default_factory=dict)


def launch_daemon(
    base: Path, env: dict[str, str] | None = None, pool_size: int = 2, *args: str
) -> SecurityDaemon:
    """Start `tooljail serve` exactly as tests/conftest.py's start_daemon does,
    with a fresh canary secret in its environment."""
    canary = "canary-" + uuid.uuid4().hex
    extra = {"TOOLJAIL_TEST_CANARY": canary, **(env or {})}
    process, target, base = spawn_daemon(base, *args, env=extra, pool_size=pool_size)
    log_path = base / "daemon.log"
    daemon = SecurityDaemon(process, target, base / "state", log_path, list(args), canary, extra)
    try:
        wait_serving(target, process, log_path)
    except BaseException:
        stop_daemon(daemon)
        raise
    # The secret did reach the daemon: a leak would be caught.
    assert canary.encode() in Path(f"/proc/{process.pid}/environ").read_bytes()
    return daemon


def stop_daemon(daemon: RunningDaemon) -> None:
    if daemon.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGCONT)  # in case an attack left it stopped
        daemon.stop(signal.SIGTERM, timeout=60)


@pytest.fixture(scope="module")
def daemon_env() -> dict[str, str]:
    """Extra environment of the module's daemon; a module may override this fixture."""
    return {}


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, daemon_env: dict[str, str]
) -> Iterator[SecurityDaemon]:
    """One daemon for the whole module (overrides the per-test one of tests/conftest.py)."""
    running = launch_daemon(tmp_path_factory.mktemp("secdaemon"), daemon_env)
    yield running
    stop_daemon(running)


@pytest.fixture
def fresh_daemon(
    tmp_path_factory: pytest.TempPathFactory, daemon_env: dict[str, str]
) -> Iterator[SecurityDaemon]:
    """A daemon of the test's own, for attacks aimed at the daemon itself."""
    running = launch_daemon(tmp_path_factory.mktemp("secdaemon"), daemon_env)
    yield running
    stop_daemon(running)


@pytest.fixture
def token() -> str:
    """A unique word to find the attack's processes and files by."""
    return "tjsec" + uuid.uuid4().hex[:16]


# ------------------------------------------------------------------ running code


def run_code(daemon: RunningDaemon, code: str, timeout: float | None = None) -> ToolResult:
    """Run `code` with execute_python_code and return its result."""
    with Client(daemon.target) as client:
        return client.call("execute_python_code", {"code": code}, tool_timeout_s=timeout)


def report(result: ToolResult) -> dict[str, Any]:
    """The attack's own account: the last `REPORT {json}` line of its stdout."""
    stdout = result.data.get("stdout", "") if isinstance(result.data, dict) else ""
    lines = [line for line in stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, f"the attack code reported nothing: {result!r}"
    return dict(json.loads(lines[-1][len("REPORT ") :]))


def output_of(result: ToolResult) -> str:
    if not isinstance(result.data, dict):
        return str(result.data)
    return str(result.data.get("stdout", "")) + str(result.data.get("stderr", ""))


class BackgroundCall:
    """A call streamed in a thread, so a test can act while it runs."""

    def __init__(self, daemon: RunningDaemon, code: str, timeout: float | None = None) -> None:
        self.call_id = "sec-" + uuid.uuid4().hex
        self.stdout = ""
        self.result: ToolResult | None = None
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(daemon, code, timeout), daemon=True)
        self._thread.start()

    def _run(self, daemon: RunningDaemon, code: str, timeout: float | None) -> None:
        try:
            with Client(daemon.target) as client:
                for item in client.stream(
                    "execute_python_code",
                    {"code": code},
                    tool_timeout_s=timeout,
                    call_id=self.call_id,
                ):
                    with self._changed:
                        if isinstance(item, Output):
                            if item.stream.value == "stdout":
                                self.stdout += item.data
                        else:
                            self.result = item
                        self._changed.notify_all()
        except BaseException as e:
            with self._changed:
                self.error = e
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        """Wait until stdout contains `text`; return stdout so far."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while text not in self.stdout:
                if self.result is not None or self.error is not None:
                    raise AssertionError(
                        f"call ended before printing {text!r}: {self.result!r} {self.error!r}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {text!r} after {timeout}s; stdout: {self.stdout!r}")
                self._changed.wait(left)
            return self.stdout

    def join(self, timeout: float = 60.0) -> ToolResult:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"call {self.call_id} still running after {timeout}s"
        assert self.error is None, f"the call failed: {self.error!r}"
        assert self.result is not None
        return self.result


# ------------------------------------------------------------------ host-side checks


def process_mentions(proc: psutil.Process, text: str) -> bool:
    """The process's command line or environment contains `text`."""
    try:
        if text in " ".join(proc.cmdline()):
            return True
        return any(text in k or text in v for k, v in proc.environ().items())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


def live_processes_mentioning(text: str) -> list[psutil.Process]:
    """Running (not zombie) host processes whose cmdline or environment holds `text`."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if process_mentions(proc, text):
            found.append(proc)
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def assert_nothing_left(text: str, timeout: float = 5.0) -> None:
    """No host process mentioning `text` runs (waiting up to `timeout` for teardown)."""
    wait_until(lambda: not live_processes_mentioning(text), timeout, 0.2)
    left = live_processes_mentioning(text)
    described = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            described.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
    for p in left:  # do not let them disturb the rest of the suite
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not left, f"processes outlived their call: {described}"


def host_process_count() -> int:
    return len(psutil.pids())


def host_thread_count() -> int:
    total = 0
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            total += proc.num_threads()
    return total


def find_on_host(root: Path, name: str) -> list[Path]:
    """Files called `name` anywhere under `root` (e.g. a daemon's state dir)."""
    found: list[Path] = []
    for dirpath, _dirs, files in os.walk(root):
        if name in files:
            found.append(Path(dirpath) / name)
    return found
