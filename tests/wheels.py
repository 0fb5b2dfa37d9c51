"""Tiny pure-Python wheels built by the tests (zipfile), and a PEP 503 index of them.

Until tests/egress_world.py serves a package index for every egress test, the
package tests build their own: `make_wheel` writes a wheel, `make_index` a
``simple/<project>/index.html`` tree over a directory of wheels (each link with
its ``#sha256=`` fragment, as PyPI gives them), served by `IndexServer` (a
stdlib HTTP server on loopback that counts the requests it gets).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    source: str,
    *,
    requires: Sequence[str] = (),
    pth: str | None = None,
    pure: bool = True,
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding module `name` (its
    ``__init__.py`` is `source`), depending on `requires`; its path.

    Args:
        pth: A ``<name>.pth`` file's content to ship beside the package.
        pure: False: a wheel that says Root-Is-Purelib: false.
    """
    dist = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {f"{name}/__init__.py": source.encode()}
    if pth is not None:
        files[f"{name}.pth"] = pth.encode()
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files[f"{dist}/METADATA"] = metadata.encode()
    files[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: tooljail-tests\n"
        f"Root-Is-Purelib: {'true' if pure else 'false'}\nTag: py3-none-any\n"
    ).encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def make_index(wheels: Path, root: Path) -> Path:
    """A PEP 503 simple index over the wheels of `wheels`, under `root`:
    ``root/simple/<project>/index.html`` linking ``root/files/<wheel>``."""
    (root / "files").mkdir(parents=True, exist_ok=True)
    projects: dict[str, list[Path]] = {}
    for wheel in sorted(wheels.glob("*.whl")):
        (root / "files" / wheel.name).write_bytes(wheel.read_bytes())
        projects.setdefault(wheel.name.split("-")[0].replace("_", "-").lower(), []).append(wheel)
    for project, files in projects.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
            f"{w.name}</a><br>\n"
            for w in files
        )
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.paths.append(self.path)
        super().do_GET()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    paths: list[str]
    lock: threading.Lock


@contextmanager
def serve_index(root: Path) -> Iterator[_Server]:
    """Serve `root` over HTTP on 127.0.0.1 (a free port); the server, which
    lists the paths it was asked for (`paths`)."""

    def handler(*args: object, **kwargs: object) -> _Handler:
        return _Handler(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    server = _Server(("127.0.0.1", 0), handler)  # type: ignore[arg-type]
    server.paths, server.lock = [], threading.Lock()
    thread = threading.Thread(target=server.serve_forever, name="test-index", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
