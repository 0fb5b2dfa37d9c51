"""The egress API through a real daemon over real gRPC: who may ask for what, and how it is told.

The local world of tests/egress_world.py stands in for the internet: its plain
HTTP server answers for "data.example.org" and "other.example.net" (mapped
through `[egress.hosts]`) and records every request it gets, so a refusal is
also checked to have reached nothing.

- levels: a call asking more than the daemon's ceiling, or a tokens-file
  identity's allowance, is PERMISSION_DENIED naming the rule, before anything
  runs or is journaled; asking for nothing is no network at all;
- a session narrowed live: connections opened 10 ms after `set_egress` returns
  are refused, while the session's call runs on;
- bad input: rules that do not parse are INVALID_ARGUMENT naming the rule;
  another identity's session is NOT_FOUND; egress asked of a daemon without
  `[egress]` is FAILED_PRECONDITION; a bad `[egress]` refuses the start by name;
- a reload with a bad secrets file keeps the old policy (and says so), a good
  one puts the new policy in force for new calls; denials are counted by reason.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningDaemon, ServedDaemon, spawn_daemon, wait_serving
from tests.egress_world import World, to_toml, write_secrets
from tooljail import Client
from tooljail.errors import (
    CallIdConflictError,
    CallNotFoundError,
    EgressUnavailableError,
    InvalidRequestError,
    PermissionDeniedError,
    SessionNotFoundError,
)
from tooljaild.settings.config import ConfigError

CEILING = ["data.example.org", "api.example.com"]

GET_DATA = (
    "import urllib.request\n"
    "print(urllib.request.urlopen('http://data.example.org/hello', timeout=10).read().decode())"
)
GET_OTHER = GET_DATA.replace("data.example.org", "other.example.net")

FIVE_TRIES = (
    f"for _ in range(5):\n    try:\n        exec({GET_OTHER!r})\n"
    "    except Exception as e:\n        print(e)"
)

TOKEN_A, TOKEN_B = "token-of-egress-a", "token-of-egress-b"

PROBE = r"""
import json, socket, time

def probe():
    # One connection through the sandbox's relay: the proxy's verdict on it.
    started = time.time()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    try:
        s.sendall(b"GET http://data.example.org/hello HTTP/1.1\r\nHost: data.example.org\r\n"
                  b"Connection: close\r\n\r\n")
        head = s.recv(64)
    finally:
        s.close()
    return started, head.split(b" ")[1].decode() if head.count(b" ") else "none"

seen = []
end = time.time() + SECONDS
while time.time() < end:
    seen.append(probe())
    time.sleep(0.002)
print(json.dumps(seen))
"""


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _tokens(directory: Path) -> Path:
    """a: may reach data.example.org only; b: the daemon's ceiling."""
    path = directory / "tokens.toml"
    path.write_text(
        f'[identities.a]\ntoken_sha256 = "{_sha(TOKEN_A)}"\negress = ["data.example.org"]\n\n'
        f'[identities.b]\ntoken_sha256 = "{_sha(TOKEN_B)}"\n'
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def egress_daemon(serve: Callable[..., ServedDaemon], egress_world: World) -> ServedDaemon:
    return serve(**egress_world.settings(allow=CEILING, index_url=None))


def test_asking_beyond_the_ceiling_is_refused_by_rule_before_anything_runs(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    mark = egress_world.mark()
    with Client(egress_daemon.target) as client:
        with pytest.raises(PermissionDeniedError, match=r"other\.example\.net") as refused:
            client.call(
                "execute_python_code",
                {"code": GET_OTHER},
                call_id="too-much",
                egress=["other.example.net"],
            )
        # What it may reach is named too, so a model can ask again within it.
        assert "data.example.org" in refused.value.message
        with pytest.raises(CallNotFoundError):
            client.get_call("too-much")  # nothing was admitted, nothing journaled
        allowed = client.call(
            "execute_python_code", {"code": GET_DATA}, egress=["data.example.org"]
        )
    assert allowed.ok, allowed
    assert "hello from http" in allowed.data["stdout"]
    assert allowed.usage is not None and allowed.usage.net_connections == 1
    assert allowed.usage.net_bytes_out > 0 and allowed.usage.net_bytes_in > 0
    seen = egress_world.since(mark)
    assert [r.host for r in seen.requests] == ["data.example.org"], seen


def test_a_retry_under_one_call_id_with_other_rules_is_a_conflict_not_the_stored_answer(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    """A call id names one call: the same id asking for other egress rules (or none)
    must not be answered with the first call's result, which ran with other rights."""
    with Client(egress_daemon.target) as client:
        first = client.call(
            "execute_python_code", {"code": GET_DATA}, call_id="one-id", egress=["data.example.org"]
        )
        assert first.ok, first
        again = client.call(
            "execute_python_code", {"code": GET_DATA}, call_id="one-id", egress=["data.example.org"]
        )
        assert again.call_id == first.call_id and again.data == first.data
        for other in ({"egress": ["data.example.org:80"]}, {}):
            with pytest.raises(CallIdConflictError, match="one-id"):
                client.call("execute_python_code", {"code": GET_DATA}, call_id="one-id", **other)


def test_the_cli_asks_for_egress_for_a_call_and_a_session(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    """`tooljail call --egress` and `tooljail sessions open --egress`, as an operator
    at a shell would; a rule beyond the ceiling is refused with the rule named."""

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tooljaild", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    code = json.dumps({"code": GET_DATA})
    target = ("--target", egress_daemon.target)
    ran = cli("call", *target, "--egress", "data.example.org", "execute_python_code", code)
    assert ran.returncode == 0, ran.stderr
    assert "hello from http" in ran.stdout
    refused = cli("call", *target, "--egress", "other.example.net", "execute_python_code", code)
    assert refused.returncode != 0 and "other.example.net" in refused.stderr, refused
    opened = cli("sessions", "open", *target, "--egress", "data.example.org")
    assert opened.returncode == 0, opened.stderr
    session_id = opened.stdout.strip()
    try:
        ran = cli("call", *target, "--session", session_id, "execute_python_code", code)
        assert ran.returncode == 0 and "hello from http" in ran.stdout, ran.stderr
    finally:
        cli("sessions", "close", *target, session_id)


def test_a_call_that_asks_for_nothing_has_no_network(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    mark = egress_world.mark()
    with Client(egress_daemon.target) as client:
        result = client.call("execute_python_code", {"code": GET_DATA})
    # No proxy in its environment, no resolver, no route: the name does not even resolve.
    assert not result.ok and "URLError" in result.data["stderr"], result
    assert result.egress_denied == ()
    assert egress_world.since(mark).nothing, egress_world.since(mark)


def test_a_denial_names_host_port_and_reason_in_the_result(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    mark = egress_world.mark()
    with Client(egress_daemon.target) as client:
        result = client.call(
            "execute_python_code",
            {"code": FIVE_TRIES},
            egress=["data.example.org"],
        )  # fmt: skip
    assert result.ok, result
    assert result.data["stdout"].count("403") == 5
    (denial,) = result.egress_denied
    assert (denial.host, denial.port, denial.reason, denial.count) == (
        "other.example.net", 80, "not_allowed", 5,
    )  # fmt: skip
    assert egress_world.since(mark).nothing


def test_a_tokens_file_identity_is_narrowed_to_its_allowance(
    serve: Callable[..., ServedDaemon], egress_world: World, tmp_path: Path
) -> None:
    served = serve(
        **egress_world.settings(allow=CEILING, index_url=None),
        auth={"tokens_file": _tokens(tmp_path)},
    )
    with Client(served.target, token=TOKEN_A) as a, Client(served.target, token=TOKEN_B) as b:
        # Within the ceiling, outside a's allowance: refused, naming the rule.
        with pytest.raises(PermissionDeniedError, match=r"api\.example\.com"):
            a.call("execute_python_code", {"code": "print(1)"}, egress=["api.example.com"])
        with pytest.raises(PermissionDeniedError, match=r"api\.example\.com"):
            a.session(egress=["api.example.com"])
        assert a.call("execute_python_code", {"code": GET_DATA}, egress=["data.example.org"]).ok
        # b has no `egress` of its own: the ceiling is its allowance.
        assert b.call("execute_python_code", {"code": "print(1)"}, egress=["api.example.com"]).ok


def test_bad_rules_are_invalid_argument_naming_the_rule(egress_daemon: ServedDaemon) -> None:
    with Client(egress_daemon.target) as client:
        with pytest.raises(InvalidRequestError, match="bad rule!"):
            client.call("execute_python_code", {"code": "print(1)"}, egress=["bad rule!"])
        with client.session() as session:
            with pytest.raises(InvalidRequestError, match=r"http://x\.example"):
                session.set_egress(["http://x.example"])
            # Unchanged by the refused request.
            assert client.list_sessions()[0].egress == ()


def test_another_identitys_session_is_not_found(
    serve: Callable[..., ServedDaemon], egress_world: World, tmp_path: Path
) -> None:
    served = serve(
        **egress_world.settings(allow=CEILING, index_url=None),
        auth={"tokens_file": _tokens(tmp_path)},
    )
    a, b = Client(served.target, token=TOKEN_A), Client(served.target, token=TOKEN_B)
    with a, b, a.session(egress=["data.example.org"]) as session:
        with pytest.raises(SessionNotFoundError):
            b.set_session_egress(session.id, ["api.example.com"])
        with pytest.raises(SessionNotFoundError):
            b.set_session_egress("no-such-session", [])
        assert a.list_sessions()[0].egress == ("data.example.org",)
        # The owner may narrow (or widen within its allowance) ...
        assert session.set_egress([]).egress == ()
        # ... and never beyond it.
        with pytest.raises(PermissionDeniedError, match=r"api\.example\.com"):
            session.set_egress(["api.example.com"])


def test_set_egress_narrows_a_session_live_within_10_ms(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    """A call in the session connects every few ms for 1.5 s; halfway, the host
    takes data.example.org away: every connection opened 10 ms after the
    answer is refused (the proxy decides each new connection by the gate's
    policy of that moment), and the ones before were let through."""
    with (
        Client(egress_daemon.target) as client,
        client.session(egress=["data.example.org"]) as session,
    ):
        assert session.info.egress == ("data.example.org",)
        outcome: list[object] = []
        code = PROBE.replace("SECONDS", "1.5")
        runner = threading.Thread(
            target=lambda: outcome.append(session.call("execute_python_code", {"code": code}))
        )
        runner.start()
        time.sleep(0.7)
        info = session.set_egress([])
        answered = time.time()
        runner.join(30)
    assert info.egress == ()
    (result,) = outcome
    assert result.ok, result  # type: ignore[attr-defined]
    seen = [(t, status) for t, status in json.loads(result.data["stdout"])]  # type: ignore[attr-defined]
    before = [s for t, s in seen if t < answered - 0.2]
    after = [s for t, s in seen if t > answered + 0.010]
    assert before and set(before) == {"200"}, seen
    assert after and set(after) == {"403"}, seen
    reasons = {d.reason for d in result.egress_denied}  # type: ignore[attr-defined]
    assert reasons == {"no_egress"}, reasons


def test_a_daemon_without_egress_refuses_egress_and_secrets(
    serve: Callable[..., ServedDaemon],
) -> None:
    served = serve()
    with Client(served.target) as client:
        for ask in ({"egress": ["data.example.org"]}, {"secrets": ["NEWS_API_KEY"]}):
            with pytest.raises(EgressUnavailableError, match=r"no \[egress\] section"):
                client.call("execute_python_code", {"code": "print(1)"}, **ask)  # type: ignore[arg-type]
            with pytest.raises(EgressUnavailableError):
                client.session(**ask)  # type: ignore[arg-type]
        # Asking for nothing works as it always did.
        assert client.call("execute_python_code", {"code": "print(1)"}).ok


def test_a_bad_egress_section_refuses_the_start_by_name(egress_world: World) -> None:
    import tooljail.testing

    settings = egress_world.settings(allow=[*CEILING, "*.co*.example"], index_url=None)
    with (
        pytest.raises(ConfigError, match=r"\*\.co\*\.example"),
        tooljail.testing.daemon(**settings),
    ):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _denials(port: int) -> dict[str, float]:
    """`tooljail_egress_denials_total` by reason; "open" is the connections gauge."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tooljail_egress_denials_total":
                found[sample.labels["reason"]] = sample.value
            elif sample.name == "tooljail_egress_connections":
                found["open"] = sample.value
    return found


def _wait_log(daemon: RunningDaemon, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in daemon.log():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the log:\n{daemon.log()[-3000:]}")
        time.sleep(0.05)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: each sandbox's gate is a Unix socket below
    the state directory, and a socket's path has at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tj-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_bad_reload_keeps_the_old_policy_and_a_good_one_replaces_it(
    egress_world: World, tmp_path: Path, short_dir: Path
) -> None:
    config, secrets = tmp_path / "tooljail.toml", tmp_path / "secrets.toml"
    port = _free_port()
    key = {"KEY": ("k" * 16, ["data.example.org"])}
    first = egress_world.settings(
        allow=["data.example.org"], index_url=None, secrets=key, secrets_file=secrets
    )
    config.write_text(to_toml(first))
    args = ["--config", str(config), "--metrics-listen", f"127.0.0.1:{port}"]
    process, target, base = spawn_daemon(short_dir, *args)
    daemon = RunningDaemon(process, target, base / "state", base / "daemon.log", args)
    try:
        wait_serving(target, process, daemon.log_path)
        wider = {
            **first,
            "egress": {**first["egress"], "allow": ["data.example.org", "other.example.net"]},
        }
        with Client(target) as client:
            denied = client.call(
                "execute_python_code", {"code": GET_OTHER}, egress=["data.example.org"]
            )
            assert [d.reason for d in denied.egress_denied] == ["not_allowed"]
            assert _denials(port) == {"not_allowed": 1.0, "open": 0.0}
            # A wider ceiling and a secrets file others may read: the old policy stays.
            config.write_text(to_toml(wider))
            secrets.chmod(0o644)
            process.send_signal(signal.SIGHUP)
            _wait_log(daemon, "egress policy kept")
            with pytest.raises(PermissionDeniedError, match=r"other\.example\.net"):
                client.call(
                    "execute_python_code", {"code": GET_OTHER}, egress=["other.example.net"]
                )
            assert client.call(
                "execute_python_code", {"code": GET_DATA}, egress=["data.example.org"]
            ).ok
            # Fixed: the next reload puts the wider ceiling in force for new calls.
            write_secrets(secrets, key)
            process.send_signal(signal.SIGHUP)
            _wait_log(daemon, "egress reloaded")
            reached = client.call(
                "execute_python_code", {"code": GET_OTHER}, egress=["other.example.net"]
            )
            assert reached.ok, reached
    finally:
        if process.poll() is None:
            daemon.stop(signal.SIGTERM, timeout=60)
    assert "k" * 16 not in daemon.log()  # a secret's value is never logged


NEWS_TOOL = '''
import os
import urllib.request

from tooljail import tool


@tool(sandbox={"egress": ["data.example.org"]}, secrets=["NEWS_KEY"])
def news() -> str:
    """GET data.example.org with the key's placeholder in a header."""
    request = urllib.request.Request(
        "http://data.example.org/echo", headers={"X-Key": os.environ["NEWS_KEY"]}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.read().decode()
'''


def test_a_tools_rules_and_secret_names_are_listed_and_held(
    serve: Callable[..., ServedDaemon], egress_world: World, tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir(mode=0o755)
    tools.chmod(0o755)  # a daemon served in this process may have left a strict umask
    (tools / "news.py").write_text(NEWS_TOOL)
    (tools / "news.py").chmod(0o644)
    value = "v" * 24
    served = serve(
        **egress_world.settings(
            allow=CEILING, index_url=None, secrets={"NEWS_KEY": (value, ["data.example.org"])}
        ),
        tools_dirs=[tools],
    )
    mark = egress_world.mark()
    with Client(served.target) as client:
        (info,) = [t for t in client.list_tools() if t.name == "news"]
        assert (info.egress, info.secrets) == (("data.example.org",), ("NEWS_KEY",))
        assert value not in repr(client.list_tools())
        # The tool's own rules bound what a call of it may ask for.
        with pytest.raises(PermissionDeniedError, match=r"api\.example\.com"):
            client.call("news", {}, egress=["api.example.com"])
        result = client.call("news", {})
    assert result.ok, result
    assert value not in result.model_dump_json()  # the sandbox held only the placeholder
    (request,) = [r for r in egress_world.since(mark).requests if r.path == "/echo"]
    assert request.header("X-Key") == value  # the server got the value


def test_a_call_in_a_session_may_narrow_the_sessions_rules_for_itself(
    egress_daemon: ServedDaemon, egress_world: World
) -> None:
    client = Client(egress_daemon.target)
    with client, client.session(egress=["data.example.org", "api.example.com"]) as session:
        narrowed = session.call(
            "execute_python_code", {"code": GET_DATA}, egress=["api.example.com"]
        )
        assert [d.reason for d in narrowed.egress_denied] == ["not_allowed"], narrowed
        # The next call has the session's rules again.
        assert session.call("execute_python_code", {"code": GET_DATA}).ok
        with pytest.raises(PermissionDeniedError, match=r"other\.example\.net"):
            session.call("execute_python_code", {"code": "1"}, egress=["other.example.net"])
        with pytest.raises(PermissionDeniedError, match="NEWS_KEY"):
            session.call("execute_python_code", {"code": "1"}, secrets=["NEWS_KEY"])
