"""SIGHUP's reload, without a daemon: what applies live, what waits for a restart,
and the tokens file read again (its identities swapped, or kept when it is bad)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import pytest

from tooljail.errors import TooljailError, UnauthenticatedError
from tooljaild.app.reload import LIVE_SETTINGS, Reloader, compare
from tooljaild.auth.policy import Identity, load_identities
from tooljaild.edge.authenticator import Authenticator
from tooljaild.edge.transport import ListenerSecurity, SocketPermissions, tls_digest
from tooljaild.settings.config import Settings
from tooljaild.tools.registry import Registry, Tool


def settings(**values: object) -> Settings:
    return Settings(state_dir=Path("/nonexistent/state"), **values)  # type: ignore[arg-type]


def test_live_settings_apply_and_the_others_keep_their_running_value() -> None:
    running = settings(pool_size=4, log_level="INFO", default_timeout_s=180.0)
    read = settings(
        pool_size=8,
        log_level="DEBUG",
        default_timeout_s=60.0,
        limits={"cpu_s": 5, "sandbox_memory_bytes": 123 * 1024**2},
        listen="127.0.0.1:7000",
    )
    change = compare(running, read)
    assert change.live == ("default_timeout_s", "limits.cpu_s", "log_level")
    assert change.restart == ("limits.sandbox_memory_bytes", "listen", "pool_size")
    now = change.settings
    assert (now.log_level, now.default_timeout_s, now.limits.cpu_s) == ("DEBUG", 60.0, 5)
    # A warm sandbox is built with its sandbox-wide limits: those wait for a restart.
    assert now.limits.sandbox_memory_bytes == running.limits.sandbox_memory_bytes
    assert (now.pool_size, now.listen) == (4, running.listen)


def test_nothing_changed_is_nothing_to_apply() -> None:
    change = compare(settings(), settings())
    assert change.live == change.restart == ()


def test_sandbox_wide_limits_are_not_live() -> None:
    assert "limits.output_bytes" in LIVE_SETTINGS
    assert "limits.cpus" not in LIVE_SETTINGS
    assert "pool_size" not in LIVE_SETTINGS


class Recorder:
    """A daemon's side of a reload: what was applied."""

    def __init__(self, running: Settings, registry: Registry) -> None:
        self.settings, self.registry = running, registry
        self.applied = 0

    def apply(self, s: Settings, r: Registry) -> None:
        self.settings, self.registry = s, r
        self.applied += 1


def tool(name: str) -> Tool:
    return Tool(name=name, input_schema={"type": "object"}, source="user")


def reloader(
    daemon: Recorder,
    read: Settings | Exception,
    tools: Registry | Exception,
    security: ListenerSecurity | None = None,
) -> Reloader:
    def read_settings() -> Settings:
        if isinstance(read, Exception):
            raise read
        return read

    async def load_tools(_s: Settings) -> Registry:
        if isinstance(tools, Exception):
            raise tools
        return tools

    return Reloader(
        running=lambda: daemon.settings,
        read_settings=read_settings,
        load_tools=load_tools,
        apply=daemon.apply,
        registry=lambda: daemon.registry,
        security=lambda: security,
    )


async def test_a_reload_applies_tools_and_live_settings_and_names_what_needs_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = Recorder(settings(), Registry(builtins=(tool("old"),)))
    new_tools = Registry(builtins=(tool("new"),))
    read = settings(max_timeout_s=500.0, pool_size=9)
    with caplog.at_level(logging.INFO, logger="tooljaild.app.reload"):
        assert await reloader(daemon, read, new_tools).reload()
    assert daemon.registry is new_tools
    assert daemon.settings.max_timeout_s == 500.0 and daemon.settings.pool_size == 4
    done = next(r for r in caplog.records if r.getMessage() == "reload: done")
    assert done.tools_added == ["new"] and done.tools_removed == ["old"]  # type: ignore[attr-defined]
    assert done.settings_applied == {"max_timeout_s": [1000.0, 500.0]}  # type: ignore[attr-defined]
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "pool_size" in warning.getMessage() and "restart" in warning.getMessage()


async def test_an_unusable_config_keeps_the_settings_and_still_reloads_the_tools(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = settings()
    daemon = Recorder(running, Registry())
    new_tools = Registry(builtins=(tool("new"),))
    bad = TooljailError("invalid configuration (file x): pool_size: too big")
    assert not await reloader(daemon, bad, new_tools).reload()
    assert daemon.settings == running and daemon.registry is new_tools
    assert "pool_size: too big" in caplog.text


async def test_tools_that_cannot_be_loaded_keep_the_served_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = Registry(builtins=(tool("kept"),))
    daemon = Recorder(settings(), served)
    root, grpc_log = logging.getLogger(), logging.getLogger("grpc")
    levels = root.level, grpc_log.level
    try:
        assert not await reloader(
            daemon, settings(log_level="ERROR"), OSError("no sandbox")
        ).reload()
        assert root.level == logging.ERROR  # the log level applies at once
    finally:
        root.setLevel(levels[0])
        grpc_log.setLevel(levels[1])
    assert daemon.registry is served
    assert daemon.settings.log_level == "ERROR"  # the settings still apply
    assert "tools kept" in caplog.text


# ---------------------------------------------------------------- the tokens file

TOKEN_X, TOKEN_Y = "token-of-x-4f1c", "token-of-y-9a2e"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _identity(name: str, token: str, **policy: object) -> str:
    lines = [f"[identities.{name}]", f'token_sha256 = "{_sha(token)}"']
    lines += [f"{key} = {value}" for key, value in policy.items()]
    return "\n".join(lines) + "\n"


class _Context:
    """What `Authenticator.identify` reads of a request: its token, or its
    verified client certificate's common name."""

    def __init__(self, token: str | None, cn: str | None) -> None:
        self._metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        self._auth = {} if cn is None else {"x509_common_name": [cn.encode()]}

    def invocation_metadata(self) -> Any:
        return self._metadata

    def auth_context(self) -> Any:
        return self._auth


def who(auth: Authenticator, token: str | None, cn: str | None = None) -> Identity | None:
    """The identity `auth` gives a request with `token` (or certificate `cn`); None: refused."""
    try:
        return auth.identify(_Context(token, cn))  # type: ignore[arg-type]
    except UnauthenticatedError:
        return None


class Served:
    """A daemon's side of a reload with a tokens file, as it was at start."""

    def __init__(self, tmp_path: Path, text: str) -> None:
        self.tokens = tmp_path / "tokens.toml"
        self.tokens.write_text(text)
        self.tokens.chmod(0o600)
        self.settings = settings(auth={"tokens_file": self.tokens})
        self.auth = Authenticator(load_identities(self.tokens), client_certificates=True)
        self.security = ListenerSecurity(self.auth, None, SocketPermissions())
        self.daemon = Recorder(self.settings, Registry())

    async def reload(self, read: Settings | None = None) -> bool:
        r = reloader(self.daemon, read or self.settings, Registry(), self.security)
        ok = await r.reload()
        assert r.kept == (() if ok else ("the tokens file",))
        return ok


async def test_a_reload_reads_the_tokens_file_again_and_new_requests_see_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bot = "[identities.bot]\n"  # no token: a client certificate's CN names it
    served = Served(
        tmp_path, _identity("x", TOKEN_X) + _identity("keep", "k", max_sessions=1) + bot
    )
    x = who(served.auth, TOKEN_X)
    assert x is not None and x.name == "x" and who(served.auth, None, cn="bot") is not None
    served.tokens.write_text(
        _identity("y", TOKEN_Y, tools='["execute_python_code"]', max_concurrent_calls=2)
        + _identity("keep", "k", max_sessions=3)
    )
    with caplog.at_level(logging.INFO, logger="tooljaild.app.reload"):
        assert await served.reload()
    assert who(served.auth, TOKEN_X) is None  # revoked: refused from now on
    y = who(served.auth, TOKEN_Y)
    assert y is not None and y.name == "y" and y.max_concurrent_calls == 2
    assert y.may_use("execute_python_code") and not y.may_use("read_file")
    keep = who(served.auth, "k")
    assert keep is not None and keep.max_sessions == 3  # its new limit, for its next session
    assert who(served.auth, None, cn="bot") is None  # its certificate names nobody now
    assert x.name == "x"  # what was identified before keeps its identity object
    done = next(r for r in caplog.records if r.getMessage() == "reload: done")
    assert done.identities_added == ["y"]  # type: ignore[attr-defined]
    assert done.identities_removed == ["bot", "x"]  # type: ignore[attr-defined]
    assert done.identities_changed == ["keep"]  # type: ignore[attr-defined]
    assert _sha(TOKEN_Y) not in caplog.text and TOKEN_Y not in caplog.text


BAD_FILES: dict[str, str | bytes | None] = {
    "missing": None,
    "unreadable": "a directory",
    "not TOML": f'[identities.y]\ntoken_sha256 = "{_sha(TOKEN_Y)}"\ntools = [\n',
    "a bad hash": f'[identities.y]\ntoken_sha256 = "{TOKEN_Y}"\n',
    "a bad policy": _identity("y", TOKEN_Y, max_concurrent_calls=0),
    "an unknown key": _identity("y", TOKEN_Y) + f'token = "{TOKEN_Y}"\n',
    "a shared token": _identity("y", TOKEN_X) + _identity("z", TOKEN_X),
    "not UTF-8": b"[identities.y]\ntoken_sha256 = '\xff" + TOKEN_Y.encode() + b"'\n",
}


@pytest.mark.parametrize("bad", BAD_FILES, ids=list(BAD_FILES))
async def test_a_bad_tokens_file_keeps_the_identities_in_force_and_says_why_without_secrets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    served = Served(tmp_path, _identity("x", TOKEN_X))
    text = BAD_FILES[bad]
    served.tokens.unlink()
    if text == "a directory":
        served.tokens.mkdir()  # root reads any file: a directory is what it cannot read
    elif isinstance(text, bytes):
        served.tokens.write_bytes(text)
    elif text is not None:
        served.tokens.write_text(text)
    with caplog.at_level(logging.INFO, logger="tooljaild.app.reload"):
        assert not await served.reload()
    x = who(served.auth, TOKEN_X)
    assert x is not None and x.name == "x"  # the old identities serve on
    assert who(served.auth, TOKEN_Y) is None
    error = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert "identities kept" in error.getMessage()
    assert str(served.tokens) in error.getMessage()
    for secret in (TOKEN_X, TOKEN_Y, _sha(TOKEN_X), _sha(TOKEN_Y)):
        assert secret not in caplog.text
    assert any(r.getMessage() == "reload: done" for r in caplog.records)  # the rest goes on


async def test_the_path_or_turning_tokens_on_or_off_waits_for_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = Served(tmp_path, _identity("x", TOKEN_X))
    elsewhere = tmp_path / "other.toml"
    elsewhere.write_text(_identity("y", TOKEN_Y))
    elsewhere.chmod(0o600)
    served.tokens.write_text(_identity("x", TOKEN_X) + _identity("z", "z"))
    for tokens_file in (elsewhere, None):
        caplog.clear()
        assert await served.reload(settings(auth={"tokens_file": tokens_file}))
        assert "auth.tokens_file" in caplog.text and "restart" in caplog.text
        # The file in force is read again: its new identity is served, the other file's not.
        assert served.daemon.settings.auth.tokens_file == served.tokens
        assert who(served.auth, "z") is not None and who(served.auth, TOKEN_Y) is None
    # A daemon started without tokens never turns them on at a reload: it stays open.
    open_daemon = Recorder(settings(), Registry())
    auth = Authenticator(None, client_certificates=False)
    security = ListenerSecurity(auth, None, SocketPermissions())
    read = settings(auth={"tokens_file": elsewhere})
    assert await reloader(open_daemon, read, Registry(), security).reload()
    assert not auth.required and open_daemon.settings.auth.tokens_file is None
    with pytest.raises(ValueError, match="restart"):
        auth.replace_identities(load_identities(elsewhere))


async def test_replaced_tls_files_are_named_as_needing_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_text("cert 1")
    key.write_text("key 1")
    key.chmod(0o600)
    running = settings(tls={"cert_file": cert, "key_file": key})
    digest = tls_digest(running.tls)
    auth = Authenticator(None, client_certificates=False)
    security = ListenerSecurity(auth, None, SocketPermissions(), digest)
    daemon = Recorder(running, Registry())
    assert await reloader(daemon, running, Registry(), security).reload()
    assert "[tls]" not in caplog.text  # the same files: nothing to say
    cert.write_text("cert 2")  # a rotation
    assert await reloader(daemon, running, Registry(), security).reload()
    assert "[tls] files changed on disk" in caplog.text
    key.unlink()
    caplog.clear()
    assert await reloader(daemon, running, Registry(), security).reload()
    assert str(key) in caplog.text and "a restart would fail" in caplog.text
