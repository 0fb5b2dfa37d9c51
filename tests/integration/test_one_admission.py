"""One trip into the call manager per admission (issue 22, part 5), through a real daemon.

`CallManager.admit` checks a call's policy, its arguments (off the event loop
when large), whose session and call id it names, and admits it, with no await
between the ownership checks and the admission: an id found free cannot be
taken by another identity in between. Each refusal on that path is counted
once in the metrics, whichever check made it.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServedDaemon
from tooljail import AsyncClient, Client, ToolResult
from tooljail.errors import (
    CallIdConflictError,
    InvalidArgumentsError,
    PermissionDeniedError,
    SessionNotFoundError,
    TooljailError,
)
from tooljaild.calls.terms import CHECK_ON_LOOP_BYTES

TOKENS = {"agent-a": "token-of-a", "agent-b": "token-of-b"}
RUN = "execute_python_code"
# Past CHECK_ON_LOOP_BYTES: its check is on a thread, an await before the admission.
PADDING = "#" + "x" * (CHECK_ON_LOOP_BYTES + 1024)
COUNT_TOOL = '''
from tooljail import tool


@tool
def count(items: list[str]) -> int:
    """How many items there are."""
    return len(items)
'''
ITEMS = 15_000
"""Values whose schema check takes the thread a while (tens of ms): a wide window."""


def _tokens_file(directory: Path) -> Path:
    """agent-a may call execute_python_code and count only; agent-b has no policy."""
    path = directory / "tokens.toml"
    path.write_text(
        f'[identities.agent-a]\ntoken_sha256 = "{_sha(TOKENS["agent-a"])}"\n'
        'tools = ["execute_python_code", "count"]\n'
        f'[identities.agent-b]\ntoken_sha256 = "{_sha(TOKENS["agent-b"])}"\n'
    )
    path.chmod(0o600)
    return path


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refusals(port: int) -> dict[str, float]:
    """tooljail_refusals_total by reason, scraped from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "tooljail_refusals_total"
    }


@pytest.fixture
def with_tokens(serve: Callable[..., ServedDaemon], tmp_path: Path) -> tuple[ServedDaemon, int]:
    port = _free_port()
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "count.py").write_text(COUNT_TOOL)
    served = serve(
        tools_dirs=[tools],
        auth={"tokens_file": _tokens_file(tmp_path)},
        metrics_listen=f"127.0.0.1:{port}",
        pool_size=2,
    )
    return served, port


def test_each_refusal_of_the_admission_is_counted_once(
    with_tokens: tuple[ServedDaemon, int],
) -> None:
    served, port = with_tokens
    with (
        Client(served.target, token=TOKENS["agent-a"], retries=0) as a,
        Client(served.target, token=TOKENS["agent-b"], retries=0) as b,
    ):
        print_1 = {"code": "print(1)"}
        assert a.call(RUN, print_1, call_id="a-call").ok
        with b.session() as session:
            attempts: list[tuple[Callable[[], object], type[TooljailError]]] = [
                # The policy: a tool outside agent-a's allow-list.
                (lambda: a.call("list_artifacts", {}), PermissionDeniedError),
                # Another identity's call id, and session.
                (lambda: b.call(RUN, print_1, call_id="a-call"), CallIdConflictError),
                (lambda: a.call(RUN, print_1, session_id=session.id), SessionNotFoundError),
                # Bad arguments, large: checked on a thread.
                (lambda: a.call(RUN, {"code": 1, "pad": PADDING}), InvalidArgumentsError),
            ]
            for attempt, error in attempts:
                with pytest.raises(error):
                    attempt()
    expected = {error.code: 1.0 for _, error in attempts}
    deadline = time.monotonic() + 5
    while (counted := _refusals(port)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted == expected


@pytest.mark.timeout(60)
async def test_a_call_id_cannot_change_hands_between_its_check_and_its_admission(
    with_tokens: tuple[ServedDaemon, int],
) -> None:
    """Two identities race for one id with large arguments (their checks go to a
    thread, for a while): whoever is admitted first owns it, and the other is
    refused: never answered with the other's call, as it would be if the
    ownership check came before the await of the argument check."""
    served, _ = with_tokens
    arguments = {"items": [f"item-{i}" for i in range(ITEMS)]}
    async with (
        AsyncClient(served.target, token=TOKENS["agent-a"], retries=0) as a,
        AsyncClient(served.target, token=TOKENS["agent-b"], retries=0) as b,
    ):

        async def race(call_id: str) -> list[ToolResult | BaseException]:
            return await asyncio.gather(
                a.call("count", arguments, call_id=call_id),
                b.call("count", arguments, call_id=call_id),
                return_exceptions=True,
            )

        races = await asyncio.gather(*(race(f"contested-{i}") for i in range(6)))
    for outcomes in races:
        answered = [o for o in outcomes if isinstance(o, ToolResult)]
        taken = [o for o in outcomes if isinstance(o, CallIdConflictError)]
        assert len(answered) == 1 and len(taken) == 1, outcomes
        assert answered[0].ok and answered[0].data == ITEMS
