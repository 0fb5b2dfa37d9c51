"""The backend table: one place that says what each backend is, used by every caller.

A real daemon runs in-process here on `FakeBackend` (no sandboxes, no engine),
so the table's seams are exercised end to end: pools, start, the built-ins'
descriptions, a refusal, stop.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tooljail import AsyncClient
from tooljaild.app.daemon import Daemon
from tooljaild.app.errors import DaemonError
from tooljaild.app.pools import PoolSet
from tooljaild.sandbox.backends import (
    BACKENDS,
    Backend,
    FakeBackend,
    Profile,
    Promises,
    Unusable,
)
from tooljaild.sandbox.base import Sandbox
from tooljaild.sandbox.fake import FakeSandbox
from tooljaild.settings.config import Settings
from tooljaild.settings.sandbox import KINDS, SandboxProfile
from tooljaild.tools.builtin.catalog import RUNS, builtin_tools
from tooljaild.tools.builtin.workspace import WORKSPACE_TOOL_NAMES


def test_the_table_holds_every_kind_a_config_or_a_tool_may_name() -> None:
    assert tuple(BACKENDS) == KINDS
    for kind, entry in BACKENDS.items():
        assert entry.kind == kind
        config = entry.config(Settings())
        # STYLE practice 1: the config picks the backend, and typos are refused;
        # the config is plain data (tooljaild.settings): the backend builds from it.
        assert isinstance(config, BaseModel)
        assert config.kind == kind  # type: ignore[attr-defined]
        assert typing.get_args(type(config).model_fields["kind"].annotation) == (kind,)
        assert not hasattr(config, "build")
        assert type(config).model_config.get("extra") == "forbid"


def test_a_profile_is_decided_by_its_backends_entry() -> None:
    class Imaged(FakeBackend):
        kind = "process"

        @classmethod
        def profile(cls, settings: Settings, chosen: SandboxProfile | None, limits: Any) -> Profile:
            return Profile("process", "an-image", True, limits)

    def factory(profile: Profile) -> Callable[[], Sandbox]:
        return FakeSandbox

    pools = PoolSet(Settings(), factory, {**BACKENDS, "process": Imaged})
    assert (pools.default.image, pools.default.network) == ("an-image", True)
    assert pools.default.describe() == "process an-image, network"
    assert PoolSet(Settings(), factory).default.describe() == "process"


def _settings(tmp_path: Path, **more: Any) -> Settings:
    return Settings(
        listen=f"unix://{tmp_path}/d.sock", state_dir=tmp_path / "state", pool_size=1, **more
    )


async def test_a_daemon_runs_on_a_table_of_fakes_and_describes_what_holds(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    daemon = Daemon(
        _settings(tmp_path, files_dirs=[files]),
        backends={**BACKENDS, "process": FakeBackend.posing_as("process")},
    )
    await daemon.start()
    try:
        assert daemon.pool is not None and daemon.pool.ready_count == 1
        async with AsyncClient(f"unix://{tmp_path}/d.sock") as client:
            tools = {t.name: t for t in await client.list_tools()}
        # FakeBackend promises no isolation and a network: nothing more may be claimed.
        code = tools["execute_python_code"].description
        assert "not isolated" in code and "can reach the network" in code
        assert "network is off" not in code and "memory limit" not in code
        assert str(files.resolve()) in tools["execute_python_file"].description
    finally:
        await daemon.stop(1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files", "state"]  # noqa: ASYNC240


class Unavailable(FakeBackend):
    kind = "process"
    closed = False

    async def unusable(self, profiles: Any) -> dict[Profile, Unusable]:
        return {p: Unusable("nothing answers at nowhere", unavailable=True) for p in profiles}

    async def close(self) -> None:
        Unavailable.closed = True


async def test_the_daemon_refuses_when_its_default_backend_cannot_make_sandboxes(
    tmp_path: Path,
) -> None:
    daemon = Daemon(_settings(tmp_path), backends={**BACKENDS, "process": Unavailable})
    with pytest.raises(DaemonError, match="the default backend is process, but nothing answers"):
        try:
            await daemon.start()
        finally:
            await daemon.stop(0)
    assert Unavailable.closed
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # noqa: ASYNC240


@pytest.mark.parametrize(
    ("promises", "says", "never"),
    [
        (
            Promises(isolated=True, network=False, memory="1 GiB for the whole sandbox"),
            ["isolated sandbox", "The network is off", "memory limit (1 GiB for the whole"],
            ["not isolated", "reach the network"],
        ),
        (
            Promises(isolated=False, network=True, memory="4 GiB of address space per process"),
            ["not isolated", "can reach the network", "4 GiB of address space per process"],
            ["network is off", "isolated sandbox"],
        ),
        (
            Promises(isolated=True, network=True, memory=None),
            ["isolated sandbox", "can reach the network", "time limit."],
            ["network is off", "memory"],
        ),
        (None, ["fresh sandbox", "time limit"], ["network", "isolated", "memory"]),
    ],
)
def test_builtin_descriptions_claim_only_what_is_promised(
    promises: Promises | None, says: list[str], never: list[str]
) -> None:
    for tool in builtin_tools(promises, [Path("/srv/scripts")]):
        if tool.name in WORKSPACE_TOOL_NAMES:
            continue  # they say only where they run (tests/unit/test_workspace_tools.py)
        if RUNS[tool.name].kind == "daemon":
            continue  # no sandbox: nothing to promise (tests/unit/test_artifact_tools.py)
        for text in says:
            assert text in tool.description, (tool.name, tool.description)
        for text in never:
            assert text not in tool.description, (tool.name, tool.description)


def test_execute_python_file_says_where_it_looks() -> None:
    def file_tool(dirs: list[Path] | None) -> str:
        return next(
            t for t in builtin_tools(None, dirs) if t.name == "execute_python_file"
        ).description

    two = file_tool([Path("/srv/a"), Path("/srv/b")])
    assert (
        "relative to a files directory of this daemon (/srv/a, /srv/b), each tried in turn" in two
    )
    assert "absolute path inside one" in two and "workspace" not in two
    assert "Not enabled on this daemon: no files directory is configured" in file_tool([])
    assert "files directories configured for the daemon" in file_tool(None)


def test_a_backend_entry_that_promises_nothing_is_a_programming_error() -> None:
    class Bare(Backend):
        kind = "bare"

    with pytest.raises(NotImplementedError):
        Bare(Settings(), None).factory(Profile("bare"))  # type: ignore[arg-type]
