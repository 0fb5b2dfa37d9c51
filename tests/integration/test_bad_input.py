"""Bad input gets a clear error with the right gRPC status, and the daemon keeps serving.

Unknown tool, missing argument, wrong type, extra argument, invalid JSON, a 100 MB
request, a malformed or reused call id: each is refused before any sandbox is
used, with a status code and a machine-readable `ErrorDetail` in the trailing
metadata, through the raw stub, the SDK and the `tooljail` CLI. The daemon runs
in the test's process (`served`): the wire contract needs no process boundary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

import tooljail
from tests.conftest import ServedDaemon
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc

DETAIL_KEY = "tooljail-error-bin"


def _detail(err: grpc.RpcError) -> pb.ErrorDetail:
    for key, value in err.trailing_metadata() or ():
        if key == DETAIL_KEY:
            return pb.ErrorDetail.FromString(value)
    raise AssertionError(f"no {DETAIL_KEY} in the trailing metadata of {err!r}")


def _call_error(
    target: str,
    tool: str,
    arguments_json: str,
    *,
    call_id: str = "",
    timeout_s: float = 0.0,
    options: list[tuple[str, int]] | None = None,
) -> grpc.RpcError:
    """Make one raw Call that must fail, and return its error."""
    with grpc.insecure_channel(target, options=options or []) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        request = pb.CallRequest(
            tool=tool, arguments_json=arguments_json, call_id=call_id, timeout_s=timeout_s
        )
        with pytest.raises(grpc.RpcError) as info:
            events = list(stub.Call(request, timeout=30))
            raise AssertionError(f"the call was not refused: {events}")
        return info.value


def _raw_call(target: str, request: pb.CallRequest) -> list[pb.CallEvent]:
    with grpc.insecure_channel(target) as channel:
        return list(tooljail_pb2_grpc.ToolRunnerStub(channel).Call(request, timeout=30))


# --------------------------------------------------------------------- raw gRPC


def test_unknown_tool_is_not_found_with_a_detail(served: ServedDaemon) -> None:
    err = _call_error(served.target, "no_such_tool", '{"code": "print(1)"}')
    assert err.code() is grpc.StatusCode.NOT_FOUND
    detail = _detail(err)
    assert detail.code == "tool_not_found"
    assert "no_such_tool" in detail.message
    assert "execute_python_code" in detail.message  # it lists what is available
    served.assert_serving()


def test_close_tool_name_gets_a_suggestion(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_cod", '{"code": "print(1)"}')
    assert err.code() is grpc.StatusCode.NOT_FOUND
    assert "Did you mean 'execute_python_code'" in _detail(err).message
    served.assert_serving()


def test_missing_argument_is_invalid_argument_naming_it(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", "{}")
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_arguments"
    assert detail.parameter == "code"
    assert detail.expected == "string"
    assert detail.actual == "missing"
    assert "code" in (err.details() or "")
    served.assert_serving()


def test_wrong_type_reports_expected_and_actual(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", '{"code": 5}')
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_arguments"
    assert (detail.parameter, detail.expected, detail.actual) == ("code", "string", "integer")
    served.assert_serving()


def test_extra_argument_is_rejected_by_name(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", '{"code": "print(1)", "verbose": true}')
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_arguments"
    assert detail.parameter == "verbose"
    assert "verbose" in detail.message
    served.assert_serving()


def test_arguments_that_are_not_json(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", "{not json")
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_request"
    assert "JSON" in detail.message
    served.assert_serving()


def test_arguments_that_are_a_json_list(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", '["print(1)"]')
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_arguments"
    assert (detail.expected, detail.actual) == ("object", "array")
    served.assert_serving()


def test_malformed_call_id(served: ServedDaemon) -> None:
    err = _call_error(
        served.target, "execute_python_code", '{"code": "print(1)"}', call_id="has space"
    )
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    detail = _detail(err)
    assert detail.code == "invalid_request"
    assert "call_id" in detail.message
    served.assert_serving()


def test_timeout_out_of_bounds(served: ServedDaemon) -> None:
    err = _call_error(served.target, "execute_python_code", '{"code": "1"}', timeout_s=5000)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert _detail(err).code == "bad_timeout"
    served.assert_serving()


def test_a_100_mb_request_is_resource_exhausted(served: ServedDaemon) -> None:
    arguments_json = json.dumps({"code": "#" * 100_000_000})
    err = _call_error(
        served.target,
        "execute_python_code",
        arguments_json,
        options=[("grpc.max_send_message_length", 200 * 1024 * 1024)],
    )
    del arguments_json
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    served.assert_serving()


def test_get_call_of_an_unknown_id_is_not_found(served: ServedDaemon) -> None:
    with grpc.insecure_channel(served.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetCall(pb.GetCallRequest(call_id="never-made"), timeout=10)
        with pytest.raises(grpc.RpcError) as cancel_info:
            stub.Cancel(pb.CancelRequest(call_id="never-made"), timeout=10)
    for err in (info.value, cancel_info.value):
        assert err.code() is grpc.StatusCode.NOT_FOUND
        detail = _detail(err)
        assert detail.code == "call_not_found"
        assert "never-made" in detail.message
    served.assert_serving()


def test_same_call_id_with_other_arguments_is_already_exists(served: ServedDaemon) -> None:
    first = _raw_call(
        served.target,
        pb.CallRequest(
            tool="execute_python_code", arguments_json='{"code": "print(1)"}', call_id="id-1"
        ),
    )
    assert first[-1].result.status == pb.STATUS_SUCCESS
    err = _call_error(served.target, "execute_python_code", '{"code": "print(2)"}', call_id="id-1")
    assert err.code() is grpc.StatusCode.ALREADY_EXISTS
    detail = _detail(err)
    assert detail.code == "call_id_conflict"
    assert "id-1" in detail.message
    served.assert_serving()


@pytest.fixture
def host_writing_daemon(serve: Callable[..., ServedDaemon]) -> ServedDaemon:
    """A daemon without namespaces: its tools can leave marks on the host to count runs."""
    return serve(isolation="none")


def test_same_call_id_with_same_arguments_runs_once(
    host_writing_daemon: ServedDaemon, host_dir: Path
) -> None:
    served = host_writing_daemon
    marker = host_dir / "runs.txt"
    code = f"with open({str(marker)!r}, 'a') as f:\n    f.write('ran\\n')\nprint('done')"
    request = pb.CallRequest(
        tool="execute_python_code", arguments_json=json.dumps({"code": code}), call_id="once-1"
    )
    first = _raw_call(served.target, request)
    # The same request, with the arguments spelled in another key order/spacing.
    again = pb.CallRequest()
    again.CopyFrom(request)
    again.arguments_json = json.dumps({"code": code}, indent=4)
    second = _raw_call(served.target, again)
    r1, r2 = first[-1].result, second[-1].result
    assert first[-1].WhichOneof("event") == second[-1].WhichOneof("event") == "result"
    assert r1.call_id == r2.call_id == "once-1"
    assert r1.status == r2.status == pb.STATUS_SUCCESS
    assert json.loads(r1.data_json) == json.loads(r2.data_json)
    assert json.loads(r2.data_json)["stdout"] == "done\n"
    assert marker.read_text() == "ran\n"
    served.assert_serving()


def test_same_call_id_while_running_attaches_to_the_running_call(
    host_writing_daemon: ServedDaemon, host_dir: Path
) -> None:
    served = host_writing_daemon
    marker = host_dir / "runs.txt"
    code = (
        f"import time\nwith open({str(marker)!r}, 'a') as f:\n    f.write('ran\\n')\n"
        "print('a', flush=True)\ntime.sleep(1.5)\nprint('b')"
    )
    first: list[tooljail.ToolResult] = []

    def run() -> None:
        with tooljail.Client(served.target) as client:
            first.append(client.call("execute_python_code", {"code": code}, call_id="live-1"))

    thread = threading.Thread(target=run)
    thread.start()
    try:
        with tooljail.Client(served.target) as client:
            wait_for(marker.exists, 10, what="the first call to start")
            items = list(client.stream("execute_python_code", {"code": code}, call_id="live-1"))
    finally:
        thread.join(20)
    second = items[-1]
    assert isinstance(second, tooljail.ToolResult)
    outputs = "".join(i.data for i in items[:-1] if isinstance(i, tooljail.Output))
    assert outputs == "a\nb\n"  # the attached caller sees the output from the start
    assert first and first[0].call_id == second.call_id == "live-1"
    assert first[0].data == second.data == {"stdout": "a\nb\n", "stderr": "", "exit_code": 0}
    assert marker.read_text() == "ran\n"


# --------------------------------------------------------------------- the SDK


def test_sdk_maps_each_refusal_to_its_exception(served: ServedDaemon) -> None:
    with tooljail.Client(served.target) as client:
        with pytest.raises(tooljail.ToolNotFoundError, match="no_such_tool"):
            client.call("no_such_tool", {"code": "print(1)"})

        with pytest.raises(tooljail.InvalidArgumentsError) as missing:
            client.call("execute_python_code", {})
        assert missing.value.parameter == "code"
        assert missing.value.expected == "string"
        assert "'code'" in str(missing.value)

        with pytest.raises(tooljail.InvalidArgumentsError) as wrong:
            client.call("execute_python_code", {"code": 5})
        assert (wrong.value.parameter, wrong.value.expected, wrong.value.actual) == (
            "code",
            "string",
            "integer",
        )
        assert "'code'" in str(wrong.value)
        assert "integer" in str(wrong.value)

        with pytest.raises(tooljail.InvalidArgumentsError) as extra:
            client.call("execute_python_code", {"code": "1", "cod": "2"})
        assert extra.value.parameter == "cod"
        assert "'cod'" in str(extra.value)

        with pytest.raises(tooljail.InvalidRequestError, match="call_id"):
            client.call("execute_python_code", {"code": "1"}, call_id="has space")

        with pytest.raises(tooljail.BadTimeoutError):
            client.call("execute_python_code", {"code": "1"}, tool_timeout_s=5000)

        assert client.call("execute_python_code", {"code": "1"}, call_id="sdk-1").ok
        with pytest.raises(tooljail.CallIdConflictError, match="sdk-1"):
            client.call("execute_python_code", {"code": "2"}, call_id="sdk-1")

        with pytest.raises(tooljail.CallNotFoundError, match="never-made"):
            client.get_call("never-made")
        with pytest.raises(tooljail.CallNotFoundError):
            client.cancel("never-made")
    served.assert_serving()


def test_sdk_error_classes_are_also_the_standard_ones(served: ServedDaemon) -> None:
    # Agent code may catch LookupError / ValueError without knowing tooljail's tree.
    with tooljail.Client(served.target) as client:
        with pytest.raises(LookupError):
            client.call("no_such_tool")
        with pytest.raises(ValueError):
            client.call("execute_python_code", {"code": 5})


async def test_async_sdk_maps_refusals_too(served: ServedDaemon) -> None:
    async with tooljail.AsyncClient(served.target) as client:
        with pytest.raises(tooljail.ToolNotFoundError):
            await client.call("no_such_tool")
        with pytest.raises(tooljail.InvalidArgumentsError) as wrong:
            await client.call("execute_python_code", {"code": 5})
        assert (wrong.value.parameter, wrong.value.actual) == ("code", "integer")
        with pytest.raises(tooljail.CallNotFoundError):
            await client.get_call("never-made")
        result = await client.call("execute_python_code", {"code": "print('still')"})
    assert result.ok and result.data["stdout"] == "still\n"


# --------------------------------------------------------------------- the CLI


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_invalid_json_arguments_exit_2(served: ServedDaemon) -> None:
    proc = _cli("call", "--target", served.target, "execute_python_code", "{bad")
    assert proc.returncode == 2, proc
    assert "JSON" in proc.stderr
    assert proc.stdout == ""


def test_cli_arguments_not_an_object_exit_2(served: ServedDaemon) -> None:
    proc = _cli("call", "--target", served.target, "execute_python_code", '["print(1)"]')
    assert proc.returncode == 2, proc
    assert "JSON object" in proc.stderr


def test_cli_unknown_tool_exit_2(served: ServedDaemon) -> None:
    proc = _cli("call", "--target", served.target, "no_such_tool", '{"code": "print(1)"}')
    assert proc.returncode == 2, proc
    assert "no tool named 'no_such_tool'" in proc.stderr
    served.assert_serving()


def test_cli_invalid_arguments_exit_2_naming_the_parameter(served: ServedDaemon) -> None:
    proc = _cli("call", "--target", served.target, "execute_python_code", '{"code": 5}')
    assert proc.returncode == 2, proc
    assert "'code'" in proc.stderr


def test_cli_no_daemon_exit_3(tmp_path: Path) -> None:
    target = f"unix://{tmp_path}/nobody.sock"
    proc = _cli("call", "--target", target, "execute_python_code", '{"code": "print(1)"}')
    assert proc.returncode == 3, proc
    assert "no tooljail daemon answers" in proc.stderr
    assert str(tmp_path / "nobody.sock") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_oversized_request_is_refused_not_unavailable(served: ServedDaemon) -> None:
    # 10 MB of code is over the daemon's default 8 MiB request bound.
    arguments = json.dumps({"code": "#" * 10_000_000})
    proc = _cli("call", "--target", served.target, "execute_python_code", "-", stdin=arguments)
    assert "larger than max" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    served.assert_serving()
