"""Object storage: the built-in `upload_file` (LightAgent's upload_file_to_oss).

`upload_file` puts a session's workspace file (`path`) or one of the caller's
artifacts (`artifact_id`) into the bucket and prefix the operator configured
(`[storage]`: any S3-compatible store, AWS S3, MinIO, Aliyun OSS, Ceph, through
boto3) and returns `{"key", "url", "size_bytes"}`: the object's key and a
presigned GET URL valid for `url_expiry_s`.

Credentials stay in the daemon: they are read here (a shared-credentials file,
else boto3's own chain: the AWS_* environment variables first) and used only by
the daemon's boto3 client; no sandbox is given them, and no message names them.

Without `[storage] bucket` the tool is still served (its description is the same
on every daemon) and each call fails saying storage is not configured and how to
configure it.

Memory: an artifact is uploaded from its file; a workspace file is first copied
from its session (chunk by chunk) into an unlinked temporary file of the daemon's
state directory. boto3 uploads either in parts past `MULTIPART_BYTES`, so a big
file costs a few parts of memory, not its size. Both are bounded by
`max_upload_bytes`.

Retries: a PUT of a whole object (or of one part) is idempotent, so botocore
retries it on connection errors and 5xx with its own backoff (`max_attempts`);
nothing else is retried. The key is the call's id and the file's name, so a
retried call (the same call id) writes the same object again.
"""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tooljail.errors import InvalidArgumentsError
from tooljaild.auth.secret_files import ExposedSecretError, read_secret
from tooljaild.settings.storage import StorageSettings
from tooljaild.tools.builtin.artifacts import gone, locate
from tooljaild.tools.in_daemon import DaemonCall, ToolFailure
from tooljaild.tools.registry import Tool

__all__ = [
    "MULTIPART_BYTES",
    "UPLOAD_FILE_TOOL",
    "check_upload_arguments",
    "upload_file",
]

MULTIPART_BYTES = 8 * 1024 * 1024
"""Files past this are uploaded in parts of this size (boto3's default)."""


def check_upload_arguments(arguments: dict[str, Any], settings: object) -> dict[str, Any]:
    """`upload_file`'s arguments name exactly one of `path` and `artifact_id`.

    Raises:
        InvalidArgumentsError: Both or neither.
    """
    given = [k for k in ("path", "artifact_id") if arguments.get(k)]
    if len(given) != 1:
        raise InvalidArgumentsError(
            "upload_file takes exactly one of path (a file of the session's workspace) "
            "and artifact_id (an artifact of yours)",
            parameter="path",
            expected="exactly one of path, artifact_id",
            actual=", ".join(given) or "neither",
        )
    return arguments


async def upload_file(call: DaemonCall) -> dict[str, Any]:
    """Upload the call's `path` or `artifact_id` and return its key and a presigned URL."""
    storage: StorageSettings = call.services.settings.storage
    if not storage.bucket:
        raise ToolFailure(
            "StorageNotConfigured",
            "Object storage is not configured on this daemon, so nothing can be uploaded. "
            "The operator sets [storage] bucket (and endpoint_url, region, credentials_file "
            "or the AWS_* environment variables) in the daemon's config.",
        )
    with tempfile.TemporaryFile(dir=call.services.settings.state_dir) as spool:
        if call.arguments.get("artifact_id"):
            name, opened = _artifact(call, storage)
        else:
            name = await _spool_workspace_file(call, storage, spool)
            opened = spool
        key = _key(storage.prefix, call.call_id, name)
        try:
            size, url = await asyncio.to_thread(_put, storage, opened, key)
        finally:
            if opened is not spool:
                opened.close()
    return {"key": key, "url": url, "size_bytes": size}


def _artifact(call: DaemonCall, storage: StorageSettings) -> tuple[str, IO[bytes]]:
    """The caller's artifact: its name and its file, open (the caller closes it)."""
    info, path = locate(call)
    _check_size(info.size_bytes, storage, f"artifact {info.artifact_id}")
    try:
        return info.name or info.artifact_id, path.open("rb")
    except FileNotFoundError:
        raise gone(info.artifact_id, "evicted") from None


async def _spool_workspace_file(
    call: DaemonCall, storage: StorageSettings, spool: IO[bytes]
) -> str:
    """Copy the session's workspace file `path` into `spool`; its name."""
    path = str(call.arguments["path"])
    sessions = call.services.sessions
    if call.session is None or sessions is None:
        raise ToolFailure(
            "NoWorkspace",
            f"upload_file's path ({path!r}) names a file of a session's workspace, and this "
            "call has no session: a call without session_id runs in a fresh, empty "
            "workspace. Call upload_file with the session_id of the session that holds the "
            "file, or pass artifact_id to upload an artifact.",
        )
    size = 0
    async for chunk in sessions.download(call.session, path):
        size += len(chunk)
        _check_size(size, storage, f"workspace file {path!r}")
        await asyncio.to_thread(spool.write, chunk)
    spool.seek(0)
    return path


def _check_size(size: int, storage: StorageSettings, what: str) -> None:
    if size > storage.max_upload_bytes:
        raise ToolFailure(
            "UploadTooLarge",
            f"The {what} is larger than this daemon uploads ({storage.max_upload_bytes} "
            "bytes at most: [storage] max_upload_bytes). Upload a smaller file (e.g. "
            "compressed or split).",
        )


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _key(prefix: str, call_id: str, name: str) -> str:
    """`<prefix>/<call id>/<base name>`: unique per call, the same when a call is retried."""
    base = _UNSAFE.sub("_", PurePosixPath(name).name).strip("._") or "file"
    prefix = prefix.strip("/")
    return f"{prefix}/{call_id}/{base}" if prefix else f"{call_id}/{base}"


def _where(storage: StorageSettings) -> str:
    at = storage.endpoint_url or "AWS S3"
    return f"bucket {storage.bucket!r} at {at}"


def _client(storage: StorageSettings) -> Any:
    """A boto3 S3 client for `storage`, its credentials read here (never passed on).

    Raises:
        ToolFailure: The credentials file cannot be read or lacks the profile.
    """
    import boto3
    from botocore.config import Config

    keys: dict[str, str] = {}
    if storage.credentials_file is not None:
        keys = _credentials(storage.credentials_file, storage.profile)
    style = storage.addressing_style
    if style == "auto":
        style = "path" if storage.endpoint_url else "virtual"
    config = Config(
        connect_timeout=storage.connect_timeout_s,
        read_timeout=storage.read_timeout_s,
        retries={"max_attempts": storage.max_attempts, "mode": "standard"},
        signature_version="s3v4",
        s3={"addressing_style": style},
    )
    session = boto3.session.Session(**keys)
    return session.client(
        "s3",
        endpoint_url=storage.endpoint_url or None,
        region_name=storage.region or None,
        config=config,
    )


def _credentials(path: Path, profile: str) -> dict[str, str]:
    """The keys of `profile` in a shared-credentials file, as boto3's Session takes them."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        # Only when private to the daemon, as its TLS key and tokens file.
        parser.read_string(read_secret(path, "the storage credentials file").decode())
    except ExposedSecretError as exc:
        raise ToolFailure(
            "StorageCredentialsInvalid",
            f"The daemon uses no credentials others could read or change: {exc}. The "
            "operator must fix [storage] credentials_file.",
        ) from None
    except (OSError, UnicodeDecodeError, configparser.Error) as exc:
        raise ToolFailure(
            "StorageCredentialsInvalid",
            f"The daemon cannot read its storage credentials file {str(path)!r} "
            f"({type(exc).__name__}): the operator must fix [storage] credentials_file.",
        ) from None
    section = parser[profile] if parser.has_section(profile) else None
    if section is None or not section.get("aws_access_key_id"):
        raise ToolFailure(
            "StorageCredentialsInvalid",
            f"The storage credentials file {str(path)!r} has no profile {profile!r} with "
            "aws_access_key_id and aws_secret_access_key: the operator must fix [storage].",
        )
    keys = {
        "aws_access_key_id": section.get("aws_access_key_id", ""),
        "aws_secret_access_key": section.get("aws_secret_access_key", ""),
    }
    if section.get("aws_session_token"):
        keys["aws_session_token"] = section["aws_session_token"]
    return keys


_DENIED = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthorizationHeaderMalformed",
}


def _put(storage: StorageSettings, f: IO[bytes], key: str) -> tuple[int, str]:
    """Upload `f` (from its start) as `key`; its size and a presigned GET URL. On a thread.

    Raises:
        ToolFailure: The store cannot be reached, refuses the credentials, has no
            such bucket, or fails otherwise (said with the bucket and endpoint).
    """
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    where = _where(storage)
    client = _client(storage)
    transfer = TransferConfig(
        multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES, use_threads=False
    )
    try:
        client.upload_fileobj(f, storage.bucket, key, Config=transfer)
        url = client.generate_presigned_url(
            "get_object",
            Params={"Bucket": storage.bucket, "Key": key},
            ExpiresIn=storage.url_expiry_s,
        )
    except (NoCredentialsError, PartialCredentialsError):
        raise ToolFailure(
            "StorageCredentialsMissing",
            f"The daemon has no credentials for {where}: the operator sets [storage] "
            "credentials_file or the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "environment variables of the daemon.",
        ) from None
    except (ReadTimeoutError, ConnectionClosedError):
        raise ToolFailure(
            "StorageUnavailable",
            f"The object store ({where}) stopped answering during the upload, after "
            f"{storage.max_attempts} attempts; the object may or may not be there. Try "
            "again later.",
            effect_unknown=True,
        ) from None
    except EndpointConnectionError:
        raise ToolFailure(
            "StorageUnavailable",
            f"The object store ({where}) cannot be reached, after {storage.max_attempts} "
            "attempts; nothing was uploaded. Try again later, or tell the operator.",
        ) from None
    except ClientError as exc:
        raise _refused(exc, storage, where) from None
    except BotoCoreError as exc:
        raise ToolFailure(
            "StorageUnavailable",
            f"The upload to {where} failed ({type(exc).__name__}); nothing may have been "
            "uploaded. Try again later, or tell the operator.",
            effect_unknown=True,
        ) from None
    return size, url


def _refused(exc: Any, storage: StorageSettings, where: str) -> ToolFailure:
    """The store's refusal (a ClientError), said without anything of the credentials."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    if code in _DENIED or code in ("403", "Forbidden"):
        return ToolFailure(
            "StorageAccessDenied",
            f"The object store refused the daemon's credentials for {where} ({code}): "
            "the operator must check the access key, its secret and its rights on the bucket.",
        )
    if code in ("NoSuchBucket", "404", "NotFound"):
        return ToolFailure(
            "StorageBucketNotFound",
            f"There is no {where}: the operator must create it or fix [storage] bucket.",
        )
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return ToolFailure(
        "StorageError",
        f"The object store ({where}) refused the upload: {code or status} "
        f"{str(error.get('Message', ''))[:200]}".rstrip(),
        effect_unknown=isinstance(status, int) and status >= 500,
    )


UPLOAD_FILE_TOOL = Tool(
    name="upload_file",
    description=(
        "Upload a file to the object storage (S3-compatible) this daemon's operator "
        "configured, and get a URL anyone can download it from for a while. Pass exactly one "
        "of: path, a file of the session's workspace (call it with that session's "
        "session_id), or artifact_id, an artifact of yours. Returns {key, url, size_bytes}: "
        "the object's key and a presigned download URL. Fails, saying so, where no storage "
        "is configured."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "A file of the session's workspace (relative to it).",
            },
            "artifact_id": {
                "type": "string",
                "minLength": 1,
                "description": "An artifact's id, as a result or list_artifacts names it.",
            },
        },
        "required": [],
        "additionalProperties": False,
    },
    source="builtin",
    builtin="upload_file",
)
"""upload_file, served by every daemon (configured or not: see the module's docstring)."""
