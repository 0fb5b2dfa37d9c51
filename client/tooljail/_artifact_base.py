"""What the sync and async artifact methods share: checks, requests and decoding, no I/O.

`Client` and `AsyncClient` build every artifact request and read every answer
through these functions, so the twins cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable

from tooljail._session_base import check_session_id
from tooljail._types import ArtifactInfo
from tooljail._wire import artifact_info_from_proto
from tooljail.errors import InvalidRequestError, TransportError
from tooljail.v1 import tooljail_pb2 as pb


def check_artifact_id(artifact_id: str) -> str:
    """An artifact id as sent on the wire.

    Raises:
        TypeError: When the id is not a string.
        InvalidRequestError: When the id is empty.
    """
    if not isinstance(artifact_id, str):
        raise TypeError(f"artifact_id must be a str, got {type(artifact_id).__name__}")
    if not artifact_id:
        raise InvalidRequestError("artifact_id is empty")
    return artifact_id


def get_artifact_request(artifact_id: str) -> pb.GetArtifactRequest:
    """The request of `get_artifact`, after checking the id (see `check_artifact_id`)."""
    return pb.GetArtifactRequest(artifact_id=check_artifact_id(artifact_id))


def delete_artifact_request(artifact_id: str) -> pb.DeleteArtifactRequest:
    """The request of `delete_artifact`, after checking the id (see `check_artifact_id`)."""
    return pb.DeleteArtifactRequest(artifact_id=check_artifact_id(artifact_id))


def list_artifacts_request(
    call_id: str | None = None, session_id: str | None = None
) -> pb.ListArtifactsRequest:
    """The request of `list_artifacts`; None (or omitted) means any call or session.

    Raises:
        TypeError: When an id is not a str (or None).
        InvalidRequestError: When an id is empty ("" would mean "any" on the wire:
            an explicit empty id is a bug).
    """
    if call_id is not None:
        if not isinstance(call_id, str):
            raise TypeError(f"call_id must be a str, got {type(call_id).__name__}")
        if not call_id:
            raise InvalidRequestError("call_id is empty")
    return pb.ListArtifactsRequest(
        call_id=call_id or "",
        session_id="" if session_id is None else check_session_id(session_id),
        page_size=LIST_PAGE_SIZE,
    )


LIST_PAGE_SIZE = 1000
"""Artifacts asked for per ListArtifacts answer (the daemon answers at most its own
bound): `list_artifacts` reads one daemon's pages in turn until the last."""
MAX_LIST_PAGES = 1000
"""Pages read at most from one daemon by one `list_artifacts` (a million artifacts):
a daemon whose tokens never end cannot keep the client looping."""


def next_page(
    request: pb.ListArtifactsRequest, answer: pb.ListArtifactsResponse, pages: int
) -> pb.ListArtifactsRequest | None:
    """The request for the page after `answer` (the `pages`-th), or None when it was the last.

    Raises:
        TransportError: The daemon gave `MAX_LIST_PAGES` pages and still names a next one.
    """
    if not answer.next_page_token:
        return None
    if pages >= MAX_LIST_PAGES:
        raise TransportError(f"the daemon's artifact listing went on past {pages} pages")
    following = pb.ListArtifactsRequest()
    following.CopyFrom(request)
    following.page_token = answer.next_page_token
    return following


def join_pages(pages: Iterable[pb.ListArtifactsResponse]) -> pb.ListArtifactsResponse:
    """One daemon's pages as one answer (in order: newest first)."""
    joined = pb.ListArtifactsResponse()
    for page in pages:
        joined.artifacts.extend(page.artifacts)
    return joined


def join_chunks(chunks: Iterable[pb.ArtifactChunk]) -> bytes:
    """An artifact's bytes from the chunks of one GetArtifact stream, checked whole.

    Raises:
        TransportError: When the stream ended before its first chunk (which
            carries the artifact's info), or held fewer or more bytes than the
            info's size.
    """
    parts: list[bytes] = []
    info: pb.ArtifactInfo | None = None
    for chunk in chunks:
        if info is None:
            info = chunk.info
        parts.append(chunk.data)
    if info is None:
        raise TransportError("the daemon's artifact stream ended before its first chunk")
    data = b"".join(parts)
    if len(data) != info.size_bytes:
        # The daemon sends what its index says; a short stream is a broken one.
        raise TransportError(
            f"artifact {info.artifact_id!r}: got {len(data)} bytes of {info.size_bytes}"
        )
    return data


def decode_artifacts(resp: pb.ListArtifactsResponse) -> list[ArtifactInfo]:
    """The artifacts a ListArtifacts answer names, in its order (newest first)."""
    return [artifact_info_from_proto(m) for m in resp.artifacts]


def merge_artifacts(answers: Iterable[pb.ListArtifactsResponse]) -> list[ArtifactInfo]:
    """The artifacts of every daemon's answer in one list, newest first.

    Raises:
        TransportError: As `decode_artifacts`.
    """
    merged = [info for resp in answers for info in decode_artifacts(resp)]
    return sorted(merged, key=lambda a: a.created_unix, reverse=True)
