"""Where `upload_file` puts files: the `[storage]` table (plain data)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["StorageSettings"]


class StorageSettings(BaseModel):
    """Where `upload_file` puts files (`[storage]` in the config file)."""

    model_config = ConfigDict(extra="forbid")

    bucket: str = ""
    """The bucket uploads go to; "" (the default): no storage, upload_file fails saying so."""
    prefix: str = ""
    """Keys start with it (e.g. "agents/uploads/"); a "/" is added between it and the rest."""
    endpoint_url: str = ""
    """The store's URL (MinIO, Ceph, Aliyun OSS, ...); "": AWS S3 itself."""
    region: str = ""
    """The bucket's region; "": boto3's default (AWS_DEFAULT_REGION, else us-east-1)."""
    credentials_file: Path | None = None
    """An AWS shared-credentials file (INI: aws_access_key_id, aws_secret_access_key,
    optionally aws_session_token); None: boto3's own chain (the AWS_ACCESS_KEY_ID and
    AWS_SECRET_ACCESS_KEY environment variables first)."""
    profile: str = "default"
    """The section of `credentials_file` to use."""
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """How the bucket is named in URLs; "auto": path style with an `endpoint_url`
    (what MinIO and Ceph expect), virtual hosts on AWS."""
    url_expiry_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    """How long a presigned URL is valid (S3 allows at most 7 days)."""
    max_upload_bytes: int = Field(default=1024**3, ge=1)
    """The largest file uploaded; a larger one is refused (and said)."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """How long one connection attempt to the store may take."""
    read_timeout_s: float = Field(default=60.0, gt=0)
    """How long the store may take to answer one request."""
    max_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts of one request (retried with botocore's backoff where idempotent)."""
