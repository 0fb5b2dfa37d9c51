"""Who a request is: the token, the verified certificate's CN, or nobody; and what
the SDK sends and the daemon's settings resolve to."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from tooljail._credentials import Credentials
from tooljail.errors import InvalidRequestError, UnauthenticatedError
from tooljaild.auth.peer import peer_uid, relay_address
from tooljaild.auth.policy import Identities, Identity
from tooljaild.edge.authenticator import UNAUTHENTICATED_MESSAGE, Authenticator, common_names
from tooljaild.edge.transport import SecurityConfigError, listener_security, socket_permissions
from tooljaild.settings.config import load_settings


class _Context:
    """The three things `identify` reads of a grpc.aio context."""

    def __init__(
        self,
        metadata: tuple[tuple[str, str], ...] = (),
        cn: bytes | None = None,
        peer: str = "unix:",
    ):
        self._metadata = metadata
        self._auth: dict[str, list[bytes]] = {} if cn is None else {"x509_common_name": [cn]}
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> Any:
        return self._metadata

    def auth_context(self) -> Any:
        return self._auth


A = Identity("agent-a", hashlib.sha256(b"tok-a").hexdigest(), tools=frozenset({"x"}))
BOT = Identity("build-bot")
KNOWN = Identities({"agent-a": A, "build-bot": BOT})


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_without_tokens_or_client_certificates_nobody_is_asked() -> None:
    auth = Authenticator(None, client_certificates=False)
    assert not auth.required
    assert auth.identify(_Context(_bearer("anything"))) is None  # type: ignore[arg-type]


def test_without_tokens_a_relayed_uid_is_its_own_identity_and_operators_are_nobody() -> None:
    auth = Authenticator(None, client_certificates=False, operators=frozenset({0, 7}))

    def relayed(uid: int) -> _Context:
        return _Context(peer="unix-abstract:" + relay_address(uid)[1:].decode())

    assert auth.identify(relayed(1000)) == Identity("uid:1000")  # type: ignore[arg-type]
    assert auth.identify(relayed(0)) is None  # type: ignore[arg-type]
    assert auth.identify(relayed(7)) is None  # type: ignore[arg-type]
    # Not relayed (TCP, or the private socket itself): nobody in particular, as before.
    for peer in ("ipv4:127.0.0.1:5555", "unix:", "unix-abstract:tooljail-peer/uid=1/x"):
        assert auth.identify(_Context(peer=peer)) is None  # type: ignore[arg-type]
    assert peer_uid("unix-abstract:" + relay_address(42)[1:].decode()) == 42


def test_common_names_are_counted_in_a_subject_with_escapes() -> None:
    assert common_names("CN=build-bot") == 1
    assert common_names("CN=admin,CN=build-bot") == 2
    assert common_names("CN=a+CN=b,O=x") == 2
    assert common_names(r"CN=a\,CN=b,O=x") == 1  # an escaped comma is part of the value
    assert common_names("O=x,OU=y") == 0
    assert common_names("cn=a,2.5.4.3=b") == 2


def test_a_token_names_its_identity_and_a_wrong_or_missing_one_is_refused_alike() -> None:
    auth = Authenticator(KNOWN, client_certificates=False)
    assert auth.identify(_Context(_bearer("tok-a"))) is A  # type: ignore[arg-type]
    assert auth.identify(_Context((("authorization", "bearer  tok-a "),))) is A  # type: ignore[arg-type]
    for metadata in ((), _bearer("tok-b"), (("authorization", "Basic tok-a"),)):
        with pytest.raises(UnauthenticatedError) as refused:
            auth.identify(_Context(metadata))  # type: ignore[arg-type]
        assert str(refused.value) == UNAUTHENTICATED_MESSAGE
    # Without client certificates configured, a CN (there is none) names nobody.
    with pytest.raises(UnauthenticatedError):
        auth.identify(_Context(cn=b"build-bot"))  # type: ignore[arg-type]


def test_a_verified_certificate_names_a_known_identity_or_any_without_a_tokens_file() -> None:
    auth = Authenticator(KNOWN, client_certificates=True)
    assert auth.identify(_Context(cn=b"build-bot")) is BOT  # type: ignore[arg-type]
    for cn in (b"stranger", b"../bad name"):
        with pytest.raises(UnauthenticatedError):
            auth.identify(_Context(cn=cn))  # type: ignore[arg-type]
    # A wrong token is refused even with a good certificate: a mistake to hear of.
    with pytest.raises(UnauthenticatedError):
        auth.identify(_Context(_bearer("tok-b"), cn=b"build-bot"))  # type: ignore[arg-type]
    open_ca = Authenticator(None, client_certificates=True)
    assert open_ca.identify(_Context(cn=b"anyone")) == Identity("anyone")  # type: ignore[arg-type]


def test_the_sdk_takes_its_credentials_from_arguments_else_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TOOLJAIL_TOKEN", "TOOLJAIL_TLS_CA", "TOOLJAIL_TLS_CERT", "TOOLJAIL_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    none = Credentials.resolve(None, None, None, None)
    assert none.metadata() == () and not none.tls and none.channel_credentials() is None
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"PEM")
    monkeypatch.setenv("TOOLJAIL_TOKEN", "from-env")
    monkeypatch.setenv("TOOLJAIL_TLS_CA", str(ca))
    env = Credentials.resolve(None, None, None, None)
    assert env.metadata() == (("authorization", "Bearer from-env"),) and env.ca == b"PEM"
    assert Credentials.resolve("given", None, None, None).token == "given"
    with pytest.raises(InvalidRequestError, match="needs its key"):
        Credentials.resolve(None, None, ca, None)
    with pytest.raises(InvalidRequestError, match="TOOLJAIL_TLS_KEY"):
        monkeypatch.setenv("TOOLJAIL_TLS_KEY", str(tmp_path / "missing.key"))
        Credentials.resolve(None, None, ca, None)
    for bad in ("", "tok\n"):
        with pytest.raises(InvalidRequestError):
            Credentials.resolve(bad, None, None, None)


def test_socket_permissions_and_a_bad_tokens_file_are_named() -> None:
    assert socket_permissions(None, None, "0660").mode == 0o660
    mine = socket_permissions(str(os.getuid()), str(os.getgid()), "600")
    assert (mine.uid, mine.gid, mine.mode) == (os.getuid(), os.getgid(), 0o600)
    for owner, group, mode, says in (
        (None, None, "rw", "octal"),
        (None, None, "1777", "permission bits"),
        ("no-such-user-here", None, "0660", "socket_owner"),
        (None, "no-such-group-here", "0660", "socket_group"),
    ):
        with pytest.raises(SecurityConfigError, match=says):
            socket_permissions(owner, group, mode)
    settings = load_settings(auth={"tokens_file": "/nonexistent/tokens.toml"})
    with pytest.raises(SecurityConfigError, match=r"/nonexistent/tokens\.toml"):
        listener_security(settings)
