"""Model-written code tries to reach the network: a TCP listener and a UDP socket
the test opens on the host, DNS, and the host's interfaces. A sandbox without a
network profile has no network: nothing arrives at the host's sockets."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator

import psutil
import pytest

from tests.security.conftest import SecurityDaemon, report, run_code

pytestmark = pytest.mark.isolation


def host_ipv4_addresses() -> list[str]:
    """The host's addresses: loopback first, then every other IPv4 address it has."""
    found = ["127.0.0.1"]
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and addr.address not in found:
                found.append(addr.address)
    return found


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    """A TCP listener on every host address, random port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    listener.setblocking(False)
    yield listener
    listener.close()


def accepted(listener: socket.socket, wait: float) -> list[tuple[str, int]]:
    """Connections that reached the listener within `wait` seconds."""
    peers = []
    ready, _, _ = select.select([listener], [], [], wait)
    while ready:
        try:
            conn, peer = listener.accept()
        except BlockingIOError:
            break
        peers.append(peer)
        conn.close()
        ready, _, _ = select.select([listener], [], [], 0.1)
    return peers


def test_tcp_to_a_listener_on_the_hosts_loopback_is_not_accepted(
    daemon: SecurityDaemon, tcp_listener: socket.socket
) -> None:
    """Attack: connect to a service on the host's 127.0.0.1 (and its other addresses),
    e.g. a database or the metadata endpoint, and send data."""
    port = tcp_listener.getsockname()[1]
    addresses = host_ipv4_addresses()
    code = f"""
import json, socket
out = {{}}
for host in {addresses!r}:
    try:
        s = socket.create_connection((host, {port}), timeout=3)
        s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')
        s.close()
        out[host] = 'connected'
    except OSError as e:
        out[host] = 'failed: %s' % e
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=60)
    peers = accepted(tcp_listener, 0.5)
    assert peers == [], f"the host's listener accepted connections from the sandbox: {peers}"
    assert result.ok, result
    got = report(result)
    connected = [host for host, outcome in got.items() if outcome == "connected"]
    assert connected == [], f"TCP connections succeeded: {got}"
    daemon.assert_serving()


def test_udp_to_a_socket_on_the_hosts_loopback_never_arrives(daemon: SecurityDaemon) -> None:
    """Attack: send UDP datagrams to a socket the test opened on the host's 127.0.0.1."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as receiver:
        receiver.bind(("127.0.0.1", 0))
        port = receiver.getsockname()[1]
        code = f"""
import json, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = 0
errors = []
for i in range(20):
    try:
        sent += s.sendto(b'exfiltrated %d' % i, ('127.0.0.1', {port}))
    except OSError as e:
        errors.append(str(e))
print('REPORT ' + json.dumps({{'sent': sent, 'errors': errors[:3]}}))
"""
        result = run_code(daemon, code, timeout=30)
        receiver.settimeout(1.0)
        received = []
        with contextlib.suppress(TimeoutError):
            while True:
                received.append(receiver.recvfrom(4096))
    assert received == [], f"datagrams from the sandbox reached the host: {received[:3]}"
    assert result.ok, result
    report(result)  # it ran to its end
    daemon.assert_serving()


def test_dns_resolution_fails(daemon: SecurityDaemon) -> None:
    """Attack: resolve example.com (the first step of any exfiltration or download)."""
    code = """
import json, socket
out = {}
for name in ('example.com', 'pypi.org'):
    try:
        out[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 443)})
    except OSError as e:
        out[name] = 'failed: %s' % e
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=60)
    assert result.ok, result
    got = report(result)
    resolved = {name: v for name, v in got.items() if isinstance(v, list)}
    assert resolved == {}, f"DNS works inside the sandbox: {resolved}"
    daemon.assert_serving()


def test_only_loopback_is_visible(daemon: SecurityDaemon) -> None:
    """Attack: enumerate network interfaces (socket.if_nameindex, /sys/class/net) to
    find a way out."""
    code = """
import json, os, socket
out = {'if_nameindex': sorted(name for _, name in socket.if_nameindex())}
try:
    out['sys_class_net'] = sorted(os.listdir('/sys/class/net'))
except OSError as e:
    out['sys_class_net'] = []
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert set(got["if_nameindex"]) <= {"lo"}, f"interfaces besides lo: {got}"
    assert set(got["sys_class_net"]) <= {"lo"}, f"interfaces besides lo: {got}"
    daemon.assert_serving()
