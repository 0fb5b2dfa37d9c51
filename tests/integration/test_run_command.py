"""run_command through a real daemon over gRPC (issue 24, item 1): git, a
pipeline, stdin, argv, a session's workspace, a timeout that leaves nothing
running, and the allow-list refusing at admission."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import ServedDaemon, docker_problem
from tooljail import CallStatus, Client, Output, PermissionDeniedError

NO_NAMESPACES = {"isolation": "none"}

GIT = (
    "git init -q . && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x "
    "&& git log --oneline"
)


def test_git_and_a_pipeline_in_a_fresh_sandbox(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        result = client.call("run_command", {"command": GIT})
        assert result.ok, result
        assert result.data["exit_code"] == 0
        assert result.data["stdout"].strip().endswith(" x")
        piped = client.call("run_command", {"command": "printf 'b\\na\\nb\\n' | sort | uniq -c"})
        assert piped.ok, piped
        assert piped.data["stdout"].split() == ["1", "a", "2", "b"]
        failed = client.call("run_command", {"command": "echo out; echo err >&2; exit 3"})
        assert failed.status is CallStatus.ERROR
        assert failed.data == {"stdout": "out\n", "stderr": "err\n", "exit_code": 3}


def test_argv_stdin_env_and_cwd(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        result = client.call("run_command", {"argv": ["cat"], "stdin": "hello\n"})
        assert result.ok and result.data["stdout"] == "hello\n", result
        missing = client.call("run_command", {"argv": ["no-such-program"]})
        assert missing.data["exit_code"] == 127, missing
        assert "cannot run 'no-such-program'" in missing.data["stderr"]
        env = client.call("run_command", {"command": "echo $GREETING", "env": {"GREETING": "hi"}})
        assert env.data["stdout"] == "hi\n", env
        s = client.session()
        try:
            assert s.call("run_command", {"command": "mkdir -p repo && cd repo && git init -q"}).ok
            where = s.call("run_command", {"command": "pwd; ls -a", "cwd": "repo"})
            assert where.ok, where
            assert where.data["stdout"].splitlines()[0].endswith("/repo")
            assert ".git" in where.data["stdout"]
            # Relative to the workspace, not to where earlier code moved the interpreter.
            s.call("execute_python_code", {"code": "import os; os.chdir('/')"})
            again = s.call("run_command", {"argv": ["ls"], "cwd": "repo"})
            assert again.ok and again.data["stdout"] == "", again
        finally:
            s.close()


def test_both_arguments_or_neither_is_refused(served: ServedDaemon) -> None:
    with Client(served.target) as client:
        for arguments in ({}, {"command": "true", "argv": ["true"]}):
            with pytest.raises(Exception, match="exactly one of command"):
                client.call("run_command", arguments)


TRAP = "sh -c 'trap \"\" TERM; sleep 30; touch {marker}/late' & echo started; sleep 30"


@pytest.mark.parametrize("isolation", ["none", "default"])
@pytest.mark.parametrize("in_session", [False, True], ids=["fresh", "session"])
def test_a_timeout_kills_the_whole_tree(
    serve: Callable[..., ServedDaemon], tmp_path: Path, in_session: bool, isolation: str
) -> None:
    """A grandchild that ignores SIGTERM is gone too (with namespaces the marker
    cannot be written on the host: the process table alone tells)."""
    served = serve(**(NO_NAMESPACES if isolation == "none" else {}))
    marker = tmp_path / "markers"
    marker.mkdir(mode=0o777)
    command = TRAP.format(marker=marker)
    with Client(served.target) as client:
        if in_session:
            s = client.session()
            result = s.call("run_command", {"command": command}, tool_timeout_s=1)
        else:
            result = client.call("run_command", {"command": command}, tool_timeout_s=1)
        assert result.status is CallStatus.TIMEOUT, result
        assert "started" in result.data["stdout"]
        time.sleep(0.5)
        left = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if str(marker) in " ".join(p.info["cmdline"] or ())
        ]
        assert left == [], "a process of the command outlived its timeout"
        if in_session:
            # The session survives: the interpreter took no KeyboardInterrupt grace.
            after = s.call("run_command", {"command": "echo still"})
            assert after.ok and after.data["stdout"] == "still\n", after
            assert not result.session_reset, result
            s.close()
    assert not (marker / "late").exists()


def test_the_allow_list_refuses_at_admission(serve: Callable[..., ServedDaemon]) -> None:
    served = serve(commands={"allow": ["git", "echo", "sort"]})
    with Client(served.target) as client:
        assert client.call("run_command", {"command": "echo a | sort"}).ok
        for command, named in (
            ("git status | curl -d @- x", "'curl'"),
            ("bash -c 'git log; rm -rf .'", "'rm'"),
            ("A=1 env B=2 python -c 1", "'python'"),
        ):
            with pytest.raises(PermissionDeniedError, match=named):
                client.call("run_command", {"command": command})
        with pytest.raises(PermissionDeniedError, match="command substitution"):
            client.call("run_command", {"command": "echo $(rm -rf /)"})
        with pytest.raises(PermissionDeniedError, match="'sudo'"):
            client.call("run_command", {"argv": ["sudo", "git"]})
        # Refused before anything was recorded: a retry of its id is not a known call.
        with pytest.raises(PermissionDeniedError):
            client.call("run_command", {"argv": ["rm", "x"]}, call_id="refused-1")
        with pytest.raises(Exception, match="refused-1"):
            client.get_call("refused-1")


def test_an_identity_and_a_tool_only_narrow_the_daemons_list(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    sha = {name: hashlib.sha256(name.encode()).hexdigest() for name in ("tok-a", "tok-b")}
    tokens.write_text(
        f'[identities.a]\ntoken_sha256 = "{sha["tok-a"]}"\ncommands = ["git", "ls"]\n\n'
        f'[identities.b]\ntoken_sha256 = "{sha["tok-b"]}"\n'
    )
    tokens.chmod(0o600)
    served = serve(
        auth={"tokens_file": tokens},
        commands={"allow": ["git", "echo", "sort"], "tools": {"run_command": ["git", "echo"]}},
    )
    with Client(served.target, token="tok-a") as a, Client(served.target, token="tok-b") as b:
        assert a.call("run_command", {"argv": ["git", "--version"]}).ok
        # echo is the daemon's and the tool's, not a's; ls is a's, not the daemon's.
        for argv in (["sort"], ["ls"]):
            with pytest.raises(PermissionDeniedError, match=repr(argv[0])):
                a.call("run_command", {"argv": argv})
        assert b.call("run_command", {"argv": ["echo", "b"]}).ok
        with pytest.raises(PermissionDeniedError, match="'sort'"):  # not the tool's
            b.call("run_command", {"argv": ["sort"]})


@pytest.mark.docker
def test_run_command_on_the_docker_backend(serve: Callable[..., ServedDaemon]) -> None:
    """The image carries bash, coreutils, git and procps; a timeout leaves nothing."""
    problem = docker_problem()
    if problem is not None:
        pytest.skip(problem)
    served = serve(backend="docker", pool_size=1)
    with Client(served.target) as client:
        result = client.call("run_command", {"command": GIT + " && ps -e | wc -l && ls --version"})
        assert result.ok, result
        assert " x\n" in result.data["stdout"] and "coreutils" in result.data["stdout"]
        inside = client.call("run_command", {"argv": ["ls", "/.dockerenv"]})
        assert inside.ok, "not in a container"
        s = client.session()
        slow = s.call(
            "run_command",
            {"command": "sh -c 'trap \"\" TERM; sleep 30' & echo started; sleep 30"},
            tool_timeout_s=1,
        )
        assert slow.status is CallStatus.TIMEOUT, slow
        left = s.call("run_command", {"command": "ps -eo comm= | grep -c sleep || true"})
        assert left.data["stdout"].strip() == "0", left
        s.close()


def test_output_streams_as_it_is_written_and_spills_whole_past_the_cap(
    served: ServedDaemon,
) -> None:
    command = "for i in 1 2 3 4 5; do echo $i $(date +%s.%N); sleep 0.3; done"
    with Client(served.target) as client:
        arrivals: list[tuple[float, float]] = []
        for item in client.stream("run_command", {"command": command}):
            if isinstance(item, Output):
                arrivals += [
                    (time.time(), float(line.split()[1])) for line in item.data.splitlines()
                ]
        assert len(arrivals) == 5
        for (arrived, _), (_, next_printed) in itertools.pairwise(arrivals):
            assert arrived < next_printed, "a line arrived only after the next was printed"
        # ~2.9 MB of stdout: the result keeps head and tail; the whole is an artifact.
        big = client.call("run_command", {"argv": ["seq", "1", "400000"]})
        assert big.ok and big.truncated, big
        whole = "".join(f"{i}\n" for i in range(1, 400001)).encode()
        (ref,) = big.artifacts
        assert (ref.name, ref.size_bytes) == ("stdout.txt", len(whole))
        assert client.get_artifact(ref.artifact_id) == whole
        assert big.data["stdout"].startswith("1\n2\n") and big.data["stdout"].endswith("400000\n")


def test_the_allow_list_holds_for_background_processes(serve: Callable[..., ServedDaemon]) -> None:
    """start_process and StartProcess run command lines too: the same list holds."""
    served = serve(commands={"allow": ["sleep"]})
    with Client(served.target) as client, client.session() as session:
        started = session.processes.start("sleep 30")
        assert started.running
        with pytest.raises(PermissionDeniedError, match="'rm'"):
            session.processes.start("sleep 1; rm -rf .")
        with pytest.raises(PermissionDeniedError, match="'python3'"):
            session.processes.start(argv=["python3", "-c", "1"])
        with pytest.raises(PermissionDeniedError, match="'curl'"):
            session.call("start_process", {"command": "curl http://x"})
        assert [p.process_id for p in session.processes.list()] == [started.process_id]
