"""The built-in Python tools, as a model's code meets them: results, crashes,
a scrubbed environment, a private working directory, rlimits and files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import CallStatus, Client, Effect, InvalidArgumentsError, ToolResult
from tooljail.testing import wait_for

RUNNER_FILES = ("_runner.py", "_kinds.py", "_frames.py")
"""The runner's files a call's code runs under: no traceback shows them."""


def run_code(
    daemon: ServedDaemon | RunningDaemon, code: str, timeout: float | None = None
) -> ToolResult:
    with Client(daemon.target) as client:
        return client.call("execute_python_code", {"code": code}, tool_timeout_s=timeout)


# ------------------------------------------------------------------ results


def test_stdout_stderr_and_exit_code_come_back_in_data(served: ServedDaemon) -> None:
    result = run_code(
        served,
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nprint(sum(range(10)))\n",
    )
    assert result.status is CallStatus.SUCCESS
    assert result.effect is Effect.APPLIED
    assert result.error is None
    assert result.data == {"stdout": "to out\n45\n", "stderr": "to err\n", "exit_code": 0}
    assert result.output_bytes == len("to out\n45\n") + len("to err\n")
    assert not result.truncated


def test_an_exception_is_an_error_result_with_type_message_and_traceback(
    served: ServedDaemon,
) -> None:
    code = "print('before')\ndef f(x):\n    raise ValueError(f'bad value {x}')\nf(7)\n"
    result = run_code(served, code)
    assert result.status is CallStatus.ERROR
    assert result.effect is Effect.APPLIED
    assert result.error is not None
    assert result.error.type == "ValueError"
    assert result.error.message == "bad value 7"
    assert "ValueError: bad value 7" in result.message
    # The traceback points at the raising line (3) and the calling line (4).
    assert "line 3, in f" in result.error.traceback
    assert "line 4" in result.error.traceback
    assert result.data["exit_code"] == 1
    assert result.data["stdout"] == "before\n"
    # Like `python -c`, the traceback is on stderr too.
    assert "ValueError: bad value 7" in result.data["stderr"]
    assert "line 3, in f" in result.data["stderr"]


def test_a_syntax_error_reports_the_users_line_not_the_runner(served: ServedDaemon) -> None:
    result = run_code(served, "x = 1\ny = (\n")
    assert result.status is CallStatus.ERROR
    assert result.error is not None
    assert result.error.type == "SyntaxError"
    assert "line 2" in result.error.traceback
    assert result.data["exit_code"] == 1
    # What `python -c` prints: nothing of the machinery that ran the code.
    for own in RUNNER_FILES:
        assert own not in result.error.traceback
        assert own not in result.data["stderr"]


def test_a_sessions_traceback_shows_the_users_code_only(served: ServedDaemon) -> None:
    code = "def f():\n    raise ValueError('in a session')\nf()\n"
    with Client(served.target) as client, client.session() as session:
        result = session.call("execute_python_code", {"code": code})
    assert result.status is CallStatus.ERROR
    assert result.error is not None
    assert 'File "<code>", line 2, in f' in result.error.traceback
    for own in (*RUNNER_FILES, "_session.py", "_interpreter.py"):
        assert own not in result.error.traceback


def test_code_of_several_megabytes_runs_whole(served: ServedDaemon) -> None:
    """Model-written code can be long (data pasted into it): 6 MB of source, far
    more than a pipe holds, reaches the sandbox whole."""
    blob = "x" * (6 * 1024 * 1024)
    result = run_code(served, f"data = {blob!r}\nprint(len(data), data[-3:])\n", timeout=60)
    assert result.ok, result
    assert result.data["stdout"] == f"{len(blob)} xxx\n"


@pytest.mark.parametrize(
    ("code", "status", "exit_code", "error_type", "named"),
    [
        pytest.param("import sys\nsys.exit(3)", "error", 3, "ExitCode", "3", id="sys.exit(3)"),
        pytest.param("import sys\nsys.exit(0)", "success", 0, None, None, id="sys.exit(0)"),
        pytest.param("import os\nos._exit(4)", "error", 4, "ExitCode", "4", id="os._exit(4)"),
        pytest.param(
            "import ctypes\nctypes.string_at(0)", "error", -11, "Signal", "SIGSEGV", id="segfault"
        ),
        pytest.param(
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
            "error",
            -9,
            "Signal",
            "SIGKILL",
            id="SIGKILL",
        ),
    ],
)
def test_exits_and_crashes_are_results_and_the_daemon_survives(
    served: ServedDaemon,
    code: str,
    status: str,
    exit_code: int,
    error_type: str | None,
    named: str | None,
) -> None:
    result = run_code(served, "print('started')\n" + code + "\nprint('not reached')\n")
    assert result.status == status, result
    assert result.effect is Effect.APPLIED  # it ended by itself: whatever it did is done
    assert result.data["stdout"] == "started\n"
    assert result.data["exit_code"] == exit_code
    if error_type is None:
        assert result.error is None
    else:
        assert result.error is not None
        assert result.error.type == error_type
        assert named is not None
        assert named in result.message, result.message
    served.assert_serving()


# ------------------------------------------------------------------ environment


def test_tool_code_does_not_see_the_daemons_environment(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(env={"TOOLJAIL_TEST_CANARY": "secret-123"})
    # The secret did reach the daemon: the test would catch a leak.
    assert b"TOOLJAIL_TEST_CANARY=secret-123" in Path(f"/proc/{daemon.pid}/environ").read_bytes()
    result = run_code(daemon, "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    assert result.ok, result
    env = json.loads(result.data["stdout"])
    assert "TOOLJAIL_TEST_CANARY" not in env
    assert not any("secret-123" in v for v in env.values())
    assert not any(k.startswith("TOOLJAIL_") for k in env)
    assert env["PATH"]  # a usable, minimal environment all the same


def test_tool_code_cannot_read_the_daemons_environment_through_proc(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(env={"TOOLJAIL_TEST_CANARY": "secret-123"})
    code = (
        "import os\n"
        "found = False\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        found |= b'secret-123' in open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "print(found)\n"
    )
    result = run_code(daemon, code)
    assert result.ok, result
    assert result.data["stdout"] == "False\n"


@pytest.mark.parametrize("isolation", ["best-effort", "none"])
def test_each_call_gets_a_fresh_private_working_directory(
    serve: Callable[..., ServedDaemon], isolation: str
) -> None:
    served = serve(isolation=isolation)
    first = run_code(
        served,
        "import os, stat\nopen('note.txt', 'w').write('left behind')\n"
        "print(os.getcwd())\nprint(oct(stat.S_IMODE(os.stat('.').st_mode)))\n",
    )
    assert first.ok, first
    cwd1, mode = first.data["stdout"].split()
    second = run_code(
        served, "import os\nprint(os.getcwd())\nprint(os.path.exists('note.txt'), os.listdir('.'))"
    )
    assert second.ok, second
    cwd2, rest = second.data["stdout"].split("\n", 1)
    assert rest.strip() == "False []"
    if isolation == "none":
        # A private host directory per call, removed once its call is over.
        assert mode == "0o700"
        assert cwd2 != cwd1
        wait_for(lambda: not Path(cwd1).exists(), 5, what="the first call's directory to go")
    else:
        # Under namespaces: a fresh tmpfs at /workspace, never on the host.
        assert cwd1 == cwd2 == "/workspace"


# ------------------------------------------------------------------ rlimits


def test_no_core_dumps_and_a_bounded_number_of_open_files(served: ServedDaemon) -> None:
    code = (
        "import resource\n"
        "print(resource.getrlimit(resource.RLIMIT_CORE))\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "files = []\n"
        "try:\n"
        "    for _ in range(300):\n"
        "        files.append(open('/dev/null'))\n"
        "    print('opened', len(files))\n"
        "except OSError as e:\n"
        "    print('failed after', len(files), e.strerror)\n"
    )
    result = run_code(served, code)
    assert result.ok, result
    core, nofile, outcome = result.data["stdout"].splitlines()
    assert core == "(0, 0)"
    assert nofile == "256"
    assert outcome.startswith("failed after ")
    assert outcome.endswith("Too many open files")
    assert int(outcome.split()[2]) < 256
    # Not caught: the tool's error, the daemon is fine.
    uncaught = run_code(served, "fs = [open('/dev/null') for _ in range(300)]")
    assert uncaught.status is CallStatus.ERROR
    assert uncaught.error is not None
    assert uncaught.error.type == "OSError"
    assert "Too many open files" in uncaught.error.message
    served.assert_serving()


def test_a_busy_loop_is_stopped_at_the_cpu_limit(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(limits={"cpu_s": 1})
    start = time.monotonic()
    result = run_code(served, "print('spinning', flush=True)\nwhile True:\n    pass\n", timeout=20)
    elapsed = time.monotonic() - start
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None
    assert result.error.type == "CpuLimit"
    assert "CPU" in result.message
    assert result.data["stdout"] == "spinning\n"
    # 1 CPU second, far from the 20 s wall timeout.
    assert elapsed < 8, elapsed
    served.assert_serving()


# ------------------------------------------------------------------ execute_python_file


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    (files / "script.py").write_text("import sys\nprint(sys.argv[1:])\nprint(__name__)\n")
    return files


def test_execute_python_file_runs_a_script_with_arguments(
    serve: Callable[..., ServedDaemon], files_dir: Path
) -> None:
    served = serve(files_dirs=[files_dir])
    with Client(served.target) as client:
        result = client.call("execute_python_file", {"path": "script.py", "args": ["a", "b"]})
    assert result.status is CallStatus.SUCCESS, result
    assert result.effect is Effect.APPLIED
    assert result.data == {"stdout": "['a', 'b']\n__main__\n", "stderr": "", "exit_code": 0}


def test_execute_python_file_refuses_paths_outside_the_files_dir(
    serve: Callable[..., ServedDaemon], files_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    outside = tmp_path / "outside.py"
    outside.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (files_dir / "link.py").symlink_to(outside)
    served = serve(files_dirs=[files_dir])
    with Client(served.target) as client:
        for path in ("../etc/passwd", "../outside.py", str(outside), "/etc/passwd", "link.py"):
            with pytest.raises(InvalidArgumentsError) as info:
                client.call("execute_python_file", {"path": path})
            assert path in str(info.value)
            assert info.value.parameter == "path"
    # Refused before any sandbox: a real call after the refusals is answered, and
    # nothing ran the file meanwhile.
    served.assert_serving()
    assert not marker.exists()


def test_execute_python_file_is_refused_without_a_files_dir(served: ServedDaemon) -> None:
    with Client(served.target) as client, pytest.raises(InvalidArgumentsError) as info:
        client.call("execute_python_file", {"path": "script.py"})
    assert "not enabled" in str(info.value)
    assert "--files-dir" in str(info.value)


def test_execute_python_file_through_the_cli(
    serve: Callable[..., ServedDaemon], files_dir: Path
) -> None:
    served = serve(files_dirs=[files_dir])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooljaild",
            "call",
            "--target",
            served.target,
            "execute_python_file",
            json.dumps({"path": "script.py", "args": ["x"]}),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "['x']\n__main__\n"
    assert "[success]" in proc.stderr
