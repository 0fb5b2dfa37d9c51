"""Egress config: [egress], [egress.hosts], [secrets], [packages], and the secrets file.

Each bad entry is refused at start (and so at reload, which builds the same
objects) by name; a secret's value never appears in a message or a repr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tooljaild.egress.hosts import HostsMap
from tooljaild.egress.policy import EgressCeiling
from tooljaild.egress.secrets import load_secrets
from tooljaild.settings.config import ConfigError, Settings, load_settings
from tooljaild.settings.egress import EgressSettings, PackagesSettings, SecretsSettings
from tooljaild.settings.sandbox import Limits, SandboxProfile
from tooljaild.tools.registry import ToolOptions

VALUE = "canary-7f3a9b2c4d5e6f708192a3b4"


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _secrets(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secrets.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_no_egress_section_is_none_and_a_ceiling_that_allows_nothing() -> None:
    s = Settings()
    assert s.egress is None and s.secrets.file is None and s.packages.urls() == []
    ceiling = EgressCeiling.from_settings(s)
    assert ceiling.allow == () and ceiling.secrets == {}
    assert len(HostsMap.from_settings(s.egress)) == 0


def test_the_egress_tables_load_from_toml(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = _config(
        tmp_path,
        f"""
[egress]
allow = ["api.example.com", "*.githubusercontent.com", "pypi.org", "pypi.internal:8080"]
deny = ["evil.example.com"]
ca_file = "{ca}"
[egress.hosts]
"pypi.internal" = "10.0.0.5:8080"
"api.example.com:443" = "127.0.0.1:8443"
"v6.example.com" = "[::1]:9443"
[packages]
index_url = "https://pypi.org/simple"
extra_index_urls = ["http://pypi.internal:8080/simple/"]
[limits]
max_egress_connections = 8
""",
    )
    s = load_settings(config)
    assert s.egress is not None and s.egress.ca_file == ca
    assert [r.text for r in s.egress.allow_rules()][:2] == [
        "api.example.com",
        "*.githubusercontent.com",
    ]
    assert s.limits.max_egress_connections == 8
    assert s.packages.hosts() == [("pypi.org", 443), ("pypi.internal", 8080)]
    hosts = HostsMap.from_settings(s.egress)
    assert hosts.lookup("api.example.com", 443) == ("127.0.0.1", 8443)
    assert hosts.lookup("API.Example.com.", 80) is None
    assert hosts.lookup("pypi.internal", 1234) == ("10.0.0.5", 8080)
    assert hosts.lookup("v6.example.com", 443) == ("::1", 9443)
    assert hosts.addresses() == {"10.0.0.5", "127.0.0.1", "::1"}
    ceiling = EgressCeiling.from_settings(s)
    assert ceiling.deny[0].ports is None  # a deny without ports: every port


def test_a_name_port_entry_wins_over_the_name_entry() -> None:
    hosts = HostsMap.parse({"a.com": "10.0.0.1:80", "a.com:443": "10.0.0.2:8443"})
    assert hosts.lookup("a.com", 443) == ("10.0.0.2", 8443)
    assert hosts.lookup("a.com", 80) == ("10.0.0.1", 80)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[egress]\nallow = ["api example.com"]', "egress.allow: Value error, allow: 'api example"),
        ('[egress]\nallow = ["*"]', "egress.allow: Value error, allow: '*'"),
        ('[egress]\ndeny = ["a.com:0"]', "egress.deny: Value error, deny: 'a.com:0'"),
        ('[egress]\nallow = "a.com"', "egress.allow"),
        ('[egress]\nalow = ["a.com"]', "egress.alow: Extra inputs"),
        ('[egress.hosts]\n"*.a.com" = "10.0.0.1:80"', "hosts '*.a.com'"),
        ('[egress.hosts]\n"a.com" = "10.0.0.1"', "hosts 'a.com': '10.0.0.1': give the port"),
        ('[egress.hosts]\n"a.com:x" = "10.0.0.1:80"', "hosts 'a.com:x'"),
        ('[egress.hosts]\n"A.com" = "1.1.1.1:1"\n"a.com" = "1.1.1.1:2"', "mapped twice"),
        ('[secrets]\nfilee = "/x"', "secrets.filee: Extra inputs"),
        ('[packages]\nindex_url = "ftp://x.org/simple"', "packages.index_url"),
        (
            '[egress]\nallow = ["a.org"]\n[packages]\nindex_url = "https://pypi.org/simple"',
            "packages: index https://pypi.org/simple: pypi.org:443 is not allowed",
        ),
        (
            '[egress]\nallow = ["*.org"]\ndeny=["pypi.org"]\n[packages]\n'
            'extra_index_urls = ["https://pypi.org/simple"]',
            "index https://pypi.org/simple: pypi.org:443 is not allowed by [egress] allow (or is "
            "denied",
        ),
        (
            '[packages]\nindex_url = "https://pypi.org/simple"',
            "index https://pypi.org/simple needs an [egress] section",
        ),
        (
            '[packages]\nindex_url = "https://u:p@pypi.org/simple"',
            "credentials do not belong in the URL",
        ),
        ("[limits]\nmax_egress_connections = 0", "limits.max_egress_connections"),
    ],
)
def test_a_bad_egress_config_is_refused_by_name(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_config(tmp_path, text))
    assert says in str(info.value)


def test_the_egress_tables_forbid_unknown_keys() -> None:
    for model in (EgressSettings, SecretsSettings, PackagesSettings):
        assert model.model_config.get("extra") == "forbid"
    assert Limits().max_egress_connections == 64


def test_an_unreadable_ca_file_is_refused_at_start_by_name(tmp_path: Path) -> None:
    s = Settings(egress=EgressSettings(allow=["a.com"], ca_file=tmp_path / "nope.pem"))
    with pytest.raises(ConfigError, match=r"\[egress\] ca_file .*nope.pem cannot be read"):
        EgressCeiling.from_settings(s)


def test_the_secrets_file_loads_within_the_ceiling(tmp_path: Path) -> None:
    path = _secrets(
        tmp_path,
        f'[NEWS_API_KEY]\nvalue = "{VALUE}"\nhosts = ["api.example.com:443"]\n'
        f'[OTHER]\nvalue = "{VALUE}-2"\nhosts = ["a.x.com", "*.y.x.com"]\n',
    )
    s = Settings(
        egress=EgressSettings(allow=["api.example.com", "*.x.com"]),
        secrets=SecretsSettings(file=path),
    )
    ceiling = EgressCeiling.from_settings(s)
    assert sorted(ceiling.secrets) == ["NEWS_API_KEY", "OTHER"]
    entry = ceiling.secrets["NEWS_API_KEY"]
    assert entry.value == VALUE and [r.text for r in entry.hosts] == ["api.example.com:443"]
    for shown in (repr(entry), str(entry), repr(ceiling), repr(dict(ceiling.secrets))):
        assert VALUE not in shown


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f'[1BAD]\nvalue = "{VALUE}"\nhosts = ["a.com"]', "secret name '1BAD'"),
        (f'[PATH]\nvalue = "{VALUE}"\nhosts = ["a.com"]', "secret name 'PATH' is a variable"),
        (f'[K]\nvalue = "{VALUE}"', "secret K: hosts must list at least one"),
        (f'[K]\nvalue = "{VALUE}"\nhosts = []', "secret K: hosts must list at least one"),
        (f'[K]\nvalue = "{VALUE}"\nhosts = ["a b"]', "secret K: hosts: 'a b'"),
        ('[K]\nvalue = 12345678\nhosts = ["a.com"]', "secret K: value must be a string"),
        ('[K]\nvalue = "short"\nhosts = ["a.com"]', "value must have 8 to"),
        (f'[K]\nvalue = "{VALUE}\\r\\nX: y"\nhosts = ["a.com"]', "line break"),
        (f'[K]\nvalue = "{VALUE}"\nhosts = ["a.com"]\nhots = 1', "unknown key 'hots'"),
        (f'K = "{VALUE}"', "secret K must be a table"),
        (f'[K]\nvalue = "{VALUE}"\nhosts = ["b.com"]', "host b.com is not within [egress] allow"),
        (f'[K]\nvalue = "{VALUE}', "is not valid TOML"),
    ],
)
def test_a_bad_secrets_file_is_refused_by_name_never_showing_a_value(
    tmp_path: Path, text: str, says: str
) -> None:
    path = _secrets(tmp_path, text)
    s = Settings(egress=EgressSettings(allow=["a.com"]), secrets=SecretsSettings(file=path))
    with pytest.raises(ConfigError) as info:
        EgressCeiling.from_settings(s)
    message = str(info.value)
    assert says in message and str(path) in message
    assert VALUE not in message and "short" not in message.replace("value must", "")
    assert info.value.__cause__ is None or VALUE not in str(info.value.__cause__)


def test_a_secrets_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = _secrets(tmp_path, f'[K]\nvalue = "{VALUE}"\nhosts = ["a.com"]', mode=0o644)
    with pytest.raises(ConfigError, match="chmod 600") as info:
        load_secrets(path)
    assert VALUE not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read the secrets file"):
        load_secrets(tmp_path / "missing.toml")


def test_a_secrets_file_without_egress_is_refused(tmp_path: Path) -> None:
    path = _secrets(tmp_path, f'[K]\nvalue = "{VALUE}"\nhosts = ["a.com"]')
    with pytest.raises(ConfigError, match=r"\[secrets\] file .* needs an \[egress\] section"):
        EgressCeiling.from_settings(Settings(secrets=SecretsSettings(file=path)))


def test_a_tool_s_profile_takes_egress_rules_on_either_backend() -> None:
    for backend in (None, "process", "docker"):
        profile = SandboxProfile(backend=backend, egress=["api.example.com:443"])
        rules = profile.egress_rules
        assert rules is not None and rules[0].ports == frozenset({443})
    assert SandboxProfile().egress_rules is None
    with pytest.raises(ValidationError, match="egress: 'a b'"):
        SandboxProfile(egress=["a b"])
    with pytest.raises(ValidationError):
        SandboxProfile(egress="api.example.com")  # type: ignore[arg-type]


def test_a_tool_s_secrets_are_names() -> None:
    assert ToolOptions(secrets=["NEWS_API_KEY"]).secrets == ["NEWS_API_KEY"]
    assert ToolOptions().secrets == []
    with pytest.raises(ValidationError, match="secret name 'no-dash'"):
        ToolOptions(secrets=["no-dash"])
    with pytest.raises(ValidationError, match="LD_PRELOAD"):
        ToolOptions(secrets=["LD_PRELOAD"])
