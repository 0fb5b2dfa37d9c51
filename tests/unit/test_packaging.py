"""The wheel carries every package of the source tree (they are listed by hand)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, source in config["package-dir"].items():
        base = ROOT / source
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            found.add(".".join([name, *relative.parts]))
    missing = found - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
