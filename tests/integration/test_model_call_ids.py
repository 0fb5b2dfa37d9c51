"""The model's own tool-call id is the daemon's call id, through each adapter.

Through a real daemon: a call dispatched with the framework's id runs as
`<client name>:<id>`; dispatched again with the same id and arguments (a host
replaying its conversation) it gets the journaled answer and does not run
again; the same id with other arguments (an id reused, not a replay) runs under
a fresh id. The call_status tool is offered with the other tools.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types import ToolUseBlock
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.responses import ResponseFunctionToolCall

import tooljail.testing
from tooljail import AsyncClient, Client
from tooljail.integrations import langchain as lc
from tooljail.integrations import openai as tj
from tooljail.integrations._ids import namespaced

PYTHON = "execute_python_code"
RANDOM = "import random\nprint(random.random())"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tooljail.testing.daemon(pool_size=2) as target:
        yield target


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target, client_name="host-under-test") as client:
        yield client


def chat(framework_id: str, code: str) -> Any:
    return ChatCompletionMessageToolCall.model_validate(
        {
            "id": framework_id,
            "type": "function",
            "function": {"name": PYTHON, "arguments": json.dumps({"code": code})},
        }
    )


def responses(framework_id: str, code: str) -> Any:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=framework_id,
        name=PYTHON,
        arguments=json.dumps({"code": code}),
    )


def anthropic(framework_id: str, code: str) -> Any:
    return ToolUseBlock(type="tool_use", id=framework_id, name=PYTHON, input={"code": code})


def text(answer: dict[str, Any]) -> str:
    return str(answer.get("content", answer.get("output")))


@pytest.mark.parametrize("shape", [chat, responses, anthropic], ids=lambda f: f.__name__)
def test_a_replayed_tool_call_gets_the_journaled_answer(client: Client, shape: Any) -> None:
    framework_id = "call_" + uuid.uuid4().hex[:12]
    dispatch = tj.anthropic_dispatch if shape is anthropic else tj.dispatch

    first = dispatch(client, shape(framework_id, RANDOM))
    replayed = dispatch(client, shape(framework_id, RANDOM))

    assert text(first) == text(replayed)  # the same random number: it did not run again
    info = client.get_call(f"host-under-test:{framework_id}")
    assert info.tool == PYTHON
    assert info.result is not None and info.result.data["stdout"].strip() == text(first)


def test_the_same_id_with_other_arguments_runs_under_a_fresh_id(client: Client) -> None:
    framework_id = "call_0"  # as servers that number their calls per turn give it
    first = tj.dispatch(client, chat(framework_id, "print('first')"))
    second = tj.dispatch(client, chat(framework_id, "print('second')"))

    assert (first["content"], second["content"]) == ("first", "second")
    assert second["tool_call_id"] == framework_id
    info = client.get_call("host-under-test:call_0")
    assert info.result is not None and info.result.data["stdout"] == "first\n"


def test_an_id_outside_the_daemons_shape_is_mapped(target: str) -> None:
    with Client(target) as default_name:  # "<host>/<pid>": a "/" is no call id's
        framework_id = "call/" + uuid.uuid4().hex
        answer = tj.dispatch(default_name, chat(framework_id, "print(7)"))
        info = default_name.get_call(namespaced(default_name.client_name, framework_id))
    assert answer["content"] == "7"
    assert info.result is not None and info.result.data["stdout"] == "7\n"


async def test_an_async_dispatch_uses_the_id_too(target: str) -> None:
    framework_id = "call_" + uuid.uuid4().hex[:12]
    async with AsyncClient(target, client_name="async-host") as client:
        first = await tj.adispatch(client, chat(framework_id, RANDOM))
        replayed = await tj.adispatch(client, chat(framework_id, RANDOM))
        info = await client.get_call(f"async-host:{framework_id}")
    assert first == replayed
    assert info.tool == PYTHON


def test_langchain_runs_a_tool_call_under_its_id(client: Client) -> None:
    (tool,) = lc.tools(client, [PYTHON])
    framework_id = "lc_" + uuid.uuid4().hex[:12]
    call = {"type": "tool_call", "id": framework_id, "name": PYTHON, "args": {"code": RANDOM}}

    first = tool.invoke(call)
    replayed = tool.invoke(call)
    bare = tool.invoke({"code": "print(1)"})  # no ToolCall, no id: a fresh one

    assert first.content == replayed.content
    assert first.artifact["call_id"] == f"host-under-test:{framework_id}"
    assert bare == "1"


async def test_langchain_ainvoke_runs_under_the_id(target: str) -> None:
    framework_id = "lc_" + uuid.uuid4().hex[:12]
    async with AsyncClient(target, client_name="lc-async") as client:
        (tool,) = await lc.tools(client, [PYTHON])
        message = await tool.ainvoke(
            {"type": "tool_call", "id": framework_id, "name": PYTHON, "args": {"code": "print(2)"}}
        )
    assert message.content == "2"
    assert message.artifact["call_id"] == f"lc-async:{framework_id}"


def test_every_adapter_offers_call_status(client: Client) -> None:
    assert "call_status" in {d["function"]["name"] for d in tj.tools(client)}
    assert "call_status" in {d["name"] for d in tj.anthropic_tools(client)}
    assert "call_status" in {t.name for t in lc.tools(client)}
    asked = tj.dispatch(
        client,
        {
            "id": "status_1",
            "type": "function",
            "function": {"name": "call_status", "arguments": '{"call_id": "no-such-call"}'},
        },
    )
    assert "No call with the id 'no-such-call'" in asked["content"]
