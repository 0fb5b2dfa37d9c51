"""The `tooljail` command against a real daemon: call, get, cancel, doctor, demo.

Exit codes: 0 success; 1 the tool failed (error, timeout, cancelled); 2 bad usage
or a refused request; 3 no daemon answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import RunningDaemon
from tooljail import CallState, CallStatus, Client, Effect, ToolResult
from tooljail.testing import wait_for


def _cli(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_call_streams_stdout_and_exits_0(daemon: RunningDaemon) -> None:
    proc = _cli("call", "--target", daemon.target, "execute_python_code", '{"code": "print(1)"}')
    assert proc.returncode == 0, proc
    assert proc.stdout == "1\n"
    assert "[success]" in proc.stderr


def test_call_stderr_of_the_code_goes_to_stderr(daemon: RunningDaemon) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)"
    proc = _cli(
        "call", "--target", daemon.target, "execute_python_code", json.dumps({"code": code})
    )
    assert proc.returncode == 0, proc
    assert proc.stdout == "out\n"
    assert "err\n" in proc.stderr


def test_call_of_code_that_raises_exits_1_with_the_error(daemon: RunningDaemon) -> None:
    code = "print('before')\n1 / 0"
    proc = _cli(
        "call", "--target", daemon.target, "execute_python_code", json.dumps({"code": code})
    )
    assert proc.returncode == 1, proc
    assert proc.stdout == "before\n"
    assert "ZeroDivisionError" in proc.stderr
    assert "division by zero" in proc.stderr
    assert "[error]" in proc.stderr


def test_call_that_times_out_exits_1_and_warns_it_may_still_take_effect(
    daemon: RunningDaemon,
) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)"
    started = time.monotonic()
    proc = _cli(
        "call",
        "--target",
        daemon.target,
        "--timeout",
        "1",
        "execute_python_code",
        json.dumps({"code": code}),
    )
    assert time.monotonic() - started < 20
    assert proc.returncode == 1, proc
    assert "[timeout]" in proc.stderr
    assert "may still take effect" in proc.stderr
    assert proc.stdout == "started\n"
    daemon.assert_serving()


def test_call_reads_arguments_from_stdin(daemon: RunningDaemon) -> None:
    code = "print('from stdin', 'quotes \\' and \"')"
    proc = _cli(
        "call",
        "--target",
        daemon.target,
        "execute_python_code",
        "-",
        stdin=json.dumps({"code": code}),
    )
    assert proc.returncode == 0, proc
    assert proc.stdout == "from stdin quotes ' and \"\n"


def test_call_json_prints_the_result(daemon: RunningDaemon) -> None:
    proc = _cli(
        "call",
        "--target",
        daemon.target,
        "--json",
        "--call-id",
        "cli-json-1",
        "execute_python_code",
        '{"code": "x = 6 * 7"}',
    )
    assert proc.returncode == 0, proc
    result = ToolResult.model_validate_json(proc.stdout)
    assert result.call_id == "cli-json-1"
    assert result.status is CallStatus.SUCCESS
    assert result.effect is Effect.APPLIED
    assert result.data == {"stdout": "", "stderr": "", "exit_code": 0}
    assert result.tool == "execute_python_code"


def test_get_shows_a_finished_call(daemon: RunningDaemon) -> None:
    made = _cli(
        "call",
        "--target",
        daemon.target,
        "--call-id",
        "cli-get-1",
        "execute_python_code",
        '{"code": "print(5)"}',
    )
    assert made.returncode == 0, made
    proc = _cli("get", "--target", daemon.target, "cli-get-1")
    assert proc.returncode == 0, proc
    info = json.loads(proc.stdout)
    assert info["call_id"] == "cli-get-1"
    assert info["tool"] == "execute_python_code"
    assert info["state"] == "succeeded"
    assert info["result"]["status"] == "success"
    assert info["result"]["data"]["stdout"] == "5\n"


def test_get_of_an_unknown_call_exits_2(daemon: RunningDaemon) -> None:
    proc = _cli("get", "--target", daemon.target, "never-made")
    assert proc.returncode == 2, proc
    assert "never-made" in proc.stderr


def test_cancel_stops_a_running_call(daemon: RunningDaemon) -> None:
    outcome: list[ToolResult] = []
    code = "import time\nprint('go', flush=True)\ntime.sleep(60)"

    def run() -> None:
        with Client(daemon.target) as client:
            outcome.append(
                client.call("execute_python_code", {"code": code}, call_id="cli-cancel-1")
            )

    thread = threading.Thread(target=run)
    thread.start()
    try:
        with Client(daemon.target) as client:

            def running() -> bool:
                try:
                    return client.get_call("cli-cancel-1").state is CallState.RUNNING
                except LookupError:  # not admitted yet
                    return False

            wait_for(running, 10, interval=0.02, what="the call to start")
        proc = _cli("cancel", "--target", daemon.target, "cli-cancel-1")
    finally:
        thread.join(20)
    assert not thread.is_alive()
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == "cancelled"
    assert len(outcome) == 1
    result = outcome[0]
    assert result.status is CallStatus.CANCELLED
    assert result.effect is Effect.UNKNOWN
    assert result.duration_s < 15

    again = _cli("get", "--target", daemon.target, "cli-cancel-1")
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["state"] == "cancelled"
    # Cancelling a finished call keeps its state.
    twice = _cli("cancel", "--target", daemon.target, "cli-cancel-1")
    assert twice.returncode == 0, twice
    assert twice.stdout.strip() == "cancelled"
    daemon.assert_serving()


def test_doctor_prints_a_table(daemon: RunningDaemon) -> None:
    proc = _cli("doctor")
    assert proc.returncode == 0, proc
    assert "cgroup" in proc.stdout
    assert "sandbox python" in proc.stdout

    as_json = _cli("doctor", "--json")
    assert as_json.returncode == 0, as_json
    checks = json.loads(as_json.stdout)
    assert any(c["name"].startswith("cgroup") for c in checks)
    assert all(c["status"] in ("active", "missing", "n/a") for c in checks)


def test_demo_starts_its_own_daemon_and_prints_42() -> None:
    proc = _cli("demo", timeout=90)
    assert proc.returncode == 0, proc
    assert "42" in proc.stdout
    assert "[success]" in proc.stdout


def test_no_command_is_a_usage_error() -> None:
    proc = _cli()
    assert proc.returncode == 2
    assert "usage" in proc.stderr.lower()


def test_serve_refuses_plaintext_tcp_beyond_loopback(tmp_path: Path) -> None:
    proc = _cli("serve", "--listen", "0.0.0.0:0", "--state-dir", str(tmp_path), timeout=30)
    assert proc.returncode == 2
    assert "refusing to serve plaintext TCP on 0.0.0.0:0" in proc.stderr
    assert "allow_insecure_tcp" in proc.stderr


def test_serve_refuses_an_unknown_key_in_a_nested_table_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[limits]\nmemroy_bytes = 1\n")
    proc = _cli("serve", "--config", str(config), "--state-dir", str(tmp_path), timeout=30)
    assert proc.returncode == 2, proc
    assert "limits.memroy_bytes" in proc.stderr
    assert "Extra inputs are not permitted" in proc.stderr
