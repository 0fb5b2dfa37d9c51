"""Runs the daemon's tools through OmniCoreAgent, offline; prints what happened as JSON.

Run by tests/integration/test_integration_omnicore.py in a Python >= 3.12
venv with omnicoreagent (tests/py312.py), against the daemon the test serves:

    python omnicore_driver.py <target>

Every call goes through OmniCoreAgent's own run: `OmniCoreAgent.run` asks the
model (a scripted one: `LLMConnection.llm_call` answers from a list, so nothing
leaves the machine), resolves the tool call against the agent's catalog and
runs it through its governed runner, `ToolExecutor` and our `ToolRegistry`.
What the driver prints for each call is the tool message the model is sent
next, decoded from its JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from typing import Any

from omnicoreagent import OmniCoreAgent
from omnicoreagent.core.llm import LLMConnection
from omnicoreagent.core.model_protocol import ModelTurn, ToolRequest

from tooljail import AsyncClient, Client
from tooljail.errors import ToolNotFoundError
from tooljail.integrations import omnicore

SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(5)\nprint('finished')"


class ScriptedModel:
    """The model: asks for the scripted tool calls one per turn, then answers "done".

    It keeps every tool message it is sent: what a real model would read.
    """

    def __init__(self) -> None:
        self.script: list[tuple[str, dict[str, Any]]] = []
        self.seen: dict[str, Any] = {}

    async def llm_call(self, messages: list[Any], tools: Any = None, **_: Any) -> ModelTurn:
        for message in messages:
            role = message.get("role") if isinstance(message, dict) else message.role
            if role == "tool":
                call_id = (
                    message["tool_call_id"] if isinstance(message, dict) else message.tool_call_id
                )
                content = message["content"] if isinstance(message, dict) else message.content
                self.seen[call_id] = json.loads(content)
        if not self.script:
            return ModelTurn(content="done", finish_reason="stop")
        name, arguments = self.script.pop(0)
        request = ToolRequest(
            id=f"call_{len(self.seen)}", name=name, arguments=json.dumps(arguments)
        )
        return ModelTurn(tool_calls=(request,), finish_reason="tool_calls")


MODEL = ScriptedModel()


async def _scripted_call(
    self: Any, messages: list[Any], tools: Any = None, **kwargs: Any
) -> ModelTurn:
    return await MODEL.llm_call(messages, tools, **kwargs)


LLMConnection.llm_call = _scripted_call  # type: ignore[method-assign]


def make_agent(tools: Any, **agent_config: Any) -> OmniCoreAgent:
    return OmniCoreAgent(
        name="tooljail_test",
        system_instruction="Use the tools.",
        model_config={"provider": "openai", "model": "gpt-4o-mini", "api_key": "sk-offline"},
        local_tools=tools,
        agent_config=agent_config or None,
    )


async def run_agent(
    tools: Any, calls: list[tuple[str, dict[str, Any]]], **agent_config: Any
) -> dict[str, Any]:
    """Runs one agent over `calls`; its answer and the tool messages the model read, in order."""
    MODEL.script, MODEL.seen = list(calls), {}
    agent = make_agent(tools, **agent_config)
    answer = await agent.run("go")
    return {
        "answer": answer.get("response"),
        "status": answer.get("status"),
        "tools": list(MODEL.seen.values()),
    }


async def main(target: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Client(target) as client:
        served = {t.name: t for t in client.list_tools()}
        out["client_name"] = client.client_name
        # With no names, the tools an agent takes with its defaults.
        tools = omnicore.registry(client)
        reserved = omnicore.WORKSPACE_TOOL_NAMES | omnicore.ARTIFACT_TOOL_NAMES
        out["registry"] = {
            "type": type(tools).__module__ + "." + type(tools).__name__,
            "names": [t.name for t in tools.list_tools()],
            "served": sorted(served),
            "served_default": sorted(set(served) - reserved),
            "idempotent": {t.name: t.idempotent for t in tools.list_tools()},
            "served_idempotent": {n: t.idempotent for n, t in served.items()},
            "schema": tools.get_tool("execute_python_code").inputSchema,
            "is_async": tools.get_tool("execute_python_code").is_async,
        }
        picked = omnicore.registry(client, ["ls", "execute_python_code"], workspace_tools=True)
        out["picked"] = [t.name for t in picked.list_tools()]
        try:
            omnicore.registry(client, ["no_such_tool"])
        except ToolNotFoundError as e:
            out["unknown"] = str(e)
        try:
            omnicore.registry(client, ["ls", "read_artifact"])
        except ValueError as e:
            out["reserved_asked"] = str(e)
        # An agent with every default setting takes the default registry and runs it.
        out["calls"] = await run_agent(
            tools,
            [
                ("execute_python_code", {"code": "print(6 * 7)"}),
                ("execute_python_code", {"code": "raise ValueError('bad input')"}),
                ("execute_python_code", {"code": SLEEPS, "timeout_s": 1}),
                (
                    "execute_python_code_stream",
                    {"code": "for i in range(3): print('line', i, flush=True)"},
                ),
            ],
        )
        # The daemon's workspace and artifact tools: for an agent with its own off.
        everything = omnicore.registry(client, workspace_tools=True, artifact_tools=True)
        out["everything"] = sorted(t.name for t in everything.list_tools())
        try:
            await make_agent(everything).run("go")
        except ValueError as e:
            out["reserved"] = str(e)
        out["own_off"] = await run_agent(
            everything,
            [
                ("write_file", {"path": "notes.txt", "content": "hello"}),
                ("list_artifacts", {}),
            ],
            enable_workspace_files=False,
            tool_offload={"enabled": False},
        )
        # A refusal, straight through the registry's own execute_tool: the
        # agent checks a call's arguments against the schema before it runs.
        out["refused"] = await tools.execute_tool("execute_python_code", {"code": 1})
        out["user"] = await run_agent(
            omnicore.registry(client, ["lookup"]),
            [("lookup", {"key": "k1", "tags": ["a", "b"], "limit": 2})],
        )
        with client.session() as session:
            out["session"] = await run_agent(
                omnicore.registry(session, ["execute_python_code"]),
                [
                    ("execute_python_code", {"code": "x = 41"}),
                    ("execute_python_code", {"code": "print(x + 1)"}),
                ],
            )
    async with AsyncClient(target) as aclient:
        # registry() with an async client is the coroutine aregistry() gives.
        atools = await omnicore.registry(aclient, ["execute_python_code"])
        out["async_is_async"] = atools.get_tool("execute_python_code").is_async
        out["async"] = await run_agent(
            atools, [("execute_python_code", {"code": "print('async')"})]
        )
    return out


if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp(prefix="omnicore-driver-"))  # the agent keeps its files in the cwd
    print(json.dumps(asyncio.run(main(sys.argv[1])), default=str))
