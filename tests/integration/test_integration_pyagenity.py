"""PyAgenity runs the daemon's tools: `tooljail.integrations.pyagenity` through a graph's ToolNode.

pyagenity 0.3.9 needs Python >= 3.12, so the graph runs in its own
venv (`pyagenity_python`, tests/py312.py): the daemon is served here, and
pyagenity_driver.py runs compiled `StateGraph`s against it, a scripted model
node asking for each tool call (offline) and a `ToolNode` of our functions
running it, once for the module; each test reads one part of what it printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tooljail.testing
from tests.py312 import lookup_tools_dir, run_driver
from tooljail.common import arguments_sha256
from tooljail.integrations._ids import namespaced

pytestmark = pytest.mark.timeout(600)  # the first run builds the venv (a minute or two)

DRIVER = Path(__file__).with_name("pyagenity_driver.py")
FIRST_IMPORT = Path(__file__).with_name("pyagenity_first_import.py")


@pytest.fixture(scope="module")
def driven(pyagenity_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tools_dir = lookup_tools_dir(tmp_path_factory.mktemp("pyagenity"))
    with tooljail.testing.daemon(pool_size=2, tools_dirs=[str(tools_dir)]) as target:
        return run_driver(pyagenity_python, DRIVER, target)


def result_of(message: dict[str, Any]) -> dict[str, Any]:
    """The message's ToolResultBlock."""
    (block,) = [b for b in message["content"] if b["type"] == "tool_result"]
    return block


def error_of(message: dict[str, Any]) -> dict[str, Any]:
    """The message's ErrorBlock."""
    (block,) = [b for b in message["content"] if b["type"] == "error"]
    return block


def test_every_tool_is_a_function_named_as_served(driven: dict[str, Any]) -> None:
    assert sorted(driven["names"]) == driven["served"]
    assert driven["picked"] == ["ls", "execute_python_code"]
    assert "no_such_tool" in driven["unknown"]


def test_toolnode_reads_the_schema_from_real_annotations(driven: dict[str, Any]) -> None:
    signature = driven["signatures"]["lookup"]
    assert signature.startswith("(*, key: str, mode: Literal['exact', 'prefix'] = 'exact'")
    assert "tags: list[str] | None = None, limit: int = 3, ratio: float = 0.5" in signature
    assert "timeout_s: float | None = None, tool_call_id: str" in signature
    lookup = driven["schemas"]["lookup"]
    properties = lookup["parameters"]["properties"]
    assert lookup["parameters"]["required"] == ["key"]
    assert properties["key"] == {"type": "string"}
    assert properties["mode"] == {"type": "string", "enum": ["exact", "prefix"], "default": "exact"}
    assert properties["tags"]["type"] == "array"
    assert properties["tags"]["items"]["type"] == "string"
    assert properties["limit"] == {"type": "integer", "default": 3}
    assert properties["ratio"] == {"type": "number", "default": 0.5}
    assert properties["strict"] == {"type": "boolean", "default": False}
    assert properties["timeout_s"]["type"] == "number"
    assert "tool_call_id" not in properties  # injected by ToolNode, not asked of the model
    # ToolNode's schema has no parameter descriptions: the docstring carries them.
    assert "    limit: how many answers at most" in lookup["description"]
    assert "may still take effect" in lookup["description"]


def test_sync_client_gives_sync_functions_and_a_streaming_coroutine(driven: dict[str, Any]) -> None:
    assert driven["coroutines"] == {
        "execute_python_code": False,
        "lookup": False,
        "execute_python_code_stream": True,
    }


def test_success_is_a_completed_tool_result_for_the_injected_call_id(
    driven: dict[str, Any],
) -> None:
    success = driven["run"]["messages"][0]
    assert success["role"] == "tool"
    assert result_of(success) == {
        "type": "tool_result",
        "call_id": success["metadata"]["tool_call_id"],
        "output": "42",
        "is_error": False,
        "status": "completed",
    }
    assert success["metadata"]["tooljail"]["status"] == "success"


def test_the_injected_call_id_is_the_call_id_and_the_arguments_hash_is_in_the_metadata(
    driven: dict[str, Any],
) -> None:
    for message in driven["run"]["messages"]:
        tool_call_id = message["metadata"]["tool_call_id"]
        details = message["metadata"]["tooljail"]
        assert details["call_id"] == namespaced(driven["client_name"], tool_call_id), details
    success = driven["run"]["messages"][0]["metadata"]["tooljail"]
    assert success["arguments_sha256"] == arguments_sha256({"code": "print(6 * 7)"})
    refused = driven["run"]["messages"][4]["metadata"]["tooljail"]  # {"code": 1}: no result
    assert refused["status"] == "refused"
    assert refused["arguments_sha256"] == arguments_sha256({"code": 1})


def test_a_tool_error_is_a_failed_result_with_an_error_block(driven: dict[str, Any]) -> None:
    error = driven["run"]["messages"][1]
    assert result_of(error)["is_error"] is True
    assert result_of(error)["status"] == "failed"
    assert "ValueError: bad input" in result_of(error)["output"]
    assert error_of(error)["message"] == result_of(error)["output"]
    assert error_of(error)["code"] == "error"


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(driven: dict[str, Any]) -> None:
    timeout = driven["run"]["messages"][2]
    text = result_of(timeout)["output"]
    assert result_of(timeout)["is_error"] is True
    assert "may still take effect" in text
    call_id = error_of(timeout)["data"]["call_id"]
    assert call_id in text
    assert error_of(timeout)["code"] == "timeout"
    assert error_of(timeout)["data"]["still_running"] is False
    assert "started" in text
    assert "finished" not in text


def test_a_streaming_tool_publishes_chunks_while_it_runs(driven: dict[str, Any]) -> None:
    run = driven["run"]
    streamed = run["messages"][3]
    call = streamed["metadata"]["tool_call_id"]
    assert result_of(streamed)["output"] == "line 0\nline 1\nline 2"
    chunks = [c for c in run["chunks"] if c["tool_call_id"] == call]
    assert [c["content"] for c in chunks] == ["line 0\n", "line 1\n", "line 2\n"]
    assert [c["index"] for c in chunks] == [0, 1, 2]
    assert {c["type"] for c in chunks} == {"progress"}
    assert {tuple(c["content_type"]) for c in chunks} == {("text",)}
    # The first line arrived while the call still ran (it sleeps 0.2 s a line).
    assert chunks[0]["at"] < run["ends"][call] - 0.2


def test_a_refusal_is_a_failed_result_saying_the_tool_did_not_run(driven: dict[str, Any]) -> None:
    refused = driven["run"]["messages"][4]
    assert result_of(refused)["is_error"] is True
    assert "expects string" in result_of(refused)["output"]
    assert "did not run" in result_of(refused)["output"]
    assert error_of(refused)["code"] == "refused"


def test_a_user_tool_gets_the_models_arguments_and_its_defaults(driven: dict[str, Any]) -> None:
    looked_up = result_of(driven["run"]["messages"][5])["output"]
    assert '"key": "k1"' in looked_up
    assert '"tags": ["a", "b"]' in looked_up
    assert '"limit": 2' in looked_up
    assert '"mode": "exact"' in looked_up


def test_a_sessions_tools_share_its_interpreter(driven: dict[str, Any]) -> None:
    first, second = driven["session"]["messages"]
    assert result_of(first)["is_error"] is False
    assert result_of(second)["output"] == "42"


def test_an_async_client_gives_coroutine_functions_that_stream(driven: dict[str, Any]) -> None:
    assert driven["async_coroutines"] == {
        "execute_python_code": True,
        "execute_python_code_stream": True,
    }
    ran, streamed = driven["async"]["messages"]
    assert result_of(ran)["output"] == "async"
    call = streamed["metadata"]["tool_call_id"]
    chunks = [c["content"] for c in driven["async"]["chunks"] if c["tool_call_id"] == call]
    assert chunks == ["line 0\n", "line 1\n", "line 2\n"]


def test_the_adapter_imported_first_works_as_the_issues_user_ran_it(
    pyagenity_python: str,
) -> None:
    # Issue 21: `from tooljail.integrations import pyagenity` before anything of
    # pyagenity's, then `pyagenity.tools(client)`, said pyagenity "is not
    # installed" on 0.3.9 (its `pyagenity.utils` imported first is a circular
    # import, and the module the adapter asked for had moved to `pyagenity.state`).
    with tooljail.testing.daemon(pool_size=1) as target:
        done = run_driver(pyagenity_python, FIRST_IMPORT, target)
    assert done["before"] == []  # nothing of pyagenity's was imported before the adapter
    assert "execute_python_code" in done["names"]
    assert done["toolnode_tools"] == done["names"]
    assert result_of(done["message"]) == {
        "type": "tool_result",
        "call_id": "call_1",
        "output": "42",
        "is_error": False,
        "status": "completed",
    }
