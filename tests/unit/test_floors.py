"""The house rules that keep the daemon in floors: import contracts, no circles, module sizes.

The import contracts themselves live in pyproject.toml ([tool.importlinter])
and `scripts/test` runs `lint-imports` as a check; here a test shows that they
bite (a wrong import in a copy of the tree breaks them), that no import circle
is left in the daemon (the layers contract sees only imports between floors),
and that no module grows past its size without a reason named below.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

MAX_LINES = 500
"""A hand-written module's size, unless it is on `OVER_500` below."""
HARD_MAX_LINES = 650
"""No module of `OVER_500` may pass this either."""

OVER_500: dict[str, str] = {
    "daemon/tooljaild/sandbox/process.py": "one sandbox's life (zygote or process start, "
    "run, measure, kill, close) is one class whose steps share its state; the bwrap and "
    "zygote specs below it are built only for it",
    "daemon/tooljaild/sandbox/docker.py": "one container's life (create, connect, wait "
    "for ready, end, remove) is one class; engine, handover, seccomp, OOM are beside it",
    "daemon/tooljaild/sandbox/session_channel.py": "one session's channel: the request "
    "loop and the interrupt/restart rules it follows are read together",
    "daemon/tooljaild/journal/store.py": "one class over the calls table whose docstrings "
    "carry each write's contract, cost and failure (sessions: journal/sessions.py)",
    "daemon/tooljaild/edge/servicer.py": "one short handler per RPC of the service and the "
    "few helpers they share (the server's assembly is edge/server.py)",
    "daemon/tooljaild/app/daemon.py": "the one place where the daemon's parts are put "
    "together and taken apart in order (the steps without a daemon are app/start.py)",
    "daemon/tooljaild/calls/manager.py": "a call's three ways (a fresh sandbox, a session, "
    "the daemon itself) share one admission, one approval wait and one end, read together "
    "(the checks before it are calls/intake.py; what is remembered, calls/book.py)",
    "daemon/tooljaild/tools/builtin/artifacts.py": "four tools, each a handler and its "
    "description for a model, sharing one reading of ids, bounds and notes",
    "client/tooljail/_tooldef.py": "copied alone next to the runner into every sandbox "
    "(isolation.install_runner), where a sibling module would not resolve",
    "client/tooljail/_client.py": "the blocking client: each method's contract is its "
    "docstring, the SDK's reference (AsyncClient's point here), each body one line of a "
    "flow in _client_plans.py",
    "daemon/tooljaild/sessions/manager.py": "a session's whole life (bounds, opening with "
    "its sandbox and egress, finding, ending, file operations in its turn) read together; "
    "its egress is sessions/egress.py, its files' places sessions/transfers.py",
    "client/tooljail/_wire.py": "every conversion of the wire contract, each enum table "
    "checked one-to-one beside its conversions",
    "client/tooljail/integrations/core.py": "the one adapter core every framework module "
    "shares (schemas, results, errors for a model)",
    "client/tooljail/integrations/mcp_server.py": "the MCP bridge's server: its tools, "
    "tenants and transport checks read together",
    "daemon/tooljaild/runner/_streams.py": "the supervisor's table of streams: every op and "
    "every poll event over one set of descriptors and credits, read together (starting a "
    "process is _spawn.py, a watch _watch.py; the daemon's side sandbox/session_streams.py)",
}
"""Modules over `MAX_LINES` on purpose, each with its reason (this list replaces the
"over 500 lines on purpose" paragraphs the modules carried)."""


def _hand_written() -> list[Path]:
    files = [*(ROOT / "client").rglob("*.py"), *(ROOT / "daemon").rglob("*.py")]
    return sorted(f for f in files if "_pb2" not in f.name)


def test_no_module_grows_past_its_size_without_a_named_reason() -> None:
    too_long = []
    for path in _hand_written():
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        limit = HARD_MAX_LINES if name in OVER_500 else MAX_LINES
        if lines > limit:
            too_long.append(f"{name}: {lines} lines (at most {limit})")
    assert not too_long, "split these along their seams, or name why not:\n" + "\n".join(too_long)


def test_the_list_of_long_modules_names_only_long_modules() -> None:
    """An entry whose module shrank or went is removed, so the list stays short and true."""
    for name in OVER_500:
        path = ROOT / name
        assert path.exists(), f"{name} is listed but does not exist"
        assert len(path.read_text().splitlines()) > MAX_LINES, f"{name} needs no entry now"
    for path in _hand_written():
        text = path.read_text()
        assert "Over 500 lines" not in text, f"{path}: the reason belongs in OVER_500"


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Strongly connected components of more than one module (import circles)."""
    modules = sorted(m for m in graph.modules if m.startswith(package))
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules)
        for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return found


@pytest.mark.parametrize("package", ["tooljaild", "tooljail"])
def test_no_import_circle_in_the_daemon_or_the_sdk(package: str) -> None:
    """TYPE_CHECKING imports count: a circle through one is still a circle to a reader
    (a session names what it needs of its client as a Protocol, `_session_host`)."""
    graph = grimp.build_graph("tooljaild", "tooljail", cache_dir=None)
    assert _cycles(graph, package) == []


RUNNER_MAY_IMPORT = frozenset({"matplotlib"})
"""Beyond the standard library: matplotlib, only when a tool's own code brought it
(`_tooljail_mpl` hooks its figures into artifacts; it is the user's package)."""


def test_the_runner_imports_only_the_standard_library() -> None:
    """The forbidden contract names the daemon's libraries; this catches any other.

    Inside a sandbox the runner's files sit side by side, so they import each
    other by their flat names (`_session`, not `tooljaild.runner._session`).
    """
    runner = ROOT / "daemon" / "tooljaild" / "runner"
    siblings = {path.stem for path in runner.glob("*.py")}
    graph = grimp.build_graph("tooljaild", include_external_packages=True, cache_dir=None)
    outside = set()
    for module in graph.find_descendants("tooljaild.runner") | {"tooljaild.runner"}:
        for imported in graph.find_modules_directly_imported_by(module):
            top = imported.split(".")[0]
            if imported.startswith("tooljaild.runner") or top in siblings:
                continue
            if top not in sys.stdlib_module_names and top not in RUNNER_MAY_IMPORT:
                outside.add(f"{module} -> {imported}")
    assert not outside


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree / 'client'}{os.pathsep}{tree / 'daemon'}",
    }
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources and pyproject.toml, to break on purpose."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "sandbox_images")
    shutil.copytree(ROOT / "client", tmp_path / "client", ignore=ignore)
    shutil.copytree(ROOT / "daemon", tmp_path / "daemon", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_lint_imports_keeps_the_contracts_of_the_tree(tree: Path) -> None:
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        # A floor importing upward: the sandbox reaching for the call manager.
        (
            "daemon/tooljaild/sandbox/pool.py",
            "from tooljaild.calls import manager as _upward",
            "The daemon's floors import only downward",
        ),
        # Even under TYPE_CHECKING.
        (
            "daemon/tooljaild/settings/sandbox.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from tooljaild.tools import registry as _upward",
            "The daemon's floors import only downward",
        ),
        (
            "client/tooljail/_types.py",
            "import tooljaild.settings.config as _daemon",
            "The SDK imports neither the daemon nor the daemon's libraries",
        ),
        (
            "daemon/tooljaild/calls/terms.py",
            "import grpc as _grpc",
            "Only the edge and app floors (and the CLI) speak gRPC",
        ),
        # The daemon reaching into the SDK's private modules (the old `tooljail._errors`).
        (
            "daemon/tooljaild/calls/terms.py",
            "from tooljail import _wire as _private",
            "The daemon imports only the SDK's public modules",
        ),
        (
            "daemon/tooljaild/runner/_turn.py",
            "import pydantic as _pydantic",
            "The runner runs in the sandbox: the standard library only",
        ),
    ],
)
def test_lint_imports_fails_on_a_wrong_import(
    tree: Path, module: str, bad_import: str, contract: str
) -> None:
    path = tree / module
    path.write_text(path.read_text() + "\n" + bad_import + "\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout
