"""The no-I/O half of the SDK client: targets, defaults, argument checks, decoding."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tooljail._client_base import (
    MAX_RECEIVE_MESSAGE_BYTES,
    _BaseClient,
    default_socket_path,
    default_target,
)
from tooljail._types import CallStatus, Output, StreamKind, ToolInfo, ToolResult
from tooljail._wire import ERROR_DETAIL_KEY
from tooljail.errors import BadTimeoutError, InvalidRequestError, TooljailError, TransportError
from tooljail.v1 import tooljail_pb2 as pb

# --- defaults ---


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("TOOLJAIL_TARGET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return monkeypatch


def test_default_socket_under_xdg_runtime_dir(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_socket_path() == Path("/run/user/1000/tooljail/tooljail.sock")
    assert default_target() == "unix:///run/user/1000/tooljail/tooljail.sock"


def test_default_socket_for_root(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(os, "getuid", lambda: 0)
    assert default_socket_path() == Path("/run/tooljail/tooljail.sock")
    assert default_target() == "unix:///run/tooljail/tooljail.sock"


def test_default_socket_for_a_user(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(os, "getuid", lambda: 1234)
    assert default_socket_path() == Path("/tmp/tooljail-1234/tooljail.sock")
    assert default_target() == "unix:///tmp/tooljail-1234/tooljail.sock"


def test_empty_xdg_runtime_dir_is_ignored(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("XDG_RUNTIME_DIR", "")
    clean_env.setattr(os, "getuid", lambda: 1234)
    assert default_socket_path() == Path("/tmp/tooljail-1234/tooljail.sock")


def test_env_target_wins(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    clean_env.setenv("TOOLJAIL_TARGET", "daemon.internal:7443")
    assert default_target() == "daemon.internal:7443"
    assert _BaseClient().target == "daemon.internal:7443"


def test_client_without_target_uses_default(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert _BaseClient().target == "unix:///run/user/7/tooljail/tooljail.sock"


# --- targets ---


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("unix:///run/x.sock", "unix:///run/x.sock"),
        ("unix:/run/x.sock", "unix:///run/x.sock"),
        ("/run/x.sock", "unix:///run/x.sock"),
        ("  /run/x.sock\n", "unix:///run/x.sock"),
        ("localhost:50051", "localhost:50051"),
        ("10.0.0.1:7443", "10.0.0.1:7443"),
        ("[::1]:50051", "[::1]:50051"),
        ("dns:///daemon.svc:7443", "dns:///daemon.svc:7443"),
        ("ipv4:127.0.0.1:1,127.0.0.2:1", "ipv4:127.0.0.1:1,127.0.0.2:1"),
        ("unix-abstract:tooljail", "unix-abstract:tooljail"),
    ],
)
def test_target_normalisation(given: str, expected: str) -> None:
    assert _BaseClient._normalize_target(given) == expected


def test_relative_socket_paths_become_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _BaseClient._normalize_target("unix:d.sock") == f"unix://{tmp_path}/d.sock"
    assert _BaseClient._normalize_target("./d.sock") == f"unix://{tmp_path}/d.sock"


def test_home_socket_path_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/ann")
    assert _BaseClient._normalize_target("~/t.sock") == "unix:///home/ann/t.sock"


@pytest.mark.parametrize("bad", ["", "   ", "unix:", "unix://relative.sock", "http://h:1"])
def test_bad_targets_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRequestError):
        _BaseClient._normalize_target(bad)


def test_non_str_target_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _BaseClient(target=Path("/x.sock"))  # type: ignore[arg-type]


def test_channel_options_raise_receive_limit() -> None:
    opts = dict(_BaseClient._channel_options())
    assert opts["grpc.max_receive_message_length"] == MAX_RECEIVE_MESSAGE_BYTES == 64 * 2**20


# --- client-level deadline ---


@pytest.mark.parametrize("ok", [None, 1, 0.5, 30.0])
def test_client_timeout_accepts(ok) -> None:
    c = _BaseClient("/x.sock", rpc_timeout_s=ok)
    assert c.rpc_timeout_s == (None if ok is None else float(ok))


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_client_timeout_refuses_values(bad) -> None:
    with pytest.raises(InvalidRequestError):
        _BaseClient("/x.sock", rpc_timeout_s=bad)


@pytest.mark.parametrize("bad", ["5", True, [1]])
def test_client_timeout_refuses_types(bad) -> None:
    with pytest.raises(TypeError):
        _BaseClient("/x.sock", rpc_timeout_s=bad)


# --- call request ---


@pytest.fixture
def base() -> _BaseClient:
    return _BaseClient("/x.sock")


def test_request_is_built_from_checked_arguments(base: _BaseClient) -> None:
    req = base._build_call_request(
        "grep", {"pattern": "é", "n": [1]}, tool_timeout_s=5, call_id="c:1"
    )
    assert req.tool == "grep"
    assert json.loads(req.arguments_json) == {"pattern": "é", "n": [1]}
    assert req.timeout_s == 5.0
    assert req.call_id == "c:1"


def test_request_defaults(base: _BaseClient) -> None:
    req = base._build_call_request("t", None, tool_timeout_s=None, call_id=None)
    assert req.arguments_json == "{}"
    # 0 on the wire means "the tool's default"; the SDK makes each call an id
    # of its own (so that a retry is the same call), a new one per request.
    assert req.timeout_s == 0.0
    assert len(req.call_id) == 32
    assert (
        base._build_call_request("t", None, tool_timeout_s=None, call_id=None).call_id
        != req.call_id
    )
    assert (
        base._build_call_request("t", None, tool_timeout_s=None, call_id="mine").call_id == "mine"
    )


@pytest.mark.parametrize("tool", [None, 3, b"t"])
def test_tool_name_must_be_str(base: _BaseClient, tool) -> None:
    with pytest.raises(TypeError, match="tool"):
        base._build_call_request(tool, None, tool_timeout_s=None, call_id=None)


def test_tool_name_must_not_be_empty(base: _BaseClient) -> None:
    with pytest.raises(InvalidRequestError, match="empty"):
        base._build_call_request("", None, tool_timeout_s=None, call_id=None)


@pytest.mark.parametrize("args", [[1, 2], "x=1", ("a",), 3])
def test_args_must_be_a_dict(base: _BaseClient, args) -> None:
    with pytest.raises(TypeError, match="args must be a dict"):
        base._build_call_request("t", args, tool_timeout_s=None, call_id=None)


def test_arg_names_must_be_str(base: _BaseClient) -> None:
    with pytest.raises(TypeError, match="argument names"):
        base._build_call_request("t", {1: "x"}, tool_timeout_s=None, call_id=None)


@pytest.mark.parametrize("value", [{1, 2}, object(), b"bytes", math.nan, math.inf])
def test_args_must_be_json(base: _BaseClient, value) -> None:
    with pytest.raises(InvalidRequestError, match="JSON") as info:
        base._build_call_request("t", {"v": value}, tool_timeout_s=None, call_id=None)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TooljailError)


@pytest.mark.parametrize("bad", [0, -2.5, math.nan, math.inf])
def test_call_timeout_must_be_positive(base: _BaseClient, bad) -> None:
    with pytest.raises(BadTimeoutError):
        base._build_call_request("t", None, tool_timeout_s=bad, call_id=None)


@pytest.mark.parametrize("bad", ["10", False])
def test_call_timeout_must_be_a_number(base: _BaseClient, bad) -> None:
    with pytest.raises(TypeError):
        base._build_call_request("t", None, tool_timeout_s=bad, call_id=None)


def test_call_id_must_be_str_or_none(base: _BaseClient) -> None:
    with pytest.raises(TypeError):
        base._build_call_request("t", None, tool_timeout_s=None, call_id=12)
    with pytest.raises(InvalidRequestError):
        base._build_call_request("t", None, tool_timeout_s=None, call_id="")


def test_call_id_is_required_for_lookups(base: _BaseClient) -> None:
    with pytest.raises(TypeError):
        base._check_call_id(None, required=True)
    assert base._check_call_id("c", required=True) == "c"


# --- decoding ---


def test_event_decoding(base: _BaseClient) -> None:
    started = pb.CallEvent(started=pb.Started(call_id="c", sandbox_id="s", tool="t"))
    assert base._decode_event(started) is None
    assert base._decode_event(pb.CallEvent()) is None
    out = base._decode_event(
        pb.CallEvent(output=pb.Output(seq=1, stream=pb.STREAM_KIND_STDERR, data=b"e"))
    )
    assert out == Output(seq=1, stream=StreamKind.STDERR, data="e")
    res = base._decode_event(
        pb.CallEvent(result=pb.Result(call_id="c", status=pb.STATUS_ERROR, data_json="null"))
    )
    assert isinstance(res, ToolResult)
    assert res.status is CallStatus.ERROR


def test_undecodable_event_is_a_transport_error(base: _BaseClient) -> None:
    with pytest.raises(TransportError, match="cannot read"):
        base._decode_event(pb.CallEvent(result=pb.Result(call_id="c", data_json="null")))


def test_openai_tools_shape(base: _BaseClient) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools = [ToolInfo(name="a", description="A.", input_schema=schema), ToolInfo(name="b")]
    got = base._openai_tools(tools)
    assert got[0] == {
        "type": "function",
        "function": {"name": "a", "description": "A.", "parameters": schema},
    }
    assert got[1]["function"]["parameters"] == {"type": "object", "properties": {}}


class _FakeRpcError(Exception):
    """Quacks like the grpc call errors: code(), details(), trailing_metadata()."""

    def __init__(self, code_name: str, details: str, trailing) -> None:
        import grpc

        self._code = grpc.StatusCode[code_name]
        self._details = details
        self._trailing = trailing

    def code(self):
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailing


def test_rpc_error_mapping_uses_the_trailer(base: _BaseClient) -> None:
    detail = pb.ErrorDetail(code="call_id_conflict", message="used").SerializeToString()
    err = base._map_rpc_error(_FakeRpcError("ALREADY_EXISTS", "x", ((ERROR_DETAIL_KEY, detail),)))
    assert type(err).__name__ == "CallIdConflictError"
    assert err.message == "used"


def test_rpc_error_mapping_names_the_target(base: _BaseClient) -> None:
    err = base._map_rpc_error(_FakeRpcError("UNAVAILABLE", "refused", None))
    assert type(err).__name__ == "DaemonUnavailableError"
    assert "unix:///x.sock" in err.message


def test_the_retry_policy_retries_only_transport_failures(base: _BaseClient) -> None:
    from tooljail.errors import (
        DaemonUnavailableError,
        InternalError,
        JournalUnavailableError,
        ShuttingDownError,
        UnknownError,
    )

    assert base._should_retry(DaemonUnavailableError("gone", status="UNAVAILABLE"), 0)
    assert base._should_retry(TransportError("reset", status="UNAVAILABLE"), 0)
    assert not base._should_retry(DaemonUnavailableError("gone", status="UNAVAILABLE"), 99)
    # Answers from the daemon, UNAVAILABLE or not, are never retried.
    for answer in (
        JournalUnavailableError("the journal is full", reason="full"),
        UnknownError("newer", code="from_the_future", status="UNAVAILABLE"),
        ShuttingDownError("draining"),
        InternalError("bug"),
        TransportError("deadline", status="DEADLINE_EXCEEDED"),
    ):
        assert not base._should_retry(answer, 0), answer
