"""SIGHUP's reload, without a daemon: what applies live, what waits for a restart."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tooljail.errors import TooljailError
from tooljaild.config import Settings
from tooljaild.registry import Registry, Tool
from tooljaild.reload import LIVE_SETTINGS, Reloader, compare


def settings(**values: object) -> Settings:
    return Settings(state_dir=Path("/nonexistent/state"), **values)  # type: ignore[arg-type]


def test_live_settings_apply_and_the_others_keep_their_running_value() -> None:
    running = settings(pool_size=4, log_level="INFO", default_timeout_s=180.0)
    read = settings(
        pool_size=8,
        log_level="DEBUG",
        default_timeout_s=60.0,
        limits={"cpu_s": 5, "sandbox_memory_bytes": 123 * 1024**2},
        listen="127.0.0.1:7000",
    )
    change = compare(running, read)
    assert change.live == ("default_timeout_s", "limits.cpu_s", "log_level")
    assert change.restart == ("limits.sandbox_memory_bytes", "listen", "pool_size")
    now = change.settings
    assert (now.log_level, now.default_timeout_s, now.limits.cpu_s) == ("DEBUG", 60.0, 5)
    # A warm sandbox is built with its sandbox-wide limits: those wait for a restart.
    assert now.limits.sandbox_memory_bytes == running.limits.sandbox_memory_bytes
    assert (now.pool_size, now.listen) == (4, running.listen)


def test_nothing_changed_is_nothing_to_apply() -> None:
    change = compare(settings(), settings())
    assert change.live == change.restart == ()


def test_sandbox_wide_limits_are_not_live() -> None:
    assert "limits.output_bytes" in LIVE_SETTINGS
    assert "limits.cpus" not in LIVE_SETTINGS
    assert "pool_size" not in LIVE_SETTINGS


class Recorder:
    """A daemon's side of a reload: what was applied."""

    def __init__(self, running: Settings, registry: Registry) -> None:
        self.settings, self.registry = running, registry
        self.applied = 0

    def apply(self, s: Settings, r: Registry) -> None:
        self.settings, self.registry = s, r
        self.applied += 1


def tool(name: str) -> Tool:
    return Tool(name=name, input_schema={"type": "object"}, source="user")


def reloader(daemon: Recorder, read: Settings | Exception, tools: Registry | Exception) -> Reloader:
    def read_settings() -> Settings:
        if isinstance(read, Exception):
            raise read
        return read

    async def load_tools(_s: Settings) -> Registry:
        if isinstance(tools, Exception):
            raise tools
        return tools

    return Reloader(
        running=lambda: daemon.settings,
        read_settings=read_settings,
        load_tools=load_tools,
        apply=daemon.apply,
        registry=lambda: daemon.registry,
    )


async def test_a_reload_applies_tools_and_live_settings_and_names_what_needs_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = Recorder(settings(), Registry(builtins=(tool("old"),)))
    new_tools = Registry(builtins=(tool("new"),))
    read = settings(max_timeout_s=500.0, pool_size=9)
    with caplog.at_level(logging.INFO, logger="tooljaild.reload"):
        assert await reloader(daemon, read, new_tools).reload()
    assert daemon.registry is new_tools
    assert daemon.settings.max_timeout_s == 500.0 and daemon.settings.pool_size == 4
    done = next(r for r in caplog.records if r.getMessage() == "reload: done")
    assert done.tools_added == ["new"] and done.tools_removed == ["old"]  # type: ignore[attr-defined]
    assert done.settings_applied == {"max_timeout_s": [1000.0, 500.0]}  # type: ignore[attr-defined]
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "pool_size" in warning.getMessage() and "restart" in warning.getMessage()


async def test_an_unusable_config_keeps_the_settings_and_still_reloads_the_tools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = settings()
    daemon = Recorder(running, Registry())
    new_tools = Registry(builtins=(tool("new"),))
    bad = TooljailError("invalid configuration (file x): pool_size: too big")
    assert not await reloader(daemon, bad, new_tools).reload()
    assert daemon.settings == running and daemon.registry is new_tools
    assert "pool_size: too big" in caplog.text


async def test_tools_that_cannot_be_loaded_keep_the_served_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = Registry(builtins=(tool("kept"),))
    daemon = Recorder(settings(), served)
    root, grpc_log = logging.getLogger(), logging.getLogger("grpc")
    levels = root.level, grpc_log.level
    try:
        assert not await reloader(
            daemon, settings(log_level="ERROR"), OSError("no sandbox")
        ).reload()
        assert root.level == logging.ERROR  # the log level applies at once
    finally:
        root.setLevel(levels[0])
        grpc_log.setLevel(levels[1])
    assert daemon.registry is served
    assert daemon.settings.log_level == "ERROR"  # the settings still apply
    assert "tools kept" in caplog.text
