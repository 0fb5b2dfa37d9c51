"""LangChain: the daemon's tools as `StructuredTool`s, run the way an agent runs them.

LangChain's dispatch path is the tool's own `invoke`/`ainvoke` with the model's
`ToolCall`, which gives the `ToolMessage` the agent appends (LangGraph's
`ToolNode` and LangChain's agents call exactly that). A scripted offline chat
model (`FakeMessagesListChatModel`) asks for the calls; the tools run against a
real daemon over its real gRPC socket.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool

import tooljail.testing
from tooljail import AsyncClient, Client
from tooljail.errors import ToolNotFoundError
from tooljail.integrations import langchain

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


def _call(name: str, call_id: str = "call_1", **args: Any) -> ToolCall:
    return {"type": "tool_call", "id": call_id, "name": name, "args": args}


def _by_name(tools: list[StructuredTool]) -> dict[str, StructuredTool]:
    return {t.name: t for t in tools}


def test_the_tools_carry_the_daemons_json_schemas_with_timeout_s(client: Client) -> None:
    tools = langchain.tools(client, [PYTHON, STREAM])

    assert [t.name for t in tools] == [PYTHON, STREAM]
    python = tools[0]
    assert isinstance(python, StructuredTool)
    assert python.func is not None and python.coroutine is None
    # What a chat model's bind_tools sends: the daemon's schema, with timeout_s.
    sent = convert_to_openai_tool(python)["function"]
    assert sent["name"] == PYTHON
    assert sent["parameters"]["required"] == ["code"]
    assert set(sent["parameters"]["properties"]) == {"code", "timeout_s"}
    assert sent["parameters"]["properties"]["timeout_s"]["maximum"] > 0
    assert (
        python.description == next(t for t in client.list_tools() if t.name == PYTHON).description
    )


def test_an_unknown_name_names_what_is_served(client: Client) -> None:
    with pytest.raises(ToolNotFoundError, match="execute_python_code"):
        langchain.tools(client, ["nope"])


def test_success_is_a_tool_message_with_the_output_and_the_outcome_as_artifact(
    client: Client,
) -> None:
    (python,) = langchain.tools(client, [PYTHON])

    message = python.invoke(_call(PYTHON, code="print(2 ** 10)"))

    assert isinstance(message, ToolMessage)
    assert message.status == "success"
    assert message.content == "1024"
    assert message.tool_call_id == "call_1"
    assert message.artifact["status"] == "success"
    assert client.get_call(message.artifact["call_id"]).result.data["stdout"] == "1024\n"
    # Called with bare arguments (no ToolCall), a tool gives its content only.
    assert python.invoke({"code": "print('plain')"}) == "plain"


def test_a_tool_error_is_an_error_message_the_model_can_read(client: Client) -> None:
    (python,) = langchain.tools(client, [PYTHON])

    message = python.invoke(_call(PYTHON, code="raise ValueError('bad input')"))

    assert message.status == "error"
    assert "ValueError: bad input" in message.content
    assert "Traceback" in message.content


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(client: Client) -> None:
    (python,) = langchain.tools(client, [PYTHON])

    message = python.invoke(_call(PYTHON, code=SLOW, timeout_s=1))

    assert message.status == "error"
    assert "timed out" in message.content
    assert "may still take effect" in message.content
    assert "started" in message.content  # the output it gave before
    call_id = re.search(r"Call id: ([0-9a-f]{32})", message.content)
    assert call_id, message.content
    # The id is the daemon's: the agent can look the call up later.
    assert client.get_call(call_id[1]).tool == PYTHON


def test_a_refused_call_is_an_error_message_and_did_not_run(client: Client) -> None:
    (python,) = langchain.tools(client, [PYTHON])

    too_long = python.invoke(_call(PYTHON, code="print(1)", timeout_s=10**6))
    bad_args = python.invoke(_call(PYTHON, code=1))

    assert too_long.status == bad_args.status == "error"
    assert "bad_timeout" in too_long.content and "did not run" in too_long.content
    assert "'code' expects string" in bad_args.content


class _Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(
        self,
        name: str,
        data: Any,
        *,
        run_id: UUID,
        tags: Any = None,
        metadata: Any = None,
        **kwargs: Any,
    ) -> None:
        self.events.append((name, data))


def test_a_streaming_tool_streams_through_langchain_callbacks(client: Client) -> None:
    (stream,) = langchain.tools(client, [STREAM])
    recorder = _Recorder()

    message = stream.invoke(_call(STREAM, code=COUNTING), config={"callbacks": [recorder]})

    assert message.status == "success"
    assert message.content == "0\n1\n2"
    chunks = [data["text"] for name, data in recorder.events if name == langchain.OUTPUT_EVENT]
    assert len(chunks) >= 2, chunks  # it came in pieces, as it was printed
    assert "".join(chunks) == "0\n1\n2\n"
    assert {data["tool"] for _, data in recorder.events} == {STREAM}


async def _events(stream: BaseTool) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    async for event in stream.astream_events(_call(STREAM, code=COUNTING), version="v2"):
        if event["event"] == "on_custom_event" and event["name"] == langchain.OUTPUT_EVENT:
            seen.append(("chunk", event["data"]["text"]))
        elif event["event"] == "on_tool_end":
            seen.append(("end", event["data"]["output"].content))
    return seen


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_streaming_tool_streams_through_astream_events(
    target: str, client: Client, kind: str
) -> None:
    if kind == "sync":  # LangChain runs the sync function in a worker thread
        (stream,) = langchain.tools(client, [STREAM])
        seen = await _events(stream)
    else:
        async with AsyncClient(target) as async_client:
            (stream,) = await langchain.tools(async_client, [STREAM])
            assert stream.coroutine is not None and stream.func is None
            seen = await _events(stream)

    chunks = [text for kind, text in seen if kind == "chunk"]
    assert len(chunks) >= 2, seen
    assert "".join(chunks) == "0\n1\n2\n"
    assert seen[-1] == ("end", "0\n1\n2")  # the chunks came before the end


async def test_async_tools_give_the_same_messages(target: str) -> None:
    async with AsyncClient(target) as client:
        tools = _by_name(await langchain.tools(client, [PYTHON]))
        ok = await tools[PYTHON].ainvoke(_call(PYTHON, code="print('hi')"))
        failed = await tools[PYTHON].ainvoke(_call(PYTHON, code=SLOW, timeout_s=1))

    assert (ok.status, ok.content) == ("success", "hi")
    assert failed.status == "error" and "may still take effect" in failed.content


async def test_a_sync_clients_tool_runs_under_ainvoke_too(client: Client) -> None:
    (python,) = langchain.tools(client, [PYTHON])

    message = await python.ainvoke(_call(PYTHON, code="print(6 * 7)"))

    assert (message.status, message.content) == ("success", "42")


def _agent_loop(model: FakeMessagesListChatModel, tools: list[BaseTool]) -> list[BaseMessage]:
    """What an agent executor does: ask the model, run each tool call it makes, repeat."""
    by_name = {t.name: t for t in tools}
    messages: list[BaseMessage] = [HumanMessage("What is x + 1?")]
    while True:
        reply = model.invoke(messages)
        messages.append(reply)
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return messages
        messages += [by_name[call["name"]].invoke(call) for call in reply.tool_calls]


def _asks(*codes: str) -> list[BaseMessage]:
    """A scripted model: one tool call per code, then a final answer."""
    return [
        AIMessage("", tool_calls=[{"name": PYTHON, "args": {"code": code}, "id": f"call_{i}"}])
        for i, code in enumerate(codes)
    ] + [AIMessage("done")]


def test_a_sessions_tools_share_its_interpreter_across_an_agents_calls(client: Client) -> None:
    with client.session() as session:
        tools: list[BaseTool] = list(langchain.tools(session, [PYTHON]))
        model = FakeMessagesListChatModel(responses=_asks("x = 41", "print(x + 1)"))

        messages = _agent_loop(model, tools)

    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["call_0", "call_1"]
    assert [m.status for m in results] == ["success", "success"]
    assert results[1].content == "42"
    assert messages[-1].content == "done"
