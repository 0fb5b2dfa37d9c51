"""upload_file's parts that need no store: `[storage]`, keys, arguments, credentials."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tooljail.errors import InvalidArgumentsError
from tooljaild.settings.config import ConfigError, Settings, load_settings
from tooljaild.settings.storage import StorageSettings
from tooljaild.tools.builtin.upload import _credentials, _key, check_upload_arguments, upload_file
from tooljaild.tools.in_daemon import DaemonCall, Services, ToolFailure


def test_the_storage_table_loads_and_refuses_typos(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[storage]\nendpoint_url = "http://127.0.0.1:9000"\nbucket = "b"\nprefix = "p/"\n'
        'credentials_file = "/etc/tooljail/credentials"\nurl_expiry_s = 60\n'
    )
    storage = load_settings(config).storage
    assert (storage.bucket, storage.prefix, storage.url_expiry_s) == ("b", "p/", 60)
    assert storage.credentials_file == Path("/etc/tooljail/credentials")
    config.write_text('[storage]\nbuckt = "b"\n')
    with pytest.raises(ConfigError, match=r"storage\.buckt"):
        load_settings(config)
    assert Settings().storage.bucket == ""  # none by default


def test_keys_are_the_prefix_the_call_and_a_safe_base_name() -> None:
    assert _key("agents/out/", "c1", "report.csv") == "agents/out/c1/report.csv"
    assert _key("", "c1", "../../etc/passwd") == "c1/passwd"
    assert _key("/p/", "c1", "a b?.txt") == "p/c1/a_b_.txt"
    assert _key("p", "c1", "..") == "p/c1/file"


@pytest.mark.parametrize("arguments", [{}, {"path": "a", "artifact_id": "b"}])
def test_exactly_one_of_path_and_artifact_id(arguments: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentsError, match="exactly one"):
        check_upload_arguments(arguments, None)
    assert check_upload_arguments({"path": "a"}, None) == {"path": "a"}


def test_a_credentials_file_without_the_profile_is_named_not_shown(tmp_path: Path) -> None:
    path = tmp_path / "credentials"
    path.write_text("[other]\naws_access_key_id = K\naws_secret_access_key = S3CRET\n")
    path.chmod(0o600)  # the daemon reads no credentials others could read
    with pytest.raises(ToolFailure) as failure:
        _credentials(path, "default")
    assert failure.value.type == "StorageCredentialsInvalid"
    assert str(path) in failure.value.message and "S3CRET" not in failure.value.message
    assert _credentials(path, "other") == {
        "aws_access_key_id": "K",
        "aws_secret_access_key": "S3CRET",
    }
    with pytest.raises(ToolFailure, match="cannot read"):
        _credentials(tmp_path / "missing", "default")


def test_without_storage_each_call_says_how_to_configure_it(tmp_path: Path) -> None:
    services = Services(settings=Settings(state_dir=tmp_path))
    call = DaemonCall("c", "upload_file", {"artifact_id": "x"}, "me", None, services)
    with pytest.raises(ToolFailure) as failure:
        asyncio.run(upload_file(call))
    assert failure.value.type == "StorageNotConfigured"
    assert "[storage] bucket" in failure.value.message


def test_a_workspace_path_outside_a_session_is_refused(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, storage=StorageSettings(bucket="b"))
    call = DaemonCall("c", "upload_file", {"path": "a.txt"}, "me", None, Services(settings))
    with pytest.raises(ToolFailure) as failure:
        asyncio.run(upload_file(call))
    assert failure.value.type == "NoWorkspace" and "session_id" in failure.value.message
