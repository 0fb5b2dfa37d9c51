"""The local world egress tests reach: servers on loopback stand in for real names.

Built once per test session (the `egress_world` fixture, registered in
tests/conftest.py) and shared by every egress test:

- a test CA (`tests.certs.Authority`) and one leaf for every name below, the
  stand-in for the public roots real hosts chain to;
- `world.https`: an HTTPS server on 127.0.0.1 ("api.example.com:443" maps to it);
- `world.http`: a plain HTTP server on 127.0.0.1 ("data.example.org:80");
- `world.traps`: TCP and UDP listeners on every host address (v4 and v6), a
  trap for a sandbox that would get around the proxy;
- `world.index`: a plain HTTP package index on 127.0.0.1 ("pypi.internal:80";
  "pypi.internal:443" maps to the HTTPS server, which serves the same index),
  PEP 503 pages with two wheels built here: `tjdemo-1.0` (requires `tjdep>=1`)
  and `tjdep-1.0`, each link with its `#sha256=` fragment.

Every server RECORDS every connection (peer, SNI) and every request (peer,
SNI, method, path, Host, headers, body) it gets, so a test asserts that a
refused request reached nothing: `mark = world.mark()` ... `world.since(mark)`.
Each answers small fixed bodies:

    GET  /hello          b"hello from <server>\\n"
    GET  /file           1 KiB of fixed bytes (FILE_BODY)
    ANY  /echo           JSON {"method", "path", "headers": {name: value}, "body"}
    GET  /simple/...     the index (index server and HTTPS server)
    GET  /packages/F     a wheel

`world.settings(...)` gives the daemon's config keys for `tooljail.testing.daemon`
/ the `serve` fixture, `world.write_config(path, ...)` the same as a TOML file for
`tooljail serve --config`; both map the names above through `[egress.hosts]`,
trust the test CA upstream (`ca_file`) and may hold secrets (a 0600 file).

Inside a sandbox, code that talks to a pass-through HTTPS host must trust the
test CA, as a real client trusts the public roots: `trust_prelude(world)` is a
few lines of Python that write a bundle of the sandbox's own (`/run/tooljail/ca.pem`,
when there) plus the test CA and point every client's variable at it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import json
import os
import socket
import ssl
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.certs import Authority

FILE_BODY = bytes(range(256)) * 4
"""What GET /file answers: 1 KiB."""

NAMES = (
    "api.example.com",
    "data.example.org",
    "pypi.internal",
    "other.example.net",
    "evil.example.net",
    "files.example.org",
    "a.files.example.org",
    "deny.files.example.org",
)
"""The names the test leaf covers (also "localhost" and 127.0.0.1); each maps to
a world server in `World.hosts`, so a refusal that failed would reach it."""

WHEEL_DATE = (2020, 1, 1, 0, 0, 0)
"""Every wheel member's timestamp: the same wheels (and hashes) on every run."""


@dataclass(frozen=True)
class Connection:
    """One TCP connection a server accepted."""

    server: str
    peer: tuple[str, int]
    sni: str | None
    at: float


@dataclass(frozen=True)
class Request:
    """One HTTP request a server read."""

    server: str
    peer: tuple[str, int]
    sni: str | None
    method: str
    path: str
    host: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    at: float
    complete: bool = True
    """False when the body ended before its Content-Length (the client hung up)."""

    def header(self, name: str) -> str | None:
        """The first header called `name` (any case), or None."""
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def raw(self) -> bytes:
        """Everything the server saw of this request, for a search through it."""
        head = f"{self.method} {self.path}\n" + "".join(f"{k}: {v}\n" for k, v in self.headers)
        return head.encode() + self.body


@dataclass
class Recorder:
    """What the world's servers saw, in order (thread-safe)."""

    connections: list[Connection] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Connection | Request) -> None:
        with self.lock:
            (self.connections if isinstance(item, Connection) else self.requests).append(item)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Mark:
    """A point in the record: what came after it is `World.since(mark)`."""

    connections: int
    requests: int


@dataclass(frozen=True)
class Seen:
    """What the world's servers saw after a mark."""

    connections: tuple[Connection, ...]
    requests: tuple[Request, ...]

    @property
    def nothing(self) -> bool:
        return not self.connections and not self.requests

    def to(self, server: str) -> Seen:
        """Only what `server` ("https", "http", "index") saw."""
        return Seen(
            tuple(c for c in self.connections if c.server == server),
            tuple(r for r in self.requests if r.server == server),
        )


@dataclass(frozen=True)
class Wheel:
    """A wheel the index serves."""

    project: str
    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(
    name: str, version: str, files: Mapping[str, str], requires: Sequence[str] = ()
) -> Wheel:
    """A pure-Python wheel (py3-none-any) with a correct METADATA, WHEEL and RECORD.

    Args:
        name: The project name (also the dist-info stem; use a normalized name).
        version: Its version.
        files: Path inside the wheel -> text (e.g. {"tjdep/__init__.py": "VALUE = 42\\n"}).
        requires: Requires-Dist lines ("tjdep>=1").
    """
    dist_info = f"{name}-{version}.dist-info"
    metadata = "".join(
        [
            "Metadata-Version: 2.1\n",
            f"Name: {name}\n",
            f"Version: {version}\n",
            "Summary: a tooljail test package\n",
            *(f"Requires-Dist: {r}\n" for r in requires),
        ]
    )
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: tooljail-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    members: list[tuple[str, bytes]] = [(p, t.encode()) for p, t in files.items()]
    members += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel_meta.encode()),
    ]
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in members)
    record += f"{dist_info}/RECORD,,\n"
    members.append((f"{dist_info}/RECORD", record.encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members:
            info = zipfile.ZipInfo(path, WHEEL_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return Wheel(name, f"{name}-{version}-py3-none-any.whl", out.getvalue())


def demo_wheels() -> tuple[Wheel, ...]:
    """`tjdemo-1.0` (requires `tjdep>=1`) and `tjdep-1.0`."""
    return (
        build_wheel(
            "tjdemo",
            "1.0",
            {
                "tjdemo/__init__.py": (
                    '"""tooljail test package with a dependency."""\n'
                    "from tjdep import VALUE\n\n"
                    "def hello() -> str:\n"
                    '    return f"tjdemo says {VALUE}"\n'
                )
            },
            requires=("tjdep>=1",),
        ),
        build_wheel(
            "tjdep",
            "1.0",
            {"tjdep/__init__.py": '"""tooljail test dependency."""\nVALUE = 42\n'},
        ),
    )


def index_pages(wheels: Iterable[Wheel]) -> dict[str, bytes]:
    """PEP 503 simple pages: path -> HTML, for "/simple/" and "/simple/<project>/"."""
    by_project: dict[str, list[Wheel]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.project, []).append(wheel)
    root = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in sorted(by_project))
    pages = {"/simple/": f"<!DOCTYPE html>\n<html><body>\n{root}</body></html>\n".encode()}
    for project, files in by_project.items():
        links = "".join(
            f'<a href="/packages/{w.filename}#sha256={w.sha256}">{w.filename}</a>\n' for w in files
        )
        pages[f"/simple/{project}/"] = (
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()
        )
    return pages


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers the world's fixed endpoints and records each request."""

    protocol_version = "HTTP/1.1"
    # Head and body go out in two writes: with Nagle on, a keep-alive client's
    # delayed ACK would stall every second request by 40 ms.
    disable_nagle_algorithm = True
    server: _Server
    tj_complete = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the record is the log

    def _body(self) -> bytes:
        self.tj_complete = True
        length = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        body = self.rfile.read(length) if length else b""
        self.tj_complete = len(body) == length
        return body

    def _handle(self) -> None:
        body = self._body()
        world = self.server
        request = Request(
            server=world.label,
            peer=self.client_address[:2],
            sni=getattr(self.connection, "tj_sni", None),
            method=self.command,
            path=self.path,
            host=self.headers.get("Host", ""),
            headers=tuple(self.headers.items()),
            body=body,
            at=time.monotonic(),
            complete=self.tj_complete,
        )
        world.recorder.add(request)
        path = self.path.split("?", 1)[0]
        if path.startswith("http://") or path.startswith("https://"):
            path = "/" + path.split("/", 3)[-1] if path.count("/") >= 3 else "/"
        status, ctype, payload = 200, "text/plain", b""
        if path == "/hello":
            payload = f"hello from {world.label}\n".encode()
        elif path == "/file":
            ctype, payload = "application/octet-stream", FILE_BODY
        elif path == "/echo":
            ctype = "application/json"
            payload = json.dumps(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body.decode("utf-8", "replace"),
                }
            ).encode()
        elif world.index_pages is not None and path.rstrip("/") + "/" in world.index_pages:
            ctype, payload = "text/html", world.index_pages[path.rstrip("/") + "/"]
        elif world.wheels is not None and path.startswith("/packages/"):
            wheel = world.wheels.get(path.removeprefix("/packages/"))
            if wheel is None:
                status, payload = 404, b"no such file\n"
            else:
                ctype, payload = "application/octet-stream", wheel.data
        else:
            status, payload = 404, b"not found\n"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = do_PATCH = _handle


class _Server(http.server.ThreadingHTTPServer):
    """A threaded HTTP(S) server on 127.0.0.1:0 that records every connection."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        label: str,
        recorder: Recorder,
        tls: ssl.SSLContext | None = None,
        index: tuple[dict[str, bytes], dict[str, Wheel]] | None = None,
    ) -> None:
        self.label = label
        self.recorder = recorder
        self.tls = tls
        self.index_pages = index[0] if index else None
        self.wheels = index[1] if index else None
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs on the connection's own thread: the TLS handshake too, so a slow
        # or broken client never holds up the accept loop.
        sni: list[str | None] = [None]
        if self.tls is not None:
            self._sni.value = sni
            try:
                request.settimeout(10)
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                self.recorder.add(
                    Connection(self.label, client_address[:2], sni[0], time.monotonic())
                )
                return
            request.tj_sni = sni[0]
        self.recorder.add(Connection(self.label, client_address[:2], sni[0], time.monotonic()))
        try:
            super().finish_request(request, client_address)
        finally:
            if self.tls is not None:
                # The TLS socket took the accepted socket's fd: the base class
                # closes only the (now empty) original.
                with contextlib.suppress(OSError):
                    request.close()

    _sni = threading.local()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up mid-request is the world's weather, not a failure


class _TlsSocket(ssl.SSLSocket):
    """An SSLSocket that may carry the SNI its client sent (`tj_sni`)."""

    tj_sni: str | None = None


def _server_context(leaf_cert: Path, leaf_key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf_cert, leaf_key)
    context.sslsocket_class = _TlsSocket

    def remember_sni(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        # The handshake runs on the connection's thread (see finish_request).
        with contextlib.suppress(AttributeError):
            _Server._sni.value[0] = name

    context.sni_callback = remember_sni  # type: ignore[assignment]
    return context


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def to_toml(settings: Mapping[str, Any]) -> str:
    """Config keys (nested tables as dicts) as TOML; scalars first, then tables."""
    lines: list[str] = []

    def emit(table: Mapping[str, Any], prefix: str) -> None:
        subtables = []
        for key, value in table.items():
            if isinstance(value, Mapping):
                subtables.append((key, value))
            else:
                lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
        for key, value in subtables:
            name = f"{prefix}.{json.dumps(key)}" if prefix else json.dumps(key)
            lines.append(f"\n[{name}]")
            emit(value, name)

    emit(settings, "")
    return "\n".join(lines) + "\n"


def write_secrets(path: Path, secrets: Mapping[str, tuple[str, Sequence[str]]]) -> Path:
    """A secrets file (0600): name -> (value, hosts it may be sent to)."""
    text = "".join(
        f"[{name}]\nvalue = {json.dumps(value)}\nhosts = {_toml_value(list(hosts))}\n\n"
        for name, (value, hosts) in secrets.items()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)
    return path


DEFAULT_ALLOW = ("api.example.com", "data.example.org", "pypi.internal")
"""The ceiling `World.settings` allows unless told: the three world names, ports 80/443."""


class _Traps:
    """Listeners on every address of the host (TCP v4 and v6, UDP v4 and v6) that
    record whatever reaches them: a sandbox that gets around the proxy (a direct
    connect(), a DNS query) would land here."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.sockets: list[socket.socket] = []
        self.tcp_port = self.udp_port = 0
        for family, kind, any_address in (
            (socket.AF_INET, socket.SOCK_STREAM, "0.0.0.0"),
            (socket.AF_INET6, socket.SOCK_STREAM, "::"),
            (socket.AF_INET, socket.SOCK_DGRAM, "0.0.0.0"),
            (socket.AF_INET6, socket.SOCK_DGRAM, "::"),
        ):
            sock = socket.socket(family, kind)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            port = self.tcp_port if kind == socket.SOCK_STREAM else self.udp_port
            try:
                sock.bind((any_address, port))
            except OSError:
                sock.close()  # no IPv6 here, or the port is taken in v6: v4 only
                continue
            if kind == socket.SOCK_STREAM:
                sock.listen(64)
                self.tcp_port = sock.getsockname()[1]
            else:
                self.udp_port = sock.getsockname()[1]
            sock.settimeout(0.2)
            self.sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()
        self._closed = False

    def _serve(self, sock: socket.socket) -> None:
        label = "trap-tcp" if sock.type == socket.SOCK_STREAM else "trap-udp"
        while not getattr(self, "_closed", False):
            try:
                if sock.type == socket.SOCK_STREAM:
                    conn, peer = sock.accept()
                    conn.close()
                else:
                    _data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.recorder.add(Connection(label, peer[:2], None, time.monotonic()))

    def close(self) -> None:
        self._closed = True
        for sock in self.sockets:
            sock.close()


@dataclass
class World:
    """The running world: servers, CA, wheels, and how to configure a daemon for it."""

    directory: Path
    ca: Authority
    recorder: Recorder
    https: _Server
    http: _Server
    index: _Server
    wheels: tuple[Wheel, ...]
    traps: _Traps

    @property
    def ca_file(self) -> Path:
        """The test CA (PEM): the daemon's upstream `ca_file`."""
        return self.ca.ca_file

    @property
    def ca_pem(self) -> str:
        return self.ca.ca_file.read_text()

    def hosts(self) -> dict[str, str]:
        """`[egress.hosts]`: the world's real names -> its loopback servers."""
        return {
            "api.example.com:443": self.https.address,
            "api.example.com:80": self.http.address,
            "data.example.org:80": self.http.address,
            "data.example.org:443": self.https.address,
            "pypi.internal:80": self.index.address,
            "pypi.internal:443": self.https.address,
            "other.example.net:443": self.https.address,
            "other.example.net:80": self.http.address,
            "evil.example.net:443": self.https.address,
            "evil.example.net:80": self.http.address,
            "files.example.org:443": self.https.address,
            "a.files.example.org:443": self.https.address,
            "deny.files.example.org:443": self.https.address,
            "api.example.com:8443": self.https.address,
        }

    def mark(self) -> Mark:
        with self.recorder.lock:
            return Mark(len(self.recorder.connections), len(self.recorder.requests))

    def since(self, mark: Mark) -> Seen:
        with self.recorder.lock:
            return Seen(
                tuple(self.recorder.connections[mark.connections :]),
                tuple(self.recorder.requests[mark.requests :]),
            )

    def wait_seen(self, mark: Mark, requests: int = 1, timeout: float = 5.0) -> Seen:
        """What came after `mark`, once at least `requests` requests arrived (or timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.since(mark)
            if len(seen.requests) >= requests or time.monotonic() > deadline:
                return seen
            time.sleep(0.01)

    def settings(
        self,
        *,
        allow: Sequence[str] = DEFAULT_ALLOW,
        deny: Sequence[str] = (),
        secrets: Mapping[str, tuple[str, Sequence[str]]] | None = None,
        secrets_file: Path | None = None,
        index_url: str | None = "http://pypi.internal/simple",
        extra_hosts: Mapping[str, str] | None = None,
        **more: Any,
    ) -> dict[str, Any]:
        """The daemon's config keys for this world (for `serve(**...)` or `to_toml`).

        Args:
            allow: `[egress] allow`, the daemon's ceiling.
            deny: `[egress] deny`.
            secrets: name -> (value, hosts): written to `secrets_file` (0600) and
                named by `[secrets] file`. None: no `[secrets]` table.
            secrets_file: Where to write them (default: a new file in the world's dir).
            index_url: `[packages] index_url`; None: no `[packages]` table.
            extra_hosts: More `[egress.hosts]` entries (over the world's).
            more: Other config keys, as given.
        """
        egress: dict[str, Any] = {
            "allow": list(allow),
            "deny": list(deny),
            "ca_file": str(self.ca_file),
            "hosts": {**self.hosts(), **(extra_hosts or {})},
        }
        settings: dict[str, Any] = {**more, "egress": egress}
        if secrets is not None:
            if secrets_file is None:
                fd, name = tempfile.mkstemp(prefix="secrets-", suffix=".toml", dir=self.directory)
                os.close(fd)
                secrets_file = Path(name)
            settings["secrets"] = {"file": str(write_secrets(secrets_file, secrets))}
        if index_url is not None:
            settings["packages"] = {"index_url": index_url}
        return settings

    def write_config(self, path: Path, **kwargs: Any) -> Path:
        """`settings(**kwargs)` written as a TOML config file at `path`."""
        path.write_text(to_toml(self.settings(**kwargs)))
        return path

    def close(self) -> None:
        for server in (self.https, self.http, self.index):
            server.shutdown()
            server.server_close()
        self.traps.close()


def start_world(directory: Path) -> World:
    """Mint the CA and leaf, build the wheels, start the three servers (threads)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority(directory, "world")
    # A server leaf for every world name, localhost and 127.0.0.1.
    leaf = ca.issue(NAMES[0], server=True, names=(*NAMES, "localhost"))
    recorder = Recorder()
    wheels = demo_wheels()
    index = (index_pages(wheels), {w.filename: w for w in wheels})
    https = _Server("https", recorder, _server_context(leaf.cert, leaf.key), index)
    plain = _Server("http", recorder)
    pypi = _Server("index", recorder, None, index)
    for server in (https, plain, pypi):
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name=f"egress-world-{server.label}",
        ).start()  # fmt: skip
    return World(directory, ca, recorder, https, plain, pypi, wheels, _Traps(recorder))


def trust_prelude(world: World, bundle: str = "/tmp/tj-world-ca.pem") -> str:
    """Python source that, run first in a sandbox, trusts the test CA as well.

    The test CA stands in for the public roots a real host chains to; the
    sandbox's own bundle (`/run/tooljail/ca.pem`: system roots + the daemon's
    intercept CA) is kept, so intercepted HTTPS still verifies.
    """
    return (
        "import os as _os\n"
        f"_b = {bundle!r}\n"
        "_c = '/run/tooljail/ca.pem'\n"
        "_own = open(_c).read() if _os.path.exists(_c) else ''\n"
        f"open(_b, 'w').write(_own + '\\n' + {world.ca_pem!r})\n"
        "for _k in ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'PIP_CERT'):\n"
        "    _os.environ[_k] = _b\n"
    )


CLIENT_LIBS = (
    "requests", "urllib3", "idna", "certifi", "charset_normalizer",
    "httpx", "httpcore", "h11", "anyio", "sniffio", "typing_extensions",
)  # fmt: skip
"""The HTTP clients the tests drive in a sandbox, with what they import."""


def vendor_client_libs(directory: Path) -> Path:
    """Copy this interpreter's `requests` and `httpx` (and their imports) into
    `directory` (world-readable), for sandboxes whose interpreter lacks them.

    The process backend runs /usr/bin/python3 where the sandbox uid cannot read
    the test venv; the docker image has its own. `lib_prelude` puts the copy
    at the END of sys.path, so an interpreter's own copy wins.
    """
    import importlib.util
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    for name in CLIENT_LIBS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            source = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(
                source,
                directory / name,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        else:
            shutil.copy(spec.origin, directory / Path(spec.origin).name)
    for path in (directory, *directory.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def lib_prelude(directory: Path) -> str:
    """Python source that makes `vendor_client_libs(directory)` importable (last)."""
    return f"import sys as _sys\n_sys.path.append({str(directory)!r})\n"


def host_get(url: str, world: World, *, timeout: float = 5.0) -> bytes:
    """GET `url` from the host straight to the world's server its name maps to.

    For checks outside any sandbox (is the world up?).
    """
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = world.hosts()[f"{parts.hostname}:{port}"]
    host, _, mapped_port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(world.ca_file))
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, int(mapped_port)), timeout))
        if parts.scheme == "https":
            sock = stack.enter_context(context.wrap_socket(sock, server_hostname=parts.hostname))
        target = parts.path or "/"
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: {parts.hostname}\r\nConnection: close\r\n\r\n".encode()
        )
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    _head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return body


@contextlib.contextmanager
def short_dir(prefix: str = "tj-eg-") -> Iterator[Path]:
    """A fresh directory with a short path (/tmp/tj-eg-XXXXXXXX), removed at exit.

    For a daemon's state dir where the path's length is not under test: each
    sandbox's gate socket lives at `<state_dir>/egress/sandboxes/<32 hex>/proxy.sock`,
    past a Unix socket path's 107 bytes under pytest's temp dirs (the daemon
    binds it through the directory's descriptor then; the conformance suite
    runs there on purpose).
    """
    import shutil

    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o711)  # the sandbox uid walks through to the state dir
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def egress_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The local world, started once per test session (see this module's docstring)."""
    world = start_world(tmp_path_factory.mktemp("egress-world"))
    try:
        yield world
    finally:
        world.close()
