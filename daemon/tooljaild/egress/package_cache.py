"""The daemon's cache of package files (wheels, sdists, wheel metadata), on the host.

Sandboxes never see this directory: the egress proxy (its own thread) reads and
writes it for them. A file a package index serves under an immutable URL (a
name ending .whl, .tar.gz, .zip or .whl.metadata: index files carry their
version in the name, and an index never serves other bytes under it) is kept
once, by content:

    <root>/files/<sha256>              the bytes (0600)
    <root>/urls/<sha256(url)>.json     {"url", "sha256", "size"} (0600)
    <root>/resolutions/<sha256(key)>.json   what `install_packages` resolved (below)
    <root>/tmp/                        files being written (renamed into files/ whole)

Every directory is 0700 and the daemon's own: no sandbox can write into what
another reads (there is no shared writable pip cache), and a file is checked
against its sha256 on every lookup, so a file changed on disk (by anyone) is
removed, logged and treated as a miss (fetched again). The cache is bounded by
`max_bytes`, least recently used first out.

Resolutions make a repeated `install_packages` fast: once every wheel pip
resolved for (requirements, index URLs, interpreter tag) is in the cache, the
daemon remembers them (`remember`), and a later install with the same key gets
them back (`recall`) and fetches each by its hash from the proxy
(``http://packages.tooljail.internal/sha256/<hex>``, `CACHE_HOST`) instead of
running pip. Only the daemon writes a resolution, from what the sandbox said
pip installed, checked against the cache (each wheel is a file the proxy
fetched from an index under that URL). A sandbox's word is still a sandbox's
word (it could name an extra wheel it fetched itself): so a resolution is kept
per owner (the identity whose session installed it, `resolution_key`), and
never reaches another identity's sandbox.

Thread-safe: the proxy's thread and the daemon's loop both use one instance.
Hashing a file is blocking disk I/O: callers on an event loop run `lookup` in
an executor.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CACHE_HOST",
    "IMMUTABLE_SUFFIXES",
    "CacheWriter",
    "CachedWheel",
    "PackageCache",
    "resolution_key",
]

log = logging.getLogger("tooljaild.egress")

CACHE_HOST = "packages.tooljail.internal"
"""The name the proxy answers itself, from the cache: ``GET /sha256/<hex>``."""
IMMUTABLE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".whl.metadata")
"""URL path endings of files an index never changes (the only ones cached)."""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CachedWheel:
    """One wheel of a remembered resolution: what pip's report said, checked."""

    name: str
    version: str
    url: str
    sha256: str


def resolution_key(requirements: Iterable[str], index_urls: Sequence[str], owner: str) -> str:
    """The key resolutions are remembered by (one per interpreter tag under it):
    the requirements as a set (each lowercased, without spaces), the index URLs
    in order, and the identity they are kept for."""
    normal = sorted({"".join(r.split()).lower() for r in requirements})
    return json.dumps([normal, list(index_urls), owner], separators=(",", ":"))


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cacheable(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.path.endswith(IMMUTABLE_SUFFIXES)


def _fragment_sha256(url: str) -> str | None:
    """The ``#sha256=<hex>`` an index (PEP 503) may put on a file's link."""
    fragment = urlsplit(url).fragment
    if fragment.startswith("sha256="):
        value = fragment[len("sha256=") :].lower()
        if _HEX64.fullmatch(value):
            return value
    return None


def _without_fragment(url: str) -> str:
    return url.split("#", 1)[0]


class CacheWriter:
    """One file on its way into the cache: `write` its bytes, then `commit` or `abort`.

    Bytes go to a private temporary file, hashed as they come; `commit` renames
    it to ``files/<sha256>`` whole, so a reader never sees half a file. A file
    past the cache's `max_bytes` is dropped (commit returns None).
    """

    def __init__(self, cache: PackageCache, url: str, expected: str | None) -> None:
        self._cache = cache
        self._url = url
        self._expected = expected
        self._hash = hashlib.sha256()
        self._size = 0
        self._done = False
        fd, name = _mkstemp(cache.root / "tmp")
        self._path = Path(name)
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        """Add the next bytes of the file (past `max_bytes`, it will not be kept)."""
        if self._done:
            return
        self._size += len(data)
        if self._size > self._cache.max_bytes:
            self.abort()
            return
        self._hash.update(data)
        self._file.write(data)

    def commit(self) -> Path | None:
        """Keep the file; its path in the cache, or None when it was dropped
        (too large, aborted, or not the sha256 the index's link promised)."""
        if self._done:
            return None
        self._done = True
        self._file.close()
        digest = self._hash.hexdigest()
        if self._expected is not None and digest != self._expected:
            log.warning(
                "package cache: %s came with sha256 %s, its link says %s: not kept",
                self._url,
                digest,
                self._expected,
            )
            self._path.unlink(missing_ok=True)
            return None
        return self._cache._adopt(self._url, self._path, digest, self._size)

    def abort(self) -> None:
        """Drop what was written (a failed or cut download). Idempotent."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self._file.close()
        self._path.unlink(missing_ok=True)


def _mkstemp(directory: Path) -> tuple[int, str]:
    name = str(directory / f"part-{os.urandom(16).hex()}")
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    return fd, name


class PackageCache:
    """Package files by content, written only by the daemon, checked on every read.

    Args:
        root: The cache's directory (created 0700; its parents must exist).
        index_hosts: The package index hosts (lowercase names, no port) whose
            files are cached: `wants` says yes to them and to `CACHE_HOST`.
        max_bytes: The most the files may take together; past it the least
            recently used go first.
    """

    def __init__(self, root: Path, index_hosts: set[str], max_bytes: int) -> None:
        self.root = root
        self.index_hosts = frozenset(h.lower().rstrip(".") for h in index_hosts)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        for directory in (root, root / "files", root / "urls", root / "resolutions", root / "tmp"):
            directory.mkdir(mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)  # an older, looser directory is tightened
        for stale in (root / "tmp").iterdir():  # a daemon that died mid-download
            stale.unlink(missing_ok=True)
        self._sizes: dict[str, int] = {}
        """sha256 -> size of each file kept."""
        self._used: dict[str, float] = {}
        """sha256 -> when it was last written or read (the LRU's order)."""
        for path in (root / "files").iterdir():
            if _HEX64.fullmatch(path.name) and path.is_file():
                stat = path.stat()
                self._sizes[path.name] = stat.st_size
                self._used[path.name] = stat.st_mtime
            else:
                path.unlink(missing_ok=True)
        self._evict()

    @property
    def size_bytes(self) -> int:
        """What the kept files take together."""
        with self._lock:
            return sum(self._sizes.values())

    def wants(self, host: str) -> bool:
        """Whether the proxy should look into (and cache from) requests to `host`."""
        host = host.lower().rstrip(".")
        return host == CACHE_HOST or host in self.index_hosts

    def lookup(self, url: str) -> Path | None:
        """The cached file of `url` (or of ``sha256:<hex>``), checked; None: a miss.

        A file whose bytes no longer hash to its name is removed, logged and
        reported as a miss, so the caller fetches it again.
        """
        digest = self._digest_of(url)
        if digest is None:
            return None
        path = self.root / "files" / digest
        try:
            actual = _hash_file(path)
        except FileNotFoundError:
            self._forget(digest)
            return None
        if actual != digest:
            log.warning(
                "package cache: %s does not hash to its name (sha256 %s): removed, fetched again",
                path,
                actual,
            )
            path.unlink(missing_ok=True)
            self._forget(digest)
            return None
        now = time.time()
        with self._lock:
            if digest in self._sizes:
                self._used[digest] = now
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))
        return path

    def lookup_target(self, target: str) -> Path | None:
        """`lookup` for a request to `CACHE_HOST`: ``/sha256/<hex>`` (any other path: None)."""
        path = urlsplit(target).path
        prefix = "/sha256/"
        if not path.startswith(prefix) or not _HEX64.fullmatch(path[len(prefix) :]):
            return None
        return self.lookup("sha256:" + path[len(prefix) :])

    def writer(self, url: str) -> CacheWriter | None:
        """Somewhere to put the file `url` answers with; None when it is not
        cacheable (not an immutable file URL, or not of an index host)."""
        if not _cacheable(url):
            return None
        host = urlsplit(url).hostname or ""
        if host.lower() not in self.index_hosts:
            return None
        return CacheWriter(self, _without_fragment(url), _fragment_sha256(url))

    # ---------------------------------------------------------------- resolutions

    def remember(self, key: str, tag: str, wheels: Sequence[CachedWheel]) -> bool:
        """Keep what an install of `key` resolved for interpreter `tag`, if every
        wheel's file is in the cache under its URL with that sha256.

        Returns:
            Whether it was kept.
        """
        if not wheels:
            return False
        for wheel in wheels:
            path = self.lookup(wheel.url)
            if path is None or path.name != wheel.sha256:
                return False
        with self._lock:  # read, change, write: one writer at a time
            known = self._read_resolutions(key)
            known[tag] = [asdict(w) for w in wheels]
            _write_private(self._resolutions(key), json.dumps(known).encode(), self.root / "tmp")
        return True

    def recall(self, key: str) -> dict[str, tuple[CachedWheel, ...]]:
        """What installs of `key` resolved before, by interpreter tag: each while
        every file of it is still cached (and hashes right)."""
        with self._lock:
            known = self._read_resolutions(key)
        found: dict[str, tuple[CachedWheel, ...]] = {}
        for tag, entries in known.items():
            try:
                wheels = tuple(CachedWheel(**entry) for entry in entries)
            except TypeError:
                continue
            if wheels and all(self.lookup("sha256:" + w.sha256) is not None for w in wheels):
                found[tag] = wheels
        return found

    def _resolutions(self, key: str) -> Path:
        return self.root / "resolutions" / f"{_sha256_hex(key.encode())}.json"

    def _read_resolutions(self, key: str) -> dict[str, Any]:
        path = self._resolutions(key)
        try:
            raw: Any = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            path.unlink(missing_ok=True)
            return {}
        return raw if isinstance(raw, dict) else {}

    # ---------------------------------------------------------------- inside

    def _digest_of(self, url: str) -> str | None:
        if url.startswith("sha256:"):
            digest = url[len("sha256:") :].lower()
            return digest if _HEX64.fullmatch(digest) else None
        entry = self.root / "urls" / f"{_sha256_hex(_without_fragment(url).encode())}.json"
        try:
            raw: Any = json.loads(entry.read_bytes())
            digest = raw["sha256"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            return None
        return digest if isinstance(digest, str) and _HEX64.fullmatch(digest) else None

    def _adopt(self, url: str, part: Path, digest: str, size: int) -> Path:
        """Move a fully written, hashed file into files/ and point `url` at it."""
        path = self.root / "files" / digest
        os.replace(part, path)
        entry = json.dumps({"url": url, "sha256": digest, "size": size}).encode()
        _write_private(
            self.root / "urls" / f"{_sha256_hex(url.encode())}.json", entry, self.root / "tmp"
        )
        with self._lock:
            self._sizes[digest] = size
            self._used[digest] = time.time()
        self._evict()
        return path

    def _forget(self, digest: str) -> None:
        with self._lock:
            self._sizes.pop(digest, None)
            self._used.pop(digest, None)

    def _evict(self) -> None:
        """Remove the least recently used files until the rest fit in `max_bytes`.

        A url entry whose file is gone is left: it reads as a miss (`lookup`).
        """
        with self._lock:
            total = sum(self._sizes.values())
            victims: list[str] = []
            for digest in sorted(self._used, key=self._used.__getitem__):
                if total <= self.max_bytes:
                    break
                total -= self._sizes.pop(digest)
                del self._used[digest]
                victims.append(digest)
        for digest in victims:
            (self.root / "files" / digest).unlink(missing_ok=True)


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_private(path: Path, data: bytes, tmp: Path) -> None:
    """Write `path` whole (0600), through a file in `tmp` renamed over it."""
    fd, name = _mkstemp(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
