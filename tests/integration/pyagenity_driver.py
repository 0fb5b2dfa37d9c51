"""Runs the daemon's tools through a PyAgenity graph, offline; prints what happened as JSON.

Run by tests/integration/test_integration_pyagenity.py in a Python >= 3.12
venv with pyagenity 0.3.9 (tests/py312.py: it needs Python >= 3.12), against
the daemon the test serves:

    python pyagenity_driver.py <target>

Every call goes through PyAgenity's own dispatch: a compiled `StateGraph` whose
"model" node is scripted (it asks for the next tool call, offline) and whose
tool node is a `ToolNode` of our functions; the graph hands the call to the
ToolNode, which injects `tool_call_id` and builds the tool message. A
publisher on the graph collects the events a streaming tool publishes.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import sys
import time
from typing import Any

from pyagenity.graph import StateGraph, ToolNode
from pyagenity.publisher.base_publisher import BasePublisher
from pyagenity.state import AgentState, Message
from pyagenity.utils import END

from tooljail import AsyncClient, Client
from tooljail.errors import ToolNotFoundError
from tooljail.integrations import pyagenity

SLEEPS = "import time\nprint('started', flush=True)\ntime.sleep(5)\nprint('finished')"
STREAMS = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)"


class Collecting(BasePublisher):
    """The graphs' publisher: keeps every event, with when it arrived."""

    def __init__(self) -> None:
        super().__init__({})
        self.events: list[tuple[float, Any]] = []

    async def publish(self, event: Any) -> Any:
        self.events.append((time.time(), event))

    async def close(self) -> None:
        pass

    def sync_close(self) -> None:
        pass


# One publisher for every graph: pyagenity 0.3.9 (as 0.3.3) sends every event of the
# process to the first publisher a StateGraph was given (see the docs page).
PUBLISHER = Collecting()
CALL_NUMBERS = itertools.count(1)
"""Tool call ids unique in the process, to tell the graphs' events apart."""


async def run_graph(
    functions: list[Any], calls: list[tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    """Runs a graph that makes `calls` one per model turn; the tool messages and streamed chunks."""
    script = list(calls)

    def model(state: AgentState, config: dict[str, Any]) -> Message:
        if not script:
            return Message.text_message("done", role="assistant")
        name, arguments = script.pop(0)
        call = {
            "id": f"call_{next(CALL_NUMBERS)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return Message(role="assistant", content=[], tools_calls=[call])

    def route(state: AgentState) -> str:
        last = state.context[-1]
        return "TOOL" if last.role == "assistant" and last.tools_calls else END

    graph = StateGraph(publisher=PUBLISHER)
    graph.add_node("MAIN", model)
    graph.add_node("TOOL", ToolNode(functions))
    graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
    graph.add_edge("TOOL", "MAIN")
    graph.set_entry_point("MAIN")
    app = graph.compile()
    result = await app.ainvoke(
        {"messages": [Message.text_message("go")]}, config={"thread_id": str(id(script))}
    )
    for _ in range(10):  # events go out on background tasks: let them land
        await asyncio.sleep(0.01)
    tool_messages = [m.model_dump(mode="json") for m in result["messages"] if m.role == "tool"]
    # When each tool message was made (a Unix time: Message's default stamp).
    ends = {m["metadata"]["tool_call_id"]: float(m["timestamp"]) for m in tool_messages}
    chunks = [
        {
            "content": e.content,
            "tool_call_id": e.data.get("tool_call_id"),
            "index": e.data["chunk_index"],
            "type": e.event_type,
            "content_type": e.content_type,
            "at": at,
        }
        for at, e in PUBLISHER.events
        if e.event == "tool_execution"
        and "chunk_index" in e.data
        and e.data.get("tool_call_id") in ends
    ]
    return {"messages": tool_messages, "chunks": chunks, "ends": ends}


def describe(functions: list[Any]) -> dict[str, Any]:
    node = ToolNode(functions)
    return {
        "schemas": {t["function"]["name"]: t["function"] for t in node.get_local_tool()},
        "signatures": {f.__name__: str(inspect.signature(f)) for f in functions},
        "coroutines": {f.__name__: inspect.iscoroutinefunction(f) for f in functions},
    }


async def main(target: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with Client(target) as client:
        functions = pyagenity.tools(client)
        out["client_name"] = client.client_name
        out["names"] = [f.__name__ for f in functions]
        out["served"] = sorted(t.name for t in client.list_tools())
        out.update(
            describe(
                pyagenity.tools(
                    client, ["execute_python_code", "lookup", "execute_python_code_stream"]
                )
            )
        )
        out["picked"] = [f.__name__ for f in pyagenity.tools(client, ["ls", "execute_python_code"])]
        try:
            pyagenity.tools(client, ["no_such_tool"])
        except ToolNotFoundError as e:
            out["unknown"] = str(e)
        out["run"] = await run_graph(
            functions,
            [
                ("execute_python_code", {"code": "print(6 * 7)"}),
                ("execute_python_code", {"code": "raise ValueError('bad input')"}),
                ("execute_python_code", {"code": SLEEPS, "timeout_s": 1}),
                ("execute_python_code_stream", {"code": STREAMS}),
                ("execute_python_code", {"code": 1}),
                ("lookup", {"key": "k1", "tags": ["a", "b"], "limit": 2}),
            ],
        )
        with client.session() as session:
            out["session"] = await run_graph(
                pyagenity.tools(session, ["execute_python_code"]),
                [
                    ("execute_python_code", {"code": "x = 41"}),
                    ("execute_python_code", {"code": "print(x + 1)"}),
                ],
            )
    async with AsyncClient(target) as aclient:
        afunctions = await pyagenity.tools(  # the coroutine atools() gives
            aclient, ["execute_python_code", "execute_python_code_stream"]
        )
        out["async_coroutines"] = {f.__name__: inspect.iscoroutinefunction(f) for f in afunctions}
        out["async"] = await run_graph(
            afunctions,
            [
                ("execute_python_code", {"code": "print('async')"}),
                ("execute_python_code_stream", {"code": STREAMS}),
            ],
        )
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1])), default=str))
