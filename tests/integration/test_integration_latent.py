"""latent-style tools: plain `async def` functions with real signatures, run on a real daemon.

The latent package is not published, so its `@tool` is stood in for by the
decorator below, which reads a function the way such decorators do: it must be
a coroutine function; its name, its docstring, `inspect.signature` and
`typing.get_type_hints` make the schema; the agent awaits `fn(**arguments)`
and shows the model the returned text, or the raised exception's.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

import pytest

import tooljail.testing
from tests.conftest import _reachable
from tooljail import AsyncClient, Client, ToolInfo
from tooljail.integrations import core, latent

PYTHON = "execute_python_code"
STREAM = "execute_python_code_stream"
SLOW = "import time\nprint('started', flush=True)\ntime.sleep(5)"
COUNTING = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)"

SHOUT = '''
from typing import Literal

from tooljail import tool


@tool
def shout(
    text: str,
    times: int = 1,
    mode: Literal["upper", "lower"] = "upper",
    tags: list[str] | None = None,
) -> str:
    """Repeat a text, loudly.

    text: what to say
    times: how many times
    """
    said = (text.upper() if mode == "upper" else text.lower()) * times
    return said + (" #" + " #".join(tags) if tags else "")
'''

JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


class LatentTool:
    """A stand-in for a latent-style `@tool`: the schema from the function itself."""

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@tool needs an async function, got {fn!r}")
        self.fn = fn
        self.name = fn.__name__
        self.description = (fn.__doc__ or "").strip()
        hints = typing.get_type_hints(fn)
        parameters = inspect.signature(fn).parameters.values()
        self.properties = {p.name: JSON_TYPES.get(hints.get(p.name), "?") for p in parameters}
        self.required = [p.name for p in parameters if p.default is inspect.Parameter.empty]

    async def __call__(self, **arguments: Any) -> str:
        """What the agent shows the model: the text, or the exception's."""
        try:
            return str(await self.fn(**arguments))
        except Exception as e:
            return f"Error: {e}"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tools_dir = _reachable(tmp_path_factory.mktemp("tools"))
    (tools_dir / "shout.py").write_text(SHOUT)
    with tooljail.testing.daemon(tools_dirs=[tools_dir], pool_size=2) as target:
        yield target


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[Client]:
    with Client(target) as client:
        yield client


@pytest.fixture(scope="module")
def registered(client: Client) -> dict[str, LatentTool]:
    """The daemon's tools as a latent-style agent registers them."""
    return {t.name: t for t in map(LatentTool, latent.tools(client, [PYTHON, STREAM, "shout"]))}


def test_each_tool_is_an_async_function_whose_signature_is_its_schema(client: Client) -> None:
    python, shout = latent.tools(client, [PYTHON, "shout"])

    assert inspect.iscoroutinefunction(python)
    assert python.__name__ == PYTHON
    assert str(inspect.signature(python)) == "(code: str, timeout_s: float = None) -> str"
    assert typing.get_type_hints(shout) == {
        "text": str,
        "times": int,
        "mode": Literal["upper", "lower"],
        "tags": list[str] | None,
        "timeout_s": float,
        "return": str,
    }
    assert list(inspect.signature(shout).parameters) == [
        "text",
        "times",
        "mode",
        "tags",
        "timeout_s",
    ]
    assert inspect.signature(shout).parameters["times"].default == 1
    assert shout.__doc__.startswith("Repeat a text, loudly.\n\nArgs:\n    text: what to say\n")
    assert "    mode: One of 'upper', 'lower'." in shout.__doc__
    assert "    timeout_s: Optional: stop the call after" in shout.__doc__
    assert shout.input_schema["properties"]["tags"]["anyOf"]  # the daemon's schema, as is


def test_a_latent_style_decorator_reads_the_schema_from_the_function(
    registered: dict[str, LatentTool],
) -> None:
    python = registered[PYTHON]

    assert python.properties == {"code": "string", "timeout_s": "number"}
    assert python.required == ["code"]
    assert python.description.startswith("Run Python 3 code")
    assert registered["shout"].required == ["text"]


async def test_success_returns_the_output_text(registered: dict[str, LatentTool]) -> None:
    assert await registered[PYTHON](code="print(2 ** 10)") == "1024"
    assert await registered["shout"](text="hi", times=2, tags=["a"]) == "HIHI #a"


async def test_a_tool_error_raises_tool_failed_with_what_the_model_reads(
    client: Client, registered: dict[str, LatentTool]
) -> None:
    (python,) = latent.tools(client, [PYTHON])

    with pytest.raises(latent.ToolFailed) as failed:
        await python(code="raise ValueError('no')")

    assert failed.value.outcome.kind is core.OutcomeKind.ERROR
    assert "ValueError: no" in str(failed.value)
    shown = await registered[PYTHON](code="raise ValueError('no')")
    assert shown.startswith("Error: The tool raised ValueError: no")


async def test_a_timeout_says_it_may_still_take_effect_and_names_the_call(
    client: Client, registered: dict[str, LatentTool]
) -> None:
    shown = await registered[PYTHON](code=SLOW, timeout_s=1)

    assert "timed out" in shown and "may still take effect" in shown
    call_id = re.search(r"Call id: ([0-9a-f]{32})", shown)
    assert call_id, shown
    assert client.get_call(call_id[1]).tool == PYTHON


async def test_bad_arguments_raise_type_error_and_nothing_is_sent(client: Client) -> None:
    (python,) = latent.tools(client, [PYTHON])

    with pytest.raises(TypeError, match="code"):
        await python(timeout_s=3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        await python(code="1", cwd="/")


async def test_a_refusal_raises_tool_failed(client: Client) -> None:
    (python,) = latent.tools(client, [PYTHON])

    with pytest.raises(latent.ToolFailed, match="did not run") as failed:
        await python(code=1)

    assert failed.value.outcome.kind is core.OutcomeKind.REFUSED


async def test_a_streaming_tool_gives_the_whole_output_and_streams_with_astream(
    client: Client, registered: dict[str, LatentTool]
) -> None:
    (stream,) = latent.tools(client, [STREAM])

    items = [item async for item in stream.astream(code=COUNTING)]

    chunks, outcome = items[:-1], items[-1]
    assert isinstance(outcome, core.Outcome) and outcome.ok
    assert len(chunks) >= 2 and "".join(map(str, chunks)) == "0\n1\n2\n"
    assert await registered[STREAM](code=COUNTING) == "0\n1\n2"


async def test_with_an_async_client_and_session(target: str) -> None:
    async with AsyncClient(target) as client:
        (python,) = await latent.tools(client, [PYTHON])
        (stream,) = await latent.tools(client, [STREAM])
        assert await python("print('async')") == "async"
        items = [item async for item in stream.astream(COUNTING)]
        async with client.session() as session:
            (in_session,) = await latent.tools(session, [PYTHON])
            await in_session(code="x = 41")
            shared = await in_session(code="print(x + 1)")

    assert len(items) >= 3 and isinstance(items[-1], core.Outcome)
    assert shared == "42"


async def test_a_sessions_tools_share_its_interpreter(client: Client) -> None:
    with client.session() as session:
        tool = LatentTool(latent.tools(session, [PYTHON])[0])
        await tool(code="x = 41")
        assert await tool(code="print(x + 1)") == "42"


def test_names_python_cannot_take_go_through_keyword_arguments(client: Client) -> None:
    info = ToolInfo(
        name="copy",
        input_schema={
            "type": "object",
            "properties": {
                "from": {"type": "string"},
                "to": {"type": ["string", "null"], "default": "."},
                "arguments": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["from"],
        },
    )
    (spec,) = core.specs_of([info])

    copy = latent._function(client, spec)
    signature = inspect.signature(copy)

    assert str(signature) == (
        "(to: Optional[str] = '.', arguments: list[int] = None, timeout_s: float = None, "
        "**_arguments) -> str"
    )
    assert latent._arguments(signature, (), {"from": "a", "to": None}) == {"from": "a", "to": None}
    assert latent._arguments(signature, ("b", [1]), {}) == {"to": "b", "arguments": [1]}
