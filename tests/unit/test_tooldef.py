"""Tests of tool definition: `@tool` schema inference, `tool_info`, `collect_tools`."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest

from tooljail._tooldef import collect_tools, tool


def _schema(func: Any) -> dict[str, Any]:
    return func.__tooljail_tool__["input_schema"]  # type: ignore[no-any-return]


def _prop(func: Any, name: str) -> dict[str, Any]:
    return _schema(func)["properties"][name]  # type: ignore[no-any-return]


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        if callable(value):
            value.__module__ = name
        setattr(module, key, value)
    return module


def test_primitive_hints_map_to_json_types() -> None:
    @tool
    def f(s: str, i: int, x: float, b: bool) -> None:
        pass

    schema = _schema(f)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["s", "i", "x", "b"]
    assert schema["properties"] == {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "x": {"type": "number"},
        "b": {"type": "boolean"},
    }


def test_containers_map_to_arrays_and_objects() -> None:
    @tool
    def f(
        names: list[str],
        pair: tuple[int, str],
        many: tuple[int, ...],
        unique: set[int],
        weights: dict[str, float],
        raw: dict,  # type: ignore[type-arg]
        anything: list,  # type: ignore[type-arg]
    ) -> None:
        pass

    assert _prop(f, "names") == {"type": "array", "items": {"type": "string"}}
    assert _prop(f, "pair") == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert _prop(f, "many") == {"type": "array", "items": {"type": "integer"}}
    assert _prop(f, "unique") == {
        "type": "array",
        "items": {"type": "integer"},
        "uniqueItems": True,
    }
    assert _prop(f, "weights") == {"type": "object", "additionalProperties": {"type": "number"}}
    assert _prop(f, "raw") == {"type": "object"}
    assert _prop(f, "anything") == {"type": "array"}


def test_literal_becomes_enum_typed_when_uniform() -> None:
    @tool
    def f(mode: Literal["fast", "slow"], level: Literal[1, 2], mixed: Literal["a", 1]) -> None:
        pass

    assert _prop(f, "mode") == {"type": "string", "enum": ["fast", "slow"]}
    assert _prop(f, "level") == {"type": "integer", "enum": [1, 2]}
    assert _prop(f, "mixed") == {"enum": ["a", 1]}


def test_optional_and_unions_become_any_of() -> None:
    @tool
    def f(a: Optional[int], b: str | None, c: int | str, d: list[int] | None = None) -> None:  # noqa: UP045
        pass

    assert _prop(f, "a") == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert _prop(f, "b") == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert _prop(f, "c") == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert _prop(f, "d") == {
        "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}],
        "default": None,
    }


def test_any_and_missing_hints_accept_anything() -> None:
    @tool
    def f(a: Any, b) -> None:  # type: ignore[no-untyped-def]
        pass

    assert _prop(f, "a") == {}
    assert _prop(f, "b") == {}
    assert _schema(f)["required"] == ["a", "b"]


def test_defaults_are_not_required_and_json_defaults_are_kept() -> None:
    @tool
    def f(q: str, n: int = 5, pair: tuple[int, int] = (1, 2), path: Any = Path(".")) -> None:
        pass

    schema = _schema(f)
    assert schema["required"] == ["q"]
    assert schema["properties"]["n"] == {"type": "integer", "default": 5}
    # Tuples are carried as JSON arrays; a non-JSON default stays out of the schema.
    assert schema["properties"]["pair"]["default"] == [1, 2]
    assert schema["properties"]["path"] == {}
    json.dumps(f.__tooljail_tool__)


class Thing:
    pass


def test_unsupported_hint_raises_naming_the_parameter() -> None:
    with pytest.raises(TypeError, match=r"parameter 'thing'.*no JSON Schema equivalent"):

        @tool
        def f(n: int, thing: Thing) -> None:
            pass


def test_unresolvable_hint_raises_naming_the_parameter() -> None:
    class Local:
        pass

    # With postponed annotations a local class cannot be resolved from the module.
    with pytest.raises(TypeError, match="parameter 'thing': cannot resolve type hint 'Local'"):

        @tool
        def f(n: int, thing: Local) -> None:
            pass


def test_positional_only_parameters_are_rejected() -> None:
    with pytest.raises(TypeError, match="positional-only parameter 'a'"):

        @tool
        def f(a: int, /) -> None:
            pass


def test_non_string_dict_keys_are_rejected() -> None:
    with pytest.raises(TypeError, match=r"parameter 'd'.*keys must be str"):

        @tool
        def f(d: dict[int, str]) -> None:
            pass


def test_var_args_and_kwargs_are_rejected() -> None:
    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def f(*args: int) -> None:
            pass

    with pytest.raises(TypeError, match=r"\*\*kwargs"):

        @tool
        def g(**kwargs: int) -> None:
            pass


def test_docstring_gives_description_and_parameter_texts() -> None:
    @tool
    def search(query: str, limit: int = 10, verbose: bool = False) -> list[str]:
        """Search the index for documents.

        Returns matches best first.

        Args:
            query (str): Words to look for;
                quotes make a phrase.
            limit: How many results at most.

        verbose: Print progress.
        Returns:
            The matching titles.
        """
        return []

    spec = search.__tooljail_tool__
    assert spec["description"] == "Search the index for documents."
    props = spec["input_schema"]["properties"]
    assert props["query"]["description"] == "Words to look for; quotes make a phrase."
    assert props["limit"]["description"] == "How many results at most."
    assert props["verbose"]["description"] == "Print progress."


def test_annotated_string_describes_a_parameter() -> None:
    @tool
    def f(n: Annotated[int, "How many times."]) -> None:
        pass

    assert _prop(f, "n") == {"description": "How many times.", "type": "integer"}


def test_decorator_with_options_keeps_function_callable() -> None:
    @tool(name="adder", description="Add two numbers.", timeout_s=5, idempotent=True)
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    spec = add.__tooljail_tool__
    assert spec["name"] == "adder"
    assert spec["description"] == "Add two numbers."
    assert spec["style"] == "decorator"
    # Only the options given are set, so the daemon's defaults apply to the rest.
    assert spec["options"] == {"timeout_s": 5, "idempotent": True, "streaming": False}


def test_bare_decorator_options_hold_only_streaming() -> None:
    @tool
    def f() -> None:
        pass

    assert f.__tooljail_tool__["options"] == {"streaming": False}
    assert f.__tooljail_tool__["name"] == "f"


def test_generators_stream_by_default() -> None:
    @tool
    def gen(n: int) -> Iterator[int]:
        yield from range(n)

    @tool
    async def agen(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @tool(streaming=False)
    def quiet() -> Iterator[int]:
        yield 1

    assert gen.__tooljail_tool__["options"]["streaming"] is True
    assert agen.__tooljail_tool__["options"]["streaming"] is True
    assert quiet.__tooljail_tool__["options"]["streaming"] is False


def _lightagent_weather(city: str, days: int = 1) -> str:
    return city


def test_tool_info_is_converted_to_a_spec() -> None:
    def weather(city: str, days: int = 1) -> str:
        return city

    weather.tool_info = {  # type: ignore[attr-defined]
        "tool_name": "get_weather",
        "tool_title": "Weather",
        "tool_description": "Get the weather forecast of a city.",
        "tool_params": [
            {"name": "city", "description": "City name", "type": "string", "required": True},
            {"name": "days", "description": "Days ahead", "type": "integer", "required": False},
        ],
        "timeout_s": 20,
        "idempotent": True,
    }
    specs, problems = collect_tools(_module("weather_mod", weather=weather))

    assert problems == []
    assert specs == [
        {
            "function": "weather",
            "name": "get_weather",
            "description": "Get the weather forecast of a city.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer", "description": "Days ahead"},
                },
                "required": ["city"],
                "additionalProperties": False,
                "title": "Weather",
            },
            "options": {"timeout_s": 20, "idempotent": True, "streaming": False},
            "style": "tool_info",
        }
    ]


def test_tool_info_required_defaults_to_the_signature() -> None:
    def f(a: str, b: str = "") -> None:
        pass

    f.tool_info = {  # type: ignore[attr-defined]
        "tool_name": "f",
        "tool_params": [{"name": "a", "type": "string"}, {"name": "b", "type": "string"}],
    }
    specs, _ = collect_tools(_module("m_req", f=f))
    assert specs[0]["input_schema"]["required"] == ["a"]


@pytest.mark.parametrize(
    ("tool_info", "fragment"),
    [
        ({"tool_params": []}, "tool_name"),
        ({"tool_name": "x", "tool_params": {"a": 1}}, "must be a list"),
        ({"tool_name": "x", "tool_params": [{"type": "string"}]}, "needs a string 'name'"),
        ({"tool_name": "x", "tool_params": [{"name": "a", "type": "text"}]}, "unknown type"),
        ("not a dict", "must be a dict"),
    ],
)
def test_malformed_tool_info_is_a_problem_not_an_exception(tool_info: Any, fragment: str) -> None:
    def bad(a: str) -> None:
        pass

    bad.tool_info = tool_info  # type: ignore[attr-defined]
    specs, problems = collect_tools(_module("m_bad", bad=bad))

    assert specs == []
    assert len(problems) == 1
    assert problems[0]["severity"] == "error"
    assert problems[0]["code"] == "bad_tool_info"
    assert problems[0]["tool"] == "bad"
    assert fragment in problems[0]["message"]


def test_tool_info_param_mismatch_is_a_warning() -> None:
    def f(a: str) -> None:
        pass

    f.tool_info = {"tool_name": "f", "tool_params": [{"name": "b", "type": "string"}]}  # type: ignore[attr-defined]
    specs, problems = collect_tools(_module("m_mis", f=f))
    assert [s["name"] for s in specs] == ["f"]
    assert {p["code"] for p in problems} == {"param_mismatch"}
    assert all(p["severity"] == "warning" for p in problems)


def test_collect_tools_keeps_good_tools_next_to_bad_ones() -> None:
    @tool
    def good(x: int) -> int:
        return x

    def broken() -> None:
        pass

    broken.tool_info = {"tool_params": []}  # type: ignore[attr-defined]

    def helper() -> None:
        pass

    module = _module("m_mixed", good=good, broken=broken, helper=helper, alias=good, n=3)
    specs, problems = collect_tools(module)

    # The helper is not a tool, and an alias of a tool is not a second tool.
    assert [(s["name"], s["function"]) for s in specs] == [("good", "good")]
    assert [p["code"] for p in problems] == ["bad_tool_info"]


def test_collect_tools_ignores_tool_info_of_imported_functions() -> None:
    _lightagent_weather.tool_info = {"tool_name": "w"}  # type: ignore[attr-defined]
    try:
        module = types.ModuleType("elsewhere")
        module.w = _lightagent_weather  # type: ignore[attr-defined]
        specs, problems = collect_tools(module)
    finally:
        del _lightagent_weather.tool_info  # type: ignore[attr-defined]
    assert specs == []
    assert [p["code"] for p in problems] == ["no_tools"]


def test_collect_tools_reports_a_module_without_tools() -> None:
    specs, problems = collect_tools(types.ModuleType("empty"))
    assert specs == []
    assert len(problems) == 1
    assert problems[0]["severity"] == "warning"
    assert problems[0]["code"] == "no_tools"


def test_collect_tools_survives_a_corrupt_spec_attribute() -> None:
    def f() -> None:
        pass

    f.__tooljail_tool__ = "garbage"  # type: ignore[attr-defined]
    specs, problems = collect_tools(_module("m_corrupt", f=f))
    assert specs == []
    assert [p["code"] for p in problems] == ["bad_tool"]


def test_collect_tools_on_an_imported_file(tmp_path: Path) -> None:
    source = tmp_path / "my_tools.py"
    source.write_text(
        "from tooljail._tooldef import tool\n"
        "\n"
        "@tool\n"
        "def shout(text: str) -> str:\n"
        '    """Upper-case a text.\n'
        "\n"
        "    text: The text to shout.\n"
        '    """\n'
        "    return text.upper()\n"
        "\n"
        "def helper() -> None:\n"
        "    pass\n"
    )
    spec = importlib.util.spec_from_file_location("my_tools_under_test", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        specs, problems = collect_tools(module)
    finally:
        del sys.modules[spec.name]

    assert problems == []
    assert len(specs) == 1
    assert specs[0]["function"] == "shout"
    assert specs[0]["description"] == "Upper-case a text."
    assert specs[0]["input_schema"]["properties"]["text"] == {
        "description": "The text to shout.",
        "type": "string",
    }
    json.dumps(specs)
