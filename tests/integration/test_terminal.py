"""A terminal in a session (issue 24, item 3), through a real daemon over gRPC.

The SDK's `session.terminal()`, the raw rpc Terminal (bad input, flow
control measured on the daemon's RSS), and `tooljail sessions shell` driven
through a real PTY on the client side (`pty.fork`), as a user types.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import Client, Terminal
from tooljail.errors import InvalidRequestError, PermissionDeniedError, SessionNotFoundError
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.calls import CallManager

pytestmark = pytest.mark.timeout(120)


def read_until(term: Terminal, pattern: bytes, timeout: float = 15.0) -> bytes:
    """What the terminal printed until `pattern` appeared (a regex), or fail."""
    seen = b""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, seen):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {pattern!r} within {timeout}s; the terminal printed {seen!r}")
        try:
            data = term.read(timeout=left)
        except TimeoutError:
            continue
        if not data:
            raise AssertionError(f"the terminal ended before {pattern!r}: {seen!r}")
        seen += data
    return seen


def test_a_shell_answers_and_its_exit_ends_the_terminal(served: ServedDaemon) -> None:
    with (
        Client(served.target) as client,
        client.session() as s,
        s.terminal(rows=30, cols=100) as term,
    ):
        assert term.process.terminal and term.process.pid > 0, term.process
        # The shell is one of the session's processes.
        listed = {p.process_id: p for p in s.processes.list()}
        assert listed[term.process.process_id].terminal, listed
        term.write(b"echo $((6*7))\n")
        read_until(term, rb"[\r\n]42\r\n")
        term.write(b"stty size\n")
        read_until(term, rb"30 100")
        term.resize(40, 120)
        term.write(b"stty size\n")
        read_until(term, rb"40 120")
        term.write(b"echo TERM=$TERM\n")
        read_until(term, rb"TERM=xterm-256color")
        term.write(b"exit 3\n")
        while term.read(timeout=15):
            pass
        assert term.exit_code == 3, term.process
        assert not term.process.running


def test_a_signal_reaches_the_foreground_job_and_the_shell_lives(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s, s.terminal() as term:
        term.write(b"sleep 100\n")
        time.sleep(0.5)
        started = time.monotonic()
        term.signal(signal.SIGINT)
        term.write(b"echo alive-$((1+1))\n")
        read_until(term, rb"alive-2", timeout=10)
        assert time.monotonic() - started < 5
        # Ctrl-C as a key does the same (the PTY's line discipline signals).
        term.write(b"sleep 100\n")
        time.sleep(0.5)
        term.write(b"\x03")
        term.write(b"echo again-$((2+2))\n")
        read_until(term, rb"again-4", timeout=10)


def test_ten_megabytes_through_the_pty_arrive_whole_and_in_order(served: ServedDaemon) -> None:
    # The markers are split in the script, so the echoed command line never holds them.
    script = (
        "head -c 7500000 /dev/urandom > big.bin\n"
        "printf '%s' '=''=B'; base64 -w 0 big.bin; printf '%s\\n' '=''=E'\n"
    )
    with Client(served.target) as client, client.session() as s:
        s.upload("run.sh", script.encode())
        with s.terminal() as term:
            term.write(b"sh run.sh\n")
            seen = read_until(term, rb"==E", timeout=90)
            sent = s.download("big.bin")
    body = seen[seen.index(b"==B") + 3 : seen.index(b"==E")]
    assert len(body) == 10_000_000, len(body)
    assert hashlib.sha256(base64.b64decode(body)).digest() == hashlib.sha256(sent).digest()


def test_another_clients_session_is_not_found(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    served = serve(auth={"tokens_file": _tokens(tmp_path)})
    a, b = Client(served.target, token="term-token-a"), Client(served.target, token="term-token-b")
    with a, b, a.session() as session, pytest.raises(SessionNotFoundError):
        b.terminal(session.id)


@pytest.mark.skipif(
    not hasattr(CallManager, "commands_allowed"),
    reason="the commands allow-list ([commands] allow) is not merged into this tree yet",
)
def test_a_terminal_is_refused_under_a_commands_allow_list(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve(commands={"allow": ["git", "echo"]})
    with Client(served.target) as client, client.session() as s:
        with pytest.raises(PermissionDeniedError, match="interactive shell cannot be checked"):
            s.terminal()
        assert not [p for p in s.processes.list() if p.terminal]


def test_bad_input_is_refused_clearly(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        stub, channel = _stub(served.target)
        with channel:
            not_open = stub.Terminal(iter([pb.TerminalInput(data=b"ls\n")]))
            with pytest.raises(grpc.RpcError) as refused:
                list(not_open)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "first message must be `open`" in refused.value.details()
            huge = pb.TerminalInput(open=pb.TerminalOpen(session_id=s.id, rows=20000, cols=80))
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Terminal(iter([huge])))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "too large" in refused.value.details()
        with pytest.raises(InvalidRequestError, match="rows"):
            client.terminal(s.id, rows=0)


def test_a_client_gone_hangs_the_shell_up(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        with s.terminal() as term:
            term.write(b"sleep 4242\n")
            time.sleep(0.5)
            assert "4242" in _sleepers(s)
        deadline = time.monotonic() + 10
        while "4242" in _sleepers(s):
            assert time.monotonic() < deadline, "the terminal's shell outlived its stream"
            time.sleep(0.2)


def test_a_client_that_stops_reading_holds_the_daemons_memory(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    """`yes` on a terminal whose client reads nothing for 3 s: the PTY blocks,
    the daemon's RSS stays within a small bound, and it answers meanwhile."""
    daemon = start_daemon()
    proc = psutil.Process(daemon.pid)
    with Client(daemon.target) as client, client.session() as s:
        stub, channel = _stub(daemon.target)
        with channel:
            stop = threading.Event()

            def inputs() -> Iterator[pb.TerminalInput]:
                yield pb.TerminalInput(open=pb.TerminalOpen(session_id=s.id, argv=["yes"]))
                stop.wait(30)

            call = stub.Terminal(inputs())
            assert next(call).WhichOneof("kind") == "opened"
            time.sleep(0.5)  # the PTY and the windows fill
            rss_before = proc.memory_info().rss
            started, slowest = time.monotonic(), 0.0
            while time.monotonic() - started < 3:
                asked = time.monotonic()
                stub.GetDaemonInfo(pb.GetDaemonInfoRequest(), timeout=5)
                slowest = max(slowest, time.monotonic() - asked)
                time.sleep(0.2)
            grown = proc.memory_info().rss - rss_before
            print(
                f"daemon RSS growth while a terminal client reads nothing: {grown / 2**20:.1f} MiB"
            )
            assert grown < 16 * 2**20, f"the daemon grew by {grown / 2**20:.1f} MiB"
            assert slowest < 0.5, f"GetDaemonInfo took {slowest:.2f}s"
            # Reading again: the shell was blocked, not lost.
            assert next(call).WhichOneof("kind") == "data"
            stop.set()
            call.cancel()
        daemon.assert_serving()


def test_the_cli_shell_behaves_as_docker_exec_it(daemon: RunningDaemon) -> None:
    """`tooljail sessions shell ID` under a real PTY: 42, the window size,
    Ctrl-C to `sleep 100`, `exit 7` ends it with 7 and the mode comes back."""
    with Client(daemon.target) as client, client.session() as s:
        pid, fd = pty.fork()
        if pid == 0:  # the child: a shell that runs the command, then shows the tty's mode
            command = (
                f"{sys.executable} -m tooljaild sessions shell --target {daemon.target} {s.id}; "
                "echo EXIT=$?; stty -a; echo 'DO''NE'"
            )
            os.execvpe("sh", ["sh", "-c", command], {**os.environ, "PYTHONUNBUFFERED": "1"})
        out = _PtyReader(fd)
        status = None
        try:
            _set_window(fd, 30, 100)
            out.expect(rb"\$ ")  # the session's shell prompts
            out.send(b"echo $((6*7))\r")
            out.expect(rb"[\r\n]42\r\n")
            _set_window(fd, 33, 111)
            os.kill(pid, signal.SIGWINCH)
            time.sleep(0.3)
            out.send(b"stty size\r")
            out.expect(rb"33 111")
            out.send(b"sleep 100\r")
            time.sleep(0.7)
            started = time.monotonic()
            out.send(b"\x03")
            out.send(b"echo still-$((3+4))\r")
            out.expect(rb"still-7")
            assert time.monotonic() - started < 5
            out.send(b"exit 7\r")
            out.expect(rb"EXIT=7")
            shown = out.expect(rb"DONE")  # stty -a's output, after the command's end
            assert re.search(rb"[^-]icanon", shown) and re.search(rb"[^-]echo ", shown), shown
            status = os.waitpid(pid, 0)[1]
        finally:
            if status is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(fd)
        assert os.waitstatus_to_exitcode(status) == 0


class _PtyReader:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = b""

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, pattern: bytes, timeout: float = 20.0) -> bytes:
        deadline = time.monotonic() + timeout
        start = len(self.seen)
        while not (match := re.search(pattern, self.seen[start:])):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} within {timeout}s: {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                assert data, f"the PTY ended before {pattern!r}: {self.seen[-2000:]!r}"
                self.seen += data
        return self.seen[start : start + match.end()]


def _set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _sleepers(session: object) -> str:
    code = (
        "import os\n"
        "found = []\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try: line = open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "        except OSError: continue\n"
        "        found.append(line.replace(b'\\0', b' ').decode())\n"
        "print([c for c in found if c.startswith('sleep')])\n"
    )
    result = session.call("execute_python_code", {"code": code})  # type: ignore[attr-defined]
    assert result.ok, result
    return str(result.data["stdout"])


def _stub(target: str) -> tuple[tooljail_pb2_grpc.ToolRunnerStub, grpc.Channel]:
    channel = grpc.insecure_channel(target)
    return tooljail_pb2_grpc.ToolRunnerStub(channel), channel  # type: ignore[no-untyped-call]


def _tokens(directory: Path) -> Path:
    path = directory / "tokens.toml"
    lines = []
    for name in ("a", "b"):
        digest = hashlib.sha256(f"term-token-{name}".encode()).hexdigest()
        lines.append(f'[identities.{name}]\ntoken_sha256 = "{digest}"\n')
    path.write_text("\n".join(lines))
    path.chmod(0o600)
    return path


def test_a_terminal_in_use_keeps_its_session_from_idling_out(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        s = client.session(idle_ttl_s=1)
        with s.terminal() as term:
            for i in range(6):  # 3 s of typing, three times the idle TTL
                term.write(f"echo tick-{i}\n".encode())
                read_until(term, f"tick-{i}\r\n".encode())
                time.sleep(0.5)
        assert s.call("execute_python_code", {"code": "print(1)"}).ok
        s.close()
