"""Streaming output: lines arrive as they are printed, in order, then one result;
and a caller that goes away does not take the call with it."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time
import uuid

from tests.conftest import ServedDaemon, wait_finished
from tooljail import (
    AsyncClient,
    CallNotFoundError,
    CallState,
    CallStatus,
    Client,
    Effect,
    Output,
    StreamKind,
    ToolResult,
)

TEN_SLOW_LINES = (
    "import time\nfor i in range(10):\n    print(i, repr(time.time()))\n    time.sleep(0.3)\n"
)


def test_each_printed_line_arrives_before_the_next_is_printed(served: ServedDaemon) -> None:
    arrivals: list[tuple[float, str]] = []  # (client arrival time, line)
    outputs: list[Output] = []
    items: list[Output | ToolResult] = []
    with Client(served.target) as client:
        for item in client.stream("execute_python_code_stream", {"code": TEN_SLOW_LINES}):
            now = time.time()
            items.append(item)
            if isinstance(item, Output):
                outputs.append(item)
                arrivals += [(now, line) for line in item.data.splitlines()]
    # One result, and it is last.
    results = [i for i in items if isinstance(i, ToolResult)]
    assert len(results) == 1
    assert items[-1] is results[0]
    result = results[0]
    assert result.status is CallStatus.SUCCESS
    assert result.effect is Effect.APPLIED
    # Sequence numbers count the chunks from 1.
    assert [o.seq for o in outputs] == list(range(1, len(outputs) + 1))
    assert all(o.stream is StreamKind.STDOUT for o in outputs)
    # Every line came, in order; the sandbox and this test share the host's clock.
    assert [int(line.split()[0]) for _, line in arrivals] == list(range(10))
    printed = [float(line.split()[1]) for _, line in arrivals]
    for i in range(9):
        arrived = arrivals[i][0]
        assert arrived < printed[i + 1], (
            f"line {i} arrived at {arrived:.3f}, after line {i + 1} was printed at "
            f"{printed[i + 1]:.3f}: output is not streamed as it is printed"
        )
    # The result holds all the output too.
    assert result.data["stdout"].splitlines() == [line for _, line in arrivals]
    assert result.data["exit_code"] == 0


def test_stderr_chunks_are_tagged_stderr(served: ServedDaemon) -> None:
    code = (
        "import sys, time\n"
        "print('out 1', flush=True)\n"
        "time.sleep(0.1)\n"
        "print('err 1', file=sys.stderr, flush=True)\n"
        "time.sleep(0.1)\n"
        "print('out 2', flush=True)\n"
    )
    with Client(served.target) as client:
        items = list(client.stream("execute_python_code_stream", {"code": code}))
    outputs = [i for i in items if isinstance(i, Output)]
    by_stream = {
        kind: "".join(o.data for o in outputs if o.stream is kind)
        for kind in (StreamKind.STDOUT, StreamKind.STDERR)
    }
    assert by_stream == {StreamKind.STDOUT: "out 1\nout 2\n", StreamKind.STDERR: "err 1\n"}
    assert [o.seq for o in outputs] == list(range(1, len(outputs) + 1))
    result = items[-1]
    assert isinstance(result, ToolResult)
    assert result.data == {"stdout": "out 1\nout 2\n", "stderr": "err 1\n", "exit_code": 0}


async def test_the_async_client_streams_too(served: ServedDaemon) -> None:
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print('line', i)\n"
        "    time.sleep(0.2)\n"
        "print('oops', file=sys.stderr)\n"
    )
    items: list[tuple[float, Output | ToolResult]] = []
    start = time.monotonic()
    async with AsyncClient(served.target) as client:
        async for item in client.stream("execute_python_code_stream", {"code": code}):
            items.append((time.monotonic() - start, item))
    outputs = [(t, i) for t, i in items if isinstance(i, Output)]
    stdout = [(t, i) for t, i in outputs if i.stream is StreamKind.STDOUT]
    assert "".join(i.data for _, i in stdout) == "line 0\nline 1\nline 2\n"
    assert "".join(i.data for _, i in outputs if i.stream is StreamKind.STDERR) == "oops\n"
    # The first line came long before the program ended (>= 0.6 s of sleeps).
    first_line_at = stdout[0][0]
    result_at, result = items[-1]
    assert isinstance(result, ToolResult)
    assert result.ok
    assert result_at - first_line_at > 0.3
    assert [i.seq for _, i in outputs] == list(range(1, len(outputs) + 1))


def test_closing_the_stream_early_does_not_stop_the_call(served: ServedDaemon) -> None:
    call_id = "early-close-" + uuid.uuid4().hex
    with Client(served.target) as client:
        stream = client.stream(
            "execute_python_code_stream", {"code": TEN_SLOW_LINES}, call_id=call_id
        )
        first = next(stream)
        assert isinstance(first, Output)
        assert first.data.startswith("0 ")
        stream.close()
        assert client.get_call(call_id).state is CallState.RUNNING
        info = wait_finished(client, call_id)
    assert info.state is CallState.SUCCEEDED, info
    assert info.result is not None
    assert info.result.status is CallStatus.SUCCESS
    lines = info.result.data["stdout"].splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(10))


CLIENT_SCRIPT = textwrap.dedent(
    """
    import sys
    from tooljail import Client, Output

    target, call_id, code = sys.argv[1:4]
    with Client(target) as client:
        for item in client.stream("execute_python_code_stream", {"code": code}, call_id=call_id):
            if isinstance(item, Output):
                sys.stdout.write(item.data)
                sys.stdout.flush()
    """
)


def test_killing_the_client_mid_stream_leaves_the_call_running_to_its_end(
    served: ServedDaemon,
) -> None:
    call_id = "killed-client-" + uuid.uuid4().hex
    client_proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, served.target, call_id, TEN_SLOW_LINES],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert client_proc.stdout is not None
        first_line = client_proc.stdout.readline()
        assert first_line.startswith(b"0 "), (first_line, client_proc.stderr)
        client_proc.kill()
        client_proc.wait(10)
    finally:
        if client_proc.poll() is None:
            client_proc.kill()
            client_proc.wait(10)
        for pipe in (client_proc.stdout, client_proc.stderr):
            if pipe is not None:
                pipe.close()
    with Client(served.target) as client:
        assert client.get_call(call_id).state is CallState.RUNNING
        info = wait_finished(client, call_id)
    assert info.state is CallState.SUCCEEDED, info
    assert info.result is not None
    assert info.result.status is CallStatus.SUCCESS
    assert info.result.effect is Effect.APPLIED
    lines = info.result.data["stdout"].splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(10))
    served.assert_serving()


async def _until_running(client: AsyncClient, call_id: str) -> None:
    """Poll GetCall until the daemon runs `call_id` (it may not know it yet)."""
    async with asyncio.timeout(10):
        while True:
            with contextlib.suppress(CallNotFoundError):
                if (await client.get_call(call_id)).state is CallState.RUNNING:
                    return
            await asyncio.sleep(0.01)


async def test_cancelling_an_awaited_call_leaves_it_running_to_its_end(
    served: ServedDaemon,
) -> None:
    call_id = "abandoned-" + uuid.uuid4().hex
    code = "import time\ntime.sleep(1)\nprint('done')\n"
    async with AsyncClient(served.target) as client:
        task = asyncio.create_task(
            client.call("execute_python_code", {"code": code}, call_id=call_id)
        )
        await _until_running(client, call_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert (await client.get_call(call_id)).state is CallState.RUNNING
    with Client(served.target) as sync_client:
        info = wait_finished(sync_client, call_id)
    assert info.state is CallState.SUCCEEDED, info
    assert info.result is not None
    assert info.result.data["stdout"] == "done\n"
