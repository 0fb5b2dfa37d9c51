"""OmniCoreAgent runs the daemon's tools: `tooljail.integrations.omnicore` through its own agent.

omnicoreagent 0.6 needs Python >= 3.12, so the agent runs in its own venv
(`omnicore_python`, tests/py312.py): the daemon is served here, and
omnicore_driver.py runs `OmniCoreAgent.run` against it with a scripted model
(offline: no key, nothing leaves the machine), once for the module; each test
reads one part of what it printed: the tool messages the model was sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tooljail.testing
from tests.py312 import lookup_tools_dir, run_driver
from tooljail.integrations._ids import namespaced

pytestmark = pytest.mark.timeout(600)  # the first run builds the venv (a minute or two)

DRIVER = Path(__file__).with_name("omnicore_driver.py")


@pytest.fixture(scope="module")
def driven(omnicore_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tools_dir = lookup_tools_dir(tmp_path_factory.mktemp("omnicore"))
    with tooljail.testing.daemon(pool_size=2, tools_dirs=[str(tools_dir)]) as target:
        return run_driver(omnicore_python, DRIVER, target)


def test_registry_holds_every_tool_with_schema_and_idempotent_flag(driven: dict[str, Any]) -> None:
    registry = driven["registry"]
    assert registry["type"] == "omnicoreagent.core.tools.local_tools_registry.ToolRegistry"
    # All the daemon serves but the names an agent's defaults reserve.
    assert sorted(registry["names"]) == registry["served_default"]
    assert not {"ls", "write_file", "read_artifact"} & set(registry["names"])
    assert "lookup" in registry["names"]
    assert registry["idempotent"] == {
        n: v for n, v in registry["served_idempotent"].items() if n in registry["names"]
    }
    assert registry["idempotent"]["lookup"] is True
    assert registry["idempotent"]["execute_python_code"] is False
    schema = registry["schema"]
    assert schema["required"] == ["code"]
    assert schema["properties"]["timeout_s"]["type"] == "number"
    assert "may still take effect" in schema["properties"]["timeout_s"]["description"]
    assert registry["is_async"] is False  # a Client: sync functions, run on a worker thread


def test_names_pick_tools_in_order_and_an_unknown_one_is_named(driven: dict[str, Any]) -> None:
    assert driven["picked"] == ["ls", "execute_python_code"]
    assert "no_such_tool" in driven["unknown"]
    assert "execute_python_code" in driven["unknown"]  # what is served
    # A reserved name asked for without leave says how to serve it.
    asked = driven["reserved_asked"]
    assert "'ls'" in asked and "'read_artifact'" in asked
    assert "workspace_tools=True" in asked and "enable_workspace_files" in asked


def test_an_agent_with_its_default_settings_runs_the_default_registry(
    driven: dict[str, Any],
) -> None:
    # make_agent sets no agent_config: workspace files and offloading are on.
    assert driven["calls"]["status"] == "success"
    assert [t["status"] for t in driven["calls"]["tools"]] == [
        "success", "error", "error", "success"
    ]  # fmt: skip


def test_success_reaches_the_model_as_a_success_envelope(driven: dict[str, Any]) -> None:
    success = driven["calls"]["tools"][0]
    assert success["status"] == "success"
    assert success["message"] == "42"  # the model's text
    # The daemon's data, as a program reads the daemon's own result.
    assert success["data"]["stdout"] == "42\n"
    assert success["data"]["exit_code"] == 0


def test_a_tool_error_is_an_error_envelope_with_the_traceback(driven: dict[str, Any]) -> None:
    error = driven["calls"]["tools"][1]
    assert error["status"] == "error"
    assert "ValueError: bad input" in error["message"]
    assert error["data"]["status"] == "error"
    # Its output is data too, not only text.
    assert "ValueError: bad input" in error["data"]["stderr"]
    assert error["data"]["exit_code"] == 1


def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(driven: dict[str, Any]) -> None:
    timeout = driven["calls"]["tools"][2]
    assert timeout["status"] == "error"
    assert timeout["data"]["status"] == "timeout"
    assert "may still take effect" in timeout["message"]
    assert timeout["data"]["call_id"] in timeout["message"]
    assert timeout["data"]["still_running"] is False
    assert "started" in timeout["message"]  # the output before it was stopped
    assert "finished" not in timeout["message"]
    assert timeout["data"]["stdout"] == "started\n"  # the partial output, as data


def test_a_call_runs_under_the_models_tool_call_id(driven: dict[str, Any]) -> None:
    # The scripted model names its calls call_0, call_1, ...: the timeout is the third.
    timeout = driven["calls"]["tools"][2]
    assert timeout["data"]["call_id"] == namespaced(driven["client_name"], "call_2")


def test_a_streaming_tool_returns_its_whole_output(driven: dict[str, Any]) -> None:
    streamed = driven["calls"]["tools"][3]
    assert streamed["tool_name"] == "execute_python_code_stream"
    assert streamed["status"] == "success"
    assert streamed["message"] == "line 0\nline 1\nline 2"
    assert streamed["data"]["stdout"] == "line 0\nline 1\nline 2\n"


def test_workspace_and_artifact_tools_serve_once_omnicores_own_are_off(
    driven: dict[str, Any],
) -> None:
    assert {"ls", "write_file", "read_artifact", "list_artifacts"} <= set(driven["everything"])
    # A default agent refuses them: why they are left out by default.
    assert "enable_workspace_files" in driven["reserved"]
    written, listed = driven["own_off"]["tools"]
    assert written["tool_name"] == "write_file"
    assert written["status"] == "success"
    assert written["data"]["size_bytes"] == 5
    assert listed["tool_name"] == "list_artifacts"
    assert listed["status"] == "success"
    assert "artifacts" in listed["data"]


def test_a_refusal_is_an_error_envelope_saying_the_tool_did_not_run(driven: dict[str, Any]) -> None:
    refused = driven["refused"]
    assert refused["status"] == "error"
    assert refused["data"]["status"] == "refused"
    assert "expects string" in refused["message"]
    assert "did not run" in refused["message"]


def test_a_sessions_tools_share_its_interpreter(driven: dict[str, Any]) -> None:
    session = driven["session"]["tools"]
    assert [t["status"] for t in session] == ["success", "success"]
    assert session[1]["message"] == "42"


def test_an_idempotent_user_tool_runs_with_its_arguments(driven: dict[str, Any]) -> None:
    (looked_up,) = driven["user"]["tools"]
    assert looked_up["status"] == "success"
    assert looked_up["data"]["key"] == "k1"  # the tool's value, as it returned it
    assert looked_up["data"]["tags"] == ["a", "b"]


def test_an_async_client_gives_coroutine_tools(driven: dict[str, Any]) -> None:
    assert driven["async_is_async"] is True
    (ran,) = driven["async"]["tools"]
    assert ran["status"] == "success"
    assert ran["message"] == "async"
