"""`[journal] durability = "power"`: no call reaches its sandbox before its admission
is on stable storage, concurrent calls share the flush, and a flush that fails
stops the call (and every later one) instead of running it unrecorded.

Through a real daemon (in this process, so the test can slow down or break the
WAL's fdatasync and watch when the tool starts). The power cut itself is
tests/integration/test_journal_power_cut.py.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tooljail import Client
from tooljail.errors import CallNotFoundError, JournalUnavailableError
from tooljail.testing import wait_for
from tooljail.types import CallState, CallStatus, Effect

from ..conftest import RunningDaemon, ServedDaemon, spawn_daemon

SLOW_SYNC_S = 0.3
STARTED = "import time; print(repr(time.time()))"


class Flushes:
    """Wraps os.fdatasync: records each flush's end, optionally slow or failing."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.delay_s = 0.0
        self.fail = False
        self.stalled = threading.Event()
        self.stalled.set()
        self._real = os.fdatasync
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        if self.fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.stalled.wait(30)
        time.sleep(self.delay_s)
        self._real(fd)
        with self._lock:
            self.ends.append(time.time())


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Flushes]:
    wrapper = Flushes()
    monkeypatch.setattr(os, "fdatasync", wrapper)
    yield wrapper


def test_power_a_call_starts_only_after_its_admission_is_flushed(
    serve: Callable[..., ServedDaemon], flushes: Flushes
) -> None:
    served = serve(journal={"durability": "power"})
    flushes.delay_s = SLOW_SYNC_S
    with Client(served.target) as client:
        sent = time.time()
        result = client.call("execute_python_code", {"code": STARTED})
    assert result.ok, result
    started = float(result.data["stdout"])
    # The tool ran after a flush that ended after the call was sent: its
    # admission (committed before that flush began) was on disk first.
    assert any(sent < end <= started for end in flushes.ends), (sent, flushes.ends, started)
    assert started - sent >= SLOW_SYNC_S


def test_power_concurrent_calls_share_flushes(
    serve: Callable[..., ServedDaemon], flushes: Flushes
) -> None:
    served = serve(journal={"durability": "power"}, pool_size=4)
    flushes.delay_s = 0.1  # long enough that admissions pile up behind one flush
    before = len(flushes.ends)
    calls = 8
    with Client(served.target) as client, ThreadPoolExecutor(calls) as pool:
        results = list(
            pool.map(lambda _: client.call("execute_python_code", {"code": "pass"}), range(calls))
        )
    assert all(r.ok for r in results), results
    # Each call's three writes (admitted, running, finished) would be 24 flushes
    # with synchronous=FULL; one flush per admission batch is far fewer.
    assert len(flushes.ends) - before < calls, flushes.ends


def test_power_a_failed_flush_stops_the_call_and_the_next_ones(
    serve: Callable[..., ServedDaemon], flushes: Flushes
) -> None:
    served = serve(journal={"durability": "power"})
    flushes.fail = True
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": STARTED})
        assert result.status is CallStatus.ERROR, result
        assert result.effect is Effect.NONE
        assert result.error is not None and result.error.type == "JournalUnavailable"
        assert "stable storage" in result.error.message
        assert result.data is None or not result.data.get("stdout"), result
        # The kernel may have dropped what it could not write: no later flush
        # proves it is there, so the daemon takes no new call until a restart.
        with pytest.raises(JournalUnavailableError, match="stable storage"):
            client.call("execute_python_code", {"code": "pass"})


def test_power_a_stalled_disk_stalls_no_rpc_and_the_waiting_call_can_be_cancelled(
    serve: Callable[..., ServedDaemon], flushes: Flushes
) -> None:
    served = serve(journal={"durability": "power"})
    flushes.stalled.clear()  # the disk stops answering flushes
    try:
        with Client(served.target) as client, ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                client.call, "execute_python_code", {"code": STARTED}, call_id="stalled"
            )
            wait_for(lambda: _known(client, "stalled"), 10)
            # The flush blocks a worker thread, never the event loop.
            for _ in range(20):
                began = time.perf_counter()
                assert client.get_call("stalled").state is CallState.QUEUED
                assert client.list_tools()
                assert time.perf_counter() - began < 0.5
            assert client.cancel("stalled") is CallState.CANCELLED
            result = waiting.result(10)
        assert result.status is CallStatus.CANCELLED and result.effect is Effect.NONE, result
        assert not result.data or not result.data.get("stdout"), result  # it never ran
    finally:
        flushes.stalled.set()


def _known(client: Client, call_id: str) -> bool:
    try:
        client.get_call(call_id)
    except CallNotFoundError:
        return False
    return True


def test_crash_durability_never_flushes(
    serve: Callable[..., ServedDaemon], flushes: Flushes
) -> None:
    served = serve()  # the default: "crash", today's behaviour
    with Client(served.target) as client:
        assert client.call("execute_python_code", {"code": "pass"}).ok
    assert flushes.ends == []


def test_a_config_with_the_old_journal_keys_still_starts_and_says_so(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    config = tmp_path / "old.toml"
    config.write_text("journal_max_age_s = 86400\njournal_max_rows = 500\n")
    daemon = start_daemon("--config", str(config))
    daemon.assert_serving()
    log = daemon.log()
    assert "journal_max_age_s is deprecated: use [journal] keep_days" in log, log
    assert "journal_max_rows is deprecated: use [journal] max_rows" in log, log


def test_a_config_with_an_old_and_a_new_journal_key_differing_does_not_start(
    tmp_path: Path,
) -> None:
    config = tmp_path / "both.toml"
    config.write_text("journal_max_rows = 500\n[journal]\nmax_rows = 600\n")
    (tmp_path / "base").mkdir()
    process, _, base = spawn_daemon(tmp_path / "base", "--config", str(config))
    assert process.wait(60) == 2
    log = (base / "daemon.log").read_text()
    assert "journal_max_rows (deprecated) and [journal] max_rows are both set" in log, log


def test_a_reload_applies_the_journal_table_live(
    start_daemon: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    config = tmp_path / "live.toml"
    config.write_text('[journal]\ndurability = "crash"\n')
    daemon = start_daemon("--config", str(config))
    config.write_text('[journal]\ndurability = "power"\nkeep_days = 2\nmax_rows = 500\n')
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload: done" in daemon.log(), 30)
    log = daemon.log()
    assert '"journal.durability": ["crash", "power"]' in log, log
    assert '"journal.keep_days": [7.0, 2.0]' in log and '"journal.max_rows"' in log, log
    assert "only after a restart" not in log, log
    daemon.assert_serving()  # its calls now wait for their flush, and run
