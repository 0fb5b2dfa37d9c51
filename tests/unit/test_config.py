"""The daemon's settings: every table of the config refuses keys it does not know."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from tooljaild.settings.config import ConfigError, Settings, load_settings


def _nested_models(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every model reachable from `model`'s fields, with its dotted config path."""
    found: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # [egress]: Model | None
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found.append((prefix + name, kind))
            found += _nested_models(kind, f"{prefix}{name}.")
    return found


def test_every_nested_table_forbids_unknown_keys() -> None:
    # A future backend's table (or any new nested model) must not swallow typos.
    nested = _nested_models(Settings)
    assert {"limits", "sandbox", "docker", "egress", "secrets"} <= {path for path, _ in nested}
    lax = [path for path, model in nested if model.model_config.get("extra") != "forbid"]
    assert lax == []


@pytest.mark.parametrize(
    ("table", "key"),
    [("limits", "memroy_bytes"), ("sandbox", "zygot"), ("docker", "imgae")],
)
def test_an_unknown_key_in_a_nested_table_is_refused_by_name(
    tmp_path: Path, table: str, key: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"[{table}]\n{key} = 1\n")
    with pytest.raises(ConfigError, match=rf"{table}\.{key}: Extra inputs are not permitted"):
        load_settings(config)


def test_an_unknown_nested_key_from_the_environment_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLJAIL_LIMITS__MEMROY_BYTES", "1")
    with pytest.raises(ConfigError, match=r"limits\.memroy_bytes: Extra inputs are not permitted"):
        load_settings()


def test_known_nested_keys_still_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[limits]\nmemory_bytes = 1048576\n[sandbox]\nzygote = false\n")
    monkeypatch.setenv("TOOLJAIL_LIMITS__CPU_S", "30")
    s = load_settings(config)
    assert (s.limits.memory_bytes, s.limits.cpu_s, s.sandbox.zygote) == (1048576, 30, False)


def test_relative_tool_and_file_dirs_are_taken_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sandbox runs in its workspace: a relative path would point there.
    monkeypatch.chdir(tmp_path)
    settings = load_settings(tools_dirs=["my_tools"], files_dirs=[Path("scripts")])
    assert settings.tools_dirs == [tmp_path / "my_tools"]
    assert settings.files_dirs == [tmp_path / "scripts"]


def test_daemon_id_comes_from_the_file_the_environment_or_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().daemon_id == ""  # empty: the default of the address
    config = tmp_path / "config.toml"
    config.write_text('daemon_id = "from-file"\n')
    assert load_settings(config).daemon_id == "from-file"
    monkeypatch.setenv("TOOLJAIL_DAEMON_ID", "node-7:7070")
    assert load_settings(config).daemon_id == "node-7:7070"
    assert load_settings(config, daemon_id="flag").daemon_id == "flag"


@pytest.mark.parametrize("bad", ["two words", "tab\there", "x" * 129, "bell\a", "nl\n"])
def test_a_daemon_id_with_whitespace_unprintable_or_too_long_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"daemon_id: .*1\.\.128 printable characters"):
        load_settings(daemon_id=bad)


def test_a_daemon_id_of_128_printable_characters_is_fine() -> None:
    name = "pod-é:" + "x" * 122
    assert load_settings(daemon_id=name).daemon_id == name
