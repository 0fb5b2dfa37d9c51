"""Isolation levels as an operator meets them: doctor's table, strict's refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, ServedDaemon

NO_BWRAP = {"TOOLJAIL_SANDBOX__BWRAP": "/nonexistent/bwrap"}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "tooljaild", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.isolation
def test_doctor_says_every_feature_is_active_here() -> None:
    proc = _cli("doctor", "--isolation", "strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "isolation = strict: every feature is active" in proc.stdout
    features = {f["name"]: f["status"] for f in json.loads(_cli("doctor", "--json").stdout)}
    for name in ("namespaces (bubblewrap)", "seccomp filter", "cgroup limits", "unprivileged uid"):
        assert features[name] == "active", features
    assert features["sandbox zygote"] == "active", features


def test_doctor_on_a_host_without_bubblewrap_says_what_is_missing_and_how() -> None:
    proc = _cli("doctor", env=NO_BWRAP)
    assert proc.returncode == 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("namespaces"))
    assert "missing" in line and "apt-get install bubblewrap" in line
    assert "isolation = strict would refuse to start: missing namespaces (bubblewrap)" in (
        proc.stdout
    )
    zygote = next(ln for ln in proc.stdout.splitlines() if ln.startswith("sandbox zygote"))
    assert "n/a" in zygote and "needs namespaces" in zygote
    strict = _cli("doctor", "--isolation", "strict", env=NO_BWRAP)
    assert strict.returncode == 1


def test_strict_refuses_to_start_without_bubblewrap(tmp_path: Path) -> None:
    proc = _cli(
        "serve",
        "--isolation",
        "strict",
        "--listen",
        f"unix://{tmp_path}/s.sock",
        "--state-dir",
        str(tmp_path / "state"),
        env=NO_BWRAP,
    )
    assert proc.returncode == 2
    assert "isolation = strict, but this host lacks: namespaces (bubblewrap)" in proc.stderr
    assert "apt-get install bubblewrap" in proc.stderr


def test_best_effort_without_bubblewrap_still_serves_and_logs_what_is_missing(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon(env=NO_BWRAP)
    daemon.assert_serving()
    assert "isolation feature missing: namespaces (bubblewrap)" in daemon.log()


@pytest.mark.isolation
def test_200_sequential_calls_each_get_a_fresh_sandbox(served: ServedDaemon) -> None:
    """The pool keeps up with a client sending as fast as it can, and never reuses."""
    import grpc

    from tooljail.v1 import tooljail_pb2 as pb
    from tooljail.v1 import tooljail_pb2_grpc

    sandboxes: list[str] = []
    with grpc.insecure_channel(served.target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)
        for i in range(200):
            request = pb.CallRequest(
                tool="execute_python_code", arguments_json=json.dumps({"code": f"print({i})"})
            )
            events = list(stub.Call(request, timeout=60))
            assert events[0].WhichOneof("event") == "started"
            sandboxes.append(events[0].started.sandbox_id)
            result = events[-1].result
            assert result.status == pb.STATUS_SUCCESS, result
            assert json.loads(result.data_json)["stdout"] == f"{i}\n"
    assert len(set(sandboxes)) == 200


@pytest.mark.isolation
def test_files_directories_are_visible_read_only_inside(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "data.txt").write_text("shared\n")
    files.chmod(0o777)  # writable on the host: only the sandbox's view is read-only
    served = serve(files_dirs=[files])
    code = (
        f"print(open({str(files / 'data.txt')!r}).read(), end='')\n"
        "try:\n"
        f"    open({str(files / 'new.txt')!r}, 'w')\n"
        "    print('written')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    from tooljail import Client

    with Client(served.target) as client:
        result = client.call("execute_python_code", {"code": code})
    assert result.ok, result
    assert result.data["stdout"] == "shared\nrefused 30\n"  # EROFS
    assert not (files / "new.txt").exists()
