"""upload_file against a real S3-compatible HTTP server: moto's standalone server.

The server runs as a child process (once per module), the daemon in this
process is configured (`[storage]`) to it, and everything goes over real HTTP:
the upload, the presigned download (urllib), the refusals. Wrong credentials
need a server that checks them: a second moto server with its IAM
authentication on (it cannot serve presigned URLs, so the first has it off).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.conftest import ServedDaemon
from tooljail import CallStatus, Client
from tooljaild.artifacts.store import ArtifactStore, Origin
from tooljaild.settings.artifacts import ArtifactSettings

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

BUCKET = "tooljail-uploads"
KEY_ID = "AKIATOOLJAILTEST0001"
SECRET = "tooljail-test-secret-never-in-a-message"


@dataclass
class Moto:
    url: str
    process: subprocess.Popen[bytes]
    key_id: str = KEY_ID
    secret: str = SECRET

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto(log: Path, **env: str) -> Moto:
    port = _free_port()
    with log.open("wb") as stderr:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    moto = Moto(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return moto
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                moto.stop()
                raise RuntimeError(f"moto's server did not start:\n{log.read_text()}") from None
            time.sleep(0.1)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """A moto S3 server with the bucket, credentials not checked."""
    server = _start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        server.s3().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def moto_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """A moto S3 server that checks credentials: one IAM user's key may write the bucket."""
    # The first 4 requests (the IAM setup and the bucket) are let through unchecked.
    log = tmp_path_factory.mktemp("moto-auth") / "moto.log"
    server = _start_moto(log, INITIAL_NO_AUTH_ACTION_COUNT="4")
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=server.url,
            region_name="us-east-1",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="agent")
        key = iam.create_access_key(UserName="agent")["AccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="agent", PolicyName="s3", PolicyDocument=json.dumps(policy))
        server.key_id, server.secret = key["AccessKeyId"], key["SecretAccessKey"]
        server.s3().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def _credentials(tmp_path: Path, key_id: str, secret: str) -> Path:
    path = tmp_path / "credentials"
    path.write_text(f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n")
    path.chmod(0o600)  # the daemon's alone: the sandbox uid cannot read it
    return path


def _storage(url: str, credentials: Path | None, **more: Any) -> dict[str, Any]:
    return {
        "endpoint_url": url,
        "region": "us-east-1",
        "bucket": BUCKET,
        "prefix": "agents/out",
        "credentials_file": credentials,
        "url_expiry_s": 600,
        **more,
    }


def _owner(client: Client) -> str:
    for key, value in getattr(client, "_metadata", ()):
        if key == "tooljail-client":
            return str(value)
    return f"{socket.gethostname()}/{os.getpid()}"


def _put_artifact(state_dir: Path, owner: str, data: bytes) -> str:
    store = ArtifactStore.open(state_dir / "artifacts", ArtifactSettings())
    try:
        return store.put("report.csv", "text/csv", data, Origin(owner), "outputs").artifact_id
    finally:
        store.close()


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return bytes(response.read())


def test_upload_an_artifact_and_a_session_file(
    moto: Moto, serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    credentials = _credentials(tmp_path, KEY_ID, SECRET)
    served = serve(state_dir=state_dir, storage=_storage(moto.url, credentials))
    big = os.urandom(3 * 1024 * 1024) * 4  # 12 MiB: past the multipart threshold
    with Client(served.target) as client:
        artifact_id = _put_artifact(state_dir, _owner(client), big)
        result = client.call("upload_file", {"artifact_id": artifact_id}, tool_timeout_s=120)
        assert result.status == CallStatus.SUCCESS, result
        assert result.data["key"].startswith("agents/out/")
        assert result.data["key"].endswith("/report.csv")
        assert result.data["size_bytes"] == len(big)
        assert _download(result.data["url"]) == big

        report = b"name,value\nx,1\ny,2\n"
        with client.session() as s:
            s.upload("report.csv", report)
            uploaded = s.call("upload_file", {"path": "report.csv"})
            assert uploaded.status == CallStatus.SUCCESS, uploaded
            assert _download(uploaded.data["url"]) == report
            key = uploaded.data["key"]
            assert moto.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read() == report
            # The sandbox cannot read the daemon's credentials file.
            probe = s.call(
                "execute_python_code",
                {"code": f"try:\n    open({str(credentials)!r}).read()\n    print('READ')\n"
                 "except OSError as e:\n    print(type(e).__name__)"},
            )  # fmt: skip
            assert "READ" not in probe.data["stdout"], probe
            missing = s.call("upload_file", {"path": "no-such-file.txt"})
            assert missing.status == CallStatus.ERROR

        outside = client.call("upload_file", {"path": "report.csv"})
        assert outside.status == CallStatus.ERROR
        assert outside.error is not None and outside.error.type == "NoWorkspace"
        assert "session" in outside.error.message


def test_env_credentials_never_reach_the_sandbox(
    moto: Moto,
    serve: Callable[..., ServedDaemon],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    served = serve(state_dir=tmp_path / "state", storage=_storage(moto.url, None))
    with Client(served.target) as client, client.session() as s:
        s.upload("data.bin", b"\x00\x01payload")
        uploaded = s.call("upload_file", {"path": "data.bin"})
        assert uploaded.status == CallStatus.SUCCESS, uploaded
        assert _download(uploaded.data["url"]) == b"\x00\x01payload"
        shown = s.call(
            "execute_python_code",
            {"code": "import os\nfor k, v in sorted(os.environ.items()):\n    print(k, '=', v)"},
        )
        assert shown.status == CallStatus.SUCCESS, shown
        assert "AWS_" not in shown.data["stdout"]
        assert SECRET not in shown.data["stdout"] and KEY_ID not in shown.data["stdout"]


def test_wrong_credentials_are_a_clear_failure_without_the_secret(
    moto_auth: Moto, serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    wrong_secret = "this-secret-is-wrong-and-must-not-show"

    def upload(case: str, key_id: str, secret: str) -> Any:
        base = tmp_path / case
        base.mkdir()
        credentials = _credentials(base, key_id, secret)
        state_dir = base / "state"
        served = serve(state_dir=state_dir, storage=_storage(moto_auth.url, credentials))
        with Client(served.target) as client:
            artifact_id = _put_artifact(state_dir, _owner(client), b"data\n")
            return client.call("upload_file", {"artifact_id": artifact_id})

    for case, key_id in (("wrong-secret", moto_auth.key_id), ("unknown", "AKIAUNKNOWNKEY000000")):
        result = upload(case, key_id, wrong_secret)
        assert result.status == CallStatus.ERROR
        assert result.error is not None and result.error.type == "StorageAccessDenied"
        assert BUCKET in result.error.message and moto_auth.url in result.error.message
        assert wrong_secret not in result.error.message
        assert wrong_secret not in result.message
    # The right key works on the same server: the refusal was the credentials'.
    assert upload("good", moto_auth.key_id, moto_auth.secret).ok


def test_a_credentials_file_others_can_read_is_not_used(
    moto: Moto, serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    """As the TLS key and the tokens file (issue 21, finding 16): a secret others
    can read is refused, by name, with the chmod that fixes it."""
    credentials = _credentials(tmp_path, KEY_ID, SECRET)
    credentials.chmod(0o644)
    state_dir = tmp_path / "state"
    served = serve(state_dir=state_dir, storage=_storage(moto.url, credentials))
    with Client(served.target) as client:
        artifact_id = _put_artifact(state_dir, _owner(client), b"data\n")
        result = client.call("upload_file", {"artifact_id": artifact_id})
    assert result.status == CallStatus.ERROR
    assert result.error is not None and result.error.type == "StorageCredentialsInvalid"
    assert "(mode 0644)" in result.error.message
    assert f"chmod 600 {credentials}" in result.error.message
    assert SECRET not in result.error.message and SECRET not in result.message


def test_a_missing_bucket_is_named(
    moto: Moto, serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    storage = _storage(moto.url, _credentials(tmp_path, KEY_ID, SECRET), bucket="no-such-bucket")
    served = serve(state_dir=state_dir, storage=storage)
    with Client(served.target) as client:
        artifact_id = _put_artifact(state_dir, _owner(client), b"data\n")
        result = client.call("upload_file", {"artifact_id": artifact_id})
    assert result.error is not None and result.error.type == "StorageBucketNotFound"
    assert "no-such-bucket" in result.error.message


def test_a_store_that_is_down_fails_clearly_in_bounded_time(
    serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    server = _start_moto(tmp_path / "moto.log")
    server.stop()  # nothing answers at its address any more
    state_dir = tmp_path / "state"
    storage = _storage(
        server.url,
        _credentials(tmp_path, KEY_ID, SECRET),
        connect_timeout_s=1.0,
        max_attempts=2,
    )
    served = serve(state_dir=state_dir, storage=storage)
    with Client(served.target) as client:
        artifact_id = _put_artifact(state_dir, _owner(client), b"data\n")
        started = time.monotonic()
        result = client.call("upload_file", {"artifact_id": artifact_id}, tool_timeout_s=60)
        elapsed = time.monotonic() - started
    assert result.status == CallStatus.ERROR
    assert result.error is not None and result.error.type == "StorageUnavailable"
    assert server.url in result.error.message and "2 attempts" in result.error.message
    assert elapsed < 30


def test_too_large_is_refused_before_any_upload(
    moto: Moto, serve: Callable[..., ServedDaemon], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    storage = _storage(moto.url, _credentials(tmp_path, KEY_ID, SECRET), max_upload_bytes=1000)
    served = serve(state_dir=state_dir, storage=storage)
    with Client(served.target) as client:
        artifact_id = _put_artifact(state_dir, _owner(client), b"x" * 1001)
        result = client.call("upload_file", {"artifact_id": artifact_id})
    assert result.error is not None and result.error.type == "UploadTooLarge"
    assert "max_upload_bytes" in result.error.message
    with contextlib.suppress(Exception):
        listed = moto.s3().list_objects_v2(Bucket=BUCKET).get("Contents", [])
        assert artifact_id not in str(listed)
