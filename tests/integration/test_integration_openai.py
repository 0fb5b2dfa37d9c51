"""OpenAI and Anthropic function calling: tool definitions, and a tool call dispatched.

No model runs: the tool calls are built with the SDKs' own types
(`ChatCompletionMessageToolCall`, the Responses API's `ResponseFunctionToolCall`,
Anthropic's `ToolUseBlock`) and as the dicts their JSON gives, exactly what a
function-calling loop hands `dispatch`; the tools run on a real daemon.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types import ToolUseBlock
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.responses import ResponseFunctionToolCall

import tooljail.testing
from tooljail import AsyncClient, Client
from tooljail.integrations import openai as tj

PYTHON = "execute_python_code"
STREAM = "execute_python_code_stream"
SLOW = "import time\nprint('started', flush=True)\ntime.sleep(5)"
COUNTING = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tooljail.testing.daemon(pool_size=2) as target:
        yield target


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target) as client:
        yield client


def _chat_call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SHAPES = {
    "object": lambda name, arguments: ChatCompletionMessageToolCall.model_validate(
        _chat_call(name, arguments)
    ),
    "dict": _chat_call,
}


@pytest.fixture(params=sorted(SHAPES))
def tool_call(request: pytest.FixtureRequest) -> Any:
    """Makes a Chat Completions tool call, as the SDK's object and as a dict."""
    return SHAPES[request.param]


def test_tools_are_function_definitions_with_the_daemons_schemas(client: Client) -> None:
    definitions = tj.tools(client, [PYTHON, STREAM])

    assert [d["function"]["name"] for d in definitions] == [PYTHON, STREAM]
    assert all(d["type"] == "function" for d in definitions)
    parameters = definitions[0]["function"]["parameters"]
    assert parameters["required"] == ["code"]
    assert set(parameters["properties"]) == {"code", "timeout_s"}
    json.dumps(definitions)  # what the SDK sends: plain JSON
    every = tj.tools(client)
    assert {d["function"]["name"] for d in every} == {t.name for t in client.list_tools()}


def test_success_is_the_tool_message_to_append(client: Client, tool_call: Any) -> None:
    message = tj.dispatch(client, tool_call(PYTHON, json.dumps({"code": "print(2 ** 10)"})))

    assert message == {"role": "tool", "tool_call_id": "call_1", "content": "1024"}


def test_a_tool_error_is_told_to_the_model(client: Client, tool_call: Any) -> None:
    message = tj.dispatch(client, tool_call(PYTHON, json.dumps({"code": "raise ValueError('no')"})))

    assert message["tool_call_id"] == "call_1"
    assert "ValueError: no" in message["content"]


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(
    client: Client, tool_call: Any
) -> None:
    arguments = json.dumps({"code": SLOW, "timeout_s": 1})

    message = tj.dispatch(client, tool_call(PYTHON, arguments))

    assert "timed out" in message["content"]
    assert "may still take effect" in message["content"]
    call_id = re.search(r"Call id: ([0-9a-f]{32})", message["content"])
    assert call_id, message["content"]
    assert client.get_call(call_id[1]).tool == PYTHON


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ('{"code": "print(1)"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ('{"code": 1}', "'code' expects string"),
        ('{"code": "1", "timeout_s": 99999}', "bad_timeout"),
    ],
    ids=["bad_json", "not_an_object", "bad_type", "bad_timeout"],
)
def test_arguments_the_tool_cannot_take_are_answered_and_nothing_runs(
    client: Client, arguments: str, said: str
) -> None:
    message = tj.dispatch(client, _chat_call(PYTHON, arguments))

    assert said in message["content"]
    assert "did not run" in message["content"]


def test_a_tool_not_served_or_not_offered_is_answered_not_run(client: Client) -> None:
    unknown = tj.dispatch(client, _chat_call("rm_rf", "{}"))
    not_offered = tj.dispatch(client, _chat_call(PYTHON, '{"code": "1"}'), names=["ls"])

    assert "no tool named 'rm_rf'" in unknown["content"]
    assert "no tool named 'execute_python_code'" in not_offered["content"]
    assert "The tools are: ls." in not_offered["content"]


def test_empty_arguments_are_an_empty_object(client: Client) -> None:
    message = tj.dispatch(client, _chat_call("list_artifacts", ""))

    assert message["tool_call_id"] == "call_1"
    assert "did not run" not in message["content"]


def test_a_streaming_tool_streams_to_on_output(client: Client) -> None:
    chunks: list[str] = []

    message = tj.dispatch(
        client, _chat_call(STREAM, json.dumps({"code": COUNTING})), on_output=chunks.append
    )

    assert message["content"] == "0\n1\n2"
    assert len(chunks) >= 2, chunks
    assert "".join(chunks) == "0\n1\n2\n"


def test_a_responses_api_function_call_gets_its_output_item(client: Client) -> None:
    item = ResponseFunctionToolCall(
        type="function_call", call_id="fc_1", name=PYTHON, arguments='{"code": "print(3)"}'
    )

    answer = tj.dispatch(client, item)

    assert answer == {"type": "function_call_output", "call_id": "fc_1", "output": "3"}


def test_a_sessions_calls_share_its_interpreter(client: Client) -> None:
    with client.session() as session:
        tj.dispatch(session, _chat_call(PYTHON, '{"code": "x = 41"}', "a"))
        message = tj.dispatch(session, _chat_call(PYTHON, '{"code": "print(x + 1)"}', "b"))

    assert message == {"role": "tool", "tool_call_id": "b", "content": "42"}


async def test_adispatch_with_an_async_client(target: str) -> None:
    chunks: list[str] = []
    async with AsyncClient(target) as client:
        definitions = await tj.tools(client, [PYTHON])
        ok = await tj.adispatch(client, _chat_call(PYTHON, '{"code": "print(5)"}'))
        slow = await tj.adispatch(
            client, _chat_call(PYTHON, json.dumps({"code": SLOW, "timeout_s": 1}))
        )
        streamed = await tj.adispatch(
            client, _chat_call(STREAM, json.dumps({"code": COUNTING})), on_output=chunks.append
        )
        async with client.session() as session:
            await tj.adispatch(session, _chat_call(PYTHON, '{"code": "x = 41"}'))
            shared = await tj.adispatch(session, _chat_call(PYTHON, '{"code": "print(x + 1)"}'))

    assert definitions[0]["function"]["name"] == PYTHON
    assert ok["content"] == "5"
    assert "may still take effect" in slow["content"] and "Call id: " in slow["content"]
    assert streamed["content"] == "0\n1\n2" and len(chunks) >= 2
    assert shared["content"] == "42"


# --- Anthropic --------------------------------------------------------------------


def _tool_use(name: str, **arguments: Any) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id="toolu_1", name=name, input=arguments)


def test_anthropic_tools_have_the_input_schema(client: Client) -> None:
    (definition,) = tj.anthropic_tools(client, [PYTHON])

    assert definition["name"] == PYTHON
    assert definition["input_schema"]["required"] == ["code"]
    assert "timeout_s" in definition["input_schema"]["properties"]


@pytest.mark.parametrize("as_dict", [False, True], ids=["object", "dict"])
def test_anthropic_tool_use_gets_a_tool_result_with_is_error(client: Client, as_dict: bool) -> None:
    def block(**arguments: Any) -> Any:
        made = _tool_use(PYTHON, **arguments)
        return made.model_dump() if as_dict else made

    ok = tj.anthropic_dispatch(client, block(code="print(7)"))
    failed = tj.anthropic_dispatch(client, block(code="1/0"))
    slow = tj.anthropic_dispatch(client, block(code=SLOW, timeout_s=1))

    assert ok == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "7",
        "is_error": False,
    }
    assert failed["is_error"] is True and "ZeroDivisionError" in failed["content"]
    assert slow["is_error"] is True and "may still take effect" in slow["content"]


async def test_anthropic_adispatch_in_an_async_session(target: str) -> None:
    async with AsyncClient(target) as client:
        (definition,) = await tj.anthropic_tools(client, [PYTHON])
        async with client.session() as session:
            await tj.anthropic_adispatch(session, _tool_use(PYTHON, code="x = 41"))
            result = await tj.anthropic_adispatch(session, _tool_use(PYTHON, code="print(x + 1)"))

    assert definition["name"] == PYTHON
    assert (result["content"], result["is_error"]) == ("42", False)
