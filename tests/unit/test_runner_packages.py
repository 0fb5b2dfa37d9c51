"""runner/_packages.py on the host: the site directory, pip's settings, the cache path.

What runs inside sandboxes is exercised here on a temporary workspace: pip
through the settings `environment` gives, in the daemon's virtualenv
interpreter and in Debian's /usr/bin/python3 (PEP 668's externally-managed
one), against a local index; the wheels from the daemon's cache, through a
stand-in proxy; and the proxy's refusal as the error.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.wheels import make_index, make_wheel, serve_index
from tooljaild.runner import _packages


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sys.path, os.environ and the module's state, restored after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in list(os.environ):
        if name.startswith("PIP_") or name in ("PYTHONPATH", "HTTP_PROXY", "http_proxy"):
            monkeypatch.delenv(name)
    saved = dict(_packages._active)
    yield
    _packages._active.clear()
    _packages._active.update(saved)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A local index of two wheels: demo (needs helperlib), helperlib."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "demo", "1.0", "from helperlib import VALUE\n", requires=["helperlib"])
    make_wheel(wheels, "helperlib", "2.0", "VALUE = 42\n")
    with serve_index(make_index(wheels, tmp_path / "index")) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"


def test_activate_puts_the_site_dir_first_with_its_pth_files(
    tmp_path: Path, isolated: None
) -> None:
    site = _packages.activate(str(tmp_path))
    assert site == str(tmp_path / ".packages") and os.path.isdir(site)
    assert sys.path[0] == site
    assert os.environ["PIP_TARGET"] == site
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == site
    assert os.environ["PIP_CACHE_DIR"].startswith(os.environ.get("TMPDIR", "/tmp"))
    # What a later install adds is seen at the next call: modules and .pth files.
    (tmp_path / ".packages" / "extra").mkdir()
    (tmp_path / ".packages" / "x.pth").write_text("extra\n")
    sys.path.remove(site)  # code took it away
    _packages.refresh()
    assert sys.path[0] == site
    assert str(tmp_path / ".packages" / "extra") in sys.path
    _packages.activate(str(tmp_path))  # idempotent: PYTHONPATH not doubled
    assert os.environ["PYTHONPATH"].count(site) == 1


INTERPRETERS = [
    pytest.param(sys.executable, id="venv"),
    pytest.param(
        "/usr/bin/python3",
        id="debian",
        marks=pytest.mark.skipif(
            subprocess.run(
                ["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True
            ).returncode
            != 0,
            reason="no /usr/bin/python3 with pip",
        ),
    ),
]


@pytest.mark.parametrize("python", INTERPRETERS)
def test_pip_as_a_model_writes_it_installs_into_the_site_dir(
    python: str, tmp_path: Path, index: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(workspace),
        "TMPDIR": str(tmp_path),
        **_packages.environment(str(workspace), str(tmp_path)),
        "PIP_INDEX_URL": index,
    }
    done = subprocess.run(
        [python, "-m", "pip", "install", "demo"],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (workspace / ".packages" / "demo" / "__init__.py").exists()
    assert (workspace / ".packages" / "helperlib" / "__init__.py").exists()
    # A subprocess imports it through PYTHONPATH.
    check = subprocess.run(
        [python, "-c", "import demo; print(demo.VALUE)"],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.stdout.strip() == "42", check.stderr
    # Nothing went into the interpreter's own site-packages.
    assert (
        "demo"
        not in subprocess.run(
            [python, "-I", "-m", "pip", "list"], capture_output=True, text=True, env={}
        ).stdout.split()
    )


class _FakeProxy(http.server.BaseHTTPRequestHandler):
    """Stands in for the egress proxy: serves the daemon's cache by hash,
    refuses CONNECT to "refused.test", allows any other CONNECT."""

    files: dict[str, bytes] = {}
    asked: list[str] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_CONNECT(self) -> None:
        self.asked.append(f"CONNECT {self.path}")
        if self.path.startswith("refused.test"):
            body = (
                b"tooljail egress: refused refused.test:443 (not_allowed): no egress rule "
                b"allows it; this sandbox may reach: pypi.test:80,443"
            )
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.end_headers()
        self.close_connection = True

    def do_GET(self) -> None:
        self.asked.append(f"GET {self.path}")
        prefix = _packages.CACHE_URL
        data = self.files.get(self.path[len(prefix) :]) if self.path.startswith(prefix) else None
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch, isolated: None) -> Iterator[type[_FakeProxy]]:
    handler = type("Proxy", (_FakeProxy,), {"files": {}, "asked": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.test/simple")
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def _known(*wheels: Path) -> list[dict[str, Any]]:
    return [
        {
            "name": w.name.split("-")[0],
            "version": w.name.split("-")[1],
            "url": f"https://pypi.test/files/{w.name}",
            "sha256": hashlib.sha256(w.read_bytes()).hexdigest(),
        }
        for w in wheels
    ]


def test_remembered_wheels_come_from_the_cache_checked_without_pip(
    tmp_path: Path, proxy: type[_FakeProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    # urllib's shared opener, as code of an earlier call (or another test) left it:
    # built before the proxy was in the environment. The cache must not depend on it.
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    monkeypatch.setattr(urllib.request, "_opener", no_proxy)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    demo = make_wheel(wheels, "demo", "1.0", "from helperlib import VALUE\n")
    helper = make_wheel(wheels, "helperlib", "2.0", "VALUE = 42\n", pth="import os\n")
    known = _known(demo, helper)
    for wheel, entry in zip((demo, helper), known, strict=True):
        proxy.files[entry["sha256"]] = wheel.read_bytes()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    request = {"requirements": ["demo"], "known": {_packages.interpreter_tag(): known}}
    frame = _packages.install(request, str(workspace))
    assert frame["ok"], frame
    value = frame["value"]
    assert value["from_cache"] is True
    assert value["installed"] == [
        {"name": "demo", "version": "1.0"},
        {"name": "helperlib", "version": "2.0"},
    ]
    site = workspace / ".packages"
    assert (site / "demo" / "__init__.py").exists() and (site / "helperlib.pth").exists()
    assert (site / "demo-1.0.dist-info" / "INSTALLER").read_text() == "tooljail\n"
    # Only the proxy's cache was asked: nothing went to the index.
    assert all(a.startswith(f"GET {_packages.CACHE_URL}") for a in proxy.asked), proxy.asked


def test_a_cached_file_that_does_not_hash_right_is_not_installed(
    tmp_path: Path, proxy: type[_FakeProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    demo = make_wheel(wheels, "demo", "1.0", "VALUE = 1\n")
    known = _known(demo)
    proxy.files[known[0]["sha256"]] = b"PK tampered"
    ran: list[list[str]] = []

    def pip(requirements: list[str], site: str) -> list[dict[str, Any]]:
        ran.append(requirements)
        return []

    monkeypatch.setattr(_packages, "_pip", pip)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    request = {"requirements": ["demo"], "known": {_packages.interpreter_tag(): known}}
    frame = _packages.install(request, str(workspace))
    assert frame["ok"] and frame["value"]["from_cache"] is False
    assert ran == [["demo"]]  # pip fetched it instead
    assert not (workspace / ".packages" / "demo").exists()


def test_the_proxys_refusal_is_the_error(tmp_path: Path, proxy: type[_FakeProxy]) -> None:
    os.environ["PIP_INDEX_URL"] = "https://refused.test/simple"
    frame = _packages.install({"requirements": ["demo"]}, str(tmp_path))
    assert not frame["ok"]
    assert frame["error"]["type"] == "EgressDenied"
    assert "refused.test:443 (not_allowed)" in frame["error"]["message"]
    assert "pypi.test:80,443" in frame["error"]["message"]


def test_without_egress_the_error_says_what_to_ask_for(tmp_path: Path, isolated: None) -> None:
    frame = _packages.install({"requirements": ["demo"]}, str(tmp_path))
    assert not frame["ok"] and frame["error"]["type"] == "NoEgress"
    assert "egress=['pypi.org']" in frame["error"]["message"]


def test_unpack_replaces_an_older_version_and_refuses_unsafe_paths(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        wheel = make_wheel(wheels, "demo", version, f"V = {version!r}\n")
        with zipfile.ZipFile(wheel) as archive:
            assert _packages._pure(archive)
            _packages._unpack(archive, str(site), "demo")
    assert (site / "demo" / "__init__.py").read_text() == "V = '2.0'\n"
    assert sorted(p.name for p in site.glob("*.dist-info")) == ["demo-2.0.dist-info"]
    evil = tmp_path / "evil.whl"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../outside.py", "x")
    with zipfile.ZipFile(evil) as archive, pytest.raises(_packages.PackagesError):
        _packages._unpack(archive, str(site), "evil")
    assert not (tmp_path / "outside.py").exists()
    native = make_wheel(wheels, "native", "1.0", "", pure=False)
    with zipfile.ZipFile(native) as archive:
        assert not _packages._pure(archive)
    shutil.rmtree(site)
