"""Workspace change events (issue 24, item 5), through a real daemon over gRPC.

`session.watch(path)` streams what the session's supervisor reads from
inotify (runner/_watch.py): a call's writes, appends, moves and deletes come
in order; a watcher that stops reading gets an explicit dropped marker (the
kernel's queue overflowed) while the daemon's memory stays bounded; a path
outside the workspace, another client's session and the bounds are refused
clearly; the session's end ends the stream.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
import pytest

from tests.conftest import RunningDaemon, ServedDaemon
from tests.integration.test_session_streams import Opener, call, drain, open_session  # noqa: F401
from tests.unit.test_docker_sandbox import context, engine  # noqa: F401
from tooljail import AsyncClient, Client, Session
from tooljail.errors import (
    InvalidPathError,
    OverloadedError,
    PermissionDeniedError,
    SessionNotFoundError,
)
from tooljail.types import WorkspaceEvent, WorkspaceEventKind
from tooljaild.sandbox.session_streams import Spawn, WatchError

pytestmark = pytest.mark.timeout(120)

C, M, D, V = (
    WorkspaceEventKind.CREATED,
    WorkspaceEventKind.MODIFIED,
    WorkspaceEventKind.DELETED,
    WorkspaceEventKind.MOVED,
)

CHANGES = """
from pathlib import Path
Path("a.txt").write_text("one\\n")
with open("a.txt", "a") as f:
    f.write("two\\n")
Path("a.txt").rename("b.txt")
Path("sub").mkdir()
Path("sub/c.txt").write_text("c")
Path("b.txt").unlink()
"""
EXPECTED = [
    (C, "a.txt", "", False),
    (M, "a.txt", "", False),
    (V, "b.txt", "a.txt", False),
    (C, "sub", "", True),
    (C, "sub/c.txt", "", False),
    (D, "b.txt", "", False),
]
"""What CHANGES makes the watch tell, `squeezed`."""


def collect(
    events: Iterable[WorkspaceEvent],
    until: Callable[[WorkspaceEvent], bool],
    timeout_s: float = 20,
) -> list[WorkspaceEvent]:
    """Events (read in a thread) up to the first for which `until` holds; past
    `timeout_s`, the watch is closed and the test fails with what came."""
    got: list[WorkspaceEvent] = []
    found = threading.Event()

    def read() -> None:
        for event in events:
            got.append(event)
            if until(event):
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found.is_set():
        events.close()  # type: ignore[attr-defined]
        reader.join(5)
        raise AssertionError(f"not there within {timeout_s}s; {len(got)} events: {got[-5:]}")
    return got


def squeezed(events: list[WorkspaceEvent]) -> list[tuple[str, str, str, bool]]:
    """(kind, path, old_path, is_dir), repeats in a row made one: the kernel merges
    writes in a row, and a file made just as its directory was may be told twice.
    A file written in a directory just made may be told as created only (it was
    written before the directory's watch was in place; the scan after found it):
    its "modified" is left out."""
    out: list[tuple[str, str, str, bool]] = []
    for e in events:
        if e.kind == M and e.path == "sub/c.txt":
            continue
        item = (e.kind, e.path, e.old_path, e.is_dir)
        if not out or out[-1] != item:
            out.append(item)
    return out


def _run(session: Session, code: str) -> None:
    result = session.call("execute_python_code", {"code": code}, tool_timeout_s=60)
    assert result.ok, result


def test_a_calls_changes_come_in_order(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s, s.watch() as events:
        _run(s, CHANGES)
        got = collect(events, lambda e: e.kind == D and e.path == "b.txt")
    assert squeezed(got) == EXPECTED
    assert not any(e.dropped for e in got)


def test_a_watch_of_a_subdirectory_not_recursive(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        _run(s, "import os; os.makedirs('src/deep')")
        with s.watch("src", recursive=False) as events:
            _run(s, "open('src/deep/x', 'w').close(); open('top', 'w').close()\n"
                    "open('src/y', 'w').close()")  # fmt: skip
            got = collect(events, lambda e: e.path == "src/y")
        # Nothing from below src/ (not recursive) nor beside it.
        assert [(e.kind, e.path) for e in got] == [(C, "src/y")]


def test_a_watcher_that_does_not_read_gets_a_dropped_marker(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    """20,000 files made, written, renamed and removed (100,000 kernel events,
    80,000 lines) while the watcher reads nothing: gRPC's window and the
    daemon's credit fill (12,000 to 40,000 events here: gRPC's BDP probing
    grows its window), the supervisor stops reading inotify, the kernel's queue (16384)
    overflows, and the watcher reads a dropped marker; the daemon's RSS stays
    bounded and it answers meanwhile."""
    daemon = start_daemon()
    proc = psutil.Process(daemon.pid)
    with Client(daemon.target) as client, client.session() as s, s.watch() as events:
        rss_before = proc.memory_info().rss
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            making = pool.submit(
                _run, s, "import os\nos.mkdir('many')\n"
                "for i in range(20000):\n"
                "    with open(f'many/{i}', 'w') as f: f.write('x')\n"
                "    os.rename(f'many/{i}', f'many/r{i}')\n"
                "    os.remove(f'many/r{i}')"
            )  # fmt: skip
            slowest = 0.0
            while not making.done():
                asked = time.monotonic()
                client.list_sessions()
                slowest = max(slowest, time.monotonic() - asked)
                time.sleep(0.1)
            making.result()
        grown = proc.memory_info().rss - rss_before
        got = collect(events, lambda e: e.dropped, timeout_s=60)
    print(f"daemon RSS growth with a watcher not reading: {grown / 2**20:.1f} MiB; "
          f"{len(got)} events before the marker")  # fmt: skip
    assert got[-1].dropped and got[-1].kind == WorkspaceEventKind.DROPPED
    assert "overflow" in got[-1].dropped_hint
    assert len(got) < 80000  # some were lost, and said so
    assert grown < 32 * 2**20, f"the daemon grew by {grown / 2**20:.1f} MiB"
    assert slowest < 1.0, f"ListSessions took {slowest:.2f}s"
    daemon.assert_serving()


def test_a_path_outside_the_workspace_is_refused(served: ServedDaemon) -> None:
    with Client(served.target) as client, client.session() as s:
        _run(s, "import os; os.symlink('/', 'out'); open('file', 'w').close()")
        for bad in ("..", "../x", "/etc", "out", "out/etc", "file", "missing"):
            with pytest.raises(InvalidPathError):
                s.watch(bad)
        with s.watch(".") as events:  # the workspace itself, spelt so
            _run(s, "open('ok', 'w').close()")
            assert collect(events, lambda e: e.path == "ok")[-1].kind == C


def test_another_clients_session_is_not_found(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    from tests.integration.test_terminal import _tokens

    served = serve(auth={"tokens_file": _tokens(tmp_path)})
    a, b = Client(served.target, token="term-token-a"), Client(served.target, token="term-token-b")
    with a, b, a.session() as session:
        theirs = Session(b, session.info)  # b names a's session by its id
        with pytest.raises(SessionNotFoundError):
            theirs.watch()


def test_an_identity_that_may_not_ls_may_not_watch(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    """A watch tells the workspace's names, as `ls` does: the same policy holds."""
    path = tmp_path / "tokens.toml"
    digest = hashlib.sha256(b"no-ls-token").hexdigest()
    path.write_text(
        f'[identities.no-ls]\ntoken_sha256 = "{digest}"\ntools = ["execute_python_code"]\n'
    )
    path.chmod(0o600)
    served = serve(auth={"tokens_file": str(path)})
    with (
        Client(served.target, token="no-ls-token") as client,
        client.session() as s,
        pytest.raises(PermissionDeniedError, match="'ls'"),
    ):
        s.watch()


def test_the_bounds_of_watches_and_directories(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(sessions={"max_watches": 2, "watch_max_dirs": 4})
    with Client(served.target) as client, client.session() as s:
        _run(s, "import os; [os.makedirs(f'tree/{i}') for i in range(6)]")
        with pytest.raises(OverloadedError, match="bound of watched directories"):
            s.watch("tree")
        with s.watch("tree", recursive=False), s.watch("tree/1") as events:
            with pytest.raises(OverloadedError, match="watches open"):
                s.watch("tree/2")
            # A directory made past the bound is not watched, and that is said.
            _run(s, "import os; os.makedirs('tree/1/a/b/c/d')")
            got = collect(events, lambda e: e.dropped)
            assert "not watched" in got[-1].dropped_hint
        # Closed by the client, the watches are closed in the sandbox: room again.
        deadline = time.monotonic() + 10
        while True:
            try:
                with s.watch("tree/2", recursive=False), s.watch("tree/3", recursive=False):
                    break
            except OverloadedError:
                assert time.monotonic() < deadline, "a closed watch still counts"
                time.sleep(0.1)


def test_the_sessions_close_ends_the_stream(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        s = client.session()
        with s.watch() as events:
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                rest = pool.submit(list, events)
                time.sleep(0.3)
                s.close()
                assert rest.result(10) == []
            assert time.monotonic() - started < 10


def test_the_async_watch(served: ServedDaemon) -> None:
    async def main() -> list[WorkspaceEvent]:
        async with (
            AsyncClient(served.target) as client,
            client.session() as s,
            s.watch("", recursive=True) as events,
        ):
            await s.call("execute_python_code", {"code": CHANGES})
            got = []
            async for event in events:
                got.append(event)
                if event.kind == D and event.path == "b.txt":
                    return got
        raise AssertionError("the stream ended early")

    assert squeezed(asyncio.run(asyncio.wait_for(main(), 30))) == EXPECTED


@pytest.mark.docker
def test_a_calls_changes_on_docker(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(backend="docker")
    with Client(served.target) as client, client.session() as s, s.watch() as events:
        _run(s, CHANGES)
        got = collect(events, lambda e: e.kind == D and e.path == "b.txt", timeout_s=60)
    assert squeezed(got) == EXPECTED


def test_a_tree_moved_in_is_watched_and_its_entries_told_within_a_bound(
    served: ServedDaemon,
) -> None:
    """A directory moved into the watch is watched from then on; the entries it
    already held are reported as created, at most SCAN_LINES of them (then a
    dropped marker), so the supervisor holds no more than that."""
    with Client(served.target) as client, client.session() as s:
        _run(s, "import os\nos.makedirs('outside/big'); os.mkdir('in')\n"
                "for i in range(1500): open(f'outside/big/{i}', 'w').close()")  # fmt: skip
        with s.watch("in") as events:  # outside/ is not watched: big comes from nowhere
            _run(s, "import os; os.rename('outside/big', 'in/big')")
            got = collect(events, lambda e: e.dropped)
            assert got[-1].dropped and "1024 entries" in got[-1].dropped_hint
            created = {e.path for e in got if e.kind == C}
            assert len(created & {f"in/big/{i}" for i in range(1500)}) == 1024
            _run(s, "open('in/big/new', 'w').close()")
            assert collect(events, lambda e: e.path == "in/big/new")[-1].kind == C


HOSTILE_WATCH_OPS = [
    b'{"op": "watch"}',
    b'{"op": "watch", "id": "x"}',
    b'{"op": "watch", "id": 900, "path": 5}',
    b'{"op": "watch", "id": 901, "path": "../.."}',
    b'{"op": "watch", "id": 902, "path": "\\u0000"}',
    b'{"op": "watch", "id": 903, "path": "", "recursive": "yes", "max_dirs": -1,'
    b' "max_watches": true}',
    b'{"op": "credit", "id": 903, "n": 1e9}',
    b'{"op": "credit", "id": 903, "n": -5}',
    b'{"op": "close", "id": 903}',
    b'{"op": "close", "id": 903}',
    b'{"op": "credit", "id": 903, "n": 10}',
]


async def test_hostile_watch_ops_never_end_the_supervisor(open_session: Opener) -> None:  # noqa: F811
    """At the sandbox floor, on each backend: malformed watch ops are refused or
    dropped; the supervisor still watches, and calls still run."""
    session = await open_session()
    for line in HOSTILE_WATCH_OPS:
        session._pipes.send(line + b"\n")
    watch = await session.watch("", recursive=True)
    process = await session.spawn(Spawn(("sh", "-c", "mkdir d && mv d e && touch e/f")))
    await drain(process)
    got: list[tuple[str, str, str]] = []

    async def read() -> None:
        async for event in watch.events():
            got.append((event.kind, event.path, event.old_path))
            if event.path == "e/f":
                return

    await asyncio.wait_for(read(), 10)
    assert got[:2] == [("created", "d", ""), ("moved", "e", "d")]
    assert (await call(session, "print('and calls run')")).strip() == b"and calls run"
    watch.close()
    with pytest.raises(WatchError) as refused:
        await session.watch("../..", recursive=False)
    assert refused.value.bad_path and "leaves the workspace" in str(refused.value)
