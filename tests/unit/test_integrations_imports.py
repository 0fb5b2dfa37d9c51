"""`pip install tooljail` without any framework: nothing of them is imported until
asked for, and asking for one that is missing says which package to install.

Each check runs in a fresh interpreter, where a framework is made missing by
`sys.modules[name] = None` (what Python does for a module that cannot be imported).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FRAMEWORKS = (
    "LightAgent",
    "omnicoreagent",
    "pyagenity",
    "light_agents",
    "langchain_core",
    "mcp",
    "openai",
    "anthropic",
)

ADAPTERS = [
    # (our module, the framework's top-level module, the extra that installs it)
    ("lightagent", "LightAgent", "lightagent"),
    ("light_agents", "light_agents", "light-agents"),
    ("pyagenity", "pyagenity", "pyagenity"),
    ("omnicore", "omnicoreagent", "omnicore"),
    ("langchain", "langchain_core", "langchain"),
    ("mcp_server", "mcp", "mcp"),
]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_the_sdk_and_the_core_import_no_framework() -> None:
    done = _python(
        f"""
        import sys
        import tooljail
        assert "tooljail.integrations" not in sys.modules
        import tooljail.integrations, tooljail.integrations.core
        from tooljail.integrations import openai, latent  # they need no framework
        print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("module", "framework", "extra"), ADAPTERS)
def test_a_missing_framework_names_the_extra_to_install(
    module: str, framework: str, extra: str
) -> None:
    done = _python(
        f"""
        import sys
        sys.modules[{framework!r}] = None
        try:
            import tooljail.integrations.{module}
        except ImportError as e:
            print(e)
        else:
            print("imported")
        """
    )
    assert done.returncode == 0, done.stderr
    assert f"pip install 'tooljail[{extra}]'" in done.stdout
    assert repr(framework.split(".")[0]) in done.stdout


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_an_installed_framework_that_fails_to_import_shows_the_real_error(
    tmp_path: Path,
) -> None:
    # Installed (findable), but its import breaks: never "not installed".
    _package(tmp_path, {"brokenfw/__init__.py": "raise ImportError('libfoo.so: cannot open')\n"})
    done = _python(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from tooljail.integrations.core import require
        try:
            require("brokenfw.inner", "brokenfw")
        except ImportError as e:
            print(e)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "not installed" not in done.stdout
    assert "'brokenfw' is installed" in done.stdout
    assert "libfoo.so: cannot open" in done.stdout


# pyagenity 0.3.9's shape: `utils.message` imported first runs into a circular
# import through `graph`; entered by `graph` (as its users do), both import.
PYAGENITY_LIKE = {
    "pyagenity/__init__.py": "",
    "pyagenity/graph/__init__.py": """
        class ToolNode: ...
        from pyagenity.utils.message import Message
        """,
    "pyagenity/graph/tool_node/__init__.py": "",
    "pyagenity/graph/tool_node/constants.py": "INJECTABLE_PARAMS = {'tool_call_id', 'state'}\n",
    "pyagenity/utils/__init__.py": "",
    "pyagenity/utils/message.py": """
        from pyagenity.graph import ToolNode
        class Message: ...
        """,
    "pyagenity/publisher/__init__.py": "",
    "pyagenity/publisher/events.py": "",
    "pyagenity/publisher/publish.py": "",
}


def test_pyagenity_is_imported_by_its_public_entry_first(tmp_path: Path) -> None:
    _package(tmp_path, PYAGENITY_LIKE)
    check = f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        {{}}
        print("imported")
        """
    # The package's own shape: its inner module first fails, its entry first works.
    first = _python(check.format("import pyagenity.utils.message"))
    assert "circular import" in first.stderr
    assert _python(check.format("import pyagenity.graph")).stdout.strip() == "imported"
    # The adapter, imported before anything of pyagenity's (the reported case).
    done = _python(check.format("from tooljail.integrations import pyagenity"))
    assert done.stdout.strip() == "imported", done.stderr
