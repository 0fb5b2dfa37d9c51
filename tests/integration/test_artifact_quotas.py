"""The artifact store's bounds played as hostile clients would, through a real
daemon over gRPC: floods of empty files, one client's writes against another's
artifacts, a file far larger than the bounds while it is being written, a
listing of a store with thousands of rows, forged names from a sandbox, and
bounds that do not nest.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import ServedDaemon, _reachable
from tests.holds import Probe
from tests.integration.test_artifacts_from_calls import SEND_ARTIFACT
from tooljail import ArtifactGoneError, Client
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.artifacts.store import MAX_PAGE_SIZE, ArtifactStore, Origin
from tooljaild.settings.artifacts import ArtifactSettings

pytestmark = pytest.mark.timeout(180)

MiB = 1024**2


def _files_code(count: int, size: int = 0, prefix: str = "f") -> str:
    """Tool code leaving `count` files of `size` bytes in outputs/."""
    return (
        "import os\nos.makedirs('outputs', exist_ok=True)\n"
        f"for i in range({count}):\n"
        f"    open(f'outputs/{prefix}{{i:03d}}', 'wb').write(b'x' * {size})\n"
    )


def _rows(state: Path) -> dict[str, int]:
    """Rows of the store's index by kind: live, tombstones."""
    db = sqlite3.connect(state / "artifacts" / "index.sqlite3")
    try:
        live, gone = db.execute("SELECT sum(gone = ''), sum(gone != '') FROM artifacts").fetchone()
    finally:
        db.close()
    return {"live": live or 0, "tombstones": gone or 0}


def _files(state: Path) -> list[Path]:
    root = state / "artifacts"
    return [f for sub in root.iterdir() if sub.is_dir() for f in sub.iterdir()]


def test_empty_files_are_counted_per_call_and_per_owner(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    served = serve(
        state_dir=state,
        pool_size=1,
        artifacts={"max_call_artifacts": 8, "max_owner_count": 20},
    )
    with (
        Client(served.target, client_name="flooder") as client,
        Probe(served.target).running() as probe,
    ):
        first = client.call("execute_python_code", {"code": _files_code(64)})
        assert first.ok, first
        # The runner is told the bound: it sends 8 and names the rest on stderr.
        assert len(first.artifacts) == 8
        assert "outputs/f008 is not kept: a call makes at most 8" in first.data["stderr"]
        # A forged sender that ignores it: the daemon keeps 8 and names the rest.
        forged = SEND_ARTIFACT + "for i in range(64):\n    send(f'e{i}', 'text/plain', b'', 1)\n"
        flood = client.call("execute_python_code", {"code": forged})
        assert flood.ok, flood
        assert len(flood.artifacts) == 8
        assert "56 artifacts were dropped" in flood.message
        assert "max_call_artifacts" in flood.message
        assert "'e8', 'e9'" in flood.message and "and 46 more" in flood.message
        for _ in range(6):
            assert client.call("execute_python_code", {"code": _files_code(64)}).ok
        kept = client.list_artifacts()
    probe.assert_responsive()
    # The owner keeps its newest 20; the flood evicted only its own.
    assert len(kept) == 20
    rows = _rows(state)
    assert rows["live"] == 20 and len(_files(state)) == 20
    # Tombstones bounded by count too (max_owner_count, forgotten a tenth at a time).
    assert rows["tombstones"] <= 20, rows


def test_one_clients_writes_never_evict_anothers(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    served = serve(
        state_dir=state,
        pool_size=1,
        artifacts={"max_bytes": 4 * MiB, "max_owner_bytes": 2 * MiB},
    )
    with (
        Client(served.target, client_name="victim") as victim,
        Client(served.target, client_name="attacker") as attacker,
        Client(served.target, client_name="third") as third,
    ):
        kept = victim.call("execute_python_code", {"code": _files_code(1, 3 * MiB // 2, "v")})
        (precious,) = kept.artifacts
        # 10 MiB from one client: it keeps 2 MiB, making room by evicting only
        # its own older ones (the daemon-wide 4 MiB would have taken the victim's).
        flood = attacker.call("execute_python_code", {"code": _files_code(10, MiB, "a")})
        assert flood.ok, flood
        assert [a.size_bytes for a in attacker.list_artifacts()] == [MiB, MiB]
        with pytest.raises(ArtifactGoneError) as gone:  # its own, evicted for its own
            attacker.get_artifact(flood.artifacts[0].artifact_id)
        assert gone.value.reason == "evicted"
        # The daemon-wide ceiling: 1.5 + 2 of 4 MiB held; a third client gets the
        # rest and is cut, and nobody else's is evicted for it.
        late = third.call("execute_python_code", {"code": _files_code(2, MiB, "t")})
        assert late.ok, late
        assert sum(a.size_bytes for a in third.list_artifacts()) <= MiB // 2
        assert "max_bytes" in late.message and "other owners" in late.message
        assert victim.get_artifact(precious.artifact_id) == b"x" * (3 * MiB // 2)
        assert [a.size_bytes for a in attacker.list_artifacts()] == [MiB, MiB]


def test_bytes_being_written_count_against_the_bound(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    served = serve(state_dir=state, pool_size=1, artifacts={"max_bytes": 8 * MiB})
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):  # a file renamed or removed under the walk
                peak[0] = max(peak[0], sum(f.stat().st_size for f in _files(state)))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with Client(served.target, client_name="big") as client:
            # Files larger than the store keeps: the runner, told, does not send them.
            huge = client.call("execute_python_code", {"code": _files_code(3, 56 * MiB, "z")})
            assert huge.ok, (huge.message, huge.data)
            assert huge.artifacts == () and "is not kept" in huge.data["stderr"]
            # Many that fit one by one: the owner's older ones make room as they come.
            many = client.call("execute_python_code", {"code": _files_code(6, 3 * MiB, "m")})
            assert many.ok, (many.message, many.data)
            # A forged sender that ignores the bounds: cut as it writes.
            forged = (
                SEND_ARTIFACT
                + "send('f.bin', 'application/octet-stream', b'y' * (12 << 20), 1 << 20)\n"
            )
            cut = client.call("execute_python_code", {"code": forged})
            assert cut.ok, (cut.message, cut.data)
            assert [a.size_bytes for a in cut.artifacts] == [8 * MiB]
            assert "max_artifact_bytes" in cut.message
    finally:
        done.set()
        watcher.join()
    assert peak[0] <= 8 * MiB, f"{peak[0] / MiB:.0f} MiB on disk against a bound of 8"


def test_listing_a_big_store_is_paged_and_quick(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    served = serve(state_dir=state, pool_size=0)
    # 20,000 rows of one owner's, put through a second handle on the store.
    store = ArtifactStore.open(state / "artifacts", ArtifactSettings(max_owner_count=100_000))
    try:
        for i in range(20_000):
            store.put(f"n{i}", "text/plain", b"", Origin("lister", f"c{i % 7}"), "outputs")
    finally:
        store.close()
    channel = grpc.insecure_channel(served.target)
    stub: Any = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
    meta = (("tooljail-client", "lister"),)
    try:
        start = time.monotonic()
        first = stub.ListArtifacts(pb.ListArtifactsRequest(), timeout=30, metadata=meta)
        elapsed = time.monotonic() - start
        assert len(first.artifacts) == 200 and first.next_page_token
        assert first.ByteSize() < 100_000 and elapsed < 0.3, (first.ByteSize(), elapsed)
        huge = stub.ListArtifacts(
            pb.ListArtifactsRequest(page_size=10**9), timeout=30, metadata=meta
        )
        assert len(huge.artifacts) == MAX_PAGE_SIZE
        # Page after page, every one seen once, newest first.
        seen: list[str] = []
        request = pb.ListArtifactsRequest(page_size=MAX_PAGE_SIZE, call_id="c3")
        while True:
            page = stub.ListArtifacts(request, timeout=30, metadata=meta)
            seen += [a.name for a in page.artifacts]
            if not page.next_page_token:
                break
            request.page_token = page.next_page_token
        want = [f"n{i}" for i in reversed(range(20_000)) if i % 7 == 3]
        assert seen == want
        with pytest.raises(grpc.RpcError) as bad:
            stub.ListArtifacts(pb.ListArtifactsRequest(page_token="x"), timeout=30, metadata=meta)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_token" in (bad.value.details() or "")
    finally:
        channel.close()
    # The SDK, sync and async, still returns them all (it reads every page).
    with Client(served.target, client_name="lister") as client:
        assert len(client.list_artifacts(call_id="c3")) == len(want)


def test_forged_names_are_kept_safe(serve: Callable[..., ServedDaemon], tmp_path: Path) -> None:
    state = tmp_path / "state"
    served = serve(state_dir=state, pool_size=1)
    code = (
        SEND_ARTIFACT
        + "send('../../../../tmp/x', 'text/plain', b'1', 10)\n"
        + "send('outputs/\\x1b]0;owned\\x07\\x1b[2Jtitle\\u202e.txt', 'text/plain', b'2', 10)\n"
    )
    with Client(served.target, client_name="forger") as client:
        made = client.call("execute_python_code", {"code": code})
        assert made.ok, (made.message, made.data)
        names = [a.name for a in made.artifacts]
    assert names == ["tmp/x", "outputs/\\x1b]0;owned\\x07\\x1b[2Jtitle\\u202e.txt"]
    assert all(ord(c) >= 0x20 and c.isprintable() for name in names for c in name)
    # The command line prints them escaped (and would escape what an old store kept).
    env = {**os.environ, "TOOLJAIL_CLIENT": "forger"}
    listed = subprocess.run(
        [sys.executable, "-m", "tooljaild", "artifacts", "ls", "--target", served.target],
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert b"\x1b" not in listed.stdout and b"tmp/x" in listed.stdout
    assert "\u202e".encode() not in listed.stdout


def test_bounds_that_do_not_nest_are_refused_at_start(tmp_path: Path) -> None:
    base = _reachable(tmp_path)
    config = base / "config.toml"
    config.write_text("[artifacts]\nmax_bytes = 8388608\nmax_artifact_bytes = 16777216\n")
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooljaild",
            "serve",
            "--config",
            str(config),
            "--listen",
            f"unix://{base}/t.sock",
            "--state-dir",
            str(base / "state"),
        ],
        capture_output=True,
        timeout=60,
    )
    assert started.returncode != 0
    err = started.stderr.decode()
    assert "max_artifact_bytes = 16777216 is more than max_bytes = 8388608" in err, err
    # A bound left unset is lowered to fit: the defaults under a small ceiling.
    small = ArtifactSettings(max_bytes=8 * MiB)
    assert small.max_owner_bytes == small.max_artifact_bytes == 8 * MiB
    with pytest.raises(ValueError, match="max_owner_count = 10 is more than max_count = 5"):
        ArtifactSettings(max_count=5, max_owner_count=10)
    assert json.dumps(ArtifactSettings().model_dump())  # plain data still
