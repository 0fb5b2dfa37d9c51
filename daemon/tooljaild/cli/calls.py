"""`tooljail tools`, `call`, `get` and `cancel`: a daemon's tools and calls, through the SDK."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from tooljaild.cli.common import (
    EXIT_OK,
    EXIT_TOOL_FAILED,
    EXIT_USAGE,
    connect,
    load_settings_or_exit,
    refused,
)

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings


def tools(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    if args.check:
        return _check_tools(args)
    try:
        with connect(args) as client:
            tools = client.list_tools()
            diagnostics = client.diagnostics()
    except TooljailError as exc:
        return refused(exc)
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
        cache = f" cache {t.cache_s:g}s" if t.cache_s else ""
        print(f"{t.name:32} {t.source:8} timeout {t.timeout_s:g}s{cache}  {first}")
    for d in diagnostics:
        print(
            f"{d.severity}: {d.file}{':' + d.tool if d.tool else ''}: [{d.code}] {d.message}",
            file=sys.stderr,
        )
    return EXIT_OK


def _check_tools(args: argparse.Namespace) -> int:
    """`tools --check`: load the tool files as the daemon would, and report."""
    from tooljaild.app.errors import DaemonError
    from tooljaild.app.start import check_tool_files

    settings = load_settings_or_exit(args.config, tools_dirs=args.tools_dirs)
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


def call(args: argparse.Namespace) -> int:
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
        with connect(args) as client:
            for item in client.stream(
                args.tool,
                arguments,
                tool_timeout_s=args.timeout,
                call_id=args.call_id,
                session_id=args.session,
                egress=args.egress,
                secrets=args.secret,
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
        return refused(exc)
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


def get(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    try:
        with connect(args) as client:
            info = client.get_call(args.call_id)
    except TooljailError as exc:
        return refused(exc)
    print(info.model_dump_json(indent=2))
    return EXIT_OK


def cancel(args: argparse.Namespace) -> int:
    from tooljail import TooljailError

    try:
        with connect(args) as client:
            state = client.cancel(args.call_id)
    except TooljailError as exc:
        return refused(exc)
    print(state.value)
    return EXIT_OK
