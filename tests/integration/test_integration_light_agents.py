"""The daemon's tools inside light-agents, run by its own dispatch, against a real daemon.

Offline: `OpenAIAgent` talks to a module-level OpenAI client, which the tests
replace with a scripted stand-in that asks for the tool calls a test names,
then answers with the tool output it was sent. Between them runs
light-agents' own code: `agent_run`, `process_model_response`,
`process_tools` (arguments parsed with `literal_eval`, the agent's own keyword
arguments merged in) and `ToolRegistry.execute_tool`.

light-agents 0.1.2's `light_agents.ai_agents` package cannot be imported with
httpx >= 0.28 (its `claude_agent` module builds an anthropic 0.36 client at
import, which passes httpx a `proxies` argument httpx no longer takes), so the
tests load `openai_agent.py` itself, without the package's `__init__`.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import light_agents
import pytest
from light_agents.core.tool_registry import ToolRegistry
from light_agents.schemas import Message, MessageRole, MessageType, ToolResponseSchema
from light_agents.serializers.tools import openai_tool_calling_serializer
from openai.types.chat import ChatCompletion, ChatCompletionMessageToolCall

import tooljail.testing
from tooljail import AsyncClient, CallState, Client, ToolNotFoundError
from tooljail.integrations import light_agents as adapter

pytestmark = pytest.mark.timeout(60)

SLEEP_PAST_TIMEOUT = "import time\nprint('started', flush=True)\ntime.sleep(5)"

USER_TOOL = '''
from tooljail import tool


@tool
def label(name: str, description: str = "") -> str:
    """Label a thing.

    name: what the thing is called
    description: what it is
    """
    return f"{name}: {description}"
'''


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tools:
        # The sandbox's uid reads the tool directory (a temporary one is 0700).
        Path(tools).chmod(0o755)
        (Path(tools) / "labels.py").write_text(textwrap.dedent(USER_TOOL))
        with tooljail.testing.daemon(pool_size=2, tools_dirs=[tools]) as t:
            yield t


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target) as c:
        yield c


@pytest.fixture
def openai_agent(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """light-agents' `openai_agent` module, loaded from its file (see the module doc)."""
    monkeypatch.setenv("OPENAI_API_KEY", "offline")
    path = Path(light_agents.__file__).parent / "ai_agents" / "openai_agent.py"
    spec = importlib.util.spec_from_file_location("light_agents_openai_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedModel:
    """An offline stand-in for the OpenAI client `OpenAIAgent` calls.

    Each request answers with the next tool call of `calls`; once they are
    done, with a reply quoting the last tool message it was sent.
    """

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = list(calls)
        self.tools: list[dict[str, Any]] = []
        self.tool_messages: list[str] = []
        self.chat = self
        self.completions = self

    def create(self, **params: Any) -> ChatCompletion:
        self.tools = params.get("tools") or []
        self.tool_messages = [m["content"] for m in params["messages"] if m["role"] == "tool"]
        step = len(self.tool_messages)
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


def _run_agent(
    module: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tools: list[adapter.DaemonTool],
    calls: list[tuple[str, dict[str, Any]]],
) -> tuple[list[Any], ScriptedModel]:
    """Runs `OpenAIAgent` on one user message; returns the messages it made and the model."""
    model = ScriptedModel(calls)
    monkeypatch.setattr(module, "client", model)
    agent = module.OpenAIAgent(
        tools=tools, tools_serializer=adapter.openai_serializer, verbose=False
    )
    thread = [Message(role=MessageRole.USER, type=MessageType.TEXT, content="go")]
    return agent.agent_run(thread, user_id="u-1"), model


def test_success_through_the_openai_agent(
    client: Client, openai_agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages, model = _run_agent(
        openai_agent,
        monkeypatch,
        adapter.tools(client, ["execute_python_code"]),
        [("execute_python_code", {"code": "print(2 ** 100)"})],
    )
    used, reply = messages
    assert used.tool_outputs == str(2**100) and not used.is_error
    # The call's outcome rides in the message's external fields, beside the
    # agent's own (`user_id`), not in what the model reads.
    assert used.external_fields["tooljail"]["status"] == "success"
    assert used.external_fields["user_id"] == "u-1"
    assert reply.content == f"model read: {2**100}"
    (schema,) = model.tools
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert schema["function"]["parameters"]["properties"]["timeout_s"]["type"] == "number"


def test_a_tool_error_is_an_error_response(
    client: Client, openai_agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tool,) = adapter.tools(client, ["execute_python_code"])
    registry = ToolRegistry()  # what the agent's process_tools calls
    registry.register(tool)
    direct = registry.execute_tool(
        "execute_python_code", {"code": "raise ValueError('no such row')"}, verbose=False
    )
    assert isinstance(direct, ToolResponseSchema)
    assert direct.is_error and "ValueError: no such row" in direct.content
    messages, model = _run_agent(
        openai_agent,
        monkeypatch,
        [tool],
        [("execute_python_code", {"code": "raise ValueError('no such row')"})],
    )
    used, _ = messages
    assert "ValueError: no such row" in model.tool_messages[0]
    assert used.external_fields["tooljail"]["status"] == "error"


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(
    client: Client, openai_agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages, model = _run_agent(
        openai_agent,
        monkeypatch,
        adapter.tools(client, ["execute_python_code"]),
        [("execute_python_code", {"code": SLEEP_PAST_TIMEOUT, "timeout_s": 1})],
    )
    (read,) = model.tool_messages
    assert "may still take effect" in read
    outcome = messages[0].external_fields["tooljail"]
    assert outcome["status"] == "timeout" and outcome["call_id"] in read
    assert client.get_call(outcome["call_id"]).state is CallState.TIMED_OUT


def test_a_streaming_tool_reaches_on_output_as_it_runs_and_the_model_whole(
    client: Client, openai_agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[float, str, str]] = []
    tools = adapter.tools(
        client,
        ["execute_python_code_stream"],
        on_output=lambda name, text: seen.append((time.monotonic(), name, text)),
    )
    code = "import time\nprint('first', flush=True)\ntime.sleep(0.8)\nprint('second', flush=True)"
    _, model = _run_agent(
        openai_agent, monkeypatch, tools, [("execute_python_code_stream", {"code": code})]
    )
    assert [name for _, name, _ in seen] == ["execute_python_code_stream"] * len(seen)
    assert "first" in seen[0][2] and "second" not in seen[0][2]
    assert "second" in "".join(text for _, _, text in seen[1:])
    assert seen[-1][0] - seen[0][0] > 0.5
    assert model.tool_messages == ["first\nsecond"]


def test_a_sessions_tools_share_its_interpreter(
    client: Client, openai_agent: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    with client.session() as session:
        messages, model = _run_agent(
            openai_agent,
            monkeypatch,
            adapter.tools(session, ["execute_python_code"]),
            [
                ("execute_python_code", {"code": "x = 41"}),
                ("execute_python_code", {"code": "print(x + 1)"}),
            ],
        )
    assert model.tool_messages == ["(no output)", "42"]
    assert messages[-1].content == "model read: 42"


def test_the_agents_extra_keyword_arguments_do_not_reach_the_daemon(client: Client) -> None:
    registry = ToolRegistry()
    registry.register_tools(adapter.tools(client, ["execute_python_code"]))
    response = registry.execute_tool(
        "execute_python_code",
        {"code": "print('ok')"},
        verbose=False,
        calling_from_inside_agent_run=True,
        thread_owner="someone",
    )
    assert not response.is_error and response.content == "ok"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_light_agents_own_serializer_reads_the_declared_fields(client: Client) -> None:
    # light-agents' serializer reads `model_fields` off the instance, which
    # pydantic 2.11 deprecates: its warning is light-agents', not ours.
    (read_file, label) = adapter.tools(client, ["read_file", "label"])
    schema = openai_tool_calling_serializer(read_file)["function"]
    assert schema["parameters"]["required"] == ["path"]
    properties = schema["parameters"]["properties"]
    assert properties["path"]["type"] == "string"
    assert properties["limit"] == {"type": "number", "description": "Most lines to return."}
    # `name` and `description` are ToolBaseSchema's own fields: the parameters
    # of that name are not fields (light-agents' schema lacks them), yet they
    # reach the daemon, and openai_serializer shows them.
    theirs = openai_tool_calling_serializer(label)["function"]
    assert theirs["name"] == "label"
    assert not {"name", "description"} & set(theirs["parameters"]["properties"])
    full = adapter.openai_serializer(label)["function"]["parameters"]
    assert {"name", "description", "timeout_s"} <= set(full["properties"])
    response = label.run(name="kettle", description="boils water", verbose=True)
    assert response.content == "kettle: boils water"


async def test_an_async_client_is_refused_by_name(target: str) -> None:
    async with AsyncClient(target) as client:
        with pytest.raises(TypeError, match="synchronously"):
            adapter.tools(client)  # type: ignore[arg-type]


def test_a_name_the_daemon_does_not_serve_is_named(client: Client) -> None:
    with pytest.raises(ToolNotFoundError, match="no_such_tool"):
        adapter.tools(client, ["no_such_tool"])
