"""A daemon command where only the SDK is installed says what to install.

The real install without extras is tested in
tests/integration/test_install_sdk_only.py; here the metadata lookups are
replaced, to show which commands check and what they print.
"""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tooljaild import cli
from tooljaild.cli import extras

ROOT = Path(__file__).resolve().parents[2]


def test_the_daemon_extra_is_read_from_the_installed_metadata() -> None:
    names = extras.requirement_names("daemon")
    assert {"pydantic-settings", "psutil", "docker"} <= set(names)
    assert extras.missing_requirements("daemon") == []  # the test venv has them
    assert extras.requirement_names("no-such-extra") == []
    assert extras.requirement_names("daemon", distribution="no-such-distribution") == []


@pytest.fixture
def without_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        if name == "psutil":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(extras.metadata, "distribution", distribution)


@pytest.mark.parametrize(
    "argv",
    [["serve"], ["doctor"], ["images", "list"], ["demo"], ["tools", "--check"]],
    ids=" ".join,
)
def test_daemon_commands_without_the_extra_exit_2_naming_it(
    argv: list[str], without_psutil: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "(psutil)" in err
    assert "pip install 'tooljail[daemon]'" in err


def test_client_commands_do_not_check(
    without_psutil: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # No daemon at this target: the client command gets as far as dialling it.
    code = cli.main(["get", "--target", "unix:///nonexistent/tooljail.sock", "some-call"])
    assert code == cli.EXIT_UNAVAILABLE
    assert "pip install" not in capsys.readouterr().err


def test_the_cli_imports_only_the_stdlib_and_stdlib_only_modules_at_module_level() -> None:
    """What `tooljail call` loads must exist in a bare install (grpcio, protobuf, pydantic).

    Module level only: the handlers import the daemon's modules when they run.
    """
    cli_modules = (
        "cli/__init__",
        "cli/common",
        "cli/serve",
        "cli/calls",
        "cli/host",
        "cli/approvals",
        "cli/mcp",
        "cli/sessions",
        "cli/artifacts",
        "cli/credentials",
        "cli/extras",
        "settings/sandbox",
        "settings/egress_rules",  # a tool profile's egress rules (settings/sandbox)
    )
    ours = {f"tooljaild.{m.replace('/__init__', '').replace('/', '.')}" for m in cli_modules}
    for module in cli_modules:
        tree = ast.parse((ROOT / "daemon" / "tooljaild" / f"{module}.py").read_text())
        for node in tree.body:
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                # The SDK and its own dependency pydantic: always there (settings are pydantic).
                allowed = name in ours or name.startswith(("tooljail.", "pydantic"))
                assert allowed or name.split(".")[0] in sys.stdlib_module_names, (
                    f"tooljaild/{module}.py imports {name} at module level"
                )
