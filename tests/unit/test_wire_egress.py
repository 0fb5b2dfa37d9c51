"""The egress fields of results, sessions and tools cross the wire and the journal whole."""

from __future__ import annotations

import pytest

from tooljail import Client, EgressDenial, SessionInfo, ToolInfo, ToolResult, Usage
from tooljail._session_base import check_names, create_session_request, set_egress_request
from tooljail._wire import session_info_from_proto, session_info_to_proto
from tooljail.errors import InvalidRequestError
from tooljail.types import CallStatus
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.wire import (
    result_from_proto,
    result_to_proto,
    tool_info_from_proto,
    tool_info_to_proto,
)

RESULT = ToolResult(
    call_id="c1",
    status=CallStatus.SUCCESS,
    usage=Usage(net_connections=3, net_bytes_out=120, net_bytes_in=4096),
    egress_denied=(
        EgressDenial(host="evil.example.com", port=443, reason="deny_rule",
                     rule="evil.example.com", count=7),
        EgressDenial(host="10.0.0.1", port=80, reason="ip_literal"),
    ),
)  # fmt: skip


def test_a_result_keeps_its_denials_and_net_usage_over_the_wire() -> None:
    assert result_from_proto(result_to_proto(RESULT)) == RESULT


def test_a_result_keeps_them_through_the_journals_json() -> None:
    # The journal stores `model_dump_json()` and reads `model_validate_json`.
    assert ToolResult.model_validate_json(RESULT.model_dump_json()) == RESULT


def test_an_unset_count_reads_as_one() -> None:
    m = pb.Result(call_id="c", status=pb.STATUS_SUCCESS, data_json="null")
    m.egress_denied.add(host="h", port=1, reason="not_allowed")
    assert result_from_proto(m).egress_denied[0].count == 1


def test_sessions_and_tools_carry_rules_and_secret_names() -> None:
    info = SessionInfo(session_id="s", egress=("api.example.com",), secrets=("KEY",))
    assert session_info_from_proto(session_info_to_proto(info)) == info
    tool = ToolInfo(name="t", egress=("*.example.org:443",), secrets=("KEY",))
    assert tool_info_from_proto(tool_info_to_proto(tool)) == tool


def test_requests_carry_egress_and_secrets() -> None:
    request = create_session_request(egress=["a.example.com"], secrets=["K"])
    assert list(request.egress) == ["a.example.com"] and list(request.secrets) == ["K"]
    assert list(set_egress_request("s1", []).egress) == []
    client = Client("127.0.0.1:1")
    try:
        call = client._build_call_request(
            "t", {}, tool_timeout_s=None, call_id=None, egress=("x.example.com",), secrets=["K"]
        )
    finally:
        client.close()
    assert list(call.egress) == ["x.example.com"] and list(call.secrets) == ["K"]


def test_the_sdk_refuses_misshapen_lists_before_sending() -> None:
    with pytest.raises(TypeError, match="list of str"):
        check_names("api.example.com", "egress")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="empty"):
        check_names(["ok.example.com", " "], "egress")
    with pytest.raises(InvalidRequestError, match="at most"):
        check_names(["h"] * 300, "egress")


def test_the_tool_decorator_carries_secrets_and_sandbox_egress() -> None:
    from tooljail import tool

    @tool(sandbox={"egress": ["api.example.com"]}, secrets=["NEWS_API_KEY"])
    def news(topic: str) -> str:
        return topic

    options = news.__tooljail_tool__["options"]  # type: ignore[attr-defined]
    assert options["sandbox"] == {"egress": ["api.example.com"]}
    assert options["secrets"] == ["NEWS_API_KEY"]
