"""Output past the per-call cap: the daemon's memory stays flat, the result keeps
the head and the tail, and says it was truncated."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

import psutil

from tests.conftest import RunningDaemon, ServedDaemon
from tooljail import CallStatus, Client, Output, StreamKind, ToolResult

MiB = 2**20
PRINT_200_MB = (
    "import sys\nchunk = 'x' * 2**20\nfor _ in range(200):\n    sys.stdout.write(chunk)\n"
)
RSS_GROWTH_LIMIT = 100 * MiB


def warmed_rss(client: Client, daemon: RunningDaemon) -> int:
    """The daemon's RSS after a call that already filled its output buffers once."""
    warm = client.call("execute_python_code", {"code": "print('w' * 3 * 2**20)"})
    assert warm.ok and warm.truncated, warm
    return int(psutil.Process(daemon.pid).memory_info().rss)


def test_printing_200_mb_keeps_the_daemon_flat_and_truncates_the_result(
    daemon: RunningDaemon,
) -> None:
    with Client(daemon.target) as client:
        before = warmed_rss(client, daemon)
        result = client.call("execute_python_code", {"code": PRINT_200_MB}, tool_timeout_s=120)
        after = int(psutil.Process(daemon.pid).memory_info().rss)
    assert result.status is CallStatus.SUCCESS, result.message
    assert result.truncated
    assert result.output_bytes >= 200 * MiB
    stdout = result.data["stdout"]
    assert len(stdout) <= 1.1 * MiB
    assert "truncated" in stdout
    assert stdout.startswith("xxxx")
    assert stdout.endswith("xxxx")
    assert after - before < RSS_GROWTH_LIMIT, f"the daemon grew by {(after - before) / MiB:.0f} MiB"
    daemon.assert_serving()


def test_a_stalled_stream_reader_of_200_mb_keeps_the_daemon_flat(daemon: RunningDaemon) -> None:
    call_id = "stalled-reader-" + uuid.uuid4().hex
    with Client(daemon.target) as client:
        before = warmed_rss(client, daemon)
        stream = client.stream(
            "execute_python_code_stream",
            {"code": PRINT_200_MB},
            tool_timeout_s=120,
            call_id=call_id,
        )
        first = next(stream)
        assert isinstance(first, Output)
        assert first.stream is StreamKind.STDOUT
        # The reader stops reading while the tool writes all 200 MB: the daemon
        # must not queue them up for it.
        deadline = time.monotonic() + 60
        while not client.get_call(call_id).state.finished:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        after = int(psutil.Process(daemon.pid).memory_info().rss)
        stream.close()
        info = client.get_call(call_id)
    assert after - before < RSS_GROWTH_LIMIT, f"the daemon grew by {(after - before) / MiB:.0f} MiB"
    assert info.result is not None
    assert info.result.status is CallStatus.SUCCESS
    assert info.result.truncated
    assert info.result.output_bytes >= 200 * MiB
    assert len(info.result.data["stdout"]) <= 1.1 * MiB
    daemon.assert_serving()


def assert_gaps_are_announced(outputs: list[Output]) -> None:
    """Chunks come in order, and every chunk a reader misses is announced by a
    notice that counts exactly the chunks missed."""
    last_seq = 0
    announced = 0
    for o in outputs:
        if o.stream is StreamKind.NOTICE:
            match = re.search(r"(\d+) output chunks dropped", o.data)
            assert match, o.data
            announced += int(match.group(1))
            continue
        assert o.seq > last_seq, f"chunk {o.seq} came after chunk {last_seq}"
        missed = o.seq - last_seq - 1
        assert missed == announced, (
            f"chunks {last_seq + 1}..{o.seq - 1} ({missed}) were skipped, "
            f"but the notices said {announced}"
        )
        last_seq, announced = o.seq, 0


def test_a_slow_reader_of_a_busy_writer_gets_every_chunk_or_a_notice(
    serve: Callable[..., ServedDaemon],
) -> None:
    # The writer may pass 1 GiB in its 1.5 s: lift the output limit, this test is
    # about readers.
    served = serve(limits={"output_limit_bytes": 0})
    code = (
        "import os, time\n"
        "chunk = b'x' * 2**16\n"
        "end = time.monotonic() + 1.5\n"
        "while time.monotonic() < end:\n"
        "    os.write(1, chunk)\n"
    )
    with Client(served.target) as client:
        for _ in range(2):
            outputs: list[Output] = []
            result: ToolResult | None = None
            for item in client.stream("execute_python_code_stream", {"code": code}):
                if isinstance(item, ToolResult):
                    result = item
                    continue
                outputs.append(item)
                if len(outputs) <= 25:
                    time.sleep(0.05)  # slower than the writer while it writes
            assert result is not None
            assert result.ok
            assert any(o.stream is StreamKind.NOTICE for o in outputs)
            assert_gaps_are_announced(outputs)


def test_head_and_tail_of_a_long_output_are_kept(served: ServedDaemon) -> None:
    code = (
        "import sys\n"
        "print('HEAD')\n"
        "for _ in range(5):\n"
        "    sys.stdout.write('y' * 2**20)\n"
        "print()\n"
        "print('TAIL')\n"
    )
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code})
    assert result.ok, result
    assert result.truncated
    stdout = result.data["stdout"]
    assert stdout.startswith("HEAD\n")
    assert stdout.endswith("\nTAIL\n")
    assert "truncated" in stdout
    assert len(stdout) < 1.1 * MiB
    assert result.output_bytes == len("HEAD\n") + 5 * MiB + len("\nTAIL\n")


def test_stderr_is_capped_too(served: ServedDaemon) -> None:
    code = "import sys\nsys.stderr.write('e' * 8 * 2**20)\nprint('fine')\n"
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code})
    assert result.ok, result
    assert result.truncated
    assert result.data["stdout"] == "fine\n"
    assert len(result.data["stderr"]) < 1.1 * MiB
    assert "truncated" in result.data["stderr"]


def test_non_ascii_output_under_the_cap_comes_back_intact(served: ServedDaemon) -> None:
    # 300 001 bytes: under the per-stream cap (512 KiB), over its head half (256 KiB),
    # and the one-byte offset puts the head/tail boundary inside an "é".
    code = "import sys\nsys.stdout.write('a' + 'é' * 150000)\n"
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code})
    assert result.ok, result
    assert not result.truncated
    assert result.output_bytes == 1 + 2 * 150000
    stdout = result.data["stdout"]
    assert "\ufffd" not in stdout
    assert stdout == "a" + "é" * 150000
