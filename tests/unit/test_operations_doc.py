"""docs/operations.md names only settings that exist: a renamed key fails here.

The settings reference (docs/settings.md) is generated; the operations guide is
written by hand, so this test holds its `snake_case` names to the model.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pydantic import BaseModel

from tooljaild.auth.policy import Identity
from tooljaild.settings.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"

NOT_SETTINGS = {
    "awaiting_approval": "a call state",
    "client_name": "the SDK's Client argument (a label within a uid)",
    "daemon_restart": "why a session ended",
    "retry_after_s": "an OverloadedError attribute",
}
"""Names the guide uses that are neither settings nor tokens-file keys."""


def _names(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names.add(name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= _names(annotation)
    return names


def test_every_setting_the_guide_names_exists() -> None:
    known = _names(Settings) | {f.name for f in dataclasses.fields(Identity)} | set(NOT_SETTINGS)
    # `name`, or `[table] name`.
    named = set(re.findall(r"`(?:\[[a-z.]+\] )?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", DOC.read_text()))
    # Metric names are the metrics module's to check (docs/metrics.md).
    unknown = sorted(n for n in named - known if not n.startswith("tooljail_"))
    assert not unknown, f"docs/operations.md names settings that do not exist: {unknown}"
    assert {"shutdown_grace_s", "tokens_file", "sandbox_memory_bytes"} <= named


def test_the_guide_links_the_generated_reference() -> None:
    text = DOC.read_text()
    assert "(settings.md)" in text
    assert (ROOT / "docs" / "settings.md").exists()
