"""Test helpers: a real tooljail daemon for a test, started and stopped around it.

    import tooljail.testing
    from tooljail import Client

    def test_my_tool() -> None:
        with tooljail.testing.daemon(tools_dirs=["my_tools"]) as target:
            with Client(target) as client:
                result = client.call("my_tool", {"n": 2})
        assert result.data == 4

`daemon(**settings)` runs the real thing (the gRPC servicer, the call manager,
sandboxes of the configured backend) on a fresh Unix socket with a fresh state
directory, and yields the target to give `Client` or `AsyncClient`. The
settings are the daemon's config keys (`tools_dirs`, `pool_size`,
`max_concurrent`, `limits={"cpu_s": 5}`, ...), checked as `tooljail serve`
checks its config file: an unknown key is refused, by name.

By default the daemon runs in this process, on its own event loop in a
background thread: it starts in a fraction of a second, and a sync `Client`
works from the test's thread as an `AsyncClient` does from the test's own loop.
Its sandboxes are then this process's children, and its log records go to this
process's `logging`. `in_process=False` runs `python -m tooljaild serve` as a
child process instead (about a second more to start), for tests where the
process boundary matters: signals, a crash, the daemon's own memory or
environment.

The daemon is not part of this package: `pip install tooljail[daemon]` brings
it, and the harness lives with it (`tooljaild.testing`). This module is its
thin entry point: `daemon()` imports the harness by name (`importlib`) when it
is called, so importing `tooljail.testing` costs an agent host nothing, and
the SDK keeps its rule that it never imports the daemon (import-linter checks
the SDK's static imports; a name looked up at run time is not one).
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

__all__ = ["daemon", "wait_for"]

_HARNESS = "tooljaild.testing"
"""The daemon's harness module, imported by name when `daemon()` is called."""


def wait_for(
    condition: Callable[[], Any], timeout: float = 15.0, interval: float = 0.01, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy, and return that.

    For waits on state that has no event to wait on (a file a tool writes, a
    process that exits); never a fixed sleep.

    Args:
        condition: Called until it returns a truthy value.
        timeout: Seconds to keep trying.
        interval: Seconds between tries.
        what: What is awaited, for the error message.

    Raises:
        TimeoutError: When `condition` stayed falsy for `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout}s: {what or condition!r}")
        time.sleep(interval)


@contextlib.contextmanager
def daemon(
    *,
    in_process: bool = True,
    start_timeout_s: float = 60.0,
    stop_grace_s: float = 5.0,
    **settings: Any,
) -> Iterator[str]:
    """Run a tooljail daemon for the duration of the `with` block.

    Args:
        in_process: Run the daemon on a background thread of this process (True,
            fast) or as a `python -m tooljaild serve` child process (False).
        start_timeout_s: How long the daemon may take to serve; past it, this raises.
        stop_grace_s: At exit, how long calls still running may take to finish
            before the daemon stops them (in place of `shutdown_grace_s`).
        settings: The daemon's config keys; nested tables as dicts
            (`limits={"cpu_s": 5}`). Unless given: `listen` is a Unix socket in
            a fresh temporary directory, `state_dir` another directory there, and
            `pool_size` is 1. The environment's `TOOLJAIL_*` variables apply as
            they do to `tooljail serve`, below these.

    Yields:
        The target to connect to: `Client(target)`.

    Raises:
        ImportError: When the daemon is not installed (`pip install tooljail[daemon]`).
        tooljaild.settings.config.ConfigError: When a setting is unknown or invalid (named).
        tooljaild.app.errors.DaemonError: When the daemon cannot start (its message says why).
        TimeoutError: When it does not serve within `start_timeout_s`.
    """
    harness = _harness()
    with harness.daemon(
        in_process=in_process,
        start_timeout_s=start_timeout_s,
        stop_grace_s=stop_grace_s,
        **settings,
    ) as target:
        yield target


def _harness() -> ModuleType:
    """The daemon's harness module.

    Raises:
        ImportError: When the daemon is not installed, saying how to install it.
    """
    try:
        return importlib.import_module(_HARNESS)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _HARNESS.startswith(exc.name):
            raise  # the daemon is there, but something it needs is not: say that
        raise ImportError(
            "tooljail.testing.daemon needs the daemon: pip install 'tooljail[daemon]'"
        ) from exc
