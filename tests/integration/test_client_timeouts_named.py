"""`Client(rpc_timeout_s=)` and `call(tool_timeout_s=)`: two timeouts, two names.

`rpc_timeout_s` is the deadline of each try of a request answered at once
(list_tools, get_call, ...); `tool_timeout_s` is how long the tool may run,
sent to the daemon, which enforces it. Both were called `timeout`; the old
keyword still works, with a DeprecationWarning that names the caller's line.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import ServedDaemon
from tooljail import AsyncClient, CallStatus, Client, InvalidRequestError

pytestmark = pytest.mark.timeout(60)

SLEEP = {"code": "import time; time.sleep(10)"}


def test_each_timeout_does_what_its_name_says(served: ServedDaemon) -> None:
    with Client(served.target, rpc_timeout_s=30) as client:
        assert client.rpc_timeout_s == 30.0
        # The tool's own bound: the daemon stops the call, a result says so.
        result = client.call("execute_python_code", SLEEP, tool_timeout_s=1)
        assert result.status is CallStatus.TIMEOUT, result
        assert "may still take effect" in result.message
    with pytest.raises(InvalidRequestError, match="rpc_timeout_s"):
        Client(served.target, rpc_timeout_s=0)


def test_the_old_keywords_still_work_with_a_deprecation_warning(served: ServedDaemon) -> None:
    with pytest.warns(DeprecationWarning, match="rpc_timeout_s") as caught:
        client = Client(served.target, timeout=30)
    assert caught[0].filename == __file__  # the caller's line, not the SDK's
    with client:
        assert client.rpc_timeout_s == 30.0
        with pytest.warns(DeprecationWarning, match="rpc_timeout_s"):
            assert client.timeout == 30.0
        with pytest.warns(DeprecationWarning, match="tool_timeout_s") as caught:
            result = client.call("execute_python_code", SLEEP, timeout=1)
        assert caught[0].filename == __file__
        assert result.status is CallStatus.TIMEOUT, result  # still the tool's timeout
        with client.session() as session, pytest.warns(DeprecationWarning) as caught:
            items = list(session.stream("execute_python_code", SLEEP, timeout=1))
        assert caught[0].filename == __file__
        assert items[-1].status is CallStatus.TIMEOUT  # type: ignore[union-attr]
        with pytest.raises(TypeError, match="not both"):
            client.call("execute_python_code", SLEEP, tool_timeout_s=1, timeout=1)


def test_the_async_client_takes_the_same_names(served: ServedDaemon) -> None:
    async def main() -> None:
        with pytest.warns(DeprecationWarning, match="rpc_timeout_s"):
            client = AsyncClient(served.target, timeout=30)
        async with client:
            assert client.rpc_timeout_s == 30.0
            result = await client.call("execute_python_code", SLEEP, tool_timeout_s=1)
            assert result.status is CallStatus.TIMEOUT, result
            with pytest.warns(DeprecationWarning, match="tool_timeout_s"):
                result = await client.call("execute_python_code", SLEEP, timeout=1)
            assert result.status is CallStatus.TIMEOUT, result

    asyncio.run(main())
