"""The tokens file: identities found by token, their policy, and bad files named."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tooljaild.auth.policy import Identity, PolicyError, changes, load_identities


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    path.chmod(0o600)  # the daemon reads no tokens file others could read
    return path


def test_identities_are_found_by_token_with_their_policy(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        f"""
[identities.agent-a]
token_sha256 = "{_sha("secret-a")}"
tools = ["execute_python_code"]
approval = ["upload_file"]
max_concurrent_calls = 3

[identities.ops]
token_sha256 = "{_sha("secret-ops").upper()}"
approver = true

[identities.build-bot]
""",
    )
    identities = load_identities(path)
    a = identities.by_token("secret-a")
    assert a is not None and a.name == "agent-a"
    assert a.may_use("execute_python_code") and not a.may_use("read_file")
    assert a.needs_approval("upload_file") and not a.approver
    assert a.max_concurrent_calls == 3 and a.max_sessions is None
    ops = identities.by_token("secret-ops")
    assert ops is not None and ops.approver and ops.may_use("anything")
    assert identities.by_token("secret-b") is None and identities.by_token("") is None
    assert identities.by_name["build-bot"].token_sha256 is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[identities.a]\ntoken_sha256 = 'abc'\n", "identities.a.token_sha256"),
        ("[identities.a]\ntools = 'x'\n", "identities.a.tools"),
        ("[identities.a]\nshoe_size = 3\n", "identities.a.shoe_size"),
        ("[identities.'a b']\n", "identity name 'a b'"),
        ("[identities.a\n", "not valid TOML"),
        (
            f"[identities.a]\ntoken_sha256 = '{'0' * 64}'\n"
            f"[identities.b]\ntoken_sha256 = '{'0' * 64}'\n",
            "'a' and 'b' have the same token",
        ),
        ("[identities.a]\negress = ['api example.com']\n", "identities.a.egress"),
        ("[identities.a]\negress = ['*']\n", "'*' alone would allow every host"),
        ("[identities.a]\negress = 'a.com'\n", "identities.a.egress"),
        ("[identities.a]\nsecrets = ['bad-name']\n", "identities.a.secrets"),
        ("[identities.a]\nsecrets = ['PATH']\n", "secret name 'PATH'"),
    ],
)
def test_a_bad_tokens_file_is_named_with_what_is_wrong(
    tmp_path: Path, text: str, says: str
) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(PolicyError, match="tokens file") as caught:
        load_identities(path)
    assert str(path) in str(caught.value) and says in str(caught.value)


def test_a_missing_tokens_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"cannot read the tokens file .*missing\.toml"):
        load_identities(tmp_path / "missing.toml")


def test_an_identity_s_egress_and_secrets_are_read_and_absent_means_ceiling_and_none(
    tmp_path: Path,
) -> None:
    path = _file(
        tmp_path,
        """
[identities.news]
egress = ["api.example.com:443", "*.example.org"]
secrets = ["NEWS_API_KEY"]

[identities.plain]
""",
    )
    by_name = load_identities(path).by_name
    news, plain = by_name["news"], by_name["plain"]
    assert news.egress is not None
    assert [(r.host, r.ports) for r in news.egress] == [
        ("api.example.com", frozenset({443})),
        ("*.example.org", frozenset({80, 443})),
    ]
    assert news.secrets == frozenset({"NEWS_API_KEY"})
    # Absent: the daemon's ceiling, and no secret (a tokens file grants none unasked).
    assert plain.egress is None and plain.secrets == frozenset()
    # An identity not from a tokens file (no tokens: a uid) may use every secret.
    assert Identity(name="uid:1000").secrets is None


def test_a_changed_egress_rule_shows_as_a_changed_identity(tmp_path: Path) -> None:
    before = load_identities(_file(tmp_path, "[identities.a]\negress = ['a.com']\n"))
    after = load_identities(_file(tmp_path, "[identities.a]\negress = ['a.com:443']\n"))
    assert changes(before, after).changed == ("a",)
