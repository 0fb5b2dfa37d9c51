"""A burst far past the daemon's bounds: every call is answered (a result, or a
quick refusal with a retry hint), and the journal has every admitted call."""

from __future__ import annotations

import threading
from collections import Counter

from tests.conftest import RunningDaemon
from tooljail import CallState, Client, OverloadedError, ToolResult

CLIENTS = 20
PER_CLIENT = 50


def test_1000_calls_from_20_clients_lose_nothing(start_daemon) -> None:  # type: ignore[no-untyped-def]
    daemon: RunningDaemon = start_daemon(
        env={"TOOLJAIL_MAX_CONCURRENT": "8", "TOOLJAIL_MAX_QUEUE": "200"}, pool_size=4
    )
    outcomes: dict[str, ToolResult | BaseException] = {}
    lock = threading.Lock()

    def client(n: int) -> None:
        with Client(daemon.target) as c:
            for i in range(PER_CLIENT):
                call_id = f"burst-{n}-{i}"
                try:
                    result: ToolResult | BaseException = c.call(
                        "execute_python_code", {"code": f"print({n * 1000 + i})"}, call_id=call_id
                    )
                except OverloadedError as exc:
                    result = exc
                with lock:
                    outcomes[call_id] = result

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outcomes) == CLIENTS * PER_CLIENT
    kinds = Counter(type(o).__name__ for o in outcomes.values())
    assert set(kinds) <= {"ToolResult", "OverloadedError"}, kinds
    with Client(daemon.target) as c:
        for call_id, outcome in outcomes.items():
            if isinstance(outcome, ToolResult):
                n, i = map(int, call_id.split("-")[1:])
                assert outcome.ok and outcome.data["stdout"] == f"{n * 1000 + i}\n"
                # Answered later too (from memory or the journal), the same way.
                assert c.get_call(call_id).state is CallState.SUCCEEDED
            else:
                assert outcome.retry_after_s > 0
    daemon.assert_serving()
