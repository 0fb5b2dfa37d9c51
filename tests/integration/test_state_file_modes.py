"""What `tooljail serve` writes is its own: a real daemon's state directory, walked.

Issue 21, finding 14: the journal (every client's code and arguments) and its
`-wal` were 0644 in a 0711 state directory, so any local user, and every
sandbox under `isolation = "none"`, read them. After real calls, an artifact,
a session and an upload, every file and directory under the state directory
must be private to the daemon (no group or other bits), except a short
allow-list, each entry with its reason (tooljaild.sandbox.file_modes).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon, ServedDaemon, spawn_daemon, wait_serving
from tooljail import Client

SECRET = "sk-live-7f3a9-of-client-a"
MAKES_AN_ARTIFACT = {
    "code": (
        "import os\nos.makedirs('outputs', exist_ok=True)\n"
        "open('outputs/table.csv', 'w').write('a,b\\n1,2\\n')\n"
        f"token = {SECRET!r}\nprint('done')"
    )
}
OTHER_UID = 65534
"""A local user who is not the daemon (nobody; the process backend's sandbox uid too)."""

PASSED_THROUGH = 0o711
"""The state directory and workspaces/: sandboxes pass through by name, list nothing."""
RUNNER_DIR, RUNNER_FILE = 0o755, 0o644
"""runner/: tooljail's own code, read by every sandbox."""


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    yield root, root.lstat()
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            yield path, path.lstat()


def _not_private(state_dir: Path) -> list[str]:
    """Every entry under `state_dir` that others may read, write or enter, off the allow-list."""
    me, problems = os.geteuid(), []
    for path, st in _walk(state_dir):
        rel, mode = path.relative_to(state_dir), stat.S_IMODE(st.st_mode)
        parts = rel.parts
        if parts[:1] == ("workspaces",) and len(parts) >= 2:
            # A session's workspace on the host (isolation = "none"): the sandbox
            # uid's own, 0700, made for it by the daemon; what is inside is the tool's.
            if len(parts) == 2 and (st.st_uid == me or mode != 0o700):
                problems.append(f"{rel}: {mode:04o} uid {st.st_uid}")
            continue
        if st.st_uid != me:
            problems.append(f"{rel}: owned by uid {st.st_uid}, not the daemon's")
        elif rel in (Path("."), Path("workspaces")):
            if mode != PASSED_THROUGH:
                problems.append(f"{rel}: {mode:04o}, expected {PASSED_THROUGH:04o}")
        elif parts[:1] == ("runner",):
            expected = RUNNER_DIR if stat.S_ISDIR(st.st_mode) else RUNNER_FILE
            code = stat.S_ISDIR(st.st_mode) or path.suffix in (".py", ".pyc")
            if mode != expected or not code:
                problems.append(f"{rel}: {mode:04o} in runner/, expected code at {expected:04o}")
        elif mode & 0o077:
            problems.append(f"{rel}: {mode:04o}, others may use it")
    return problems


def _read_as_other_user(paths: list[Path]) -> dict[str, str]:
    """Try to read each file as another local user: "READ" or "DENIED" by path."""
    probe = (
        'for p; do if head -c 16 "$p" >/dev/null 2>&1; then r=READ; else r=DENIED; fi; '
        'echo "$p $r"; done'
    )
    proc = subprocess.run(
        ["/bin/sh", "-c", probe, "sh", *map(str, paths)],
        user=OTHER_UID,
        group=OTHER_UID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines())


def _use_everything(client: Client) -> None:
    """Real calls, an artifact, a session with an upload and a call in it."""
    result = client.call("execute_python_code", MAKES_AN_ARTIFACT)
    assert result.ok and result.artifacts, result
    with client.session() as session:
        assert client.upload_file(session.id, "notes/secret.txt", SECRET.encode()) == len(SECRET)
        done = session.call(
            "execute_python_code", {"code": "print(open('notes/secret.txt').read())"}
        )
        assert done.data["stdout"] == SECRET + "\n", done


@pytest.mark.parametrize("isolation", ["best-effort", "none"])
def test_everything_under_the_state_directory_is_private_to_the_daemon(
    start_daemon: Callable[..., RunningDaemon], isolation: str
) -> None:
    daemon = start_daemon("--isolation", isolation)
    state = daemon.state_dir
    with Client(daemon.target) as client:
        _use_everything(client)
        with client.session() as open_session:
            open_session.call("execute_python_code", {"code": "open('kept.txt', 'w').write('x')"})
            # While serving: the -wal, the artifact index's side files, live workspaces.
            assert (state / "journal.sqlite3-wal").exists()
            assert _not_private(state) == [], _not_private(state)
    assert daemon.stop() == 0, daemon.log()
    assert _not_private(state) == [], _not_private(state)


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root to become one")
def test_no_other_local_user_reads_the_journal_or_the_artifacts(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    daemon = start_daemon()
    state = daemon.state_dir
    with Client(daemon.target) as client:
        _use_everything(client)
        secrets = [p for p, st in _walk(state) if stat.S_ISREG(st.st_mode)]
        secrets = [p for p in secrets if "runner" not in p.relative_to(state).parts]
        assert {p.name for p in secrets} >= {"journal.sqlite3", "journal.sqlite3-wal"}
        assert any(SECRET.encode() in p.read_bytes() for p in secrets), "the secret is on disk"
        said = _read_as_other_user(secrets)
    assert len(said) == len(secrets) and set(said.values()) == {"DENIED"}, said


def test_a_sandbox_without_isolation_cannot_read_other_clients_code_in_the_journal(
    start_daemon: Callable[..., RunningDaemon],
) -> None:
    """The attack as found: under isolation = "none" one client's sandbox read the
    journal, and in it another client's code and the secret in it."""
    daemon = start_daemon("--isolation", "none")
    journal = daemon.state_dir / "journal.sqlite3"
    with Client(daemon.target, client_name="a") as a:
        assert a.call("execute_python_code", MAKES_AN_ARTIFACT).ok
    steal = (
        "for p in (%r, %r, %r):\n"
        "    try:\n"
        "        data = open(p, 'rb').read()\n"
        f"        print(p, 'LEAKED' if {SECRET.encode()!r} in data else 'read')\n"
        "    except OSError as e:\n"
        "        print(p, type(e).__name__)\n"
    ) % (str(journal), f"{journal}-wal", str(daemon.state_dir / "artifacts" / "index.sqlite3"))
    with Client(daemon.target, client_name="b") as b:
        result = b.call("execute_python_code", {"code": steal})
    assert result.ok, result
    lines = result.data["stdout"].splitlines()
    assert len(lines) == 3 and all(line.endswith("PermissionError") for line in lines), lines


def test_an_older_versions_world_readable_journal_is_made_private_at_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A journal and the -wal a killed daemon left, both 0644 (as before this
    fix): the next start makes them 0600 and keeps every call."""
    base = tmp_path_factory.mktemp("daemon")
    process, target, base = spawn_daemon(base)
    journal = base / "state" / "journal.sqlite3"
    wal = journal.with_name("journal.sqlite3-wal")
    try:
        wait_serving(target, process, base / "daemon.log")
        with Client(target) as client:
            done = client.call("execute_python_code", {"code": "print(1)"}, call_id="before")
            assert done.ok
    finally:
        process.send_signal(signal.SIGKILL)  # no checkpoint: the -wal stays
        process.wait(30)
    assert wal.exists()
    for path in (journal, wal):
        path.chmod(0o644)

    process, target, base = spawn_daemon(base)
    try:
        wait_serving(target, process, base / "daemon.log")
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in (journal, wal)} == {
            journal.name: 0o600,
            wal.name: 0o600,
        }
        with Client(target) as client:
            assert client.get_call("before").state.finished
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask of a process that embeds a daemon (a test run, a notebook)."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.usefixtures("loose_umask")
def test_an_embedded_daemon_keeps_its_artifacts_private_under_its_hosts_umask(
    serve: Callable[..., ServedDaemon],
) -> None:
    """`tooljail.testing.daemon()` runs the daemon in the host process, whose umask
    (0022 here) is not `tooljail serve`'s 0077: the artifact store's index (and its
    -wal), its directories and its files were made 0644/0755 by it, readable by
    every local user. Each is made with its own mode now, whatever the umask."""
    served = serve()
    state = Path(served.target.removeprefix("unix://")).parent / "state"
    with Client(served.target) as client:
        result = client.call("execute_python_code", MAKES_AN_ARTIFACT)
        assert result.ok and result.artifacts, result
        artifacts = state / "artifacts"
        made = [p for p, _ in _walk(artifacts)]
        assert {p.name for p in made} >= {"index.sqlite3", "index.sqlite3-wal"}
        assert any(p.name == result.artifacts[0].artifact_id for p in made), made
        loose = [
            f"{p.relative_to(state)}: {stat.S_IMODE(st.st_mode):04o}"
            for p, st in _walk(artifacts)
            if stat.S_IMODE(st.st_mode) & 0o077
        ]
    assert loose == []
