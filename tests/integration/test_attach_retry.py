"""A caller that loses its stream re-attaches, and the SDK rides out a daemon
that is not there yet: nothing missing, nothing twice, nothing run twice."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

import tooljail.testing
from tests.conftest import ServedDaemon
from tooljail import CallNotFoundError, Client, Output, StreamKind, ToolResult

SLOW_LINES = (
    "import time\nfor i in range(8):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
)

# A client that prints each chunk as "<seq> <data>" and is killed after a few.
CLIENT = textwrap.dedent(
    """
    import sys
    from tooljail import Client, Output

    target, call_id, code = sys.argv[1:4]
    with Client(target) as client:
        for item in client.stream("execute_python_code_stream", {"code": code}, call_id=call_id):
            if isinstance(item, Output):
                print(item.seq, item.data, end="", flush=True)
    """
)


def test_attach_after_the_client_died_gives_the_rest_once(served: ServedDaemon) -> None:
    call_id = "reattach-" + uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, served.target, call_id, SLOW_LINES],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen: dict[int, str] = {}
    for _ in range(3):  # the first three chunks, then the "network" goes
        seq, _, data = proc.stdout.readline().partition(" ")
        seen[int(seq)] = data
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    last = max(seen)
    with Client(served.target) as client:
        items = list(client.attach(call_id, from_seq=last + 1))
    outputs = [i for i in items if isinstance(i, Output)]
    assert all(o.stream is StreamKind.STDOUT for o in outputs)
    assert [o.seq for o in outputs] == list(range(last + 1, last + 1 + len(outputs)))
    for o in outputs:
        seen[o.seq] = o.data
    assert "".join(seen[s] for s in sorted(seen)) == "".join(f"line {i}\n" for i in range(8))
    assert isinstance(items[-1], ToolResult) and items[-1].ok
    # From the start, the whole call again; an unknown id is refused.
    with Client(served.target) as client:
        again = [i.data for i in client.attach(call_id) if isinstance(i, Output)]
        assert "".join(again) == "".join(f"line {i}\n" for i in range(8))
        with pytest.raises(CallNotFoundError):
            list(client.attach("no-such-call"))


def test_a_call_made_while_the_daemon_starts_waits_for_it_and_runs_once(
    tmp_path_factory: pytest.TempPathFactory, host_dir: Path
) -> None:
    base = tmp_path_factory.mktemp("late")
    target = f"unix://{base}/tooljail.sock"
    marker = host_dir / "ran"
    code = f"open({str(marker)!r}, 'a').write('x')\nprint('ok')"
    results: list[ToolResult | BaseException] = []

    def call() -> None:
        try:
            with Client(target, retries=6) as client:
                results.append(client.call("execute_python_code", {"code": code}))
        except BaseException as exc:  # reported below
            results.append(exc)

    caller = threading.Thread(target=call)
    # No daemon yet: the SDK retries with backoff. The daemon binds its socket only
    # after its isolation, zygote and pool are set up, long after the caller's first try.
    caller.start()
    with tooljail.testing.daemon(listen=target, isolation="none", pool_size=2):
        caller.join(30)
    assert results and isinstance(results[0], ToolResult), results
    assert results[0].ok and results[0].data["stdout"] == "ok\n"
    assert marker.read_text() == "x"  # it ran once
