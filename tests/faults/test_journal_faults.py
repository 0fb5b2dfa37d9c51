"""A journal that cannot be used: refused clearly, never replaced, no crash loop."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import spawn_daemon, wait_serving
from tooljail import Client, TransportError


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


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_refuses_calls_until_there_is_room_again(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("full")
    state = base / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0711", "tmpfs", state], check=True)
    process = None
    try:
        target = f"unix://{base}/tooljail.sock"
        process, _, _ = spawn_daemon(base, listen=target, env={"TOOLJAIL_ISOLATION": "none"})
        wait_serving(target, process, base / "daemon.log")
        with Client(target, retries=0) as client:
            assert client.call("execute_python_code", {"code": "print(1)"}).ok
            filler = state / "filler"
            with open(filler, "wb") as f, pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            with pytest.raises(TransportError, match=r"(?i)full|space") as info:
                for _ in range(50):  # the WAL may still have room for a few
                    client.call("execute_python_code", {"code": "print(2)"})
            assert info.value.status == "UNAVAILABLE"
            assert process.poll() is None  # still serving, no crash loop
            filler.unlink()
            assert client.call("execute_python_code", {"code": "print(3)"}).ok
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        subprocess.run(["umount", "-l", state], check=False)
