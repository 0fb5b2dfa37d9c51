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


def _metadata(version: str) -> str:
    """A distribution's METADATA: what importlib.metadata reads the version from."""
    return f"Metadata-Version: 2.1\nName: pyagenity\nVersion: {version}\n"


# pyagenity 0.3.9's shape: `pyagenity.utils` imported first is a circular import
# (utils -> state.reducers -> state -> state.agent_state -> utils' START, not yet
# set); entered by `graph` (as its users do), or by `state`, everything imports.
# Message and its blocks live in `state` (0.3.3 had them in `utils.message`).
PYAGENITY_LIKE = {
    "pyagenity/__init__.py": "",
    "pyagenity-0.3.9.dist-info/METADATA": _metadata("0.3.9"),
    "pyagenity/graph/__init__.py": """
        from pyagenity.state import Message
        class ToolNode: ...
        """,
    "pyagenity/graph/tool_node/__init__.py": "",
    "pyagenity/graph/tool_node/constants.py": "INJECTABLE_PARAMS = {'tool_call_id', 'state'}\n",
    "pyagenity/utils/__init__.py": """
        from pyagenity.state.reducers import add_messages
        from .constants import START
        """,
    "pyagenity/utils/constants.py": "START = '__start__'\n",
    "pyagenity/state/__init__.py": """
        from .agent_state import AgentState
        from .message import Message
        from .message_block import ErrorBlock, ToolResultBlock
        """,
    "pyagenity/state/agent_state.py": """
        from pyagenity.utils import START
        class AgentState: ...
        """,
    "pyagenity/state/reducers.py": "def add_messages(left, right): return left + right\n",
    "pyagenity/state/message.py": "class Message: ...\n",
    "pyagenity/state/message_block.py": "class ToolResultBlock: ...\nclass ErrorBlock: ...\n",
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
    # The package's own shape: its utils first fails, its entry first works.
    first = _python(check.format("import pyagenity.utils"))
    assert "circular import" in first.stderr
    assert _python(check.format("import pyagenity.graph")).stdout.strip() == "imported"
    # The adapter, imported before anything of pyagenity's (the reported case).
    done = _python(check.format("from tooljail.integrations import pyagenity"))
    assert done.stdout.strip() == "imported", done.stderr


# pyagenity 0.3.3's shape: Message in `utils.message`; a `state` package without it.
PYAGENITY_0_3_3_LIKE = {
    **{
        k: v
        for k, v in PYAGENITY_LIKE.items()
        if not k.startswith(("pyagenity-", "pyagenity/state"))
    },
    "pyagenity-0.3.3.dist-info/METADATA": _metadata("0.3.3"),
    "pyagenity/graph/__init__.py": "class ToolNode: ...\n",
    "pyagenity/utils/__init__.py": "",
    "pyagenity/utils/message.py": "class Message: ...\n",
    "pyagenity/state/__init__.py": "from .agent_state import AgentState\n",
    "pyagenity/state/agent_state.py": "class AgentState: ...\n",
}


def test_an_older_pyagenity_names_the_release_to_install(tmp_path: Path) -> None:
    _package(tmp_path, PYAGENITY_0_3_3_LIKE)
    done = _python(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        try:
            from tooljail.integrations import pyagenity
        except ImportError as e:
            print(e)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "needs pyagenity >= 0.3.9, and 0.3.3 is installed" in done.stdout
    assert "pip install -U 'tooljail[pyagenity]'" in done.stdout
    assert "not installed" not in done.stdout
