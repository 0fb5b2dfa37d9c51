"""Pins the public surface of `tooljail`, and what importing it pulls in."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

import tooljail
import tooljail.errors

EXPECTED_ALL = {
    "ApprovalEvent",
    "ApprovalEventKind",
    "CallPage",
    "AsyncClient",
    "BadTimeoutError",
    "CallIdConflictError",
    "CallInfo",
    "CallNotFoundError",
    "CallState",
    "CallStatus",
    "Client",
    "DaemonUnavailableError",
    "Diagnostic",
    "Effect",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "JournalUnavailableError",
    "Output",
    "OverloadedError",
    "ShuttingDownError",
    "StreamKind",
    "ToolError",
    "ToolInfo",
    "ToolNotFoundError",
    "ToolResult",
    "TooljailError",
    "TransportError",
    "UnknownError",
    "__version__",
    "default_target",
    "tool",
    "InvalidPathError",
    "SessionEndedError",
    "SessionNotFoundError",
    "WorkspaceFileNotFoundError",
    "WorkspaceFullError",
    "SessionInfo",
    "SessionState",
    "Session",
    "AsyncSession",
    "ArtifactGoneError",
    "ArtifactInfo",
    "ArtifactNotFoundError",
    "ArtifactRef",
    # Operations and API security (issue 14).
    "Usage",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "NotAwaitingApprovalError",
    # Egress (issue 23).
    "EgressDenial",
    "EgressUnavailableError",
    "SessionRequiredError",
    "ProcessNotFoundError",
    "ProcessLimitError",
    "PortUnreachableError",
    # A terminal and forwarded ports (issue 24).
    "Terminal",
    "AsyncTerminal",
    "Forward",
    "AsyncForward",
    "Processes",
    "AsyncProcesses",
    # Workspace change events (issue 24, item 5).
    "Watch",
    "AsyncWatch",
}


def test_all_is_pinned() -> None:
    assert set(tooljail.__all__) == EXPECTED_ALL
    assert len(tooljail.__all__) == len(EXPECTED_ALL), "duplicate names in __all__"


def test_every_exported_name_exists() -> None:
    for name in tooljail.__all__:
        assert hasattr(tooljail, name), name


EXPECTED_ERRORS_ALL = {
    "ERRORS_BY_CODE",
    "BadTimeoutError",
    "CallIdConflictError",
    "CallNotFoundError",
    "DaemonUnavailableError",
    "InternalError",
    "InvalidArgumentsError",
    "InvalidRequestError",
    "JournalUnavailableError",
    "OverloadedError",
    "ShuttingDownError",
    "ToolNotFoundError",
    "TooljailError",
    "TransportError",
    "UnknownError",
    "InvalidPathError",
    "SessionEndedError",
    "SessionNotFoundError",
    "WorkspaceFileNotFoundError",
    "WorkspaceFullError",
    "ArtifactGoneError",
    "ArtifactNotFoundError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "NotAwaitingApprovalError",
    "EgressUnavailableError",
    "SessionRequiredError",
    "ProcessNotFoundError",
    "ProcessLimitError",
    "PortUnreachableError",
}


def _exception_classes(module: object) -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    }


def test_the_error_tree_is_public_as_tooljail_errors() -> None:
    assert set(tooljail.errors.__all__) == EXPECTED_ERRORS_ALL
    assert len(tooljail.errors.__all__) == len(EXPECTED_ERRORS_ALL)
    for name in tooljail.errors.__all__:
        assert hasattr(tooljail.errors, name), name


def test_every_exception_class_is_exported() -> None:
    exported = set(tooljail.__all__)
    for name in _exception_classes(tooljail.errors):
        assert name in exported, name
        assert getattr(tooljail, name) is getattr(tooljail.errors, name)


def test_the_daemon_is_forbidden_every_private_module_of_the_sdk() -> None:
    """The contract lint-imports runs ("The daemon imports only the SDK's public
    modules") names the SDK's private modules one by one (import-linter has no
    wildcard for a name's prefix): a new private module must join it."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith("The daemon imports only")]
    assert contract["source_modules"] == ["tooljaild"]
    graph = grimp.build_graph("tooljail", cache_dir=None)
    private = {m for m in graph.modules if any(part.startswith("_") for part in m.split(".")[1:])}
    assert private >= {"tooljail._types", "tooljail._wire", "tooljail._tooldef"}
    assert set(contract["forbidden_modules"]) == private


def test_the_error_tree_has_one_home() -> None:
    # The `tooljail._errors` shim is gone (issue 22): the tree is `tooljail.errors`.
    assert not (Path(tooljail.errors.__file__).parent / "_errors.py").exists()


def test_public_names_are_defined_in_private_modules() -> None:
    # The error tree is the one public module that defines classes itself.
    for name in tooljail.__all__:
        obj = getattr(tooljail, name)
        module = getattr(obj, "__module__", None)
        if module is not None and isinstance(obj, type):
            assert module.startswith("tooljail._") or module == "tooljail.errors", (name, module)


def test_version() -> None:
    assert tooljail.__version__ == "0.1.0"


def test_import_does_not_pull_in_daemon_or_its_dependencies() -> None:
    # A fresh interpreter: this test process may already have them imported.
    code = (
        "import sys, tooljail\n"
        "bad = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('tooljaild', 'docker', 'psutil'))\n"
        "assert not bad, bad\n"
    )
    # Find tooljail where this process found it, installed or not (`errors`, as
    # the package's own __file__ is None under some editable installs).
    package_root = str(Path(tooljail.errors.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_the_testing_harness_surface_is_pinned() -> None:
    import tooljail.testing

    assert tooljail.testing.__all__ == ["daemon", "wait_for"]


def test_the_clients_artifact_methods_and_name_are_public() -> None:
    import inspect

    for cls in (tooljail.Client, tooljail.AsyncClient):
        for method in ("get_artifact", "list_artifacts", "delete_artifact"):
            assert callable(getattr(cls, method)), (cls, method)
            is_async = inspect.iscoroutinefunction(getattr(cls, method))
            assert is_async is (cls is tooljail.AsyncClient), (cls, method)
        assert "client_name" in inspect.signature(cls).parameters
        assert isinstance(inspect.getattr_static(cls, "client_name"), property)
    listing = inspect.signature(tooljail.Client.list_artifacts).parameters
    assert [p for p in listing if p != "self"] == ["call_id", "session_id"]
