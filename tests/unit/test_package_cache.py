"""The daemon's package cache: content-addressed, private, checked on every read, bounded."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path

import pytest

from tooljail.errors import InvalidArgumentsError
from tooljaild.egress.package_cache import (
    CACHE_HOST,
    CachedWheel,
    PackageCache,
    resolution_key,
)
from tooljaild.settings.config import Settings
from tooljaild.tools.builtin.packages import check_install_arguments

INDEX = "pypi.test"
WHEEL_URL = f"https://{INDEX}/packages/ab/cd/demo-1.0-py3-none-any.whl"


def put(cache: PackageCache, url: str, data: bytes) -> Path | None:
    writer = cache.writer(url)
    assert writer is not None, url
    writer.write(data[: len(data) // 2])
    writer.write(data[len(data) // 2 :])
    return writer.commit()


@pytest.fixture
def cache(tmp_path: Path) -> PackageCache:
    return PackageCache(tmp_path / "cache", {INDEX}, max_bytes=1 << 20)


def test_a_file_is_kept_by_content_and_found_by_url_and_by_hash(cache: PackageCache) -> None:
    data = b"wheel bytes" * 100
    digest = hashlib.sha256(data).hexdigest()
    path = put(cache, WHEEL_URL, data)
    assert path == cache.root / "files" / digest
    assert cache.lookup(WHEEL_URL) == path
    assert cache.lookup(WHEEL_URL + "#sha256=" + digest) == path  # the link's fragment
    assert cache.lookup("sha256:" + digest) == path
    assert cache.lookup_target(f"/sha256/{digest}") == path
    assert cache.lookup_target("/sha256/../../etc/passwd") is None
    assert cache.lookup(f"https://{INDEX}/packages/other-1.0-py3-none-any.whl") is None
    assert path.read_bytes() == data


def test_files_and_directories_are_the_daemons_alone(cache: PackageCache) -> None:
    path = put(cache, WHEEL_URL, b"x")
    assert path is not None
    for directory in (cache.root, *(p for p in cache.root.iterdir() if p.is_dir())):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for file in (path, *(cache.root / "urls").iterdir()):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def test_only_immutable_file_urls_of_index_hosts_are_cached(cache: PackageCache) -> None:
    assert cache.wants(INDEX) and cache.wants(INDEX.upper()) and cache.wants(CACHE_HOST)
    assert not cache.wants("api.example.com")
    for url in (
        f"https://{INDEX}/simple/demo/",  # an index page changes
        f"https://{INDEX}/packages/demo-1.0.txt",
        "https://elsewhere.test/demo-1.0-py3-none-any.whl",  # not an index host
        "ftp://pypi.test/demo-1.0.tar.gz",
    ):
        assert cache.writer(url) is None, url
    for suffix in (".whl", ".tar.gz", ".zip", ".whl.metadata"):
        writer = cache.writer(f"https://{INDEX}/p/demo-1.0{suffix}")
        assert writer is not None
        writer.abort()


def test_a_tampered_file_is_removed_logged_and_a_miss(
    cache: PackageCache, caplog: pytest.LogCaptureFixture
) -> None:
    path = put(cache, WHEEL_URL, b"the real wheel")
    assert path is not None
    os.chmod(path, 0o600)
    path.write_bytes(b"the attacker's wheel")
    with caplog.at_level(logging.WARNING, logger="tooljaild.egress"):
        assert cache.lookup(WHEEL_URL) is None
    assert not path.exists()
    assert "does not hash to its name" in caplog.text
    # Fetched again, it is kept again.
    assert put(cache, WHEEL_URL, b"the real wheel") == path


def test_a_download_unlike_its_links_hash_is_not_kept(cache: PackageCache) -> None:
    wrong = "0" * 64
    assert put(cache, f"{WHEEL_URL}#sha256={wrong}", b"bytes") is None
    assert cache.lookup(WHEEL_URL) is None
    assert list((cache.root / "tmp").iterdir()) == []


def test_an_aborted_download_leaves_nothing(cache: PackageCache) -> None:
    writer = cache.writer(WHEEL_URL)
    assert writer is not None
    writer.write(b"half")
    writer.abort()
    assert writer.commit() is None
    assert cache.lookup(WHEEL_URL) is None
    assert list((cache.root / "tmp").iterdir()) == []


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    cache = PackageCache(tmp_path / "c", {INDEX}, max_bytes=2500)
    urls = [f"https://{INDEX}/p/d{i}-1.0-py3-none-any.whl" for i in range(3)]
    put(cache, urls[0], b"a" * 1000)
    put(cache, urls[1], b"b" * 1000)
    assert cache.lookup(urls[0]) is not None  # used: now the most recent
    put(cache, urls[2], b"c" * 1000)  # 3000 > 2500: the least recent (d1) goes
    assert cache.lookup(urls[1]) is None
    assert cache.lookup(urls[0]) is not None and cache.lookup(urls[2]) is not None
    assert cache.size_bytes == 2000
    # A file larger than the whole cache is never kept.
    assert put(cache, urls[1], b"x" * 3000) is None
    # A new daemon finds what is there, still bounded.
    again = PackageCache(tmp_path / "c", {INDEX}, max_bytes=1500)
    assert again.size_bytes <= 1500


def test_resolutions_are_recalled_only_while_every_file_is_cached(cache: PackageCache) -> None:
    data = b"wheel"
    digest = hashlib.sha256(data).hexdigest()
    wheel = CachedWheel("demo", "1.0", WHEEL_URL, digest)
    key = resolution_key(["Demo == 1.0"], ["https://pypi.test/simple"], "alice")
    assert key == resolution_key(["demo==1.0"], ["https://pypi.test/simple"], "alice")
    assert not cache.remember(key, "cp311", [wheel])  # not cached yet
    path = put(cache, WHEEL_URL, data)
    assert path is not None
    # A sandbox's report naming a cached URL with another file's hash is not kept.
    assert not cache.remember(key, "cp311", [CachedWheel("demo", "1.0", WHEEL_URL, "1" * 64)])
    assert cache.remember(key, "cp311", [wheel])
    assert cache.recall(key) == {"cp311": (wheel,)}
    assert cache.recall(resolution_key(["demo==1.0"], [], "alice")) == {}
    assert cache.recall(resolution_key(["demo==1.0"], ["https://pypi.test/simple"], "bob")) == {}
    os.chmod(path, 0o600)
    path.write_bytes(b"tampered")
    assert cache.recall(key) == {}


# --------------------------------------------------------------------------- install_packages


@pytest.mark.parametrize(
    "requirement",
    [
        "pandas==2.2.3",
        "requests",
        "httpx >= 0.27, <1",
        "Flask[async]~=3.0",
        "zope.interface",
        'tomli; python_version < "3.11"',
    ],
)
def test_install_packages_takes_pep_508_requirements(requirement: str) -> None:
    checked = check_install_arguments({"packages": [requirement]}, Settings())
    assert checked == {"packages": [requirement]}


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("--index-url=https://evil.test/simple", "is an option"),
        ("-e .", "is an option"),
        ("demo @ https://evil.test/demo.whl", "URL or a path"),
        ("https://evil.test/demo-1.0-py3-none-any.whl", "URL or a path"),
        ("./local/pkg", "URL or a path"),
        ("/etc/passwd", "URL or a path"),
        ("demo\n--extra-index-url x", "PEP 508"),
        ("", "empty"),
        ("demo===1.0 junk", "PEP 508"),
        ("x" * 201, "longer than 200"),
    ],
)
def test_install_packages_refuses_what_is_not_a_requirement(requirement: str, why: str) -> None:
    with pytest.raises(InvalidArgumentsError, match=why) as info:
        check_install_arguments({"packages": [requirement]}, Settings())
    assert info.value.parameter == "packages"


def test_install_packages_takes_1_to_50() -> None:
    for packages in ([], [f"p{i}" for i in range(51)]):
        with pytest.raises(InvalidArgumentsError, match="1 to 50"):
            check_install_arguments({"packages": packages}, Settings())
    assert len(check_install_arguments({"packages": ["a"] * 50}, Settings())["packages"]) == 50
