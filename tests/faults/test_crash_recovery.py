"""The daemon killed with SIGKILL mid-work, then started again on the same state
directory: every call gets an honest answer, none runs twice, nothing is left."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import spawn_daemon, wait_serving
from tooljail import CallState, CallStatus, Client, Effect, ToolResult

CALLS = 20


def _start(base: Path, target: str) -> subprocess.Popen[bytes]:
    # No namespaces: the calls append to a file in a host directory we can read.
    process, _, _ = spawn_daemon(
        base, listen=target, env={"TOOLJAIL_ISOLATION": "none"}, pool_size=4
    )
    wait_serving(target, process, base / "daemon.log")
    return process


def _left_running(token: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(token in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def test_sigkill_during_20_calls_then_restart_every_call_has_an_honest_answer(
    tmp_path_factory: pytest.TempPathFactory, host_dir: Path
) -> None:
    base = tmp_path_factory.mktemp("crash")
    target = f"unix://{base}/tooljail.sock"
    token = "crash-" + uuid.uuid4().hex
    ledger = host_dir / "ledger"
    # Each call writes its id to the ledger when it starts, sleeps, then again at
    # its end; a sleeping child carries the token so leftovers can be found.
    code = (
        "import os, subprocess, sys, time\n"
        f"open({str(ledger)!r}, 'a').write('start ' + CALL + '\\n')\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 60', {token!r}])\n"
        "time.sleep(SLEEP)\n"
        f"open({str(ledger)!r}, 'a').write('end ' + CALL + '\\n')\n"
    )
    ids = [f"c{i}-{uuid.uuid4().hex[:8]}" for i in range(CALLS)]
    process = _start(base, target)
    results: dict[str, ToolResult | BaseException] = {}

    def call(call_id: str, sleep: float) -> None:
        body = code.replace("CALL", repr(call_id)).replace("SLEEP", str(sleep))
        try:
            with Client(target, retries=0) as client:
                results[call_id] = client.call(
                    "execute_python_code", {"code": body}, call_id=call_id, tool_timeout_s=60
                )
        except BaseException as exc:  # the daemon dies under most of them
            results[call_id] = exc

    # Five quick calls finish before the crash; fifteen are still running.
    threads = [threading.Thread(target=call, args=(i, 0.0)) for i in ids[:5]]
    threads += [threading.Thread(target=call, args=(i, 30.0)) for i in ids[5:]]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        if sum(line.startswith("start") for line in lines) == CALLS:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    for t in threads:
        t.join(30)

    process = _start(base, target)
    try:
        # Nothing of the dead daemon runs on.
        deadline = time.monotonic() + 10
        while _left_running(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _left_running(token) == []
        with Client(target) as client:
            infos = {call_id: client.get_call(call_id) for call_id in ids}
            for call_id in ids[:5]:
                assert infos[call_id].state is CallState.SUCCEEDED, str(infos[call_id].result.data)
            for call_id in ids[5:]:
                info = infos[call_id]
                assert info.state is CallState.LOST, info
                assert info.result is not None
                assert info.result.status is CallStatus.LOST
                assert info.result.effect is Effect.UNKNOWN
                assert "may or may not have taken effect" in info.result.message
            # Asking again with the same id and arguments answers from the record:
            # the call does not run a second time.
            body = code.replace("CALL", repr(ids[7])).replace("SLEEP", "30.0")
            again = client.call("execute_python_code", {"code": body}, call_id=ids[7])
            assert again.status is CallStatus.LOST
        starts = [line for line in ledger.read_text().splitlines() if line.startswith("start")]
        assert sorted(starts) == sorted(f"start {i}" for i in ids)  # each ran exactly once
    finally:
        process.terminate()
        process.wait(30)
