"""The daemon's error edge: one table, agreeing with the SDK's and the proto's lists."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import grpc
import pytest

import tooljaild
from tooljail.errors import (
    ERRORS_BY_CODE,
    InternalError,
    InvalidRequestError,
    JournalUnavailableError,
    ShuttingDownError,
    TooljailError,
    ToolNotFoundError,
)
from tooljail.v1 import tooljail_pb2 as pb
from tooljaild.app.errors import DaemonError
from tooljaild.edge.errors import STATUS_BY_ERROR, status_for, wire_error
from tooljaild.journal.store import JournalError
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.images.build import ImageError
from tooljaild.sandbox.isolation import IsolationError
from tooljaild.settings.config import ConfigError


def _proto_codes() -> set[str]:
    names = pb.ErrorCode.keys()
    return {n.removeprefix("ERROR_CODE_").lower() for n in names if n != "ERROR_CODE_UNSPECIFIED"}


def test_daemon_table_sdk_table_and_proto_list_agree() -> None:
    daemon_codes = {cls.code for cls in STATUS_BY_ERROR}
    assert daemon_codes == set(ERRORS_BY_CODE) == _proto_codes()
    for code, cls in ERRORS_BY_CODE.items():
        assert cls in STATUS_BY_ERROR, code  # the very class, not a lookalike


def test_the_status_of_each_code_is_the_one_the_proto_documents() -> None:
    # In the proto, the comment above each ErrorCode value starts with its status.
    proto = Path(__file__).resolve().parents[2] / "proto/tooljail/v1/tooljail.proto"
    lines = [line.strip() for line in proto.read_text().splitlines()]
    for cls, status in STATUS_BY_ERROR.items():
        at = next(
            i for i, line in enumerate(lines) if line.startswith(f"ERROR_CODE_{cls.code.upper()} =")
        )
        first = at - 1
        while lines[first - 1].startswith("//"):
            first -= 1
        assert lines[first].startswith(f"// {status.name}:"), (cls, status, lines[first])


def _daemon_exception_classes() -> list[type[BaseException]]:
    """Every class derived from an exception that the daemon's modules define."""
    found: list[type[BaseException]] = []
    root = Path(inspect.getfile(tooljaild)).parent
    for path in sorted(root.rglob("*.py")):
        if path.parent.name == "runner":
            # Stdlib-only code that runs inside sandboxes: it cannot import the
            # tree, and its errors reach the daemon as result frames, never raised.
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception"))
                for b in node.bases
            ):
                module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
                mod = __import__(module, fromlist=[node.name])
                found.append(getattr(mod, node.name))
    return found


def test_every_exception_the_daemon_defines_is_in_the_tree() -> None:
    classes = _daemon_exception_classes()
    assert {SandboxError, IsolationError, ConfigError, ImageError, DaemonError} <= set(classes)
    for cls in classes:
        assert issubclass(cls, TooljailError), cls


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (ToolNotFoundError("x"), grpc.StatusCode.NOT_FOUND, "tool_not_found"),
        (ShuttingDownError("x"), grpc.StatusCode.UNAVAILABLE, "shutting_down"),
        (
            JournalError("full", Path("/s/journal.sqlite3"), "full"),
            grpc.StatusCode.UNAVAILABLE,
            "journal_unavailable",
        ),
        (SandboxError("no sandbox could be started"), grpc.StatusCode.INTERNAL, "internal"),
        (DaemonError("x"), grpc.StatusCode.INTERNAL, "internal"),
        (TooljailError("x"), grpc.StatusCode.INTERNAL, "internal"),
        (RecursionError("maximum recursion depth"), grpc.StatusCode.INVALID_ARGUMENT, None),
        (KeyError("boom"), grpc.StatusCode.INTERNAL, "internal"),
    ],
)
def test_wire_error_maps_anything_to_a_listed_code(
    exc: BaseException, status: grpc.StatusCode, code: str | None
) -> None:
    got = wire_error(exc)
    assert status_for(got) == status
    assert got.code in ERRORS_BY_CODE
    if code is not None:
        assert got.code == code
    if isinstance(exc, RecursionError):
        assert isinstance(got, InvalidRequestError)
        assert "nests too deeply" in got.message
        assert "maximum recursion" not in got.message  # not Python's text
    if isinstance(exc, SandboxError):
        assert isinstance(got, InternalError)
        assert got.message == "no sandbox could be started"


def test_a_journal_error_is_the_public_journal_unavailable_error() -> None:
    exc = JournalError("unwritable", Path("/s/j"), "cannot write /s/j")
    assert isinstance(exc, JournalUnavailableError)
    assert (exc.reason, exc.code) == ("unwritable", "journal_unavailable")
    assert wire_error(exc) is exc
