"""Pins the public surface of `tooljail`, and what importing it pulls in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tooljail
from tooljail import _errors

EXPECTED_ALL = {
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
    "InvalidArgumentsError",
    "InvalidRequestError",
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
    "__version__",
    "default_target",
    "tool",
}


def test_all_is_pinned() -> None:
    assert set(tooljail.__all__) == EXPECTED_ALL
    assert len(tooljail.__all__) == len(EXPECTED_ALL), "duplicate names in __all__"


def test_every_exported_name_exists() -> None:
    for name in tooljail.__all__:
        assert hasattr(tooljail, name), name


def test_every_exception_class_is_exported() -> None:
    exported = set(tooljail.__all__)
    for name, obj in vars(_errors).items():
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert name in exported, name


def test_public_names_are_defined_in_private_modules() -> None:
    for name in tooljail.__all__:
        obj = getattr(tooljail, name)
        module = getattr(obj, "__module__", None)
        if module is not None and isinstance(obj, type):
            assert module.startswith("tooljail._"), (name, module)


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
    # Find tooljail where this process found it, installed or not (`_errors`, as
    # the package's own __file__ is None under some editable installs).
    package_root = str(Path(_errors.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
