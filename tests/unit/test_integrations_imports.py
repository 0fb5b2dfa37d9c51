"""`pip install tooljail` without any framework: nothing of them is imported until
asked for, and asking for one that is missing says which package to install.

Each check runs in a fresh interpreter, where a framework is made missing by
`sys.modules[name] = None` (what Python does for a module that cannot be imported).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
