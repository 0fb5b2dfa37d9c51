"""docs/settings.md is what scripts/gen_settings_doc.py makes of the settings model today."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from tooljaild.settings.config import Settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_settings_doc.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_settings_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60
    )


def test_the_committed_reference_is_fresh() -> None:
    proc = _check(SCRIPT)
    assert proc.returncode == 0, (
        f"docs/settings.md is stale; run: python scripts/gen_settings_doc.py\n{proc.stdout}"
    )


def test_a_stale_reference_is_detected(tmp_path: Path) -> None:
    """The check is not vacuous: a reference that differs from the model fails it."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "docs").mkdir()
    script = tmp_path / "scripts" / SCRIPT.name
    shutil.copy2(SCRIPT, script)
    stale = (ROOT / "docs" / "settings.md").read_text().replace("`pool_size`", "`pool_sise`")
    (tmp_path / "docs" / "settings.md").write_text(stale)
    proc = _check(script)
    assert proc.returncode == 1
    assert "stale docs/settings.md" in proc.stdout
    assert "pool_sise" in proc.stdout  # the diff shows what differs


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every plain key of `model`, dotted by its tables: `limits.cpu_s`."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        annotation = _script().table_model(field)  # a table, or an optional one ([egress])
        if annotation is not None:
            keys += _keys(annotation, f"{prefix}{name}.")
        elif name != "kind":  # a backend table's constant discriminator
            keys.append(f"{prefix}{name}")
    return keys


def test_every_key_is_in_the_reference_with_its_meaning_and_variable() -> None:
    text = _script().render()
    assert "(undocumented)" not in text, "give each setting an attribute docstring"
    keys = _keys(Settings)
    assert len(keys) > 50
    for dotted in keys:
        *tables, name = dotted.split(".")
        env = "TOOLJAIL_" + "__".join(p.upper() for p in dotted.split("."))
        assert f"| `{name}` |" in text, dotted
        assert f"`{env}`" in text, dotted
        if tables:
            assert f"## `[{'.'.join(tables)}]`" in text, dotted


def test_the_reference_does_not_depend_on_who_generates_it() -> None:
    """Defaults computed from the user or the machine are words, not values."""
    text = _script().render()
    for machine_specific in (str(Path.home()), "/tmp/tooljail-"):
        assert machine_specific not in text.replace("/tmp/tooljail-<uid>", "")
