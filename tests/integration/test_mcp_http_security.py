"""Who reaches `tooljail mcp --listen`, and what one MCP client reaches of another's.

Played against a real daemon with mcp's own HTTP client: a request without the
bridge's token, or with a wrong one, is answered 401 with a Bearer challenge;
a listener off loopback without TLS never starts; with TLS it serves HTTPS;
two MCP sessions act under names of their own, and neither reads the other's
artifacts through the bridge.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import tooljail.testing
from tooljail import AsyncClient
from tooljail.integrations import mcp_server

CODE = "execute_python_code"
TOKEN = "sec-token-0123456789abcdefghij"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with tooljail.testing.daemon(pool_size=2) as target:
        yield target


@pytest.fixture(autouse=True)
def _token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # For a bridge started in this process; a child gets it in `_start`.
    monkeypatch.setenv("TOOLJAIL_MCP_TOKEN", TOKEN)


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tooljaild", "mcp", *args]


def _start(target: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _command("--target", target, *args),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TOOLJAIL_MCP_TOKEN": TOKEN, **(env or {})},
    )


def _url_of(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"at (https?://\S+)", line)
    assert found, f"no URL from tooljail mcp --listen: {line!r}"
    return found.group(1)


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    assert process.wait(30) == 0


@pytest.fixture(scope="module")
def http_url(target: str) -> Iterator[str]:
    with _start(target, "--listen", "127.0.0.1:0") as process:
        try:
            yield _url_of(process)
        finally:
            _stop(process)


@asynccontextmanager
async def _mcp(
    url: str,
    token: str | None = TOKEN,
    verify: ssl.SSLContext | bool = True,
    statuses: list[int] | None = None,
) -> AsyncIterator[Client]:
    """mcp's client of the bridge at `url`, bearing `token`; `statuses` records each
    HTTP status it is answered with (mcp's errors do not tell)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if verify is True:
        http = create_mcp_http_client(headers=headers)
    else:
        http = httpx2.AsyncClient(headers=headers, verify=verify, timeout=60)

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    http.event_hooks["response"].append(record)
    async with http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, read_timeout_seconds=60) as client:  # type: ignore[arg-type]
            yield client


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


# --- the token ----------------------------------------------------------------------


async def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **headers})


def _messages(error: BaseException) -> str:
    """The messages of an error and of every error it groups (mcp's task groups)."""
    if isinstance(error, BaseExceptionGroup):
        return "\n".join(_messages(e) for e in error.exceptions)
    return f"{type(error).__name__}: {error}"


async def _mcp_refusal(url: str, token: str | None) -> list[int]:
    """The HTTP statuses mcp's client is answered with when it connects with `token`
    and tries a call, which must fail."""
    statuses: list[int] = []
    try:
        async with _mcp(url, token=token, statuses=statuses) as client:
            await client.call_tool(CODE, {"code": "print(1)"})
    except Exception as e:
        assert "Server returned an error" in _messages(e) or "401" in _messages(e)
        return statuses
    raise AssertionError("mcp's client was served")


async def test_a_request_without_the_token_is_401_with_a_bearer_challenge(http_url: str) -> None:
    answer = await _post(http_url, {})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith('Bearer realm="tooljail-mcp"')
    assert "Authorization: Bearer" in answer.json()["error_description"]
    # mcp's own client, sending none, gets no session and runs nothing.
    assert set(await _mcp_refusal(http_url, None)) == {401}


async def test_a_wrong_token_is_401_invalid_token(http_url: str) -> None:
    for wrong in (TOKEN[:-1] + "X", TOKEN + "X", "short", TOKEN.upper()):
        answer = await _post(http_url, {"Authorization": f"Bearer {wrong}"})
        assert answer.status_code == 401, wrong
        assert 'error="invalid_token"' in answer.headers["www-authenticate"]
    basic = await _post(http_url, {"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert set(await _mcp_refusal(http_url, TOKEN + "X")) == {401}


async def test_the_right_token_is_served(http_url: str) -> None:
    async with _mcp(http_url) as client:
        result = await client.call_tool(CODE, {"code": "print(6 * 7)"})
    assert not result.is_error and _text(result) == "42"


# --- refusals at the start ----------------------------------------------------------


def _refused(target: str, *args: str, env: dict[str, str] | None = None) -> str:
    with _start(target, *args, env=env) as process:
        _, err = process.communicate(timeout=60)
        assert process.returncode == 2, err
        assert err.startswith("tooljail: "), err
        return err


def _refused_here(target: str, listen: str | None, **options: Any) -> str:
    """`tooljail mcp`'s refusal at its start, in this process (a CLI start costs seconds)."""
    with pytest.raises(ValueError) as refused:
        mcp_server.main(target, listen=listen, **options)
    return str(refused.value)


def test_a_listener_off_loopback_without_tls_is_refused_saying_how(target: str) -> None:
    # The command line: status 2 and what to do instead.
    err = _refused(target, "--listen", "0.0.0.0:0")
    assert "not a loopback address" in err and "--tls-cert-file" in err and "proxy" in err
    for host in ("[::]:0", "example.com:0", "10.1.2.3:0"):
        assert "not a loopback address" in _refused_here(target, host)


def test_no_token_is_refused_saying_where_to_put_one(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLJAIL_MCP_TOKEN", raising=False)
    err = _refused_here(target, "127.0.0.1:0")
    assert "--token-file" in err and "TOOLJAIL_MCP_TOKEN" in err and "bearer token" in err
    monkeypatch.setenv("TOOLJAIL_MCP_TOKEN", "abc")
    assert "at least 16 characters" in _refused_here(target, "127.0.0.1:0")
    # A token file other users can read is theirs too.
    shared = tmp_path / "token"
    shared.write_text(TOKEN + "\n")
    shared.chmod(0o644)
    err = _refused_here(target, "127.0.0.1:0", token_file=shared)
    assert "readable by other users" in err and "chmod 600" in err
    # Over stdio there is no listener to guard: the option is a mistake, said so.
    assert "for --listen" in _refused_here(target, None, token_file=shared)


async def test_a_token_file_is_read_and_its_token_required(target: str, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("file-token-0123456789abcdef\n")
    path.chmod(0o600)
    with _start(
        target, "--listen", "127.0.0.1:0", "--token-file", str(path), env={"TOOLJAIL_MCP_TOKEN": ""}
    ) as process:
        try:
            url = _url_of(process)
            assert (await _post(url, {"Authorization": f"Bearer {TOKEN}"})).status_code == 401
            async with _mcp(url, token="file-token-0123456789abcdef") as client:
                result = await client.call_tool(CODE, {"code": "print('by file')"})
            assert _text(result) == "by file"
        finally:
            _stop(process)


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


async def test_with_tls_a_listener_off_loopback_serves_https(target: str, tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    key.chmod(0o644)
    err = _refused_here(target, "0.0.0.0:0", tls_cert_file=cert, tls_key_file=key)
    assert "--tls-key-file" in err and "readable by other users" in err
    key.chmod(0o600)
    err = _refused_here(target, "0.0.0.0:0", tls_cert_file=cert)
    assert "go together" in err
    tls = ("--tls-cert-file", str(cert), "--tls-key-file", str(key))
    with _start(target, "--listen", "0.0.0.0:0", *tls) as process:
        try:
            url = _url_of(process)
            assert url.startswith("https://0.0.0.0:")
            url = url.replace("0.0.0.0", "127.0.0.1")
            trusted = ssl.create_default_context(cafile=str(cert))
            async with _mcp(url, verify=trusted) as client:
                result = await client.call_tool(CODE, {"code": "print('over tls')"})
            assert _text(result) == "over tls"
            # Plain HTTP to it is no MCP: nothing is served in clear text.
            with pytest.raises(httpx2.HTTPError):
                plain = url.replace("https://", "http://")
                await _post(plain, {"Authorization": f"Bearer {TOKEN}"})
        finally:
            _stop(process)


# --- one MCP client and another -----------------------------------------------------


@asynccontextmanager
async def _bridge(target: str, names: list[str], **options: Any) -> AsyncIterator[str]:
    """The HTTP bridge in this process, recording the client name of each tenant."""

    def client_for(name: str) -> AsyncClient:
        names.append(name)
        return AsyncClient(target, client_name=name)

    sock = mcp_server.bind("127.0.0.1", 0)
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    async with AsyncClient(target, client_name="bridge-under-test") as client:
        serving = asyncio.create_task(
            mcp_server.serve_http(
                client,
                sock,
                mcp_server.HttpSecurity(TOKEN),
                client_for=client_for,
                on_ready=ready.set_result,
                stop=stop,
                **options,
            )
        )
        try:
            yield await ready
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
            sock.close()


MAKE_ARTIFACT = (
    "import os\nos.makedirs('outputs', exist_ok=True)\n"
    "open('outputs/secret.txt', 'w').write('only for the first\\n')"
)


@pytest.mark.parametrize("stateful", [False, True], ids=["stateless", "stateful"])
async def test_two_mcp_sessions_have_their_own_names_and_artifacts(
    target: str, stateful: bool
) -> None:
    names: list[str] = []
    async with (
        _bridge(target, names, stateful=stateful) as url,
        _mcp(url) as first,
        _mcp(url) as second,
    ):
        made = await first.call_tool(CODE, {"code": MAKE_ARTIFACT})
        assert not made.is_error, _text(made)
        assert made.structured_content is not None
        (artifact,) = made.structured_content["artifacts"]
        artifact_id, call_id = artifact["artifact_id"], made.structured_content["call_id"]
        await second.call_tool(CODE, {"code": "print('second')"})

        # Each MCP session acts under a name of its own, the bridge's with a suffix.
        assert len(names) == 2 and len(set(names)) == 2
        assert all(re.fullmatch(r"bridge-under-test/mcp-[0-9a-f]{8}", n) for n in names)

        # The second reaches none of the first's artifacts, by any tool.
        for tool, arguments in [
            ("read_artifact", {"artifact_id": artifact_id}),
            ("tail_artifact", {"artifact_id": artifact_id}),
            ("search_artifact", {"artifact_id": artifact_id, "pattern": "only"}),
            ("list_artifacts", {"call_id": call_id}),
        ]:
            stolen = await second.call_tool(tool, arguments)
            assert stolen.is_error, (tool, _text(stolen))
            assert "of yours" in _text(stolen) and "only for the first" not in _text(stolen)
        listed = await second.call_tool("list_artifacts", {})
        assert not listed.is_error and artifact_id not in _text(listed)

        # The first reads and lists its own.
        mine = await first.call_tool("read_artifact", {"artifact_id": artifact_id})
        assert not mine.is_error and "only for the first" in _text(mine)
        own = await first.call_tool("list_artifacts", {})
        assert artifact_id in _text(own)
