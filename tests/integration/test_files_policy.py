"""The session RPCs that do a tool's work keep that tool's policy, through a real
daemon with a tokens file: an upload is a write_file, a download a read_file,
and a session is a sandbox to run tools in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon
from tooljail import Client
from tooljail.errors import PermissionDeniedError

POLICIES = {
    "writer": "",
    "no-write": 'tools = ["execute_python_code", "ls", "read_file"]',
    "no-read": 'tools = ["execute_python_code", "write_file"]',
    "approved-write": 'approval = ["write_file"]',
    "artifacts-only": 'tools = ["list_artifacts", "read_artifact"]',
}
TOKENS = {name: f"token-of-{name}" for name in POLICIES}


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def served(serve: Callable[..., ServedDaemon], tmp_path: Path) -> ServedDaemon:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        "".join(
            f'[identities.{name}]\ntoken_sha256 = "{_sha256(TOKENS[name])}"\n{policy}\n'
            for name, policy in POLICIES.items()
        )
    )
    tokens.chmod(0o600)
    return serve(auth={"tokens_file": str(tokens)})


@pytest.fixture
def client(served: ServedDaemon) -> Iterator[Callable[[str], Client]]:
    made: list[Client] = []

    def make(name: str) -> Client:
        made.append(Client(served.target, token=TOKENS[name]))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _exists(client: Client, session_id: str, path: str) -> bool:
    code = f"import os; print(os.path.exists({path!r}))"
    result = client.call("execute_python_code", {"code": code}, session_id=session_id)
    return bool(result.data["stdout"].strip() == "True")


def test_an_identity_without_write_file_cannot_upload(client: Callable[[str], Client]) -> None:
    c = client("no-write")
    with c.session() as s:
        with pytest.raises(PermissionDeniedError, match="'write_file'"):
            s.upload("planted.txt", b"x")
        assert not _exists(c, s.id, "planted.txt")


def test_an_upload_is_refused_where_write_file_needs_approval(
    client: Callable[[str], Client],
) -> None:
    c = client("approved-write")
    with c.session() as s:
        with pytest.raises(PermissionDeniedError, match="approver") as info:
            s.upload("planted.txt", b"x")
        assert "Call the write_file tool" in info.value.message
        assert not _exists(c, s.id, "planted.txt")


def test_an_identity_without_read_file_cannot_download(client: Callable[[str], Client]) -> None:
    c = client("no-read")
    with c.session() as s:
        s.call("write_file", {"path": "secret.txt", "content": "s3cret"})
        with pytest.raises(PermissionDeniedError, match="'read_file'"):
            s.download("secret.txt")


def test_an_identity_with_no_sandboxed_tool_opens_no_session(
    client: Callable[[str], Client],
) -> None:
    with pytest.raises(PermissionDeniedError, match="no tool that runs in a sandbox"):
        client("artifacts-only").session()


def test_an_allowed_identity_uploads_and_downloads(client: Callable[[str], Client]) -> None:
    with client("writer").session() as s:
        assert s.upload("ok.txt", b"fine") == 4
        assert s.download("ok.txt") == b"fine"
