"""The python sandbox image, built (offline where no registry answers) and run for real."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tooljaild.sandbox.images import build as images

# Whichever test runs first builds the image: offline, that takes a minute or more.
pytestmark = [pytest.mark.docker(needs_image=False), pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    try:
        client = images.connect()
    except images.EngineUnavailableError as exc:
        pytest.skip(str(exc))  # "no Docker engine answers at ...: start it ..."
    yield client
    client.close()


@pytest.fixture(scope="module")
def python_image(engine: Any) -> images.BuildResult:
    """The current python image: built now (a minute or more offline) or found current."""
    return images.build(engine, "python", log=lambda _: None)


def run(engine: Any, image: str, code: str) -> str:
    """stdout of `python3 -c code` in a fresh container, as the image's own user."""
    output: bytes = engine.containers.run(
        image, command=["/usr/bin/python3", "-c", code], remove=True, network_disabled=True
    )
    return output.decode()


def test_build_gives_a_current_image(engine: Any, python_image: images.BuildResult) -> None:
    status = python_image.status
    assert status.state is images.State.CURRENT
    assert images.image_status(engine, "python") == status
    image = engine.images.get(status.moving_tag)
    assert image.id == status.image_id
    assert image.labels[images.LABEL_IMAGE] == "python"
    assert image.labels[images.LABEL_HASH] == status.content_hash


def test_python_3_11_as_uid_65534(engine: Any, python_image: images.BuildResult) -> None:
    out = run(
        engine,
        python_image.status.tag,
        "import os,sys; print(sys.version_info[:2], os.getuid())",
    )
    version, uid = out.strip().rsplit(" ", 1)
    assert tuple(int(n) for n in version.strip("()").split(",")) >= (3, 11), out
    assert int(uid) == 65534, out


def test_empty_workspace_and_no_setuid_binaries(
    engine: Any, python_image: images.BuildResult
) -> None:
    code = """
import json, os, stat
privileged = []
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        mode = os.lstat(os.path.join(top, name)).st_mode
        if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
            privileged.append(os.path.join(top, name))
ws = os.stat("/workspace")
print(json.dumps({"cwd": os.getcwd(), "workspace": os.listdir("/workspace"),
                  "owner": [ws.st_uid, ws.st_gid], "gid": os.getgid(), "setuid": privileged}))
"""
    found = json.loads(run(engine, python_image.status.tag, code))
    assert found == {
        "cwd": "/workspace",
        "workspace": [],
        "owner": [65534, 65534],
        "gid": 65534,
        "setuid": [],
    }


def test_building_again_does_nothing(engine: Any, python_image: images.BuildResult) -> None:
    lines: list[str] = []
    start = time.monotonic()
    again = images.build(engine, "python", log=lines.append)
    assert time.monotonic() - start < 10
    assert not again.built
    assert again.status.image_id == python_image.status.image_id
    assert lines[-1] == f"{again.status.tag} is current: nothing to build"
