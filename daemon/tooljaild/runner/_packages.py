"""Packages at run time, inside a sandbox: the site directory, pip's settings, installs.

Where packages go. A sandbox with egress has a site directory in its
workspace, ``<workspace>/.packages`` (`SITE_DIR`): it counts in the workspace's
quota, is kept across a session's calls and goes with the session. It is never
the interpreter's own site-packages (which is read-only in every sandbox
anyway). `activate` puts it:

- on the interpreter's ``sys.path`` (in front, as PYTHONPATH would; through
  ``site.addsitedir`` semantics, so the ``.pth`` files of what is installed
  work), at a session's start, after every interpreter reset, and again before
  each call (`refresh`: code may have removed it, and a call's pip may have
  added ``.pth`` files or packages the import system has not seen yet);
- in ``PYTHONPATH`` for subprocesses (``python -c``, ``python -m x``), and in
  pip's settings (`environment`): ``PIP_TARGET`` is the site directory, so
  ``subprocess.run([sys.executable, "-m", "pip", "install", "x"])`` written by
  a model installs there, in a virtualenv's interpreter and in Debian's
  python3 alike (``--target`` skips PEP 668's externally-managed check;
  ``PIP_BREAK_SYSTEM_PACKAGES`` is set too for a ``--user`` or plain install
  by hand), ``PIP_TRUSTED_HOST`` for an index the operator configured over
  plain HTTP, ``PIP_UPGRADE`` so that the version asked for last replaces an
  older one in the target, and pip's own cache under the sandbox's TMPDIR
  (never shared between sandboxes).

`install` runs the ``install_packages`` built-in's request (kind "packages"):

    {"kind": "packages", "requirements": ["name==1.0", ...],
     "known": {"<interpreter tag>": [{"name", "version", "url", "sha256"}, ...]}}

``known`` is what the daemon remembered of an earlier install of the same
requirements from the same indexes (`tooljaild.egress.package_cache`). When it
holds this interpreter's tag and every wheel is pure Python, each wheel is
fetched by its hash from the daemon's cache through the proxy
(``http://packages.tooljail.internal/sha256/<hex>``), checked against its
sha256 here, and unpacked into the site directory: no pip, no index. Anything
else runs pip (``--target``, ``--report``) through the proxy, which caches
what it downloads. The value:

    {"installed": [{"name", "version"}], "from_cache": bool, "tag": str,
     "resolved": [{"name", "version", "url", "sha256"}]}

The index must be reachable: the proxy serves its cache only to a sandbox
whose egress allows an index, and before pip runs each index is asked for
once (`_check_reachable`): a sandbox without egress, or whose egress refuses
the index, gets the proxy's own refusal (host, port, rule) as the error, not
pip's retries.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket
    import zipfile

# hashlib, json, shutil, socket, subprocess, zipfile and urllib are imported
# where they are needed: every session's interpreter imports
# this module at its start, and most never install anything.

SITE_DIR = ".packages"
"""The site directory's name in the workspace."""
CACHE_URL = "http://packages.tooljail.internal/sha256/"
"""Where the daemon's proxy serves its cached files by sha256."""
MAX_WHEEL_BYTES = 512 * 1024 * 1024
"""The largest wheel the cache path fetches (bigger: pip)."""
_OUTPUT_TAIL = 4000
"""How much of pip's output a failure quotes."""
_NAME = re.compile(r"[-_.]+")

_active: dict[str, Any] = {}
"""What `activate` set up: "site" (the directory), "pth" (.pth files read, by
name, with their mtime), "mtime" (the directory's, when last looked at)."""


class PackagesError(Exception):
    """An install failed in a way the caller (a model) should read."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message


def site_dir(workspace: str) -> str:
    """The site directory of a sandbox whose workspace is `workspace`."""
    return os.path.join(workspace, SITE_DIR)


def environment(workspace: str, tmpdir: str, pythonpath: str = "") -> dict[str, str]:
    """The environment variables that send pip's installs (and imports of
    subprocesses) to the site directory.

    Args:
        workspace: The sandbox's workspace, as it sees it.
        tmpdir: The sandbox's own TMPDIR (pip's cache goes there).
        pythonpath: A PYTHONPATH already set, kept after the site directory.
    """
    site = site_dir(workspace)
    env = {
        "PYTHONPATH": f"{site}{os.pathsep}{pythonpath}" if pythonpath else site,
        "PIP_TARGET": site,
        "PIP_UPGRADE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_NO_WARN_SCRIPT_LOCATION": "1",
        "PIP_BREAK_SYSTEM_PACKAGES": "1",
        "PIP_PROGRESS_BAR": "off",
        "PIP_CACHE_DIR": os.path.join(tmpdir or "/tmp", "pip-cache"),
    }
    # An index the operator configured over plain HTTP (a local mirror, reached
    # only through the egress proxy) is trusted as such: pip ignores it otherwise.
    configured = [os.environ.get("PIP_INDEX_URL") or "", *_extra_index_urls()]
    plain = [_netloc(url) for url in configured if url.startswith("http://")]
    if plain:
        env["PIP_TRUSTED_HOST"] = " ".join(dict.fromkeys(plain))
    return env


def _netloc(url: str) -> str:
    """host[:port] of an http(s) URL."""
    return url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]


def _extra_index_urls() -> list[str]:
    return (os.environ.get("PIP_EXTRA_INDEX_URL") or "").split()


def activate(workspace: str) -> str:
    """Make the site directory of `workspace` this process's and its children's.

    Idempotent. Creates the directory, sets `environment` in os.environ and
    puts it on sys.path (`refresh`).

    Returns:
        The site directory.
    """
    site = site_dir(workspace)
    with contextlib.suppress(FileExistsError):
        os.mkdir(site, 0o755)
    if _active.get("site") != site:
        _active.clear()
        _active.update(site=site, pth={}, mtime=None)
        tmpdir = os.environ.get("TMPDIR", "/tmp")
        old = os.environ.get("PYTHONPATH", "")
        if old.split(os.pathsep)[0] != site:
            os.environ.update(environment(workspace, tmpdir, old))
        else:
            os.environ.update(environment(workspace, tmpdir, ""))
            os.environ["PYTHONPATH"] = old
    refresh()
    return site


def refresh() -> None:
    """Before a call: the site directory back on sys.path (in front) if code
    took it off, new ``.pth`` files read, and the import system told of what a
    subprocess installed since (its directory caches are dropped when the
    site directory changed). A no-op when `activate` was never called."""
    site = _active.get("site")
    if not site:
        return
    if site not in sys.path:
        sys.path.insert(0, site)
    try:
        mtime = os.stat(site).st_mtime_ns
    except OSError:
        return
    if mtime == _active.get("mtime"):
        return
    _active["mtime"] = mtime
    import importlib

    importlib.invalidate_caches()
    import site as site_module

    seen: dict[str, int] = _active["pth"]
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(site), key=lambda e: e.name):
            if not entry.name.endswith(".pth") or entry.name.startswith("."):
                continue
            stamp = entry.stat().st_mtime_ns
            if seen.get(entry.name) == stamp:
                continue
            seen[entry.name] = stamp
            # As site.addsitedir does for each file (paths it names, `import` lines).
            site_module.addpackage(site, entry.name, set(sys.path))


def interpreter_tag() -> str:
    """What decides which files pip picks for this interpreter: implementation,
    version, ABI flags, platform and C library."""
    import platform
    import sysconfig

    libc = "-".join(platform.libc_ver()) or "nolibc"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f"{sys.implementation.name}{version}{sys.abiflags}-{sysconfig.get_platform()}-{libc}"


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return _NAME.sub("-", name).lower()


# ------------------------------------------------------------------ install


def install(request: dict[str, Any], workspace: str) -> dict[str, Any]:
    """Run a "packages" request; the result frame (see the module docstring)."""
    try:
        value = _install(request, workspace)
    except PackagesError as exc:
        error = {"type": exc.type, "message": exc.message, "traceback": ""}
        return {"t": "result", "ok": False, "exit_code": 1, "error": error}
    return {"t": "result", "ok": True, "kind": "json", "value": value, "exit_code": 0}


def _install(request: dict[str, Any], workspace: str) -> dict[str, Any]:
    requirements = [str(r) for r in request.get("requirements") or []]
    if not requirements or any(r.startswith("-") for r in requirements):
        raise PackagesError("InvalidArguments", "no requirements, or one that is an option")
    site = activate(workspace)
    tag = interpreter_tag()
    known = (request.get("known") or {}).get(tag)
    if known and _proxy() is not None:
        # The proxy serves its cache only to a sandbox whose egress allows an
        # index: one that may not reach it gets a refusal here, and the check
        # below says why.
        installed = _from_cache(known, site)
        if installed is not None:
            refresh()
            return {"installed": installed, "from_cache": True, "tag": tag, "resolved": known}
    for url in _index_urls():
        _check_reachable(url)
    resolved = _pip(requirements, site)
    refresh()
    installed = [{"name": w["name"], "version": w["version"]} for w in resolved]
    return {"installed": installed, "from_cache": False, "tag": tag, "resolved": resolved}


def _index_urls() -> list[str]:
    """The indexes pip would use here: PIP_INDEX_URL, then PIP_EXTRA_INDEX_URL's."""
    primary = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    return [primary, *_extra_index_urls()]


def _proxy() -> tuple[str, int] | None:
    """The proxy this sandbox's egress goes through (HTTP_PROXY), if any."""
    value = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
    if not value:
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(value if "://" in value else f"http://{value}")
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 3128


def _check_reachable(url: str) -> None:
    """Ask the proxy once whether `url`'s host may be reached; its refusal, if
    it refuses, becomes the error (a model reads host, port and rule in it)."""
    import socket
    from urllib.parse import urlsplit

    proxy = _proxy()
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    no_egress = PackagesError(
        "NoEgress",
        f"this sandbox has no network, so the package index {host} cannot be reached: "
        f"open the session with egress to it (e.g. egress=['{host}'])",
    )
    if proxy is None:
        raise no_egress
    if parts.scheme == "https":
        head = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    else:
        head = f"HEAD {url} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n\r\n"
    try:
        with socket.create_connection(proxy, timeout=30) as conn:
            conn.sendall(head.encode("ascii", "replace"))
            status, body = _read_response(conn)
    except OSError:
        # The relay hangs up on a sandbox whose egress asks for nothing.
        raise no_egress from None
    if status == 0:  # closed unanswered: this sandbox's egress asks for nothing
        raise no_egress
    if status == 403:
        raise PackagesError(
            "EgressDenied",
            f"the package index {host}:{port} is not reachable from this sandbox: "
            f"{body.strip() or 'refused by the egress policy'}",
        )


def _read_response(conn: socket.socket) -> tuple[int, str]:
    """The status and (up to 4 KiB of) the body of the proxy's answer."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, ""
    if status != 403:
        return status, ""
    length = 4096
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = min(int(value.strip()), 4096)
    while len(body) < length:
        chunk = conn.recv(4096)
        if not chunk:
            break
        body += chunk
    return status, body[:length].decode("utf-8", "replace")


# ------------------------------------------------------------------ from the cache


def _from_cache(known: list[dict[str, Any]], site: str) -> list[dict[str, str]] | None:
    """Install the remembered wheels from the daemon's cache; None when this path
    cannot (a wheel not pure Python, a fetch that failed): then pip runs."""
    import io
    import zipfile

    wheels: list[tuple[dict[str, Any], zipfile.ZipFile]] = []
    try:
        for wheel in known:
            data = _fetch(str(wheel["sha256"]))
            if data is None:
                return None
            archive = zipfile.ZipFile(io.BytesIO(data))
            if not _pure(archive):
                return None
            wheels.append((wheel, archive))
    except (KeyError, zipfile.BadZipFile, PackagesError):
        return None
    for wheel, archive in wheels:
        _unpack(archive, site, str(wheel["name"]))
    return [{"name": str(w["name"]), "version": str(w["version"])} for w, _ in wheels]


def _fetch(sha256: str) -> bytes | None:
    """A cached file by its hash, through the proxy, checked here; None: not served."""
    import hashlib
    import urllib.error
    import urllib.request

    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return None
    try:
        # An opener of its own: urlopen's shared one keeps the proxies of the
        # environment it first saw (code of an earlier call may have made it).
        opener = urllib.request.build_opener(urllib.request.ProxyHandler())
        with opener.open(CACHE_URL + sha256, timeout=60) as response:
            data: bytes = response.read(MAX_WHEEL_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if len(data) > MAX_WHEEL_BYTES or hashlib.sha256(data).hexdigest() != sha256:
        return None  # not what was remembered: pip fetches it from the index instead
    return data


def _pure(archive: zipfile.ZipFile) -> bool:
    """Whether a wheel is pure Python: Root-Is-Purelib, and nothing but purelib data."""
    names = archive.namelist()
    wheel_files = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/WHEEL")]
    if len(wheel_files) != 1:
        return False
    text = archive.read(wheel_files[0]).decode("utf-8", "replace")
    if "root-is-purelib: true" not in text.lower():
        return False
    for name in names:
        top = name.split("/", 1)[0]
        if top.endswith(".data") and not name.startswith(f"{top}/purelib/"):
            return False  # scripts, headers, data: pip knows where they go
    return True


def _unpack(archive: zipfile.ZipFile, site: str, name: str) -> None:
    """Unpack a pure wheel into `site` as ``pip install --target --upgrade`` would:
    what it replaces (the same top-level entries, older dist-info) goes first."""
    import shutil

    members: list[tuple[zipfile.ZipInfo, str]] = []
    for info in archive.infolist():
        path = info.filename
        top = path.split("/", 1)[0]
        if top.endswith(".data"):
            path = path.split("/", 2)[2] if path.count("/") >= 2 else ""
        if not path or path.endswith("/"):
            continue
        parts = path.split("/")
        if (
            path.startswith("/")
            or ".." in parts
            or "\\" in path
            or (info.external_attr >> 28) == 0xA
        ):
            raise PackagesError("BadWheel", f"the wheel holds an unsafe path {info.filename!r}")
        members.append((info, path))
    tops = {path.split("/", 1)[0] for _, path in members}
    project = normalize(name)
    for entry in os.listdir(site):
        older = entry.endswith(".dist-info") and normalize(entry.split("-", 1)[0]) == project
        if entry in tops or older:
            target = os.path.join(site, entry)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
    for info, path in members:
        target = os.path.join(site, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with archive.open(info) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    for directory in dist_info:
        with open(os.path.join(site, directory, "INSTALLER"), "w") as f:
            f.write("tooljail\n")


# ------------------------------------------------------------------ pip


def _pip(requirements: list[str], site: str) -> list[dict[str, Any]]:
    """``pip install --target site --upgrade --report`` through the proxy; what it installed."""
    import json
    import subprocess

    tmpdir = os.environ.get("TMPDIR") or "/tmp"
    report = os.path.join(tmpdir, f"tooljail-pip-report-{os.getpid()}.json")
    argv = [
        sys.executable,
        "-I",  # pip of the interpreter, never one a package put into the site directory
        "-m",
        "pip",
        "install",
        "--target",
        site,
        "--upgrade",
        "--report",
        report,
        "--",
        *requirements,
    ]
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace"
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip()[-_OUTPUT_TAIL:]
            raise PackagesError(
                "PipFailed", f"pip install failed (exit code {done.returncode}):\n{said}"
            )
        with open(report, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise PackagesError("PipFailed", "pip wrote no report of what it installed") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(report)
    return [_resolved(item) for item in data.get("install") or []]


def _resolved(item: dict[str, Any]) -> dict[str, Any]:
    """One entry of pip's report, as name, version, url and sha256 ("" if unknown)."""
    metadata = item.get("metadata") or {}
    info = item.get("download_info") or {}
    archive = info.get("archive_info") or {}
    sha256 = (archive.get("hashes") or {}).get("sha256") or ""
    if not sha256 and str(archive.get("hash") or "").startswith("sha256="):
        sha256 = str(archive["hash"])[len("sha256=") :]
    return {
        "name": str(metadata.get("name") or ""),
        "version": str(metadata.get("version") or ""),
        "url": str(info.get("url") or ""),
        "sha256": str(sha256),
    }
