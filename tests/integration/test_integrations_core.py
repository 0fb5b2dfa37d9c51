"""The adapters' shared core against a real daemon: specs, outcomes and their text.

Every framework adapter hands its model `Outcome.text` and maps `Outcome.kind`
to its own success or failure form; these tests hold what that text says for
each way a call can end, so each adapter's tests can stay about its framework.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import tooljail.testing
from tests.conftest import _reachable
from tooljail import AsyncClient, Client, ToolNotFoundError
from tooljail.integrations import core
from tooljail.integrations.core import Outcome, OutcomeKind

OWN_TIMEOUT_TOOL = '''
from tooljail import tool


@tool
def wait_for(timeout_s: float) -> str:
    """Says how long it was asked to wait."""
    return f"asked for {timeout_s}"
'''

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(30)"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tools = _reachable(tmp_path_factory.mktemp("tools"))
    (tools / "own.py").write_text(textwrap.dedent(OWN_TIMEOUT_TOOL))
    with tooljail.testing.daemon(pool_size=2, tools_dirs=[str(tools)]) as target:
        yield target


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target) as client:
        yield client


@pytest.fixture(scope="module")
def python(client: Client) -> core.ToolSpec:
    return core.tool_specs(client, ["execute_python_code"])[0]


def test_specs_keep_the_order_asked_and_add_a_bounded_timeout(client: Client) -> None:
    specs = core.tool_specs(client, ["read_file", "execute_python_code"])
    assert [s.name for s in specs] == ["read_file", "execute_python_code"]
    timeout = specs[1].parameters["properties"]["timeout_s"]
    assert timeout["type"] == "number" and timeout["maximum"] == specs[1].info.max_timeout_s
    assert "may still take effect" in timeout["description"]
    # The tool's own schema is untouched: `code` is still the one required argument.
    assert specs[1].parameters["required"] == ["code"]
    assert "timeout_s" not in specs[1].info.input_schema["properties"]


def test_a_tool_with_its_own_timeout_s_keeps_it(client: Client) -> None:
    (spec,) = core.tool_specs(client, ["wait_for"])
    assert "exclusiveMinimum" not in spec.parameters["properties"]["timeout_s"]
    outcome = core.run(client, spec, {"timeout_s": 2.5})
    assert outcome.ok and outcome.text == "asked for 2.5"


def test_all_tools_by_default_and_renames(client: Client) -> None:
    specs = core.tool_specs(client, renames={"execute_python_code": "run_python_code"})
    names = {s.name: s.tool for s in specs}
    assert names["run_python_code"] == "execute_python_code"
    assert {"read_file", "read_artifact", "wait_for"} <= names.keys()


def test_an_unknown_name_is_refused_naming_what_is_served(client: Client) -> None:
    with pytest.raises(ToolNotFoundError, match=r"'nope'.*it serves: .*execute_python_code"):
        core.tool_specs(client, ["execute_python_code", "nope"])


def test_success_is_the_output(client: Client, python: core.ToolSpec) -> None:
    outcome = core.run(client, python, {"code": "print(6 * 7)"})
    assert (outcome.ok, outcome.kind, outcome.text) == (True, OutcomeKind.SUCCESS, "42")
    assert outcome.data == {"stdout": "42\n", "stderr": "", "exit_code": 0}
    assert outcome.as_dict()["effect"] == "applied"


def test_a_tool_error_carries_its_message_and_traceback(
    client: Client, python: core.ToolSpec
) -> None:
    outcome = core.run(client, python, {"code": "print('before')\nraise ValueError('no luck')"})
    assert not outcome.ok and outcome.kind is OutcomeKind.ERROR
    assert outcome.text.startswith("The tool raised ValueError: no luck")
    assert "before" in outcome.text and 'File "<code>", line 2' in outcome.text
    assert outcome.text.count("Traceback") == 1


def test_a_timeout_says_it_may_still_take_effect_with_the_call_id(
    client: Client, python: core.ToolSpec
) -> None:
    outcome = core.run(client, python, {"code": SLEEP, "timeout_s": 1})
    assert outcome.kind is OutcomeKind.TIMEOUT and not outcome.ok
    assert "timed out after 1s" in outcome.text and "may still take effect" in outcome.text
    assert f"Call id: {outcome.call_id}" in outcome.text and "started" in outcome.text
    assert client.get_call(outcome.call_id).state.finished


def test_bad_arguments_and_timeouts_are_refused_and_say_the_tool_did_not_run(
    client: Client, python: core.ToolSpec
) -> None:
    cases = {
        "invalid_arguments": {"code": 1},
        "bad_timeout": {"code": "1", "timeout_s": 10**6},
    }
    for code, arguments in cases.items():
        outcome = core.run(client, python, arguments)
        assert outcome.kind is OutcomeKind.REFUSED and outcome.result is None
        assert outcome.text.startswith(f"The call was refused ({code}):")
        assert outcome.text.endswith("The tool did not run.")
    for bad in ("soon", -1, 0):
        outcome = core.run(client, python, {"code": "1", "timeout_s": bad})
        assert outcome.kind is OutcomeKind.REFUSED and "timeout_s must be" in outcome.text


def test_no_daemon_is_an_outcome_not_an_exception(python: core.ToolSpec, tmp_path: Path) -> None:
    with Client(f"unix://{tmp_path}/none.sock") as gone:
        outcome = core.run(gone, python, {"code": "print(1)"})
    assert outcome.kind is OutcomeKind.UNAVAILABLE
    assert outcome.text.startswith("The tool service is not reachable")
    assert outcome.call_id in outcome.text


def test_a_session_keeps_variables_and_an_ended_one_says_so(
    client: Client, python: core.ToolSpec
) -> None:
    with client.session() as session:
        assert core.run(session, python, {"code": "x = 41"}).ok
        assert core.run(session, python, {"code": "print(x + 1)"}).text == "42"
    outcome = core.run(session, python, {"code": "print(x)"})
    assert outcome.kind is OutcomeKind.REFUSED and "(session_ended)" in outcome.text
    assert "a new session starts empty" in outcome.text


def test_artifacts_are_named_in_the_text(client: Client, python: core.ToolSpec) -> None:
    code = "import os\nos.makedirs('outputs')\nopen('outputs/table.csv', 'w').write('a,b\\n')"
    outcome = core.run(client, python, {"code": code})
    assert outcome.ok and len(outcome.artifacts) == 1
    ref = outcome.artifacts[0]
    assert f"outputs/table.csv (text/csv, 4 bytes): artifact_id {ref.artifact_id}" in outcome.text


def test_stream_yields_text_as_it_comes_then_the_outcome(client: Client) -> None:
    (spec,) = core.tool_specs(client, ["execute_python_code_stream"])
    code = "import sys\nfor i in range(3): print(i, flush=True)\nprint('warn', file=sys.stderr)"
    items = list(core.stream(client, spec, {"code": code}))
    *chunks, last = items
    assert isinstance(last, Outcome) and last.ok
    assert all(isinstance(c, str) for c in chunks)
    assert "".join(c for c in chunks if not c.startswith("[stderr]")) == "0\n1\n2\n"
    assert "[stderr] warn\n" in chunks
    assert last.text == "0\n1\n2\nstderr:\nwarn"


def test_stream_ends_with_a_refusal_as_an_outcome(client: Client) -> None:
    (spec,) = core.tool_specs(client, ["execute_python_code_stream"])
    (only,) = list(core.stream(client, spec, {"code": "1", "timeout_s": "x"}))
    assert isinstance(only, Outcome) and only.kind is OutcomeKind.REFUSED


def test_async_run_stream_and_session(target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target) as client:
            python, streaming = await core.atool_specs(
                client, ["execute_python_code", "execute_python_code_stream"]
            )
            assert (await core.arun(client, python, {"code": "print(2)"})).text == "2"
            items = [i async for i in core.astream(client, streaming, {"code": "print(3)"})]
            assert items[0] == "3\n" and isinstance(items[-1], Outcome) and items[-1].ok
            async with client.session() as session:
                await core.arun(session, python, {"code": "y = 5"})
                assert (await core.arun(session, python, {"code": "print(y)"})).text == "5"

    asyncio.run(main())


def test_the_wrong_kind_of_target_is_a_type_error(target: str, python: core.ToolSpec) -> None:
    async def main() -> None:
        async with AsyncClient(target) as client:
            with pytest.raises(TypeError, match="use arun"):
                core.run(client, python, {"code": "1"})

    asyncio.run(main())
    with pytest.raises(TypeError, match="expected a tooljail Client"):
        core.tool_specs("unix:///x")
