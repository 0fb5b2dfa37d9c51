"""API security through a real daemon: tokens, TLS and mTLS with certificates made
here, the allow-list, the identity as owner and its limits, the socket's mode.

Every refusal is checked for what it says: an unauthenticated caller learns
what to send and nothing of the daemon (no tool, identity or state).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.certs import Authority
from tests.conftest import ServedDaemon
from tooljail import AsyncClient, Client
from tooljail.errors import (
    ArtifactNotFoundError,
    CallIdConflictError,
    CallNotFoundError,
    OverloadedError,
    PermissionDeniedError,
    SessionNotFoundError,
    TransportError,
    UnauthenticatedError,
)
from tooljail.testing import wait_for
from tooljail.v1 import tooljail_pb2 as pb
from tooljail.v1 import tooljail_pb2_grpc
from tooljaild.app.errors import DaemonError
from tooljaild.edge.authenticator import AMBIGUOUS_CERTIFICATE_MESSAGE, UNAUTHENTICATED_MESSAGE

TOKEN_A, TOKEN_B, TOKEN_C = "token-of-agent-a", "token-of-agent-b", "token-of-agent-c"
PRINT_1 = {"code": "print(1)"}
BIG_OUTPUT = {"code": "import sys; sys.stdout.write('x' * (2 << 20))"}
"""Past the output kept inline: its stdout is stored as an artifact of the caller."""


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _tokens_file(directory: Path) -> Path:
    """agent-a: one tool, one call and one session at a time; agent-b and agent-c:
    no policy; build-bot: no token (a client certificate names it)."""
    path = directory / "tokens.toml"
    path.write_text(
        f"""
[identities.agent-a]
token_sha256 = "{_sha(TOKEN_A)}"
tools = ["execute_python_code"]
max_concurrent_calls = 1
max_sessions = 1

[identities.agent-b]
token_sha256 = "{_sha(TOKEN_B)}"

[identities.agent-c]
token_sha256 = "{_sha(TOKEN_C)}"

[identities.build-bot]
tools = ["execute_python_code"]
"""
    )
    path.chmod(0o600)
    return path


@pytest.fixture
def with_tokens(serve: Callable[..., ServedDaemon], tmp_path: Path) -> ServedDaemon:
    return serve(auth={"tokens_file": _tokens_file(tmp_path)})


def test_no_token_or_a_wrong_one_is_refused_and_told_nothing_of_the_daemon(
    with_tokens: ServedDaemon,
) -> None:
    target = with_tokens.target
    for token in (None, "not-a-token", TOKEN_A + "x"):
        # A claimed client name is no identity.
        with Client(target, token=token, client_name="agent-a", retries=0) as client:
            with pytest.raises(UnauthenticatedError) as refused:
                client.list_tools()
            assert str(refused.value).startswith(UNAUTHENTICATED_MESSAGE)
            for secret in ("execute_python_code", "agent-a", "agent-b", "build-bot", "tokens"):
                assert secret not in str(refused.value)
            with pytest.raises(UnauthenticatedError):
                client.call("execute_python_code", PRINT_1)
            with pytest.raises(UnauthenticatedError):
                client.get_call("some-call")
    with grpc.insecure_channel(target) as channel:
        # Probes need no token...
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # ...but reflection would describe the daemon: it is refused like the rest.
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        with pytest.raises(grpc.RpcError) as rpc:
            list(replies)
        assert rpc.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with Client(target, token=TOKEN_B) as client:
        assert client.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"


def test_an_identity_limited_to_one_tool_lists_and_calls_only_it(
    with_tokens: ServedDaemon,
) -> None:
    with Client(with_tokens.target, token=TOKEN_B) as b:
        every = {t.name for t in b.list_tools()}
    other = sorted(every - {"execute_python_code", "call_status"})[0]
    with Client(with_tokens.target, token=TOKEN_A) as a:
        # call_status is every identity's (auth.policy.ALWAYS_ALLOWED): it tells of
        # the identity's own calls only, as GetCall does.
        assert [t.name for t in a.list_tools()] == ["execute_python_code", "call_status"]
        with pytest.raises(PermissionDeniedError) as refused:
            a.call(other, {})
        assert other in str(refused.value)
        assert a.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"


def test_the_identity_owns_its_calls_and_artifacts_whatever_name_the_client_claims(
    with_tokens: ServedDaemon,
) -> None:
    target = with_tokens.target
    # agent-b claims to be agent-a: its identity, not the claim, owns what it makes.
    with Client(target, token=TOKEN_B, client_name="agent-a") as b:
        result = b.call("execute_python_code", BIG_OUTPUT, call_id="b-call")
        assert result.artifacts, result
        artifact_id = result.artifacts[0].artifact_id
        assert b.get_artifact(artifact_id).startswith(b"x")
        assert [i.artifact_id for i in b.list_artifacts()] == [artifact_id]
    with Client(target, token=TOKEN_A, client_name="agent-b") as a:
        with pytest.raises(ArtifactNotFoundError):
            a.get_artifact(artifact_id)
        assert a.list_artifacts() == []
        with pytest.raises(ArtifactNotFoundError):
            a.delete_artifact(artifact_id)
        with pytest.raises(CallNotFoundError):
            a.get_call("b-call")
        with pytest.raises(CallNotFoundError):
            a.cancel("b-call")
        # Reusing another identity's call id joins nothing of it.
        with pytest.raises(CallIdConflictError):
            a.call("execute_python_code", BIG_OUTPUT, call_id="b-call")
    with Client(target, token=TOKEN_B) as b:
        assert b.get_call("b-call").call_id == "b-call"


def test_not_found_reads_the_same_for_another_identitys_id_as_for_one_never_used(
    with_tokens: ServedDaemon,
) -> None:
    """Nothing in the answer tells another identity's session, call or artifact
    id (open or ended) from an id never used, but the id itself."""
    target = with_tokens.target
    with Client(target, token=TOKEN_B) as b:
        open_session = b.session()
        ended = b.session()
        ended.close()
        result = b.call("execute_python_code", BIG_OUTPUT, call_id="b-only")
        artifact_id = result.artifacts[0].artifact_id

    def said(action: Callable[[str], object], real: str, never: str) -> tuple[str, str]:
        answers = []
        for the_id in (real, never):
            with pytest.raises(
                (SessionNotFoundError, CallNotFoundError, ArtifactNotFoundError)
            ) as e:
                action(the_id)
            answers.append(f"{type(e.value).__name__}: {e.value}".replace(the_id, "<id>"))
        return answers[0], answers[1]

    # agent-a may call only execute_python_code, so its uploads and downloads are
    # refused before any session is looked up; agent-c (no policy) probes those.
    with Client(target, token=TOKEN_A) as a, Client(target, token=TOKEN_C) as c:
        never = "f" * 32
        for real in (open_session.id, ended.id):
            for action in (
                lambda sid: a.call("execute_python_code", PRINT_1, session_id=sid),
                a.close_session,
                lambda sid: c.download_file(sid, "x"),
                lambda sid: c.upload_file(sid, "x", b"x"),
            ):
                theirs, nobodys = said(action, real, never)
                assert theirs == nobodys
        for action in (a.get_call, a.cancel, lambda cid: list(a.attach(cid))):
            theirs, nobodys = said(action, "b-only", "never-used")
            assert theirs == nobodys
        theirs, nobodys = said(a.get_artifact, artifact_id, "f" * len(artifact_id))
        assert theirs == nobodys
    with Client(target, token=TOKEN_B) as b:
        # The owner still hears the truth of its own.
        assert b.close_session(ended.id).end_reason == "closed"
        assert b.close_session(open_session.id).end_reason == "closed"


def test_an_identity_is_held_to_its_own_call_and_session_limits(
    with_tokens: ServedDaemon,
) -> None:
    target = with_tokens.target
    slow = pb.CallRequest(
        tool="execute_python_code",
        arguments_json='{"code": "import time; time.sleep(4)"}',
        call_id="slow-a",
    )
    auth = (("authorization", f"Bearer {TOKEN_A}"),)
    with grpc.insecure_channel(target) as channel:
        stub = tooljail_pb2_grpc.ToolRunnerStub(channel)  # type: ignore[no-untyped-call]
        running = threading.Thread(target=lambda: stub.Run(slow, metadata=auth, timeout=60))
        running.start()
        with Client(target, token=TOKEN_A) as a:
            wait_for(lambda: _known(a, "slow-a"), timeout=30, what="the slow call admitted")
            with pytest.raises(OverloadedError):
                a.call("execute_python_code", PRINT_1)
            # Another identity is not held to agent-a's bound.
            with Client(target, token=TOKEN_B) as b:
                assert b.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
            running.join(60)
            assert a.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
            session = a.session()
            try:
                with pytest.raises(OverloadedError):
                    a.session()
                with Client(target, token=TOKEN_B) as b:
                    listed = [s.session_id for s in b.list_sessions(all_clients=True)]
                    assert session.id not in listed
                    with pytest.raises(SessionNotFoundError):
                        b.close_session(session.id)
            finally:
                session.close()


def _known(client: Client, call_id: str) -> bool:
    try:
        client.get_call(call_id)
    except CallNotFoundError:
        return False
    return True


@pytest.fixture
def authorities(tmp_path: Path) -> tuple[Authority, Authority]:
    return Authority(tmp_path, "ours"), Authority(tmp_path, "theirs")


def test_mtls_the_certificate_names_the_identity_and_another_cas_is_refused(
    serve: Callable[..., ServedDaemon],
    tmp_path: Path,
    authorities: tuple[Authority, Authority],
) -> None:
    ours, theirs = authorities
    server = ours.issue("localhost", server=True)
    served = serve(
        listen="127.0.0.1:0",
        tls={"cert_file": server.cert, "key_file": server.key, "client_ca_file": ours.ca_file},
        auth={"tokens_file": _tokens_file(tmp_path)},
    )
    bot = ours.issue("build-bot")
    with Client(
        served.target, tls_ca_file=ours.ca_file, tls_cert_file=bot.cert, tls_key_file=bot.key
    ) as client:
        # build-bot's policy, found by its certificate's subject.
        assert [t.name for t in client.list_tools()] == ["execute_python_code", "call_status"]
        assert client.call("execute_python_code", PRINT_1).data["stdout"] == "1\n"
    # A certificate of the right CA whose subject names two identities: the first
    # is known, yet it is refused, in a fixed sentence (gRPC would name the first).
    two = ours.issue("build-bot", also=("agent-b",))
    with (
        Client(
            served.target,
            tls_ca_file=ours.ca_file,
            tls_cert_file=two.cert,
            tls_key_file=two.key,
            retries=0,
        ) as client,
        pytest.raises(UnauthenticatedError) as refused,
    ):
        client.list_tools()
    assert str(refused.value) == AMBIGUOUS_CERTIFICATE_MESSAGE
    # A certificate of the right CA, naming nobody the tokens file knows.
    stranger = ours.issue("stranger")
    with (
        Client(
            served.target,
            tls_ca_file=ours.ca_file,
            tls_cert_file=stranger.cert,
            tls_key_file=stranger.key,
            retries=0,
        ) as client,
        pytest.raises(UnauthenticatedError),
    ):
        client.list_tools()
    # Another CA's certificate, even naming a known identity; and no certificate.
    forged = theirs.issue("build-bot")
    for pair in (forged, None):
        with (
            Client(
                served.target,
                tls_ca_file=ours.ca_file,
                tls_cert_file=None if pair is None else pair.cert,
                tls_key_file=None if pair is None else pair.key,
                retries=0,
                rpc_timeout_s=10,
            ) as client,
            pytest.raises(TransportError),
        ):
            client.list_tools()


def test_tls_with_tokens_serves_beyond_loopback_and_the_sdk_reads_its_environment(
    serve: Callable[..., ServedDaemon],
    tmp_path: Path,
    authorities: tuple[Authority, Authority],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, theirs = authorities
    server = ours.issue("localhost", server=True)
    # Not loopback: refused in plaintext (test_cli) and with TLS that admits anyone...
    with pytest.raises(DaemonError, match="without tokens or client certificates"):
        serve(listen="0.0.0.0:0", tls={"cert_file": server.cert, "key_file": server.key})
    # ...served with TLS and tokens.
    served = serve(
        listen="0.0.0.0:0",
        tls={"cert_file": server.cert, "key_file": server.key},
        auth={"tokens_file": _tokens_file(tmp_path)},
    )
    target = "127.0.0.1:" + served.target.rsplit(":", 1)[1]
    monkeypatch.setenv("TOOLJAIL_TOKEN", TOKEN_A)
    monkeypatch.setenv("TOOLJAIL_TLS_CA", str(ours.ca_file))
    with Client(target) as client:
        assert [t.name for t in client.list_tools()] == ["execute_python_code", "call_status"]
    monkeypatch.delenv("TOOLJAIL_TLS_CA")
    with Client(target, retries=0, rpc_timeout_s=10) as plaintext, pytest.raises(TransportError):
        plaintext.list_tools()
    unverified = Client(target, tls_ca_file=theirs.ca_file, retries=0, rpc_timeout_s=10)
    with unverified, pytest.raises(TransportError):
        unverified.list_tools()


def test_the_cli_takes_the_token_and_tls_flags(
    serve: Callable[..., ServedDaemon],
    tmp_path: Path,
    authorities: tuple[Authority, Authority],
) -> None:
    ours, _ = authorities
    server = ours.issue("localhost", server=True)
    served = serve(
        listen="127.0.0.1:0",
        tls={"cert_file": server.cert, "key_file": server.key},
        auth={"tokens_file": _tokens_file(tmp_path)},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLJAIL_")}
    base = [sys.executable, "-m", "tooljaild", "tools", "--target", served.target]
    base += ["--tls-ca", str(ours.ca_file)]
    ok = subprocess.run(
        [*base, "--token", TOKEN_A], capture_output=True, text=True, env=env, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert "execute_python_code" in ok.stdout
    refused = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode != 0
    assert "token" in refused.stderr and "execute_python_code" not in refused.stdout


def test_the_socket_gets_its_mode_and_group_from_config(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    # A group this user is in, other than its own when it has one: chown needs no root.
    groups = [g for g in os.getgroups() if g != os.getgid()] or [os.getgid()]
    served = serve(socket_mode="0600", socket_group=str(groups[0]), socket_owner=str(os.getuid()))
    st = os.stat(served.target.removeprefix("unix://"))
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_gid == groups[0]
    assert st.st_uid == os.getuid()
    served.assert_serving()


async def test_the_async_client_sends_its_token_and_tls_too(
    serve: Callable[..., ServedDaemon],
    tmp_path: Path,
    authorities: tuple[Authority, Authority],
) -> None:
    ours, _ = authorities
    server, bot = ours.issue("localhost", server=True), ours.issue("build-bot")
    served = serve(
        listen="127.0.0.1:0",
        tls={"cert_file": server.cert, "key_file": server.key, "client_ca_file": ours.ca_file},
        auth={"tokens_file": _tokens_file(tmp_path)},
    )
    tls = {"tls_ca_file": ours.ca_file, "tls_cert_file": bot.cert, "tls_key_file": bot.key}
    async with AsyncClient(served.target, token=TOKEN_B, **tls) as b:
        # The token names agent-b (every tool), over the connection build-bot's certificate made.
        assert len(await b.list_tools()) > 1
    async with AsyncClient(served.target, token="wrong", retries=0, **tls) as nobody:
        with pytest.raises(UnauthenticatedError):
            await nobody.list_tools()
