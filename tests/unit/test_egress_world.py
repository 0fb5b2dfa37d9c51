"""The egress tests' local world works on its own (no daemon): its servers answer
and record, its wheels install with pip, its config is valid TOML."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.egress_world import FILE_BODY, World, host_get, to_toml


def test_servers_answer_and_record_each_connection_and_request(egress_world: World) -> None:
    mark = egress_world.mark()
    assert host_get("https://api.example.com/hello", egress_world) == b"hello from https\n"
    assert host_get("http://data.example.org/file", egress_world) == FILE_BODY
    seen = egress_world.since(mark)
    assert [(c.server, c.sni) for c in seen.connections] == [
        ("https", "api.example.com"),
        ("http", None),
    ]
    assert [(r.server, r.path, r.host) for r in seen.requests] == [
        ("https", "/hello", "api.example.com"),
        ("http", "/file", "data.example.org"),
    ]


def test_index_wheels_install_with_their_dependency(egress_world: World, tmp_path: Path) -> None:
    index = f"http://{egress_world.index.address}/simple"
    target = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--isolated",
         "--disable-pip-version-check", "--target", str(target), "--index-url", index,
         "tjdemo", "tjdep"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr
    run = subprocess.run(
        [sys.executable, "-c", "import tjdemo; print(tjdemo.hello())"],
        capture_output=True, text=True, env={"PYTHONPATH": str(target)}, timeout=30,
    )  # fmt: skip
    assert run.stdout == "tjdemo says 42\n", run.stderr
    page = host_get("http://pypi.internal/simple/tjdemo/", egress_world).decode()
    (demo,) = [w for w in egress_world.wheels if w.project == "tjdemo"]
    assert f"#sha256={demo.sha256}" in page


def test_config_is_toml_with_hosts_ca_and_a_0600_secrets_file(egress_world: World) -> None:
    settings = egress_world.settings(secrets={"KEY": ("v4lue", ["api.example.com"])})
    parsed = tomllib.loads(to_toml(settings))
    assert parsed["egress"]["hosts"]["api.example.com:443"] == egress_world.https.address
    assert parsed["egress"]["ca_file"] == str(egress_world.ca_file)
    secrets = Path(parsed["secrets"]["file"])
    assert secrets.stat().st_mode & 0o777 == 0o600
    assert tomllib.loads(secrets.read_text())["KEY"] == {
        "value": "v4lue",
        "hosts": ["api.example.com"],
    }


def test_traps_record_tcp_and_udp_on_any_address(egress_world: World) -> None:
    mark = egress_world.mark()
    socket.create_connection(("127.0.0.1", egress_world.traps.tcp_port), 5).close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"\0" * 12, ("127.0.0.1", egress_world.traps.udp_port))
    deadline = time.monotonic() + 5
    while len(egress_world.since(mark).connections) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(c.server for c in egress_world.since(mark).connections) == [
        "trap-tcp",
        "trap-udp",
    ]
