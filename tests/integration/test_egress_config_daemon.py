"""Egress policy config through a real daemon: bad rules refused at start and at reload.

Issue 23, "Bad input": malformed rules in the config or the tokens file are
refused at start and at reload by name (the old policy stays in force on a bad
reload). A tool's own egress rules are checked as it loads: a bad one is a
diagnostic naming the rule, a good one is served (on either backend).
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ServedDaemon, _reachable, spawn_daemon
from tests.integration.test_systemd_daemon import Systemd, systemd  # noqa: F401 (a fixture)
from tooljail import Client

TOKEN_X = "token-of-x-egress-config"
PRINT_1 = {"code": "print(1)"}


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _write(path: Path, text: str) -> Path:
    draft = path.with_suffix(".new")
    draft.write_text(text)
    draft.chmod(0o600)
    draft.replace(path)
    return path


def _serve_refused(base: Path, config: Path) -> str:
    """The last line `tooljail serve` prints when it refuses `config` (exit 2)."""
    base = _reachable(base)
    argv = [
        sys.executable, "-m", "tooljaild", "serve", "--state-dir", str(base / "state"),
        "--pool-size", "1", "--listen", f"unix://{base}/s.sock", "--config", str(config),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    assert not (base / "s.sock").exists()
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (
            '[egress]\nallow = ["api example.com"]\n',
            "egress.allow: Value error, allow: 'api example",
        ),
        ('[egress]\nallow = ["*"]\n', "'*' alone would allow every host"),
        ('[egress]\ndeny = ["https://evil.example.com"]\n', "not a URL or a path"),
        ('[egress.hosts]\n"pypi.internal" = "10.0.0.5"\n', "hosts 'pypi.internal'"),
        (
            '[egress]\nallow = ["api.example.com"]\n[packages]\n'
            'index_url = "https://pypi.org/simple"\n',
            "index https://pypi.org/simple: pypi.org:443 is not allowed by [egress] allow",
        ),
        (
            "[limits]\nmax_egress_connections = 0\n",
            "limits.max_egress_connections: Input should be greater than or equal to 1",
        ),
    ],
    ids=["whitespace", "star", "url", "hosts-port", "index-not-allowed", "connections"],
)
def test_serve_refuses_a_bad_egress_config_naming_the_key_and_rule(
    tmp_path_factory: pytest.TempPathFactory, config: str, said: str
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    path = base / "tooljail.toml"
    path.write_text(config)
    error = _serve_refused(base, path)
    assert error.startswith("tooljail: invalid configuration"), error
    assert said in error, error


def test_serve_refuses_a_tokens_file_with_a_bad_egress_rule_or_secret_name(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tokens = _write(base / "tokens.toml", '[identities.x]\negress = ["api.example.com:http"]\n')
    config = base / "tooljail.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    error = _serve_refused(base, config)
    assert f"the tokens file {tokens}: identities.x.egress" in error, error
    assert "'api.example.com:http': port 'http'" in error, error
    _write(tokens, '[identities.x]\nsecrets = ["LD_PRELOAD"]\n')
    error = _serve_refused(base, config)
    assert "identities.x.secrets" in error and "secret name 'LD_PRELOAD'" in error, error


def test_a_reload_with_a_bad_egress_rule_keeps_the_identities_in_force(
    tmp_path_factory: pytest.TempPathFactory,
    systemd: Systemd,  # noqa: F811 (the fixture imported above)
) -> None:
    base = tmp_path_factory.mktemp("daemon")
    tokens = _write(
        base / "tokens.toml",
        f'[identities.x]\ntoken_sha256 = "{_sha(TOKEN_X)}"\negress = ["api.example.com"]\n',
    )
    config = base / "tooljail.toml"
    config.write_text(
        'log_level = "INFO"\n[egress]\nallow = ["*.example.com"]\n'
        f'[auth]\ntokens_file = "{tokens}"\n'
    )
    process, target, base = spawn_daemon(
        base, "--config", str(config), env={"NOTIFY_SOCKET": str(systemd.path)}, pool_size=1
    )
    try:
        systemd.next("READY")
        with Client(target, token=TOKEN_X, retries=0) as x:
            assert x.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
            _write(
                tokens,
                f'[identities.x]\ntoken_sha256 = "{_sha(TOKEN_X)}"\negress = ["*.example.com:0"]\n',
            )
            process.send_signal(signal.SIGHUP)
            systemd.next("RELOADING")
            assert "kept the tokens file" in systemd.next("READY")["STATUS"]
            # The identities read at start still answer.
            assert x.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
        text = (base / "daemon.log").read_text()
        assert "identities.x.egress" in text and "'*.example.com:0'" in text
    finally:
        process.terminate()
        process.wait(timeout=30)


TOOLS = '''
from tooljail import tool


@tool(sandbox={"egress": ["api.example.com:443", "*.example.org"]})
def news(topic: str) -> str:
    """Fetch news (its rules are checked as it loads)."""
    return topic


@tool(sandbox={"egress": ["api.example.com:https"]})
def broken_rule(topic: str) -> str:
    """A rule with a port that is no number."""
    return topic
'''


def test_a_tool_s_egress_rules_are_checked_as_it_loads(
    tmp_path: Path, serve: Callable[..., ServedDaemon]
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    _reachable(tools)
    (tools / "net.py").write_text(TOOLS)
    daemon = serve(tools_dirs=[tools], egress={"allow": ["*.example.com", "*.example.org"]})
    with Client(daemon.target) as client:
        names = {t.name for t in client.list_tools()}
        assert "news" in names and "broken_rule" not in names
        assert client.call("news", {"topic": "x"}).data == "x"
        (bad,) = [d for d in client.diagnostics() if d.severity == "error"]
    assert bad.code == "bad_options", bad
    assert "broken_rule" in bad.message and "'api.example.com:https'" in bad.message, bad
