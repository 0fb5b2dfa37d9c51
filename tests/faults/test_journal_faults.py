"""A journal that cannot be used: refused clearly, never replaced, no crash loop."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tooljail import Client, JournalUnavailableError, TransportError


def test_a_corrupt_journal_stops_the_start_with_what_to_do(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("corrupt")
    state = base / "state"
    state.mkdir(mode=0o711)
    journal = state / "journal.sqlite3"
    junk = os.urandom(8192)
    journal.write_bytes(junk)
    process, _, _ = spawn_daemon(base)
    code = process.wait(60)
    log = (base / "daemon.log").read_text()
    assert code != 0
    assert str(journal) in log
    assert f"mv {journal}" in log  # what to do, with the file named
    assert journal.read_bytes() == junk  # never replaced


@contextlib.contextmanager
def _full_state_dir(base: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """A daemon whose state directory is a 4 MiB tmpfs: (target, process, filler path)."""
    state = base / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0711", "tmpfs", state], check=True)
    process = None
    try:
        target = f"unix://{base}/tooljail.sock"
        process, _, _ = spawn_daemon(base, listen=target, env={"TOOLJAIL_ISOLATION": "none"})
        wait_serving(target, process, base / "daemon.log")
        yield target, process, state / "filler"
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        subprocess.run(["umount", "-l", state], check=False)


def _fill(path: Path) -> None:
    # Unbuffered: a buffered file keeps what did not fit and raises ENOSPC again
    # when it is closed, outside `pytest.raises` (whether it does depends on how
    # the last write meets the end of the space).
    with open(path, "wb", buffering=0) as f, pytest.raises(OSError):
        while True:
            f.write(b"\0" * 65536)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_refuses_calls_until_there_is_room_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("full")
    with _full_state_dir(base) as (target, process, filler), Client(target, retries=0) as client:
        assert client.call("execute_python_code", {"code": "print(1)"}).ok
        _fill(filler)
        with pytest.raises(JournalUnavailableError, match=r"(?i)full|space") as info:
            for _ in range(50):  # the WAL may still have room for a few
                client.call("execute_python_code", {"code": "print(2)"})
        assert info.value.reason == "full"
        assert process.poll() is None  # still serving, no crash loop
        filler.unlink()
        assert client.call("execute_python_code", {"code": "print(3)"}).ok


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_failing_journal_is_one_clear_error_the_sdk_does_not_retry(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The user story: the daemon's journal fails; the client gets a clear,
    # non-retried error naming it. Before, the SDK did not know the code and
    # retried it as a dropped connection, then raised a generic TransportError.
    base = tmp_path_factory.mktemp("story")
    with _full_state_dir(base) as (target, _, filler), Client(target, retries=3) as client:
        assert client.call("execute_python_code", {"code": "print(1)"}).ok
        _fill(filler)
        tries = 0
        run = client._stub.Run

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal tries
            tries += 1
            return run(*args, **kwargs)

        client._stub.Run = counted
        with pytest.raises(JournalUnavailableError) as info:
            for _ in range(50):  # the WAL may still have room for a few
                tries = 0
                client.call("execute_python_code", {"code": "print(2)"})
        assert tries == 1  # refused once, not retried
        error = info.value
        assert not isinstance(error, TransportError)
        assert error.code == "journal_unavailable"
        assert error.reason == "full"
        journal = base / "state" / "journal.sqlite3"
        assert str(journal) in error.message  # names the journal, and why
        assert "full" in error.message
