"""The `tooljail` command: serve, tools, call, get, cancel, approve, deny, sessions,
artifacts, doctor, images, demo, mcp.

Exit codes: 0 success; 1 the tool failed (error, timeout, cancelled, lost), or an
image build failed; 2 bad usage, a request the daemon refused, or a daemon command
(`serve`, `doctor`, `images`, `demo`, `tools --check`) where only the SDK is
installed; 3 no daemon (or, for `images` and `serve --backend docker`, no Docker
engine) answers.

Over 500 lines, on purpose: the parser and one short handler per command, each
read top to bottom; the work is elsewhere (`daemon`, `doctor`, `images`, the
SDK). Commands with a family of actions or options of their own have a module
each (`cli_sessions`, `cli_artifacts`, `cli_approvals`, `cli_mcp`), which adds
its parsers and runs them. Handlers import lazily:
`tooljail call` must not pay for the daemon's modules, and `pip install tooljail`
(no extras) has only the SDK's dependencies: at module level this imports the
standard library, the SDK and modules of tooljaild that import nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tooljaild.cli.credentials import add_credential_options, credential_arguments
from tooljaild.cli.extras import MissingExtraError, require_extra
from tooljaild.settings.sandbox import KINDS

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings

EXIT_OK, EXIT_TOOL_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
_DAEMON_COMMANDS = frozenset({"serve", "doctor", "images", "demo"})
"""The commands that need `pip install 'tooljail[daemon]'` (and `tools --check`)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tooljail",
        description="Run AI agents' tool calls in sandboxes, served over gRPC.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", type=Path, help="TOML config file (also $TOOLJAIL_CONFIG)")
    serve.add_argument("--listen", help="unix:///path/to.sock (default) or HOST:PORT")
    serve.add_argument(
        "--daemon-id",
        help="this daemon's name for clients (default: HOSTNAME:PORT or HOSTNAME:SOCKET)",
    )
    serve.add_argument(
        "--tools-dir",
        type=Path,
        action="append",
        dest="tools_dirs",
        help="directory of user tool files (repeatable)",
    )
    serve.add_argument(
        "--files-dir",
        type=Path,
        action="append",
        dest="files_dirs",
        help="directory execute_python_file may run files from (repeatable)",
    )
    serve.add_argument("--state-dir", type=Path, help="where state and workspaces live")
    serve.add_argument("--pool-size", type=int, help="sandboxes kept ready (0: none)")
    serve.add_argument(
        "--backend",
        choices=KINDS,
        help="where tools run unless their sandbox profile says otherwise: process "
        "(default) or docker (containers of docker.image; needs a Docker engine)",
    )
    serve.add_argument("--max-concurrent", type=int, help="calls running at once")
    serve.add_argument(
        "--max-queue", type=int, help="calls waiting for a slot; past it: RESOURCE_EXHAUSTED"
    )
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    serve.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics at /metrics here"
    )
    serve.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve gRPC health checks alone here, in plaintext (for probes without TLS)",
    )
    serve.add_argument(
        "--isolation",
        choices=["strict", "best-effort", "none"],
        help="strict: refuse to start without every isolation feature; "
        "best-effort (default): use what the host has; none: no namespaces",
    )

    def target(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--target", help="daemon address (default: $TOOLJAIL_TARGET or the default Unix socket)"
        )
        add_credential_options(sp)

    tools = sub.add_parser("tools", help="list the daemon's tools, or check tool files")
    target(tools)
    tools.add_argument(
        "--check",
        action="store_true",
        help="load tool files here (in a sandbox) and report problems",
    )
    tools.add_argument(
        "--tools-dir",
        type=Path,
        action="append",
        dest="tools_dirs",
        help="with --check: directory to check (repeatable; default: config)",
    )
    tools.add_argument("--config", type=Path, help="with --check: config file with tools_dirs")
    tools.add_argument("--json", action="store_true", help="print JSON")

    call = sub.add_parser("call", help="call a tool and stream its output")
    target(call)
    call.add_argument("tool")
    call.add_argument(
        "arguments",
        nargs="?",
        default="{}",
        help="the arguments as a JSON object, or - to read them from stdin",
    )
    call.add_argument("--timeout", type=float, help="seconds before the call times out")
    call.add_argument("--call-id", help="idempotency key for this call")
    call.add_argument("--session", metavar="ID", help="run in this session (tooljail sessions)")
    call.add_argument("--json", action="store_true", help="print the final result as JSON")

    get = sub.add_parser("get", help="show a call's state and result")
    target(get)
    get.add_argument("call_id")

    cancel = sub.add_parser("cancel", help="cancel a call")
    target(cancel)
    cancel.add_argument("call_id")

    # Here, not at the top: these modules import this one's helpers.
    from tooljaild.cli import approvals as cli_approvals
    from tooljaild.cli import artifacts as cli_artifacts
    from tooljaild.cli import mcp as cli_mcp
    from tooljaild.cli import sessions as cli_sessions

    cli_approvals.add_parsers(sub, target)
    cli_sessions.add_parser(sub, target)
    cli_artifacts.add_parser(sub, target)
    cli_artifacts.client_option(call)
    cli_mcp.add_parser(sub, target)

    doctor = sub.add_parser("doctor", help="report what this host provides for sandboxes")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--config", type=Path, help="config file (sandbox settings)")
    doctor.add_argument(
        "--isolation",
        choices=["strict", "best-effort", "none"],
        help="the level to check for; strict exits 1 when a feature is missing",
    )

    images = sub.add_parser("images", help="build and list the docker backend's sandbox images")
    images_sub = images.add_subparsers(dest="images_command", required=True, metavar="ACTION")
    build = images_sub.add_parser(
        "build",
        help="build sandbox images (offline too); does nothing for a current one",
    )
    build.add_argument("name", nargs="?", help="the image, e.g. python (default: every image)")
    build.add_argument(
        "--scientific",
        action="store_true",
        help="the variant with numpy, pandas, matplotlib, scipy",
    )
    build.add_argument(
        "--force", action="store_true", help="build even when current, without the build cache"
    )
    listing = images_sub.add_parser("list", help="each image's tag, status and size")
    listing.add_argument("--json", action="store_true", help="print JSON")

    demo = sub.add_parser("demo", help="start a daemon, make one real tool call, stop it")
    demo.add_argument(
        "--code",
        default="import sys, platform\n"
        "print(f'6 x 7 = {6 * 7}, from Python {platform.python_version()} "
        "in a tooljail sandbox')",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from tooljaild.cli import approvals as cli_approvals  # _parser's
    from tooljaild.cli import artifacts as cli_artifacts
    from tooljaild.cli import mcp as cli_mcp
    from tooljaild.cli import sessions as cli_sessions

    handler = {
        "serve": _serve,
        "tools": _tools,
        "call": _call,
        "get": _get,
        "cancel": _cancel,
        "approve": cli_approvals.run,
        "deny": cli_approvals.run,
        "sessions": cli_sessions.run,
        "artifacts": cli_artifacts.run,
        "doctor": _doctor,
        "images": _images,
        "demo": _demo,
        "mcp": cli_mcp.run,
    }[args.command]
    try:
        if args.command in _DAEMON_COMMANDS or (args.command == "tools" and args.check):
            require_extra("daemon")
        return handler(args)
    except MissingExtraError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _Exit as exit_:
        return exit_.code
    except KeyboardInterrupt:
        return 130


class _Exit(SystemExit):
    """Ends a command early with its exit status, after saying why on stderr.

    A SystemExit, not an error of the tree: nothing went wrong in tooljail, and
    outside `main` it ends the program with that status as `sys.exit` would.
    """

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code: int = code


def _settings(config: Path | None, **overrides: Any) -> Settings:
    """The daemon's settings from the config file, the environment and `overrides`.

    Raises:
        _Exit: With EXIT_USAGE, after naming what is wrong, when they are invalid.
    """
    from tooljaild.settings.config import ConfigError, load_settings

    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        raise _Exit(EXIT_USAGE) from exc


# ---------------------------------------------------------------------- serve


def _serve(args: argparse.Namespace) -> int:
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
    settings = _settings(args.config, **overrides)
    setup_logging(settings.log_level)
    # A reload (SIGHUP) reads them as here: the same file, environment and flags.
    reread = functools.partial(load_settings, args.config, **overrides)
    try:
        asyncio.run(Daemon(settings, reload_settings=reread).serve_until_signalled())
    except DaemonError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.unavailable else EXIT_USAGE
    return EXIT_OK


# ---------------------------------------------------------------------- client commands


def _client(args: argparse.Namespace) -> Any:
    from tooljail import Client

    # --client where the command has it; else the SDK's default ($TOOLJAIL_CLIENT).
    return Client(
        args.target, client_name=getattr(args, "client", None), **credential_arguments(args)
    )


def _with_client(args: argparse.Namespace, act: Callable[[Any, argparse.Namespace], int]) -> int:
    """`act(client, args)` on a client of `args`'s daemon; a refusal's exit status if refused."""
    from tooljail import TooljailError

    try:
        with _client(args) as client:
            status: int = act(client, args)
    except TooljailError as exc:
        return _refused(exc)
    return status


def _refused(exc: Exception) -> int:
    """Exit 3 when no daemon could be reached; 2 when it refused the request."""
    from tooljail import (
        ArtifactGoneError,
        DaemonUnavailableError,
        JournalUnavailableError,
        SessionEndedError,
        TransportError,
    )

    # The reason in a word too ("closed", "idle_ttl", "daemon_restart"), for scripts.
    why = ""
    if isinstance(exc, SessionEndedError | ArtifactGoneError) and exc.reason:
        why = f" [reason: {exc.reason}]"
    print(f"tooljail: {exc}{why}", file=sys.stderr)
    if isinstance(exc, (DaemonUnavailableError, JournalUnavailableError)) or (
        isinstance(exc, TransportError) and exc.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    ):
        return EXIT_UNAVAILABLE
    return EXIT_USAGE


def _tools(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    if args.check:
        return _check_tools(args)
    try:
        with _client(args) as client:
            tools = client.list_tools()
            diagnostics = client.diagnostics()
    except TooljailError as exc:
        return _refused(exc)
    if args.json:
        print(
            json.dumps(
                {
                    "tools": [t.model_dump() for t in tools],
                    "diagnostics": [d.model_dump() for d in diagnostics],
                },
                indent=2,
            )
        )
        return EXIT_OK
    for t in tools:
        first = t.description.strip().splitlines()[0] if t.description.strip() else ""
        print(f"{t.name:32} {t.source:8} timeout {t.timeout_s:g}s  {first}")
    for d in diagnostics:
        print(
            f"{d.severity}: {d.file}{':' + d.tool if d.tool else ''}: [{d.code}] {d.message}",
            file=sys.stderr,
        )
    return EXIT_OK


def _check_tools(args: argparse.Namespace) -> int:
    """`tools --check`: load the tool files as the daemon would, and report."""
    from tooljaild.app.daemon import check_tool_files
    from tooljaild.app.errors import DaemonError

    settings = _settings(args.config, tools_dirs=args.tools_dirs)
    if not settings.tools_dirs:
        print("tooljail: no tools directory: pass --tools-dir DIR", file=sys.stderr)
        return EXIT_USAGE
    try:
        registry = asyncio.run(check_tool_files(settings))
    except DaemonError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _report_check(registry, settings, as_json=args.json)


def _report_check(registry: Any, settings: Settings, *, as_json: bool) -> int:
    """Print the user tools (with the timeouts a daemon of these settings puts in
    force) and the diagnostics; exit 1 when any is an error."""
    from tooljaild.calls.terms import tool_info

    users = [t for t in registry.tools() if t.source == "user"]
    errors = [d for d in registry.diagnostics if d.severity == "error"]
    if as_json:
        print(
            json.dumps(
                {
                    "tools": [tool_info(t, settings).model_dump() for t in users],
                    "diagnostics": [d.model_dump() for d in registry.diagnostics],
                },
                indent=2,
            )
        )
    else:
        for t in users:
            print(f"ok      {t.name}  ({t.file})")
        for d in registry.diagnostics:
            where = d.file + (f" [{d.tool}]" if d.tool else "")
            print(f"{d.severity:7} {where}: {d.code}: {d.message}")
        print(f"{len(users)} tools ok, {len(errors)} errors")
    return EXIT_TOOL_FAILED if errors else EXIT_OK


def _call(args: argparse.Namespace) -> int:
    from tooljail import Output, StreamKind, TooljailError, ToolResult

    raw = sys.stdin.read() if args.arguments == "-" else args.arguments
    try:
        arguments = json.loads(raw)
    except ValueError as exc:
        print(
            f"tooljail: the arguments are not valid JSON ({exc}); pass a JSON object "
            """such as '{"code": "print(1)"}'""",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not isinstance(arguments, dict):
        print(
            "tooljail: the arguments must be a JSON object, e.g. "
            """'{"code": "print(1)"}'""",
            file=sys.stderr,
        )
        return EXIT_USAGE
    result: ToolResult | None = None
    try:
        with _client(args) as client:
            for item in client.stream(
                args.tool,
                arguments,
                timeout=args.timeout,
                call_id=args.call_id,
                session_id=args.session,
            ):
                if isinstance(item, Output):
                    out = (
                        sys.stderr
                        if item.stream in (StreamKind.STDERR, StreamKind.NOTICE)
                        else sys.stdout
                    )
                    text = item.data if item.stream is not StreamKind.YIELD else item.data + "\n"
                    out.write(text)
                    out.flush()
                else:
                    result = item
    except TooljailError as exc:
        return _refused(exc)
    assert result is not None
    _print_result(result, as_json=args.json)
    return EXIT_OK if result.ok else EXIT_TOOL_FAILED


def _print_result(result: Any, *, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    data = result.data
    python_data = isinstance(data, dict) and {"stdout", "stderr", "exit_code"} <= set(data)
    if data is not None and not python_data:
        print(data if isinstance(data, str) else json.dumps(data, indent=2))
    summary = f"[{result.status.value}] call {result.call_id} in {result.duration_s:.3f}s"
    if result.truncated:
        summary += f", output truncated ({result.output_bytes} bytes written)"
    if result.still_running:
        summary += ", still running"
    print(summary, file=sys.stderr)
    if result.message:
        print(result.message, file=sys.stderr)
    if result.error is not None and result.status.value != "timeout":
        print(f"{result.error.type}: {result.error.message}", file=sys.stderr)


def _get(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    try:
        with _client(args) as client:
            info = client.get_call(args.call_id)
    except TooljailError as exc:
        return _refused(exc)
    print(info.model_dump_json(indent=2))
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    try:
        with _client(args) as client:
            state = client.cancel(args.call_id)
    except TooljailError as exc:
        return _refused(exc)
    print(state.value)
    return EXIT_OK


# ---------------------------------------------------------------------- doctor, demo


def _doctor(args: argparse.Namespace) -> int:
    from tooljaild.cli.doctor import check_docker, check_host, render, strict_ready

    settings = _settings(args.config, isolation=args.isolation)
    features = check_host(
        settings.isolation,
        bwrap=settings.sandbox.bwrap,
        sandbox_user=settings.sandbox.user,
        python=settings.sandbox.python,
    ) + check_docker(
        settings.docker.docker_host, backend=settings.backend, image=settings.docker.image
    )
    if args.json:
        print(json.dumps([f.__dict__ for f in features], indent=2))
    else:
        print(render(features, settings.isolation))
    return (
        EXIT_TOOL_FAILED if settings.isolation == "strict" and strict_ready(features) else EXIT_OK
    )


# ---------------------------------------------------------------------- images


def _images(args: argparse.Namespace) -> int:
    from docker.errors import DockerException

    from tooljaild.sandbox.images import build as images

    specs: list[images.ImageSpec] = []
    if args.images_command == "build":
        try:
            specs = [images.spec_for(args.name)] if args.name else list(images.IMAGES.values())
            for spec in specs:  # raises for --scientific of an image without that variant
                images.build_args(spec, scientific=args.scientific)
        except images.ImageError as exc:
            print(f"tooljail: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        client = images.connect()
    except images.EngineUnavailableError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        if args.images_command == "list":
            return _images_list(client, as_json=args.json)
        for spec in specs:
            images.build(
                client,
                spec.name,
                scientific=args.scientific,
                force=args.force,
                log=lambda line: print(line, flush=True),
            )
    except images.ImageError as exc:
        print(f"tooljail: {exc}", file=sys.stderr)
        return EXIT_TOOL_FAILED
    except (DockerException, OSError) as exc:  # OSError: the connection broke
        print(f"tooljail: the Docker engine failed: {exc}", file=sys.stderr)
        return EXIT_TOOL_FAILED
    finally:
        client.close()
    return EXIT_OK


def _images_list(client: Any, *, as_json: bool) -> int:
    """Every image and variant: its tag, current / stale / missing, and size."""
    import dataclasses

    from tooljaild.sandbox.images import build as images

    rows = [
        images.image_status(client, name, scientific=scientific)
        for name, spec in sorted(images.IMAGES.items())
        for scientific in ((False, True) if spec.has_scientific else (False,))
    ]
    if as_json:
        print(json.dumps([dataclasses.asdict(s) for s in rows], indent=2))
        return EXIT_OK
    print(f"{'name':10} {'variant':11} {'tag':32} {'status':8} size")
    for s in rows:
        size = f"{s.size / 1e6:.0f} MB" if s.size is not None else "-"
        print(f"{s.name:10} {s.variant:11} {s.tag:32} {s.state.value:8} {size}")
    if any(s.state is not images.State.CURRENT for s in rows):
        print("\nbuild with: tooljail images build [NAME] [--scientific]")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
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
        with Client(target, timeout=5) as client:
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


if __name__ == "__main__":
    sys.exit(main())
