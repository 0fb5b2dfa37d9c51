"""The daemon's tools inside LightAgent, run by LightAgent's own dispatch, against a real daemon.

Offline: the agent's model is a scripted stand-in for the OpenAI client
(`agent.client`), which asks for the tool calls a test names and then answers
with the tool message it was sent, so the test reads what the model read.
Everything between (LightAgent's `run`, its argument check, its sandbox
guard, its `AsyncToolDispatcher`, its streaming of a generator tool) is
LightAgent's own code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from LightAgent import LightAgent
from LightAgent.tools import AsyncToolDispatcher, ToolRegistry
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageToolCall,
)

import tooljail.testing
from tooljail import AsyncClient, CallState, Client, ToolNotFoundError
from tooljail.integrations import lightagent
from tooljail.integrations.core import MAX_TEXT_CHARS

pytestmark = pytest.mark.timeout(60)

SLEEP_PAST_TIMEOUT = "import time\nprint('started', flush=True)\ntime.sleep(5)"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tooljail.testing.daemon(pool_size=2) as t:
        yield t


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target) as c:
        yield c


class ScriptedModel:
    """An offline stand-in for the OpenAI client LightAgent calls (`client.chat.completions`).

    Each request answers with the next tool call of `calls`; once they are
    done, with a reply quoting the last tool message it was sent.
    """

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = list(calls)
        self.tool_messages: list[str] = []
        self.chat = self
        self.completions = self

    def create(self, **params: Any) -> Any:
        self.tool_messages = [
            str(_field(m, "content")) for m in params["messages"] if _field(m, "role") == "tool"
        ]
        step = len([m for m in params["messages"] if _field(m, "role") == "tool"])
        if params.get("stream"):
            return iter(self._chunks(step))
        return self._completion(step)

    def _completion(self, step: int) -> ChatCompletion:
        if step < len(self.calls):
            name, args = self.calls[step]
            call = ChatCompletionMessageToolCall(
                id=f"call_{step}",
                type="function",
                function={"name": name, "arguments": json.dumps(args)},
            )
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "model read: " + self.tool_messages[-1]}
            finish = "stop"
        return ChatCompletion.model_validate(
            {
                "id": f"scripted-{step}",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted",
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            }
        )

    def _chunks(self, step: int) -> list[ChatCompletionChunk]:
        if step < len(self.calls):
            name, args = self.calls[step]
            delta: dict[str, Any] = {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"call_{step}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            delta = {"role": "assistant", "content": "model read: " + self.tool_messages[-1]}
            finish = "stop"
        return [
            ChatCompletionChunk.model_validate(
                {
                    "id": f"scripted-{step}",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "scripted",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
        ]


def _field(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, dict) else getattr(message, key, None)


def _agent(
    tools: list[Any], calls: list[tuple[str, dict[str, Any]]], where: Path
) -> tuple[LightAgent, ScriptedModel]:
    model = ScriptedModel(calls)
    agent = LightAgent(
        model="scripted",
        api_key="offline",
        base_url="http://127.0.0.1:9/v1",
        tools=tools,
        auto_discover_skills=False,
        skills_directories=[str(where / "skills")],
    )
    agent.client = model
    return agent, model


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # LightAgent makes a ./logs directory where it is constructed.
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_tools_register_under_names_lightagents_guard_lets_through(client: Client) -> None:
    tools = lightagent.tools(client)
    names = [t.tool_info["tool_name"] for t in tools]
    assert {"run_python_code", "run_python_file", "run_python_code_stream"} <= set(names)
    assert not {"execute_python_code", "execute_python_file", "execute_python_code_stream"} & set(
        names
    )
    registry = ToolRegistry()
    assert registry.register_tools(tools)
    assert registry.validate_tools() == []
    schema = next(
        s["function"] for s in registry.get_tools() if s["function"]["name"] == "read_file"
    )
    assert schema["parameters"]["required"] == ["path"]
    assert schema["parameters"]["properties"]["limit"]["minimum"] == 1
    assert schema["parameters"]["properties"]["timeout_s"]["type"] == "number"


async def test_the_daemons_own_name_would_be_refused_by_lightagents_guard(client: Client) -> None:
    (tool,) = lightagent.tools(client, ["execute_python_code"])
    registry = ToolRegistry()
    registry.register_tool(tool)
    dispatcher = AsyncToolDispatcher(registry.function_mappings, registry.function_info)
    assert await dispatcher.dispatch("run_python_code", {"code": "print(6 * 7)"}) == "42"
    dispatcher.function_mappings["execute_python_code"] = tool
    refused = await dispatcher.dispatch("execute_python_code", {"code": "print(1)"})
    assert refused.startswith("[LA-SANDBOX]")


def test_success_through_the_agent(client: Client, in_tmp: Path) -> None:
    agent, _ = _agent(
        lightagent.tools(client, ["execute_python_code"]),
        [("run_python_code", {"code": "print(2 ** 100)"})],
        in_tmp,
    )
    assert agent.run("what is 2**100?") == f"model read: {2**100}"


def test_a_tool_error_reaches_the_model_as_la_tool(client: Client, in_tmp: Path) -> None:
    agent, model = _agent(
        lightagent.tools(client, ["execute_python_code"]),
        [("run_python_code", {"code": "raise ValueError('no such row')"})],
        in_tmp,
    )
    agent.run("go")
    (read,) = model.tool_messages
    assert read.startswith("[LA-TOOL] Tool execution failed.")
    assert "ValueError: no such row" in read


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(
    client: Client, in_tmp: Path
) -> None:
    agent, model = _agent(
        lightagent.tools(client, ["execute_python_code"]),
        [("run_python_code", {"code": SLEEP_PAST_TIMEOUT, "timeout_s": 1})],
        in_tmp,
    )
    agent.run("go")
    (read,) = model.tool_messages
    assert read.startswith("[LA-TOOL]")
    assert "may still take effect" in read
    call_id = read.split("Call id: ")[1].split(".")[0]
    assert client.get_call(call_id).state is CallState.TIMED_OUT


def test_lightagents_argument_check_runs_before_the_daemon(client: Client, in_tmp: Path) -> None:
    agent, model = _agent(
        lightagent.tools(client, ["execute_python_code"]),
        [("run_python_code", {"code": 42})],
        in_tmp,
    )
    agent.run("go")
    (read,) = model.tool_messages
    assert read.startswith("[LA-TOOL]") and "expected `string`, got `int`" in read


def test_a_streaming_tool_streams_through_run_stream_true(client: Client, in_tmp: Path) -> None:
    code = "import time\nprint('first', flush=True)\ntime.sleep(0.8)\nprint('second', flush=True)"
    agent, model = _agent(
        lightagent.tools(client, ["execute_python_code_stream"]),
        [("run_python_code_stream", {"code": code})],
        in_tmp,
    )
    pieces: list[tuple[float, str]] = []
    for event in agent.run("go", stream=True):
        if isinstance(event, dict) and "output" in event:
            assert event["name"] == "run_python_code_stream"
            assert event["title"] == "execute_python_code_stream"
            pieces.append((time.monotonic(), event["output"]))
    texts = [text for _, text in pieces]
    assert "first" in texts[0] and "second" not in texts[0]
    assert "second" in "".join(texts[1:])
    # The first piece came while the tool still ran, not with the result.
    assert pieces[-1][0] - pieces[0][0] > 0.5
    assert model.tool_messages == ["first\nsecond\n"]


def test_a_streaming_tools_failure_ends_its_stream(client: Client, in_tmp: Path) -> None:
    agent, model = _agent(
        lightagent.tools(client, ["execute_python_code_stream"]),
        [("run_python_code_stream", {"code": SLEEP_PAST_TIMEOUT, "timeout_s": 1})],
        in_tmp,
    )
    events = list(agent.run("go", stream=True))
    outputs = [e["output"] for e in events if isinstance(e, dict) and "output" in e]
    assert outputs[0] == "started\n"
    assert outputs[-1].startswith("\n[LA-TOOL]") and "may still take effect" in outputs[-1]
    (read,) = model.tool_messages
    assert read.startswith("started\n") and "Call id: " in read


def test_a_streaming_tool_without_streaming_is_joined(client: Client, in_tmp: Path) -> None:
    agent, _ = _agent(
        lightagent.tools(client, ["execute_python_code_stream"]),
        [("run_python_code_stream", {"code": "for i in range(3): print(i, flush=True)"})],
        in_tmp,
    )
    assert agent.run("go") == "model read: 0\n1\n2\n"


def test_a_sessions_tools_share_its_interpreter(client: Client, in_tmp: Path) -> None:
    with client.session() as session:
        agent, model = _agent(
            lightagent.tools(session, ["execute_python_code"]),
            [
                ("run_python_code", {"code": "x = 41"}),
                ("run_python_code", {"code": "print(x + 1)"}),
            ],
            in_tmp,
        )
        assert agent.run("go") == "model read: 42"
    assert model.tool_messages[0] == "(no output)"


async def test_async_tools_through_the_dispatcher_in_the_clients_loop(target: str) -> None:
    async with AsyncClient(target) as client:
        tools = await lightagent.atools(
            client, ["execute_python_code", "execute_python_code_stream"]
        )
        registry = ToolRegistry()
        registry.register_tools(tools)
        dispatcher = AsyncToolDispatcher(registry.function_mappings, registry.function_info)
        assert await dispatcher.dispatch("run_python_code", {"code": "print('hi')"}) == "hi"
        failed = await dispatcher.dispatch("run_python_code", {"code": "1/0"})
        assert failed.startswith("[LA-TOOL]") and "ZeroDivisionError" in failed
        # LightAgent collects an async generator's pieces into one string.
        joined = await dispatcher.dispatch(
            "run_python_code_stream", {"code": "for i in range(3): print(i, flush=True)"}
        )
        assert joined == "0\n1\n2\n"
        # tools() with an async client is the same coroutine as atools().
        assert [t.__name__ for t in await lightagent.tools(client, ["execute_python_code"])] == [
            "run_python_code"
        ]


def test_a_name_the_daemon_does_not_serve_is_named(client: Client) -> None:
    with pytest.raises(ToolNotFoundError, match="no_such_tool"):
        lightagent.tools(client, ["no_such_tool"])


async def test_a_streamed_run_names_its_artifacts_and_caps_what_the_model_reads(
    client: Client,
) -> None:
    registry = ToolRegistry()
    registry.register_tools(lightagent.tools(client, ["execute_python_code_stream"]))
    dispatcher = AsyncToolDispatcher(registry.function_mappings, registry.function_info)
    report = (
        "import os\nos.makedirs('outputs', exist_ok=True)\n"
        "open('outputs/report.txt', 'w').write('hello')\nprint('done', flush=True)"
    )
    pieces = list(await dispatcher.dispatch("run_python_code_stream", {"code": report}))
    assert pieces[0] == "done\n"
    assert "outputs/report.txt (text/plain, 5 bytes): artifact_id " in pieces[-1]
    big = "print('x' * 30000, flush=True)"
    joined = "".join(await dispatcher.dispatch("run_python_code_stream", {"code": big}))
    assert joined.startswith("x" * MAX_TEXT_CHARS)
    assert joined.endswith(f"[... {30001 - MAX_TEXT_CHARS} more characters not shown]")


def test_a_user_tool_named_like_a_rename_is_not_hidden(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from tooljail import tool\n\n\n"
        "@tool\ndef run_python_code(code: str) -> str:\n"
        '    """Not the daemon\'s runner."""\n'
        "    return code\n"
    )
    with tooljail.testing.daemon(tools_dirs=[str(tmp_path)]) as other, Client(other) as client:
        with pytest.raises(ValueError, match="'execute_python_code' and 'run_python_code'"):
            lightagent.tools(client)
        (mine,) = lightagent.tools(client, ["run_python_code"])
        assert mine(code="echo") == "echo"


async def test_async_tools_through_the_agents_arun(target: str, in_tmp: Path) -> None:
    # LightAgent.arun dispatches on a loop of its own, in a worker thread: the
    # calls are handed back to the loop the AsyncClient lives on.
    async with AsyncClient(target) as client:
        agent, model = _agent(
            await lightagent.atools(client, ["execute_python_code", "execute_python_code_stream"]),
            [
                ("run_python_code", {"code": "print('hi')"}),
                ("run_python_code_stream", {"code": "for i in range(3): print(i, flush=True)"}),
                ("run_python_code", {"code": SLEEP_PAST_TIMEOUT, "timeout_s": 1}),
            ],
            in_tmp,
        )
        await agent.arun("go")
    hi, streamed, timed_out = model.tool_messages
    assert (hi, streamed) == ("hi", "0\n1\n2\n")
    assert timed_out.startswith("[LA-TOOL]") and "may still take effect" in timed_out
