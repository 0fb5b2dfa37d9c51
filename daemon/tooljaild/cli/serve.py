"""`tooljail serve` and `tooljail demo`: run the daemon, or try it once."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from tooljaild.cli.common import (
    EXIT_OK,
    EXIT_TOOL_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    load_settings_or_exit,
)


def serve(args: argparse.Namespace) -> int:
    import functools

    from tooljaild.app.daemon import Daemon
    from tooljaild.app.errors import DaemonError
    from tooljaild.app.logs import setup_logging
    from tooljaild.settings.config import load_settings

    overrides = dict(
        listen=args.listen,
        daemon_id=args.daemon_id,
        tools_dirs=args.tools_dirs,
        files_dirs=args.files_dirs,
        state_dir=args.state_dir,
        pool_size=args.pool_size,
        max_concurrent=args.max_concurrent,
        max_queue=args.max_queue,
        log_level=args.log_level,
        metrics_listen=args.metrics_listen,
        health_listen=args.health_listen,
        isolation=args.isolation,
        backend=args.backend,
    )
    settings = load_settings_or_exit(args.config, **overrides)
    setup_logging(settings.log_level)
    # A reload (SIGHUP) reads them as here: the same file, environment and flags.
    reread = functools.partial(load_settings, args.config, **overrides)
    try:
        asyncio.run(Daemon(settings, reload_settings=reread).serve_until_signalled())
    except DaemonError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.unavailable else EXIT_USAGE
    return EXIT_OK


def demo(args: argparse.Namespace) -> int:
    """Start the daemon on its defaults, make one real call through it, stop it.

    When a daemon already answers at the default target, the call goes to it
    and it is left running.
    """
    import subprocess
    import time

    from tooljail import Client, DaemonUnavailableError, default_target

    target = default_target()
    daemon: subprocess.Popen[bytes] | None = None
    try:
        with Client(target, rpc_timeout_s=5) as client:
            try:
                client.list_tools()
                print(f"using the daemon already serving at {target}", flush=True)
            except DaemonUnavailableError:
                print(f"$ tooljail serve    # listens on {target}", flush=True)
                daemon = subprocess.Popen(
                    [sys.executable, "-m", "tooljaild", "serve", "--log-level", "WARNING"]
                )
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.list_tools()
                        break
                    except DaemonUnavailableError:
                        if daemon.poll() is not None or time.monotonic() > deadline:
                            print("tooljail: the daemon did not start", file=sys.stderr)
                            return EXIT_UNAVAILABLE
                        time.sleep(0.1)
            call = {"code": args.code}
            print(f"$ tooljail call execute_python_code '{json.dumps(call)}'", flush=True)
            result = client.call("execute_python_code", call)
        sys.stdout.write(result.data["stdout"] if isinstance(result.data, dict) else "")
        print(
            f"[{result.status.value}] effect={result.effect.value} "
            f"in {result.duration_s * 1000:.1f} ms (call {result.call_id})"
        )
        return EXIT_OK if result.ok else EXIT_TOOL_FAILED
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
