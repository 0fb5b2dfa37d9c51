"""Sessions and workspace files, on every backend: what the issue says users will try.

Each test opens its own session on the package's daemon (one per backend) and
talks to it through the SDK over real gRPC.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.conformance.conftest import Backend, assert_gone, containers_of_token
from tests.security.conftest import SecurityDaemon, live_processes_mentioning, wait_until
from tooljail import (
    CallStatus,
    Client,
    Effect,
    InvalidPathError,
    Output,
    SessionEndedError,
    SessionNotFoundError,
    WorkspaceFileNotFoundError,
)

pytestmark = pytest.mark.timeout(180)


def _stdout(result: object) -> str:
    data = getattr(result, "data", None)
    assert isinstance(data, dict), result
    return str(data["stdout"])


def test_variables_live_across_calls_and_not_across_sessions(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        with client.session() as s:
            first = s.call("execute_python_code", {"code": "x = 41\nimport math"})
            assert first.status is CallStatus.SUCCESS, first
            assert first.session_id == s.id
            second = s.call("execute_python_code", {"code": "print(x + 1, math.pi > 3)"})
            assert _stdout(second) == "42 True\n", second
            assert not second.session_reset
        with client.session() as other:
            third = other.call("execute_python_code", {"code": "print(x)"})
            assert third.status is CallStatus.ERROR
            assert "NameError" in third.data["stderr"]


def test_write_edit_run_grep_download(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        wrote = s.call(
            "write_file", {"path": "pkg/f.py", "content": "GREETING = 'hi'\nprint(GREETING)\n"}
        )
        assert wrote.status is CallStatus.SUCCESS, wrote
        edited = s.call(
            "edit_file", {"path": "pkg/f.py", "old_string": "'hi'", "new_string": "'hello'"}
        )
        assert edited.status is CallStatus.SUCCESS, edited
        ran = s.call("execute_python_code", {"code": "exec(open('pkg/f.py').read())"})
        assert _stdout(ran) == "hello\n", ran
        found = s.call("grep", {"pattern": r"GREET\w+ ="})
        assert found.status is CallStatus.SUCCESS, found
        assert "pkg/f.py" in str(found.data) and "hello" in str(found.data)
        assert s.download("pkg/f.py") == b"GREETING = 'hello'\nprint(GREETING)\n"
        # The interpreter's view and the file tools' are one workspace.
        s.call("execute_python_code", {"code": "open('made.txt', 'w').write('from code')"})
        read = s.call("read_file", {"path": "made.txt"})
        assert "from code" in str(read.data), read


def test_an_edit_that_matches_twice_says_so(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.upload("twice.txt", b"a\na\n")
        result = s.call("edit_file", {"path": "twice.txt", "old_string": "a", "new_string": "b"})
        assert result.status is CallStatus.ERROR, result
        assert "2" in result.to_model_text()
        assert s.download("twice.txt") == b"a\na\n"


def test_upload_and_download_stream_large_files(daemon: SecurityDaemon) -> None:
    blob = bytes(range(256)) * (9 * 4096 + 17)  # ~9.4 MiB: past the 8 MiB request limit
    with Client(daemon.target) as client, client.session() as s:
        s.upload("data/blob.bin", blob)
        size = s.call(
            "execute_python_code", {"code": "import os; print(os.path.getsize('data/blob.bin'))"}
        )
        assert _stdout(size) == f"{len(blob)}\n"
        assert s.download("data/blob.bin") == blob
        with pytest.raises(WorkspaceFileNotFoundError):
            s.download("data/none.bin")
        with pytest.raises(InvalidPathError):
            s.upload("../escape.txt", b"x")
        with pytest.raises(InvalidPathError):
            s.download("/etc/passwd")


def test_no_path_reaches_the_hosts_files(daemon: SecurityDaemon) -> None:
    secret = (daemon.state_dir / "journal.sqlite3").resolve()
    with Client(daemon.target) as client, client.session() as s:
        made = s.call(
            "execute_python_code",
            {
                "code": "import os\n"
                "os.symlink('/etc/shadow', 'shadow')\n"
                f"os.symlink({str(secret)!r}, 'journal')\n"
                f"os.symlink({str(secret.parent)!r}, 'state')\n"
            },
        )
        assert made.status is CallStatus.SUCCESS, made
        for path in (
            "../../etc/passwd",
            "/etc/passwd",
            "shadow",
            "journal",
            "state/journal.sqlite3",
        ):
            result = s.call("read_file", {"path": path})
            assert result.status is CallStatus.ERROR, (path, result)
            assert path in result.to_model_text(), (path, result)
            assert "root:" not in str(result.data)
            assert "SQLite" not in str(result.data)
        for path in ("shadow", "journal"):
            with pytest.raises(InvalidPathError):
                s.download(path)


def test_a_timeout_interrupts_and_keeps_the_variables(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": "x = 7"})
        started = time.monotonic()
        result = s.call("execute_python_code", {"code": "while True: pass"}, tool_timeout_s=1)
        assert time.monotonic() - started < 10
        assert result.status is CallStatus.TIMEOUT, result
        assert result.effect is Effect.UNKNOWN
        assert not result.session_reset
        assert "variables are kept" in result.message
        after = s.call("execute_python_code", {"code": "print(x)"})
        assert _stdout(after) == "7\n", after


def test_code_deaf_to_the_interrupt_is_reset_and_the_session_works_on(
    daemon: SecurityDaemon,
) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": "x = 7\nopen('kept.txt', 'w').write('kept')"})
        deaf = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
        result = s.call("execute_python_code", {"code": deaf}, tool_timeout_s=1)
        assert result.status is CallStatus.TIMEOUT, result
        assert result.session_reset
        assert "variable" in result.message and "gone" in result.message
        after = s.call("execute_python_code", {"code": "print(open('kept.txt').read()); print(x)"})
        assert after.status is CallStatus.ERROR
        assert after.data["stdout"] == "kept\n"
        assert "NameError" in after.data["stderr"]
        assert not after.session_reset
        assert s.call("execute_python_code", {"code": "print(1)"}).ok


def test_an_interpreter_that_dies_is_restarted_and_the_result_says_so(
    daemon: SecurityDaemon,
) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": "x = 1"})
        died = s.call("execute_python_code", {"code": "import os; os._exit(3)"})
        assert died.status is CallStatus.ERROR, died
        assert died.session_reset
        assert "gone" in died.message
        assert s.call("execute_python_code", {"code": "print('alive')"}).data["stdout"] == "alive\n"


def _background(token: str) -> str:
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {token!r}],"
        " start_new_session=True)\n"
        "print('started')\n"
    )


def test_processes_a_call_starts_end_with_the_call(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    with Client(daemon.target) as client, client.session() as s:
        result = s.call("execute_python_code", {"code": _background(token)})
        assert _stdout(result) == "started\n"
        # Gone when the result is heard: no wait.
        assert not live_processes_mentioning(token)
        assert s.call("execute_python_code", {"code": "print(2)"}).ok


def test_kept_processes_live_until_the_session_ends(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    with Client(daemon.target) as client:
        s = client.session(keep_processes=True)
        s.call("execute_python_code", {"code": _background(token)})
        assert wait_until(lambda: bool(live_processes_mentioning(token)), 5)
        containers = containers_of_token(backend, token)
        assert s.call("execute_python_code", {"code": "print(3)"}).ok
        assert live_processes_mentioning(token)
        s.close()
        assert_gone(backend, token, containers)


def test_calls_in_one_session_run_one_at_a_time_in_order(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": "log = []"})
        results = {}

        def run(i: int) -> None:
            code = (
                f"import time\nlog.append(('start', {i}))\ntime.sleep(0.3)\n"
                f"log.append(('end', {i}))"
            )
            results[i] = s.call("execute_python_code", {"code": code})

        threads = []
        for i in range(3):
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(30)
        assert all(r.ok for r in results.values()), results
        log = s.call("execute_python_code", {"code": "print(log)"})
        events = eval(_stdout(log))
        assert events == [(e, i) for i in range(3) for e in ("start", "end")], events


def test_streaming_in_a_session(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.call("execute_python_code", {"code": "n = 3"})
        code = "import time\nfor i in range(n):\n    print(i, flush=True)\n    time.sleep(0.2)"
        items = list(s.stream("execute_python_code_stream", {"code": code}))
        chunks = [i for i in items if isinstance(i, Output)]
        assert "".join(c.data for c in chunks) == "0\n1\n2\n"
        assert len(chunks) >= 2  # it arrived as printed, not at the end
        assert items[-1].status is CallStatus.SUCCESS  # type: ignore[union-attr]


def test_user_tools_run_in_the_session_and_see_its_workspace(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        s.upload("note.txt", b"for the tool")
        result = s.call("where", {})
        assert result.ok, result
        listing = s.call(
            "execute_python_code",
            {"code": f"import os; print(os.getcwd() == {result.data['cwd']!r})"},
        )
        assert _stdout(listing) == "True\n"


def test_an_ended_session_says_so_and_an_unknown_one_is_not_found(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        s = client.session()
        session_id = s.id
        assert session_id in [i.session_id for i in client.list_sessions()]
        s.close()
        with pytest.raises(SessionEndedError) as ended:
            client.call("execute_python_code", {"code": "print(1)"}, session_id=session_id)
        assert ended.value.reason == "closed"
        assert "create a new session" in str(ended.value).lower()
        assert session_id not in [i.session_id for i in client.list_sessions()]
        with pytest.raises(SessionNotFoundError):
            client.call("execute_python_code", {"code": "1"}, session_id="f" * 32)


def test_file_tools_outside_a_session_say_nothing_persists(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        wrote = client.call("write_file", {"path": "a.txt", "content": "x"})
        assert wrote.ok, wrote
        assert "persist" in wrote.message
        read = client.call("read_file", {"path": "a.txt"})
        assert read.status is CallStatus.ERROR


def test_the_sessions_memory_bound_holds_and_the_session_survives_it(
    daemon: SecurityDaemon,
) -> None:
    with Client(daemon.target) as client, client.session(memory_bytes=128 * 2**20) as s:
        assert s.info.memory_bytes == 128 * 2**20
        s.call("execute_python_code", {"code": "open('kept.txt', 'w').write('kept')"})
        hog = s.call("execute_python_code", {"code": "b = b'\\x01' * (400 * 2**20)"})
        assert hog.status is CallStatus.ERROR, hog
        assert hog.session_reset, hog
        assert hog.error is not None and hog.error.type in ("OutOfMemory", "MemoryError"), hog
        after = s.call("execute_python_code", {"code": "print(open('kept.txt').read())"})
        assert _stdout(after) == "kept\n", after


# A thread that outlives its call, and attacks the next one once that one runs
# (it waits for the file "go"; the next call waits for "done"): it prints, and
# forges that call's result five ways (the runner's frame writer, that call's
# own frame writer as it is then, the pipe to the supervisor with its own
# call's nonce and with none, and the sys.stdout of its own call).
_FORGER = """
import gc, json, os, sys, threading, time

# The runner's frame writer and pipe (its module ``_frames``: in a sandbox
# the runner's modules are top-level ones).
frames = sys.modules["_frames"]
try:  # its own call's nonce (its own call's code can find it)
    import _turn
    nonce = next(o for o in gc.get_objects() if isinstance(o, _turn.Turn) and o.open).nonce
except ImportError:
    nonce = "none"
old_stdout = sys.stdout

def pipe():
    return frames.get_fd()

def forge():
    while not os.path.exists("go"):
        time.sleep(0.01)
    fake = {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
    print("FORGED by the thread")
    old_stdout.write("FORGED through the old stdout\\n")
    frames.write_frame(dict(fake))
    for turn in [o for o in gc.get_objects() if isinstance(o, _turn.Turn) and o.open]:
        turn.frame_writer(frames.write_frame)(dict(fake))  # the running call's own
    for n in (nonce, None):
        for seq in range(1, 10):
            frame = dict(fake, seq=seq, **({"n": n} if n else {}))
            os.write(pipe(), ("\\n" + json.dumps(frame) + "\\n").encode())
    open("done", "w").close()

threading.Thread(target=forge, daemon=True).start()
print("first")
"""

_ATTACKED = """
import os, time
open("go", "w").close()
deadline = time.time() + 20
while not os.path.exists("done") and time.time() < deadline:
    time.sleep(0.01)
time.sleep(0.2)
print("real")
raise ValueError("the real outcome")
"""


def test_a_thread_of_an_earlier_call_cannot_speak_for_a_later_one(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        first = s.call("execute_python_code", {"code": _FORGER})
        assert first.status is CallStatus.SUCCESS, first
        assert _stdout(first) == "first\n"
        # It says what it leaves running.
        assert first.data["left_running"]["threads"] == 1, first
        assert "leaves 1 thread running" in first.message, first
        second = s.call("execute_python_code", {"code": _ATTACKED})
        # Its own outcome, and only its own output: nothing of the thread's.
        assert second.status is CallStatus.ERROR, second
        assert second.data["stdout"] == "real\n", second
        assert "ValueError: the real outcome" in second.data["stderr"], second
        assert "FORGED" not in str(second.data), second
        left = second.data["left_running"]
        assert left["earlier_threads"] == 1, second
        assert left["dropped_output_bytes"] > 0, second
        assert "started by earlier calls" in second.message, second
        third = s.call("execute_python_code", {"code": "print('third')"})
        assert third.status is CallStatus.SUCCESS, third
        assert _stdout(third) == "third\n", third


def test_what_a_call_leaves_running_is_said(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    with Client(daemon.target) as client:
        with client.session() as s:
            killed = s.call("execute_python_code", {"code": _background(token)})
            assert killed.data["left_running"]["processes"] == 1, killed
            assert not killed.data["left_running"]["processes_kept"]
            assert "1 process this call started was still running" in killed.message, killed
            assert "killed" in killed.message
            quiet = s.call("execute_python_code", {"code": "print(1)"})
            assert "left_running" not in quiet.data, quiet
            assert quiet.message == "", quiet
        s = client.session(keep_processes=True)
        kept = s.call("execute_python_code", {"code": _background(token)})
        assert kept.data["left_running"]["processes"] == 1, kept
        assert kept.data["left_running"]["processes_kept"] is True
        assert "still running (the session keeps processes)" in kept.message, kept
        containers = containers_of_token(backend, token)
        s.close()
        assert_gone(backend, token, containers)


def test_a_kept_process_prints_into_its_own_call_only(daemon: SecurityDaemon) -> None:
    chatty = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n"
        '    print("CHATTY", flush=True)\\n    time.sleep(0.01)\'])\n'
        "print('started')\n"
    )
    with Client(daemon.target) as client, client.session(keep_processes=True) as s:
        started = s.call("execute_python_code", {"code": chatty})
        assert started.status is CallStatus.SUCCESS, started
        time.sleep(0.5)  # it prints between calls: nobody's
        later = s.call("execute_python_code", {"code": "import time; time.sleep(0.5); print(2)"})
        assert _stdout(later) == "2\n", later  # nothing of the kept process's, even now
        assert later.data["left_running"]["dropped_output_bytes"] > 0, later
        assert later.data["left_running"]["processes"] == 1, later


_EVERY_FD = """
import json, os
fake = {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
lines = b"".join(
    ("\\n" + json.dumps(dict(fake, seq=seq)) + "\\n").encode() for seq in range(1, 20)
)
wrote, reached = [], []
for fd in range(3, 1024):
    try:
        os.write(fd, lines)
        wrote.append(fd)
    except OSError:
        pass
for entry in os.listdir("/proc/self/fd"):
    if int(entry) <= 2:
        continue  # its own stdout and stderr: what it writes there is its output
    try:
        fd = os.open(f"/proc/self/fd/{entry}", os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, lines)
        os.close(fd)
    except OSError:
        pass
try:  # the supervisor's descriptors: it is not dumpable
    for entry in os.listdir(f"/proc/{os.getppid()}/fd"):
        fd = os.open(f"/proc/{os.getppid()}/fd/{entry}", os.O_WRONLY | os.O_NONBLOCK)
        reached.append(entry)
        os.write(fd, lines)
except OSError:
    pass
print(len(reached))
raise ValueError("the real outcome")
"""


def test_tool_code_cannot_write_a_frame_for_any_call(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client, client.session() as s:
        first = s.call("execute_python_code", {"code": _EVERY_FD})
        assert first.status is CallStatus.ERROR, first
        assert first.data["stdout"] == "0\n", first  # nothing of the supervisor's reached
        assert "ValueError: the real outcome" in first.data["stderr"], first
        second = s.call("execute_python_code", {"code": "print('second')"})
        assert second.status is CallStatus.SUCCESS, second
        assert _stdout(second) == "second\n", second
        third = s.call("execute_python_code", {"code": "raise KeyError('third')"})
        assert third.status is CallStatus.ERROR, third


def test_a_user_tool_yields_in_a_session(daemon: SecurityDaemon) -> None:
    """Its yields go through the call's own (tagged) frame writer."""
    with Client(daemon.target) as client, client.session() as s:
        items = list(s.stream("countdown", {"n": 3, "pause": 0.05}))
        values = [i for i in items if isinstance(i, Output)]
        assert [json.loads(v.data)["i"] for v in values] == [3, 2, 1], items
        assert items[-1].status is CallStatus.SUCCESS  # type: ignore[union-attr]
