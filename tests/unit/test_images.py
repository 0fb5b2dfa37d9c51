"""Sandbox images without an engine: content hash, status, idempotent build, errors."""

from __future__ import annotations

import os
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from docker.errors import APIError, ImageNotFound

from tooljaild import cli
from tooljaild.cli.doctor import check_docker
from tooljaild.sandbox.images import base as image_base
from tooljaild.sandbox.images import build as images
from tooljaild.sandbox.images.build import ImageSpec, State

ROOT = Path(__file__).resolve().parents[2]
NO_ENGINE = "unix:///nonexistent/docker.sock"


# ---------------------------------------------------------------------- a fake engine


@dataclass
class FakeImage:
    id: str
    labels: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=lambda: {"Size": 123_000_000})


class FakeImages:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def get(self, reference: str) -> FakeImage:
        try:
            return self.engine.store[reference]
        except KeyError:
            raise ImageNotFound(f"No such image: {reference}") from None

    def pull(self, reference: str) -> None:
        self.engine.pulls.append(reference)
        self.engine.pull_gate.wait()
        if not self.engine.registry:
            raise APIError("dial tcp: lookup registry-1.docker.io: no such host")
        self.engine.store[reference] = FakeImage("sha256:registry-base")


class FakeAPI:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.engine.builds.append(kwargs)
        yield from self.engine.build_log
        if not any("error" in chunk for chunk in self.engine.build_log):
            built = FakeImage(f"sha256:built{len(self.engine.builds)}", dict(kwargs["labels"]))
            self.engine.store[kwargs["tag"]] = built

    def tag(self, image_id: str, repository: str, tag: str, force: bool = False) -> bool:
        image = next(i for i in self.engine.store.values() if i.id == image_id)
        self.engine.store[f"{repository}:{tag}"] = image
        return True


class FakeEngine:
    """The slice of `docker.DockerClient` that tooljaild.sandbox.images.build uses."""

    def __init__(self, *, registry: bool = True) -> None:
        self.store: dict[str, FakeImage] = {}
        self.registry = registry
        self.pulls: list[str] = []
        self.pull_gate = threading.Event()
        self.pull_gate.set()
        self.builds: list[dict[str, Any]] = []
        self.build_log: list[dict[str, Any]] = [
            {"stream": "Step 1/2 : FROM base\n"},
            {"stream": "Successfully built abc\n"},
        ]
        self.images = FakeImages(self)
        self.api = FakeAPI(self)


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ImageSpec:
    """A small image "t" with a Dockerfile and a helper file, registered in IMAGES."""
    directory = tmp_path / "t"
    directory.mkdir()
    (directory / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\nCOPY run.sh /\n")
    (directory / "run.sh").write_text("echo hi\n")
    spec = ImageSpec("t", directory, "tooljail/t", {"SCIENTIFIC": "0"})
    monkeypatch.setitem(images.IMAGES, "t", spec)
    return spec


def digest(spec: ImageSpec, **args: str) -> str:
    return images.content_hash(spec, {**spec.args, **args})


# ---------------------------------------------------------------------- the images themselves


def test_the_python_image_is_found_in_the_checkout() -> None:
    spec = images.IMAGES["python"]
    assert spec.directory == ROOT / "sandbox_images" / "python"
    dockerfile = (spec.directory / "Dockerfile").read_text()
    for line in ("ARG BASE=debian:bookworm-slim", "FROM ${BASE}", "ARG SCIENTIFIC=0"):
        assert line in dockerfile.splitlines()
    assert "USER 65534:65534" in dockerfile.splitlines()
    assert spec.has_scientific


def test_every_image_directory_ships_in_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["tooljaild.sandbox_images"] == "sandbox_images"
    for name in images.IMAGES:
        assert f"tooljaild.sandbox_images.{name}" in config["packages"], name
        assert config["package-data"][f"tooljaild.sandbox_images.{name}"] == ["*"], name


# ---------------------------------------------------------------------- content hash


def test_hash_is_stable_and_ignores_timestamps(spec: ImageSpec) -> None:
    first = digest(spec)
    assert first == digest(spec)
    dockerfile = spec.directory / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text())
    os.utime(dockerfile, (1, 1))
    assert digest(spec) == first
    assert len(first) == 64


@pytest.mark.parametrize(
    "change",
    [
        lambda d: (d / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\n"),
        lambda d: (d / "run.sh").write_text("echo bye\n"),
        lambda d: (d / "extra.txt").write_text(""),
        lambda d: (d / "run.sh").rename(d / "other.sh"),
        lambda d: (d / "run.sh").chmod(0o755),
    ],
    ids=["dockerfile", "file content", "new file", "renamed file", "executable bit"],
)
def test_hash_changes_with_the_directory(spec: ImageSpec, change: Any) -> None:
    before = digest(spec)
    change(spec.directory)
    assert digest(spec) != before


def test_hash_changes_with_the_build_args(spec: ImageSpec) -> None:
    assert digest(spec) != digest(spec, SCIENTIFIC="1")
    assert images.build_args(spec, scientific=True) == {"SCIENTIFIC": "1"}


def test_no_dockerfile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match=r"no Dockerfile in .*sandbox_images"):
        images.content_hash(ImageSpec("x", tmp_path, "tooljail/x"), {})


def test_unknown_image_and_variant(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match=r"no sandbox image 'nope'; known: .*python"):
        images.spec_for("nope")
    plain = ImageSpec("plain", tmp_path, "tooljail/plain")
    with pytest.raises(images.ImageError, match="has no scientific variant"):
        images.build_args(plain, scientific=True)


# ---------------------------------------------------------------------- status


def test_status_missing_stale_current(spec: ImageSpec) -> None:
    engine = FakeEngine()
    status = images.image_status(engine, "t")
    assert status.state is State.MISSING
    assert status.tag == f"tooljail/t:{digest(spec)[:12]}"
    assert status.moving_tag == "tooljail/t:latest"
    assert status.image_id is None

    engine.store["tooljail/t:latest"] = FakeImage("sha256:old", {images.LABEL_HASH: "0" * 64})
    stale = images.image_status(engine, "t")
    assert (stale.state, stale.image_id) == (State.STALE, "sha256:old")

    engine.store[status.tag] = FakeImage("sha256:new", {images.LABEL_HASH: digest(spec)})
    current = images.image_status(engine, "t")
    assert (current.state, current.image_id, current.size) == (
        State.CURRENT,
        "sha256:new",
        123_000_000,
    )
    scientific = images.image_status(engine, "t", scientific=True)
    assert scientific.state is State.MISSING
    assert scientific.moving_tag == "tooljail/t:scientific"


def test_a_tag_without_the_hash_label_is_not_current(spec: ImageSpec) -> None:
    engine = FakeEngine()
    engine.store[f"tooljail/t:{digest(spec)[:12]}"] = FakeImage("sha256:x", {})
    assert images.image_status(engine, "t").state is State.MISSING


# ---------------------------------------------------------------------- build


def test_build_on_the_registry_base_then_nothing(spec: ImageSpec) -> None:
    engine = FakeEngine()
    lines: list[str] = []
    result = images.build(engine, "t", log=lines.append)

    assert result.built and result.base == image_base.REGISTRY_BASE
    assert result.status.state is State.CURRENT
    assert engine.pulls == [image_base.REGISTRY_BASE]
    (call,) = engine.builds
    assert call["path"] == str(spec.directory)
    assert call["buildargs"] == {"SCIENTIFIC": "0", "BASE": image_base.REGISTRY_BASE}
    assert call["labels"] == {
        images.LABEL_IMAGE: "t",
        images.LABEL_HASH: digest(spec),
        images.LABEL_BASE: image_base.REGISTRY_BASE,
    }
    assert call["nocache"] is False and call["pull"] is False
    assert engine.store["tooljail/t:latest"] is engine.store[result.status.tag]
    assert "Step 1/2 : FROM base" in lines

    lines.clear()
    again = images.build(engine, "t", log=lines.append)
    assert not again.built and again.base is None
    assert len(engine.builds) == 1
    assert lines == [f"{result.status.tag} is current: nothing to build"]


def test_a_current_image_gets_its_moving_tag_back_without_a_build(spec: ImageSpec) -> None:
    engine = FakeEngine()
    images.build(engine, "t", log=lambda _: None)
    engine.store["tooljail/t:latest"] = FakeImage("sha256:something-else")
    lines: list[str] = []
    result = images.build(engine, "t", log=lines.append)
    assert not result.built and len(engine.builds) == 1
    assert engine.store["tooljail/t:latest"].id == result.status.image_id
    assert lines[0] == f"tagged tooljail/t:latest -> {result.status.tag}"


def test_force_builds_a_current_image_again_without_cache(spec: ImageSpec) -> None:
    engine = FakeEngine()
    images.build(engine, "t", log=lambda _: None)
    result = images.build(engine, "t", force=True, log=lambda _: None)
    assert result.built and len(engine.builds) == 2
    assert engine.builds[1]["nocache"] is True


def test_the_scientific_variant_has_its_own_tags(spec: ImageSpec) -> None:
    engine = FakeEngine()
    plain = images.build(engine, "t", log=lambda _: None)
    science = images.build(engine, "t", scientific=True, log=lambda _: None)
    assert science.built and science.status.tag != plain.status.tag
    assert engine.builds[1]["buildargs"]["SCIENTIFIC"] == "1"
    assert engine.store["tooljail/t:scientific"].id == science.status.image_id
    assert engine.store["tooljail/t:latest"].id == plain.status.image_id


def test_build_failure_shows_the_last_log_lines(spec: ImageSpec) -> None:
    engine = FakeEngine()
    engine.build_log = [
        {"stream": "Step 2/3 : RUN apt-get install nothing\n"},
        {"stream": "\x1b[91mE: Unable to locate "},
        {"stream": "package nothing\n\x1b[0m"},
        {"error": "The command '/bin/sh -c apt-get install nothing' returned a non-zero code: 100"},
    ]
    lines: list[str] = []
    with pytest.raises(images.ImageBuildError) as caught:
        images.build(engine, "t", log=lines.append)
    message = str(caught.value)
    assert "building tooljail/t:" in message and "returned a non-zero code: 100" in message
    assert "E: Unable to locate package nothing" in message
    assert caught.value.log_tail[-1] == "E: Unable to locate package nothing"
    assert "E: Unable to locate package nothing" in lines
    assert images.image_status(engine, "t").state is State.MISSING


# ---------------------------------------------------------------------- base


def test_a_present_registry_base_is_used_without_a_pull() -> None:
    engine = FakeEngine()
    engine.store[image_base.REGISTRY_BASE] = FakeImage("sha256:slim")
    assert image_base.ensure_base(engine, log=lambda _: None) == image_base.REGISTRY_BASE
    assert engine.pulls == []


def test_without_a_registry_an_offline_base_built_before_is_reused() -> None:
    engine = FakeEngine(registry=False)
    offline = f"{image_base.OFFLINE_REPOSITORY}:"
    engine.store[offline + _recipe_hash()] = FakeImage("sha256:debootstrapped")
    lines: list[str] = []
    assert image_base.ensure_base(engine, log=lines.append) == offline + _recipe_hash()
    assert any("cannot pull debian:bookworm-slim" in line for line in lines)


def _recipe_hash() -> str:
    import hashlib

    return hashlib.sha256(image_base.OFFLINE_RECIPE.encode()).hexdigest()[:12]


def test_a_pull_that_hangs_counts_as_no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    engine.pull_gate.clear()  # the pull never answers
    engine.store[f"{image_base.OFFLINE_REPOSITORY}:{_recipe_hash()}"] = FakeImage("sha256:b")
    monkeypatch.setattr(image_base, "PULL_TIMEOUT_S", 0.1)
    lines: list[str] = []
    start = time.monotonic()
    base = image_base.ensure_base(engine, log=lines.append)
    assert time.monotonic() - start < 5
    assert base.startswith(image_base.OFFLINE_REPOSITORY)
    assert any("no registry answered within" in line for line in lines)
    engine.pull_gate.set()


def test_offline_base_without_debootstrap_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(image_base.shutil, "which", lambda _: None)
    with pytest.raises(images.ImageError, match=r"apt-get install debootstrap.*debian:bookworm"):
        image_base.ensure_base(FakeEngine(registry=False), log=lambda _: None)


def test_offline_base_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_base.shutil, "which", lambda _: "/usr/sbin/debootstrap")
    monkeypatch.setattr(image_base.os, "geteuid", lambda: 1000)
    with pytest.raises(images.ImageError, match=r"needs root.*sudo tooljail images build"):
        image_base.ensure_base(FakeEngine(registry=False), log=lambda _: None)


def test_trim_never_follows_a_symlink_out_of_the_tree(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep")
    rootfs = tmp_path / "rootfs"
    doc = rootfs / "usr/share/doc"
    (doc / "bash").mkdir(parents=True)
    (doc / "bash/copyright").write_text("GPL")
    (doc / "bash/changelog.gz").write_text("...")
    (doc / "escape").symlink_to(host)  # an absolute link: the host's directory
    (rootfs / "usr/share/man/man1").mkdir(parents=True)
    (rootfs / "usr/share/locale").symlink_to(host)
    (rootfs / "var/cache/apt/archives").mkdir(parents=True)
    (rootfs / "var/cache/apt/archives/bash_5.2_amd64.deb").write_text("")
    (rootfs / "var/lib/apt/lists").mkdir(parents=True)
    (rootfs / "var/lib/apt/lists/deb.debian.org_Packages").write_text("")

    image_base._trim(rootfs)

    assert (host / "precious").read_text() == "keep"
    assert sorted(p.name for p in (doc / "bash").iterdir()) == ["copyright"]
    assert not (doc / "escape").exists()
    assert list((rootfs / "usr/share/man").iterdir()) == []
    assert list((rootfs / "var/cache/apt/archives").iterdir()) == []
    assert list((rootfs / "var/lib/apt/lists").iterdir()) == []


def test_debian_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    assert image_base.debian_mirror(tmp_path) == image_base.DEFAULT_MIRROR
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/2025\n"
        "URIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main contrib\n"
    )
    assert image_base.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
        "deb [signed-by=/usr/share/keyrings/k.gpg arch=amd64] http://first.example/debian "
        "bookworm main\n"
    )
    assert image_base.debian_mirror(tmp_path) == "http://first.example/debian"


# ---------------------------------------------------------------------- no engine


def test_connect_without_an_engine_says_how_to_start_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    start = time.monotonic()
    with pytest.raises(images.EngineUnavailableError) as caught:
        images.connect()
    assert time.monotonic() - start < 5
    assert NO_ENGINE in str(caught.value)
    assert "systemctl start docker" in str(caught.value)
    assert isinstance(caught.value, ConnectionError)


def test_cli_without_an_engine_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    assert cli.main(["images", "list"]) == cli.EXIT_UNAVAILABLE
    assert cli.main(["images", "build", "python"]) == cli.EXIT_UNAVAILABLE
    assert "no Docker engine answers" in capsys.readouterr().err


def test_cli_unknown_image_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["images", "build", "nope"]) == cli.EXIT_USAGE
    assert "no sandbox image 'nope'" in capsys.readouterr().err


def test_doctor_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    engine, sandbox_images = check_docker()
    assert (engine.name, engine.status, engine.required) == ("docker engine", "missing", False)
    assert "systemctl start docker" in engine.detail
    assert (sandbox_images.name, sandbox_images.status) == ("sandbox images", "n/a")
