"""The artifact tools through a real daemon over gRPC, called by name with the SDK.

The artifacts are put into the in-process daemon's store directly (a second
handle on its directory), owned by the client the SDK names itself as.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client, InvalidArgumentsError
from tooljaild.artifacts.store import ArtifactStore, Origin
from tooljaild.settings.artifacts import ArtifactSettings

pytestmark = pytest.mark.timeout(120)


def _owner(client: Client) -> str:
    """The name the SDK sends for this client (`tooljail-client`): the artifacts' owner."""
    for key, value in getattr(client, "_metadata", ()):
        if key == "tooljail-client":
            return str(value)
    return f"{socket.gethostname()}/{os.getpid()}"


def _put(state_dir: Path, owner: str, data: bytes, mime: str = "text/plain") -> str:
    store = ArtifactStore.open(state_dir / "artifacts", ArtifactSettings())
    try:
        return store.put("out.txt", mime, data, Origin(owner, "c-made"), "output").artifact_id
    finally:
        store.close()


@pytest.fixture
def daemon(serve: Callable[..., ServedDaemon], tmp_path: Path) -> tuple[ServedDaemon, Path]:
    state_dir = tmp_path / "state"
    return serve(state_dir=state_dir, pool_size=0), state_dir


def test_the_tools_read_a_big_output_by_name(daemon: tuple[ServedDaemon, Path]) -> None:
    served, state_dir = daemon
    lines = 200_000
    data = "".join(f"row {i}\n" for i in range(1, lines + 1)).encode()
    with Client(served.target) as client:
        artifact_id = _put(state_dir, _owner(client), data)
        page = client.call("read_artifact", {"artifact_id": artifact_id, "offset": 99_999})
        assert page.status == CallStatus.SUCCESS, page
        assert page.data["content"].splitlines()[0] == "100000\trow 100000"
        assert page.data["total_lines"] == lines
        assert "offset=" in page.data["note"]
        tail = client.call("tail_artifact", {"artifact_id": artifact_id, "lines": 2})
        assert tail.data["content"] == "199999\trow 199999\n200000\trow 200000\n"
        found = client.call(
            "search_artifact", {"artifact_id": artifact_id, "pattern": r"^row 12345\d$"}
        )
        assert found.data["matches"].splitlines()[0] == "123450:row 123450"
        assert found.data["match_count"] == 10
        listed = client.call("list_artifacts", {"call_id": "c-made"})
        assert [a["artifact_id"] for a in listed.data["artifacts"]] == [artifact_id]
        assert listed.data["artifacts"][0]["size_bytes"] == len(data)


def test_failures_a_model_can_act_on(daemon: tuple[ServedDaemon, Path]) -> None:
    served, state_dir = daemon
    with Client(served.target) as client:
        mine = _put(state_dir, _owner(client), b"a\nb\n")
        theirs = _put(state_dir, "another-agent", b"secret line\n")
        bad = client.call("search_artifact", {"artifact_id": mine, "pattern": "[a-"})
        assert bad.status == CallStatus.ERROR
        assert bad.error is not None and bad.error.type == "InvalidPattern"
        hidden = client.call("read_artifact", {"artifact_id": theirs})
        assert hidden.status == CallStatus.ERROR
        assert hidden.error is not None and hidden.error.type == "ArtifactNotFound"
        assert "secret" not in hidden.message and "secret" not in str(hidden.data)
        assert theirs not in str(client.call("list_artifacts").data)
        store = ArtifactStore.open(state_dir / "artifacts", ArtifactSettings())
        store.delete(mine, _owner(client))
        store.close()
        gone = client.call("tail_artifact", {"artifact_id": mine})
        assert gone.error is not None and gone.error.type == "ArtifactGone"
        assert "deleted" in gone.error.message
        with pytest.raises(InvalidArgumentsError):
            client.call("read_artifact", {"artifact_id": mine, "limit": 0})


def test_upload_file_without_storage_says_how_to_configure_it(
    daemon: tuple[ServedDaemon, Path],
) -> None:
    served, state_dir = daemon
    with Client(served.target) as client:
        artifact_id = _put(state_dir, _owner(client), b"x\n")
        result = client.call("upload_file", {"artifact_id": artifact_id})
        assert result.status == CallStatus.ERROR
        assert result.error is not None and result.error.type == "StorageNotConfigured"
        assert "[storage] bucket" in result.error.message
        with pytest.raises(InvalidArgumentsError, match="exactly one"):
            client.call("upload_file", {"artifact_id": artifact_id, "path": "a.txt"})
        with pytest.raises(InvalidArgumentsError, match="exactly one"):
            client.call("upload_file", {})
