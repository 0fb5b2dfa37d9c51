"""Results, streaming and bad input: the same answers whichever backend runs the tool."""

from __future__ import annotations

import itertools
import json

import grpc
import pytest

from tests.conformance.conftest import Backend, stream_with_times
from tests.security.conftest import SecurityDaemon, run_code
from tooljail import (
    CallStatus,
    Client,
    Effect,
    InvalidArgumentsError,
    StreamKind,
    ToolNotFoundError,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

pytestmark = pytest.mark.timeout(120)


def test_stdout_stderr_and_exit_code(daemon: SecurityDaemon) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"
    result = run_code(daemon, code)
    assert result.status is CallStatus.ERROR, result
    assert result.effect is Effect.APPLIED
    assert result.data == {"stdout": "out\n", "stderr": "err\n", "exit_code": 3}
    ok = run_code(daemon, "print(6 * 7)")
    assert ok.ok and ok.data == {"stdout": "42\n", "stderr": "", "exit_code": 0}


def test_an_exception_in_code_has_its_traceback_on_stderr(daemon: SecurityDaemon) -> None:
    result = run_code(daemon, "def f():\n    raise KeyError('nope')\nf()")
    assert result.status is CallStatus.ERROR, result
    assert result.data["exit_code"] == 1
    stderr = result.data["stderr"]
    assert "Traceback (most recent call last)" in stderr
    assert "in f" in stderr and "KeyError: 'nope'" in stderr


def test_a_user_tool_returns_a_value_and_raises_with_a_traceback(daemon: SecurityDaemon) -> None:
    with Client(daemon.target) as client:
        value = client.call("double", {"x": 21})
        failed = client.call("fail", {"message": "bad input"})
    assert value.ok and value.data == {"doubled": 42}, value
    assert value.effect is Effect.APPLIED
    assert failed.status is CallStatus.ERROR, failed
    assert failed.error is not None
    assert (failed.error.type, failed.error.message) == ("ValueError", "bad input")
    assert "in inner" in failed.error.traceback and "raise ValueError" in failed.error.traceback


def test_tools_run_where_the_backend_says(daemon: SecurityDaemon, backend: Backend) -> None:
    with Client(daemon.target) as client:
        result = client.call("where", {})
    assert result.ok, result
    assert result.data["docker"] is (backend.name == "docker")
    assert result.data["uid"] != 0


def test_a_generator_tool_streams_each_yield_as_it_is_made(daemon: SecurityDaemon) -> None:
    chunks, result = stream_with_times(daemon, "countdown", {"n": 3, "pause": 0.5})
    assert result.ok, result
    assert result.message == "Tool streamed 3 values"
    yields = [(at, json.loads(c.data)) for at, c in chunks if c.stream is StreamKind.YIELD]
    assert [v["i"] for _, v in yields] == [3, 2, 1]
    # Each value reached the caller before the tool made the next one.
    for (arrived, _), (_, following) in itertools.pairwise(yields):
        assert arrived < following["t"], yields


def test_output_streams_line_by_line(daemon: SecurityDaemon) -> None:
    code = (
        "import time\n"
        "for i in range(4):\n"
        "    print(f'line {i} {time.time()!r}', flush=True)\n"
        "    time.sleep(0.5)\n"
    )
    chunks, result = stream_with_times(daemon, "execute_python_code_stream", {"code": code})
    assert result.ok, result
    lines: list[tuple[float, int, float]] = []
    for arrived, chunk in chunks:
        assert chunk.stream is StreamKind.STDOUT
        for line in chunk.data.splitlines():
            _, i, printed = line.split()
            lines.append((arrived, int(i), float(printed)))
    assert [i for _, i, _ in lines] == [0, 1, 2, 3], chunks
    for (arrived, _, _), (_, _, next_printed) in itertools.pairwise(lines):
        assert arrived < next_printed, f"a line waited for the next one: {lines}"


def _refused(daemon: SecurityDaemon, tool: str, arguments_json: str) -> grpc.RpcError:
    with grpc.insecure_channel(daemon.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        request = pb.CallRequest(tool=tool, arguments_json=arguments_json)
        with pytest.raises(grpc.RpcError) as info:
            events = list(stub.Call(request, timeout=30))
            raise AssertionError(f"the call was not refused: {events}")
        return info.value


def test_an_unknown_tool_is_not_found(daemon: SecurityDaemon) -> None:
    err = _refused(daemon, "execute_python_cod", '{"code": "print(1)"}')
    assert err.code() is grpc.StatusCode.NOT_FOUND
    assert "Did you mean 'execute_python_code'" in (err.details() or "")
    with Client(daemon.target) as client, pytest.raises(ToolNotFoundError):
        client.call("no_such_tool", {})


@pytest.mark.parametrize(
    ("tool", "arguments", "parameter"),
    [
        ("execute_python_code", {"code": 5}, "code"),
        ("execute_python_code", {}, "code"),
        ("double", {"x": "two"}, "x"),
        ("double", {"x": 2, "y": 3}, "y"),
    ],
)
def test_bad_arguments_are_invalid_argument_naming_the_parameter(
    daemon: SecurityDaemon, tool: str, arguments: dict[str, object], parameter: str
) -> None:
    err = _refused(daemon, tool, json.dumps(arguments))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    with Client(daemon.target) as client, pytest.raises(InvalidArgumentsError) as caught:
        client.call(tool, arguments)
    assert caught.value.parameter == parameter
