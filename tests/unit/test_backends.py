"""Choosing backends: the config keys, a tool's sandbox profile, and one pool per profile.

No Docker engine is needed: sandboxes here are fakes, and the engine-less paths
(`doctor`, a daemon refusing `--backend docker`) point at a socket nobody serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tooljail import tool
from tooljaild import cli
from tooljaild.app.pools import PoolSet, Profile
from tooljaild.cli.doctor import check_docker, zygote_feature
from tooljaild.sandbox.base import Sandbox
from tooljaild.sandbox.fake import FakeSandbox
from tooljaild.sandbox.pool import SandboxPool
from tooljaild.settings.config import ConfigError, Settings, load_settings
from tooljaild.settings.sandbox import DockerSandboxConfig, Limits, SandboxProfile, image_reference
from tooljaild.tools.loader import build_user_tools
from tooljaild.tools.registry import Tool, ToolOptions

NO_ENGINE = "unix:///nonexistent/docker.sock"


def user_tool(name: str = "t", **options: Any) -> Tool:
    return Tool(
        name=name,
        input_schema={"type": "object"},
        options=ToolOptions.model_validate(options),
        source="user",
        module_path="/tools/t.py",
        function=name,
    )


# ---------------------------------------------------------------------- config


def test_the_default_backend_is_process_and_docker_settings_have_defaults() -> None:
    s = Settings()
    assert s.backend == "process"
    assert s.docker.image == "tooljail/python:latest"
    assert s.docker.network is False
    assert s.docker.docker_host is None


def test_backend_and_docker_from_toml_env_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        'backend = "docker"\n'
        "[sandbox]\n"
        'user = "nobody"\n'  # the process backend's table, as before
        "[docker]\n"
        'image = "python:scientific"\n'
        'docker_host = "unix:///run/docker.sock"\n'
    )
    s = load_settings(config)
    assert s.backend == "docker"
    assert s.docker.image == "tooljail/python:scientific"
    assert s.docker.docker_host == "unix:///run/docker.sock"
    assert s.sandbox.user == "nobody"
    monkeypatch.setenv("TOOLJAIL_DOCKER__NETWORK", "true")
    monkeypatch.setenv("TOOLJAIL_DOCKER__IMAGE", "docker.io/library/python:3.12")
    s = load_settings(config, backend="process")  # a flag wins over the file
    assert s.backend == "process"
    assert s.docker.network is True
    assert s.docker.image == "docker.io/library/python:3.12"
    monkeypatch.setenv("TOOLJAIL_BACKEND", "docker")
    assert load_settings().backend == "docker"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('backend = "podman"', "backend: Input should be 'process' or 'docker'"),
        ('[docker]\nimage = "not an image"', "is not an image"),
        ('[docker]\nimgae = "python"', "docker.imgae: Extra inputs are not permitted"),
        ('[docker]\nuser = "0:0"', "never run as root"),
    ],
)
def test_bad_backend_settings_are_refused_saying_what(tmp_path: Path, text: str, says: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text + "\n")
    with pytest.raises(ConfigError, match=r"invalid configuration") as caught:
        load_settings(config)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("python", "tooljail/python:latest"),
        ("python:scientific", "tooljail/python:scientific"),
        ("tooljail/python:96e43054b62e", "tooljail/python:96e43054b62e"),
        ("docker.io/library/python:3.12", "docker.io/library/python:3.12"),
        ("localhost:5000/tools/py@sha256:" + "a" * 64,) * 2,
    ],
)
def test_image_names_and_references(given: str, meant: str) -> None:
    assert image_reference(given) == meant
    assert DockerSandboxConfig(image=given).image == meant


@pytest.mark.parametrize("bad", ["", "python 3", "py:", "python@sha256:abc", "-x", "a" * 300])
def test_bad_image_references(bad: str) -> None:
    with pytest.raises(ValueError, match="image"):
        image_reference(bad)


def test_serve_has_a_backend_flag() -> None:
    args = cli._parser().parse_args(["serve", "--backend", "docker"])
    assert args.backend == "docker"
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["serve", "--backend", "podman"])


# ---------------------------------------------------------------------- tool profiles


def test_tool_decorator_carries_the_sandbox_profile() -> None:
    @tool(sandbox={"backend": "docker", "image": "python", "network": False})
    def f() -> None:
        """Nothing."""

    spec = f.__tooljail_tool__  # type: ignore[attr-defined]
    assert spec["options"]["sandbox"] == {"backend": "docker", "image": "python", "network": False}
    tools, diagnostics = build_user_tools(
        [{"file": "/t.py", "specs": [{**spec, "function": "f"}], "problems": []}]
    )
    assert diagnostics == []
    assert tools[0].options.sandbox == SandboxProfile(
        backend="docker", image="python", network=False
    )


@pytest.mark.parametrize(
    ("sandbox", "says"),
    [
        ({"backend": "dock"}, "sandbox.backend: Input should be 'process' or 'docker'"),
        ({"backend": "docker", "imgae": "python"}, "sandbox.imgae: unknown sandbox key (known:"),
        ({"image": "python"}, "image is a docker setting: add backend='docker'"),
        ({"backend": "process", "image": "python"}, "image is a docker setting"),
        ({"network": True}, "network=True needs backend='docker'"),
        ({"backend": "docker", "network": "yes"}, "sandbox.network: Input should be a valid bool"),
        ({"backend": "docker", "image": "Not An Image"}, "is not an image"),
        ("docker", "sandbox: must be a dict, e.g. {'backend': 'docker'"),
    ],
)
def test_bad_sandbox_profiles_are_diagnostics_naming_the_problem(sandbox: Any, says: str) -> None:
    spec = {
        "name": "t",
        "function": "t",
        "input_schema": {"type": "object"},
        "options": {"sandbox": sandbox},
    }
    tools, diagnostics = build_user_tools([{"file": "/t.py", "specs": [spec]}])
    assert tools == []
    assert [d.code for d in diagnostics] == ["bad_options"]
    assert says in diagnostics[0].message, diagnostics[0].message


# ---------------------------------------------------------------------- profiles and pools


def pool_set(**settings: Any) -> tuple[PoolSet, list[Profile]]:
    made: list[Profile] = []

    def factory(profile: Profile) -> Callable[[], Sandbox]:
        def make() -> Sandbox:
            made.append(profile)
            return FakeSandbox()

        return make

    return PoolSet(Settings(pool_size=2, **settings), factory), made


def test_profiles_follow_the_daemon_unless_the_tool_chooses() -> None:
    pools, _ = pool_set()
    plain = user_tool("plain")
    docker = user_tool("docker", sandbox={"backend": "docker"})
    networked = user_tool("net", sandbox={"backend": "docker", "network": True})
    other_image = user_tool("img", sandbox={"backend": "docker", "image": "python:scientific"})
    big = user_tool("big", limits={"sandbox_memory_bytes": 2 * 1024**3})
    rlimit_only = user_tool("cpu", limits={"cpu_s": 5, "output_limit_bytes": 1000})
    assert pools.default.backend == "process"
    assert pools.profile_for(plain) == pools.default
    assert pools.profile_for(rlimit_only) == pools.default  # per-call limits share a pool
    assert pools.profile_for(docker) == Profile(
        "docker", "tooljail/python:latest", False, pools.default.limits
    )
    assert pools.profile_for(networked).network is True
    assert pools.profile_for(other_image).image == "tooljail/python:scientific"
    assert dict(pools.profile_for(big).limits)["sandbox_memory_bytes"] == 2 * 1024**3
    profiles = pools.profiles([plain, docker, networked, other_image, big, rlimit_only])
    assert profiles[0] == pools.default
    assert len(profiles) == 5


def test_with_the_docker_default_builtins_and_plain_tools_use_docker() -> None:
    pools, _ = pool_set(backend="docker", docker={"image": "python:scientific", "network": True})
    assert pools.default == Profile(
        "docker", "tooljail/python:scientific", True, pools.default.limits
    )
    assert pools.profile_for(user_tool(sandbox={"backend": "process"})).backend == "process"
    assert pools.profile_for(user_tool(sandbox={"backend": "docker", "network": False})) == (
        Profile("docker", "tooljail/python:scientific", False, pools.default.limits)
    )


def test_sandbox_limits_of_a_profile_override_only_the_sandbox_wide_ones() -> None:
    base = Limits(cpu_s=7)
    pools, _ = pool_set()
    profile = pools.profile_for(user_tool(limits={"sandbox_pids": 9, "cpu_s": 1}))
    built = profile.sandbox_limits(base)
    assert built.sandbox_pids == 9
    assert built.cpu_s == 7  # per call: it comes with the request


async def test_one_pool_per_profile_made_on_first_use_and_closed_together() -> None:
    pools, made = pool_set()
    plain, docker = user_tool("plain"), user_tool("docker", sandbox={"backend": "docker"})
    default_pool = pools.pool_for(plain)
    assert pools.pool_for(plain) is default_pool
    docker_pool = pools.pool_for(docker)
    assert docker_pool is not default_pool
    assert set(pools.pools) == {pools.default, pools.profile_for(docker)}
    assert await pools.wait_ready(list(pools.pools), timeout_s=5) == []
    assert made.count(pools.default) == 2 and made.count(pools.profile_for(docker)) == 2
    sandbox = await docker_pool.acquire()
    docker_pool.release(sandbox)
    await asyncio.sleep(0.1)  # release closes it in the background
    await pools.close()
    assert docker_pool.ready_count == 0 and default_pool.ready_count == 0


async def test_a_pool_whose_sandboxes_cannot_start_backs_off_instead_of_multiplying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No engine: every start fails at once. Retries must stay at one round per back-off
    step, not grow with every round (each failure used to start a round of its own)."""
    attempts = 0

    def make() -> Sandbox:
        nonlocal attempts
        attempts += 1
        return FakeSandbox(fail_start=True)

    pool = SandboxPool(make, 4)
    caplog.set_level(logging.CRITICAL, logger="tooljaild.sandbox.pool")
    pool.start()
    # Back-off steps of 0.2, 0.4, 0.8 and 1.6 s: 4 rounds of at most 2 (the CPUs) by 3.1 s.
    await asyncio.sleep(3.1)
    await pool.close()
    assert attempts <= 2 * 5, attempts


# ---------------------------------------------------------------------- no engine


def test_doctor_without_an_engine_says_what_each_default_means() -> None:
    features = check_docker(NO_ENGINE, backend="docker", image="tooljail/python:latest")
    by_name = {f.name: f for f in features}
    assert list(by_name) == ["default backend", "docker engine", "sandbox images", "docker image"]
    assert by_name["default backend"].detail == "docker (tooljail/python:latest)"
    engine = by_name["docker engine"]
    assert engine.status == "missing" and not engine.required
    assert NO_ENGINE in engine.detail and "systemctl start docker" in engine.detail
    assert "refuses to start" in engine.detail
    process = {f.name: f for f in check_docker(NO_ENGINE, backend="process")}
    assert "process-backed ones work" in process["docker engine"].detail


@pytest.mark.parametrize(
    ("machine", "release", "status", "says"),
    [
        ("x86_64", "6.1.0-28-amd64", "active", "cloned from a warm interpreter"),
        ("x86_64", "5.8.0", "active", "cloned from a warm interpreter"),
        ("x86_64", "5.4.0-150-generic", "missing", "older than 5.8"),
        ("aarch64", "6.1.0", "missing", "x86_64 only"),
    ],
)
def test_doctor_says_whether_sandboxes_come_from_the_zygote(
    machine: str, release: str, status: str, says: str
) -> None:
    feature = zygote_feature(True, machine, release)
    assert (feature.status, feature.required) == (status, False)
    assert says in feature.detail
    if status == "missing":
        assert "each sandbox starts its own bubblewrap" in feature.detail
    assert zygote_feature(False, machine, release).status == "n/a"
