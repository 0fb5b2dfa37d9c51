"""`tooljail mcp` through the `mcp` package's own clients, against a real daemon.

Over stdio the client spawns `python -m tooljaild mcp` (what the `tooljail`
script runs) with TOOLJAIL_TARGET naming the test daemon; over streamable HTTP
one `tooljail mcp --listen 127.0.0.1:0` per module serves every test, its token
in TOOLJAIL_MCP_TOKEN, which every client sends (`_http`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import tooljail.testing
from tooljail import AsyncClient

CODE = "execute_python_code"
STREAM = "execute_python_code_stream"
TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tooljail.testing.daemon(pool_size=2) as target:
        yield target


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tooljaild", "mcp", *args]


@asynccontextmanager
async def _stdio(target: str, *args: str) -> AsyncIterator[Client]:
    command = _command(*args)
    params = StdioServerParameters(
        command=command[0], args=command[1:], env={**os.environ, "TOOLJAIL_TARGET": target}
    )
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


@pytest.fixture(scope="module")
def http_url(target: str) -> Iterator[str]:
    yield from _http_server(target)


@pytest.fixture(scope="module")
def stateful_http_url(target: str) -> Iterator[str]:
    yield from _http_server(target, "--stateful")


@asynccontextmanager
async def _http(url: str, token: str | None = TOKEN, **options: Any) -> AsyncIterator[Client]:
    """mcp's client of the bridge at `url`, sending `token` as its bearer token."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    # Ours to close: mcp's transport leaves a client it was given open.
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, read_timeout_seconds=60, **options) as client:
            yield client


def _http_server(target: str, *args: str) -> Iterator[str]:
    with subprocess.Popen(
        _command("--target", target, "--listen", "127.0.0.1:0", *args),
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TOOLJAIL_MCP_TOKEN": TOKEN},
    ) as process:
        try:
            assert process.stderr is not None
            line = process.stderr.readline()  # it says where it serves, then serves
            found = re.search(r"at (http://\S+)", line)
            assert found, f"no URL from tooljail mcp --listen: {line!r}"
            yield found.group(1)
        finally:
            process.terminate()
            # SIGTERM is the way to stop it: a clean exit, status 0.
            assert process.wait(30) == 0


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def _check_list_success_failure(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    # Built-in, workspace and artifact tools, each with the optional timeout_s.
    assert {CODE, STREAM, "read_file", "read_artifact"} <= tools.keys()
    assert "timeout_s" in tools[CODE].input_schema["properties"]
    assert tools[CODE].input_schema["properties"]["code"]

    ok = await client.call_tool(CODE, {"code": "print(6 * 7)"})
    assert not ok.is_error
    assert _text(ok) == "42"
    assert ok.structured_content is not None and ok.structured_content["status"] == "success"

    failed = await client.call_tool(CODE, {"code": "raise ValueError('no such planet')"})
    assert failed.is_error
    assert "ValueError: no such planet" in _text(failed)

    unknown = await client.call_tool("no_such_tool", {})
    assert unknown.is_error
    assert "no_such_tool" in _text(unknown) and CODE in _text(unknown)


async def _check_stream(client: Client) -> None:
    pieces: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        pieces.append(message or "")

    code = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)"
    result = await client.call_tool(STREAM, {"code": code}, progress_callback=progress)
    assert not result.is_error, _text(result)
    assert "line 2" in _text(result)
    # Each line went out as it was printed: as progress, before the result.
    assert "".join(pieces).splitlines() == ["line 0", "line 1", "line 2"]
    assert len(pieces) >= 2


async def _check_session(client: Client, *, kept: bool) -> None:
    await client.call_tool(CODE, {"code": "x = 41"})
    result = await client.call_tool(CODE, {"code": "print(x + 1)"})
    if kept:
        assert not result.is_error, _text(result)
        assert _text(result) == "42"
    else:
        assert result.is_error
        assert "NameError" in _text(result)


# --- stdio --------------------------------------------------------------------------


async def test_stdio_lists_tools_and_calls_them(target: str) -> None:
    async with _stdio(target) as client:
        await _check_list_success_failure(client)


async def test_stdio_timeout_says_it_may_still_take_effect(target: str) -> None:
    async with _stdio(target) as client:
        result = await client.call_tool(
            CODE, {"code": "import time\ntime.sleep(5)", "timeout_s": 1}
        )
    assert result.is_error
    text = _text(result)
    assert "may still take effect" in text
    assert result.structured_content is not None
    call_id = result.structured_content["call_id"]
    assert f"Call id: {call_id}" in text
    assert result.structured_content["status"] == "timeout"
    assert "still_running" in result.structured_content


async def test_stdio_streams_output_as_progress(target: str) -> None:
    async with _stdio(target) as client:
        await _check_stream(client)


async def test_stdio_stateful_keeps_one_session_and_closes_it(target: str) -> None:
    async with AsyncClient(target) as tj:
        before = {s.session_id for s in await tj.list_sessions(all_clients=True)}
        async with _stdio(target, "--stateful") as client:
            await _check_session(client, kept=True)
            opened = [
                s for s in await tj.list_sessions(all_clients=True) if s.session_id not in before
            ]
            assert len(opened) == 1
        # The MCP client left: its session is closed.
        await _wait_closed(tj, {opened[0].session_id})


def test_sigterm_closes_the_stdio_clients_session_and_exits_0(target: str) -> None:
    # JSON-RPC by hand: mcp's stdio client hides the server's process.
    with (
        subprocess.Popen(
            _command("--stateful"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "TOOLJAIL_TARGET": target},
        ) as server,
        tooljail.Client(target) as tj,
    ):
        assert server.stdin is not None and server.stdout is not None

        def send(message: dict[str, object]) -> None:
            server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            server.stdin.flush()

        hello = {"name": "test", "version": "1"}
        send(
            {
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": hello,
                },
            }
        )
        assert json.loads(server.stdout.readline())["id"] == 1
        send({"method": "notifications/initialized"})
        before = {s.session_id for s in tj.list_sessions(all_clients=True)}
        send(
            {
                "id": 2,
                "method": "tools/call",
                "params": {"name": CODE, "arguments": {"code": "x = 1"}},
            }
        )
        assert json.loads(server.stdout.readline())["result"]["isError"] is False
        (opened,) = {s.session_id for s in tj.list_sessions(all_clients=True)} - before
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
        assert opened not in {s.session_id for s in tj.list_sessions(all_clients=True)}


async def test_a_request_the_client_gives_up_on_is_cancelled_on_the_daemon(target: str) -> None:
    async with _stdio(target, "--stateful") as client:
        # The client stops waiting after 1s and sends notifications/cancelled.
        with pytest.raises(Exception, match=r"(?i)timed out|timeout"):
            await client.call_tool(CODE, {"code": "import time\ntime.sleep(60)"}, 1)
        # A session runs one call at a time: this one runs at once only if the
        # daemon stopped the first (else it would wait ~60s for its turn).
        started = time.monotonic()
        after = await client.call_tool(CODE, {"code": "print('next')"}, 20)
        assert not after.is_error and "next" in _text(after)
        assert time.monotonic() - started < 15


async def test_stdio_without_stateful_keeps_no_variables(target: str) -> None:
    async with _stdio(target, "--tools", CODE) as client:
        assert [t.name for t in (await client.list_tools()).tools] == [CODE]
        await _check_session(client, kept=False)


def test_no_daemon_exits_3_saying_so(tmp_path: object) -> None:
    done = subprocess.run(
        _command("--target", f"unix://{tmp_path}/none.sock"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 3, done.stderr
    assert "tooljail:" in done.stderr and done.stdout == ""


def test_a_tool_not_served_exits_2_naming_them(target: str) -> None:
    done = subprocess.run(
        _command("--target", target, "--tools", "nope"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "'nope'" in done.stderr and CODE in done.stderr


# --- streamable HTTP ----------------------------------------------------------------


async def test_http_lists_tools_and_calls_them(http_url: str) -> None:
    async with _http(http_url) as client:
        await _check_list_success_failure(client)
        await _check_session(client, kept=False)


async def test_http_streams_output_as_progress(http_url: str) -> None:
    async with _http(http_url) as client:
        await _check_stream(client)


async def test_http_stateful_gives_each_client_its_session(
    target: str, stateful_http_url: str
) -> None:
    async with AsyncClient(target) as tj:
        before = {s.session_id for s in await tj.list_sessions(all_clients=True)}
        async with _http(stateful_http_url) as first:
            await _check_session(first, kept=True)
            async with _http(stateful_http_url) as second:
                # Its own session: the first's x is not there.
                other = await second.call_tool(CODE, {"code": "print(x)"})
                assert other.is_error and "NameError" in _text(other)
                opened = {s.session_id for s in await tj.list_sessions(all_clients=True)} - before
                assert len(opened) == 2
        # Both MCP sessions ended (a client deletes its own as it leaves): both closed.
        await _wait_closed(tj, opened)


async def _wait_closed(tj: AsyncClient, ids: set[str], timeout_s: float = 20) -> None:
    """Waits until none of `ids` is open (the bridge closes them as its clients go)."""
    deadline = time.monotonic() + timeout_s
    while ids & {s.session_id for s in await tj.list_sessions(all_clients=True)}:
        assert time.monotonic() < deadline, f"sessions still open: {ids}"
        await asyncio.sleep(0.1)


async def test_http_stateful_refuses_a_request_without_an_mcp_session(
    stateful_http_url: str,
) -> None:
    # A 2026-07-28 client sends each request on its own: no session to keep one for.
    async with _http(stateful_http_url, mode="2026-07-28") as client:
        result = await client.call_tool(CODE, {"code": "print(1)"})
    assert result.is_error
    assert "initialize handshake" in _text(result) and "did not run" in _text(result)


async def test_stdio_stateful_opens_a_new_session_when_its_session_ended(target: str) -> None:
    async with AsyncClient(target) as tj, _stdio(target, "--stateful") as client:
        before = {s.session_id for s in await tj.list_sessions(all_clients=True)}
        await client.call_tool(CODE, {"code": "x = 41"})
        (ended,) = {s.session_id for s in await tj.list_sessions(all_clients=True)} - before
        await tj.close_session(ended)

        gone = await client.call_tool(CODE, {"code": "print(x + 1)"})
        assert gone.is_error
        assert "a new session starts empty" in _text(gone)
        # The next call runs in a new, empty session.
        fresh = await client.call_tool(CODE, {"code": "print('fresh')"})
        assert not fresh.is_error and _text(fresh) == "fresh"
        now = {s.session_id for s in await tj.list_sessions(all_clients=True)} - before
        assert len(now) == 1 and ended not in now
