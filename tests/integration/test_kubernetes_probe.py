"""The pod's probes (deploy/kubernetes/image/probe.py) against a real daemon.

The daemon runs as `tooljail serve` does in the pod: the ConfigMap's own
tooljail.toml (listen on 0.0.0.0 with TLS and tokens), with only the paths and
the port moved here through the environment. The probe must pass `ready` once
the pools are warm, fail it from the first moment of a drain while `live` still
passes (the kubelet must not restart a draining daemon), and fail both once
the daemon is gone or its certificate is not the CA's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.certs import Authority
from tooljail import Client
from tooljail.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "kubernetes" / "base" / "tooljail.toml"
PROBE = ROOT / "deploy" / "kubernetes" / "image" / "probe.py"
TOKEN = "token-of-an-agent-pod"


def _probe_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tooljail_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = _probe_module()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PodDaemon:
    """A `tooljail serve` child process configured like the pod."""

    process: subprocess.Popen[bytes]
    port: int
    ca: Path

    def probe(self, mode: str, ca: Path | None = None) -> int:
        argv = [mode, "--port", str(self.port), "--ca", str(ca or self.ca)]
        return int(probe.main([*argv, "--server-name", "localhost", "--timeout", "2"]))


@pytest.fixture
def pod_daemon(tmp_path: Path) -> Iterator[PodDaemon]:
    authority = Authority(tmp_path, "cluster")
    server = authority.issue("tooljail.tooljail.svc.cluster.local", server=True)
    tokens = tmp_path / "tokens.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(f'[identities.agent]\ntoken_sha256 = "{digest}"\n')
    tokens.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir(mode=0o711)
    tmp_path.chmod(0o711)
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOLJAIL_")},
        "TOOLJAIL_LISTEN": f"0.0.0.0:{port}",
        "TOOLJAIL_STATE_DIR": str(state),
        "TOOLJAIL_METRICS_LISTEN": f"127.0.0.1:{_free_port()}",
        "TOOLJAIL_TLS__CERT_FILE": str(server.cert),
        "TOOLJAIL_TLS__KEY_FILE": str(server.key),
        "TOOLJAIL_AUTH__TOKENS_FILE": str(tokens),
        # The pod asks for strict; this host's features are tooljail doctor's business.
        "TOOLJAIL_ISOLATION": "best-effort",
        "TOOLJAIL_POOL_SIZE": "1",
    }
    argv = [sys.executable, "-m", "tooljaild", "serve", "--config", str(CONFIG)]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    daemon = PodDaemon(process, port, authority.ca_file)
    try:
        yield daemon
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        assert process.stderr is not None
        process.stderr.close()


def _until(predicate: Any, timeout: float, daemon: PodDaemon) -> None:
    def holds() -> bool:
        assert daemon.process.poll() is None or predicate(), "the daemon exited"
        return bool(predicate())

    wait_for(holds, timeout, interval=0.1)


def test_ready_once_warm_then_not_ready_but_live_while_draining(pod_daemon: PodDaemon) -> None:
    _until(lambda: pod_daemon.probe("ready") == 0, 60, pod_daemon)
    assert pod_daemon.probe("live") == 0

    # A call that outlasts the SIGTERM keeps the daemon draining for a while.
    results: list[Any] = []
    client = Client(
        f"127.0.0.1:{pod_daemon.port}", token=TOKEN, tls_ca_file=str(pod_daemon.ca), timeout=60
    )
    code = "import time; time.sleep(5); print('finished in the drain')"
    caller = threading.Thread(
        target=lambda: results.append(client.call("execute_python_code", {"code": code}))
    )
    with client:
        caller.start()
        try:
            # A warm sandbox takes the call within milliseconds; a second is plenty.
            threading.Event().wait(1.0)
            pod_daemon.process.send_signal(signal.SIGTERM)
            _until(lambda: pod_daemon.probe("ready") == 1, 5, pod_daemon)
            live_while_draining = pod_daemon.probe("live")
        finally:
            # The call's own answer, whatever the probes said.
            caller.join(30)
    assert live_while_draining == 0, "a draining daemon must stay live"
    assert results and results[0].ok, results
    assert results[0].data["stdout"] == "finished in the drain\n"
    assert pod_daemon.process.wait(30) == 0
    assert pod_daemon.probe("live") == 1


def test_a_certificate_of_another_ca_fails_the_probe(pod_daemon: PodDaemon, tmp_path: Path) -> None:
    _until(lambda: pod_daemon.probe("ready") == 0, 60, pod_daemon)
    other = Authority(tmp_path, "elsewhere")
    assert pod_daemon.probe("live", ca=other.ca_file) == 1
    assert pod_daemon.probe("live", ca=tmp_path / "missing.pem") == 1
