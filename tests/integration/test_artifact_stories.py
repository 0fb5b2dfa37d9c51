"""What the issue says users will try with artifacts, end to end: through a real
daemon over gRPC, with the SDK's own methods and the built-in artifact tools.
(Object storage's story is in test_object_storage.py, with its S3 server.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon
from tooljail import ArtifactNotFoundError, CallStatus, Client

pytestmark = pytest.mark.timeout(600)

FIFTY_MB = """
import sys
for i in range(50 * 2**20 // 64):
    sys.stdout.write("%063d\\n" % i)
"""

FIVE_MB_TOOL = '''
from tooljail import tool


@tool
def five_megabytes() -> list:
    """A 5 MB list."""
    return [f"item {i:07d}" + "." * 40 for i in range(100_000)]
'''


def _expected_50_mb() -> bytes:
    return b"".join(b"%063d\n" % i for i in range(50 * 2**20 // 64))


def test_fifty_megabytes_of_output_come_back_whole_and_searchable(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": FIFTY_MB}, tool_timeout_s=120)
        assert result.status is CallStatus.SUCCESS, result.message
        assert result.truncated
        assert len(json.dumps(result.data)) < 2 * 2**20  # the result stays small
        spilled = [a for a in result.artifacts if a.mime_type.startswith("text/")]
        assert spilled, result.artifacts
        artifact = spilled[0]
        assert artifact.artifact_id in result.message
        whole = client.get_artifact(artifact.artifact_id)
        assert len(whole) == 50 * 2**20
        assert hashlib.sha256(whole).digest() == hashlib.sha256(_expected_50_mb()).digest()
        middle = 400_000
        found = client.call(
            "search_artifact",
            {"artifact_id": artifact.artifact_id, "pattern": f"^0+{middle}$"},
        )
        assert found.status is CallStatus.SUCCESS, found.message
        text = json.dumps(found.data)
        assert f"{middle:063d}" in text and str(middle + 1) in text  # the line and its number


def test_a_five_megabyte_result_is_a_preview_and_an_id_read_by_pages(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "big.py").write_text(FIVE_MB_TOOL)
    served = serve(tools_dirs=[tools])
    with Client(served.target) as client:
        result = client.call("five_megabytes", {})
        assert result.status is CallStatus.SUCCESS, result.message
        assert len(json.dumps(result.data)) < 64 * 1024
        [offloaded] = [a for a in result.artifacts if a.mime_type == "application/json"]
        assert offloaded.artifact_id in result.message
        assert offloaded.size_bytes > 5_000_000
        page = client.call(
            "read_artifact", {"artifact_id": offloaded.artifact_id, "offset": 50_000, "limit": 3}
        )
        assert page.status is CallStatus.SUCCESS, page.message
        assert "item 0049999" in json.dumps(page.data)
        whole = json.loads(client.get_artifact(offloaded.artifact_id))
        assert len(whole) == 100_000 and whole[-1].startswith("item 0099999")


def test_a_plot_comes_back_as_a_png(
    serve: Callable[..., ServedDaemon], plotting_python: str
) -> None:
    served = serve(sandbox={"python": plotting_python})
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code}, tool_timeout_s=120)
        assert result.status is CallStatus.SUCCESS, (result.message, result.data)
        [png] = result.artifacts
        assert png.mime_type == "image/png"
        data = client.get_artifact(png.artifact_id)
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) == png.size_bytes


def test_someone_elses_artifact_is_not_found(serve: Callable[..., ServedDaemon]) -> None:
    served = serve()
    with Client(served.target, client_name="agent-a") as mine:
        result = mine.call("execute_python_code", {"code": FIFTY_MB.replace("50 *", "2 *")})
        [artifact] = [a for a in result.artifacts if a.mime_type.startswith("text/")]
        assert mine.get_artifact(artifact.artifact_id)
    with Client(served.target, client_name="agent-b") as theirs:
        with pytest.raises(ArtifactNotFoundError) as caught:
            theirs.get_artifact(artifact.artifact_id)
        assert "agent-a" not in str(caught.value)
        assert theirs.list_artifacts() == []
        read = theirs.call("read_artifact", {"artifact_id": artifact.artifact_id})
        assert read.status is CallStatus.ERROR
        assert "0000000" not in json.dumps(read.data)


def test_files_written_to_outputs_come_back_and_in_a_session_only_new_ones(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    write = (
        "import os\nos.makedirs('outputs/sub', exist_ok=True)\n"
        "open('outputs/report.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open('outputs/sub/n.bin', 'wb').write(bytes(range(256)))\n"
    )
    with Client(served.target) as client:
        fresh = client.call("execute_python_code", {"code": write})
        assert fresh.status is CallStatus.SUCCESS, fresh.message
        names = {a.name: a for a in fresh.artifacts}
        assert set(names) == {"outputs/report.csv", "outputs/sub/n.bin"}, fresh.artifacts
        assert names["outputs/report.csv"].mime_type == "text/csv"
        assert client.get_artifact(names["outputs/sub/n.bin"].artifact_id) == bytes(range(256))
        with client.session() as s:
            first = s.call("execute_python_code", {"code": write})
            assert len(first.artifacts) == 2, first.artifacts
            again = s.call(
                "execute_python_code", {"code": "open('outputs/new.txt', 'w').write('x')"}
            )
            assert [a.name for a in again.artifacts] == ["outputs/new.txt"]
            listed = client.list_artifacts(session_id=s.id)
            assert {a.name for a in listed} == {
                "outputs/report.csv",
                "outputs/sub/n.bin",
                "outputs/new.txt",
            }
