"""The pod's probes against a real daemon, as the kubelet's native gRPC probe asks.

The daemon runs as `tooljail serve` does in the pod: the ConfigMap's own
tooljail.toml (its API on 0.0.0.0 with TLS and tokens, health checks alone in
plaintext on `health_listen`), with only the paths and the ports moved here
through the environment. The kubelet's `grpc:` probe is one grpc.health.v1
Check (service "") in plaintext, passing on SERVING only: it must pass once the
pools are warm, fail from the first moment of a drain (the pod leaves the
Service) while the daemon's calls still finish, and the health port must serve
nothing but health.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.certs import Authority
from tooljail import Client
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2, tooljail_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "kubernetes" / "base" / "tooljail.toml"
TOKEN = "token-of-an-agent-pod"
SERVING = health_pb2.HealthCheckResponse.SERVING


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PodDaemon:
    """A `tooljail serve` child process configured like the pod."""

    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    ca: Path

    def probe(self) -> bool:
        """The kubelet's grpc probe: a plaintext Check of service "", SERVING passes."""
        with grpc.insecure_channel(f"127.0.0.1:{self.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            except grpc.RpcError:
                return False
        return bool(answer.status == SERVING)


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
    port, health_port = _free_port(), _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOLJAIL_")},
        "TOOLJAIL_LISTEN": f"0.0.0.0:{port}",
        "TOOLJAIL_STATE_DIR": str(state),
        "TOOLJAIL_HEALTH_LISTEN": f"0.0.0.0:{health_port}",
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
    daemon = PodDaemon(process, port, health_port, authority.ca_file)
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


def test_ready_once_warm_then_not_ready_while_draining_and_calls_finish(
    pod_daemon: PodDaemon,
) -> None:
    _until(pod_daemon.probe, 60, pod_daemon)

    # A call that outlasts the SIGTERM keeps the daemon draining for a while.
    results: list[Any] = []
    client = Client(
        f"127.0.0.1:{pod_daemon.port}",
        token=TOKEN,
        tls_ca_file=str(pod_daemon.ca),
        rpc_timeout_s=60,
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
            _until(lambda: not pod_daemon.probe(), 5, pod_daemon)
            draining = pod_daemon.process.poll() is None
        finally:
            # The call's own answer, whatever the probes said.
            caller.join(30)
    assert draining, "the probe failed only because the daemon had already exited"
    assert results and results[0].ok, results
    assert results[0].data["stdout"] == "finished in the drain\n"
    assert pod_daemon.process.wait(30) == 0
    assert not pod_daemon.probe()


def test_the_health_port_serves_health_alone_and_the_api_needs_tls(pod_daemon: PodDaemon) -> None:
    _until(pod_daemon.probe, 60, pod_daemon)
    with grpc.insecure_channel(f"127.0.0.1:{pod_daemon.health_port}") as channel:
        tools = tooljail_pb2_grpc.ToolRunnerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            tools.ListTools(tooljail_pb2.ListToolsRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # The API's own port answers no plaintext, health included.
    with grpc.insecure_channel(f"127.0.0.1:{pod_daemon.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
