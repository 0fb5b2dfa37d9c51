"""What the sync and async session APIs share: checks, requests and decoding, no I/O.

`Client`/`AsyncClient` (their session and file methods) and `Session`/
`AsyncSession` build every session request and read every answer through
these functions, so the twins cannot drift.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict, Unpack

from tooljail._types import SessionInfo, SessionState
from tooljail._wire import session_info_from_proto
from tooljail.errors import InvalidPathError, InvalidRequestError, TooljailError, TransportError
from tooljail.v1 import tooljail_pb2 as pb

UPLOAD_CHUNK_BYTES = 1024 * 1024
"""Bytes of file data per upload message: well under the daemon's request limit
(`max_request_bytes`, 8 MiB by default), so a file of any size streams through."""

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


def check_session_id(session_id: str) -> str:
    """A session id as sent on the wire.

    Raises:
        TypeError: When the id is not a string.
        InvalidRequestError: When the id is empty.
    """
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
    if not session_id:
        # "" on a CallRequest means "no session": an explicit empty id is a bug.
        raise InvalidRequestError("session_id is empty")
    return session_id


MAX_NAMES = 256
"""Egress rules (or secret names) one request may carry: far more than a real
policy lists, few enough that a runaway list is refused before it is sent."""


def check_names(names: Sequence[str] | None, what: str) -> list[str]:
    """Egress rules or secret names as sent on the wire (None: none).

    Only their shape is checked here: the daemon parses the rules and judges
    them (INVALID_ARGUMENT or PERMISSION_DENIED, naming the rule).

    Raises:
        TypeError: When `names` is a str (a list was meant) or holds a non-str.
        InvalidRequestError: When a name is empty, or there are more than 256.
    """
    if names is None:
        return []
    if isinstance(names, str | bytes):
        raise TypeError(f"{what} must be a list of str, got a single {type(names).__name__}")
    out = list(names)
    if len(out) > MAX_NAMES:
        raise InvalidRequestError(f"{what} names {len(out)} entries; at most {MAX_NAMES}")
    for name in out:
        if not isinstance(name, str):
            raise TypeError(f"{what} must hold str, got {name!r}")
        if not name.strip():
            raise InvalidRequestError(f"{what} holds an empty entry")
    return out


def set_egress_request(session_id: str, rules: Sequence[str]) -> pb.SetSessionEgressRequest:
    """The `SetSessionEgressRequest` for `set_egress`. Raises as `check_names`."""
    return pb.SetSessionEgressRequest(
        session_id=check_session_id(session_id), egress=check_names(rules, "egress")
    )


def check_path(path: str) -> str:
    """A workspace path as sent on the wire; the daemon confines it to the workspace.

    Raises:
        TypeError: When the path is not a string.
        InvalidPathError: When the path is empty.
    """
    if not isinstance(path, str):
        raise TypeError(
            f"path must be a str (relative to the workspace), got {type(path).__name__}"
        )
    if not path:
        raise InvalidPathError("path is empty: name a file relative to the workspace")
    return path


def _bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    """`data` as a flat view of bytes, without copying when it already is one.

    Raises:
        TypeError: When `data` is not bytes-like (a str must be encoded first).
    """
    if isinstance(data, str):
        raise TypeError("data must be bytes, got str: encode it first (e.g. text.encode())")
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"data must be bytes-like, got {type(data).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B")


def upload_messages(
    session_id: str, path: str, data: bytes | bytearray | memoryview
) -> Callable[[], Iterator[pb.FileChunk]]:
    """What makes the messages of one upload, after checking every argument at once.

    The first chunk names the session and the path; the rest carry data only.
    An empty file is one chunk with no data. Each call of the returned function
    gives a fresh iterator over the same bytes, so a retry sends the whole file
    again (the bytes are not copied until each chunk is made).

    Raises:
        TypeError: When an argument has the wrong type.
        InvalidRequestError: When the session id is empty.
        InvalidPathError: When the path is empty.
    """
    session_id = check_session_id(session_id)
    path = check_path(path)
    view = _bytes_view(data)

    def chunks() -> Iterator[pb.FileChunk]:
        yield pb.FileChunk(session_id=session_id, path=path, data=bytes(view[:UPLOAD_CHUNK_BYTES]))
        for start in range(UPLOAD_CHUNK_BYTES, len(view), UPLOAD_CHUNK_BYTES):
            yield pb.FileChunk(data=bytes(view[start : start + UPLOAD_CHUNK_BYTES]))

    return chunks


def download_request(session_id: str, path: str) -> pb.DownloadFileRequest:
    """The `DownloadFileRequest` for a file, after checking its arguments.

    Raises:
        TypeError, InvalidRequestError, InvalidPathError: As for `upload_messages`.
    """
    return pb.DownloadFileRequest(session_id=check_session_id(session_id), path=check_path(path))


def _check_float_bound(value: float | None, what: str) -> float:
    """A session's bound in seconds or cores: None or 0 (the daemon's), or a
    positive finite number."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number or None, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError(f"{what} must be a finite number, 0 or more, got {value!r}")
    return float(value)


def _check_count_bound(value: int | None, what: str, most: int) -> int:
    """A session's size bound: None or 0 (the daemon's), or a positive int up to `most`."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None, got {value!r}")
    if value < 0 or value > most:
        raise InvalidRequestError(f"{what} must be between 0 and {most}, got {value}")
    return value


class SessionOptions(TypedDict, total=False):
    """The options of `session(...)`; see `Client.session` for each.

    Each bound may only lower the daemon's own; None (or 0, or left out) takes
    the daemon's.
    """

    idle_ttl_s: float | None
    max_lifetime_s: float | None
    memory_bytes: int | None
    pids: int | None
    cpus: float | None
    workspace_bytes: int | None
    keep_processes: bool
    egress: Sequence[str] | None
    secrets: Sequence[str] | None


def create_session_request(**options: Unpack[SessionOptions]) -> pb.CreateSessionRequest:
    """The `CreateSessionRequest` for `session(...)`, after checking every option.

    None (or 0) leaves an option to the daemon's bound; a value may only lower
    it, which the daemon judges (this checks only what the wire can carry).

    Raises:
        TypeError: When an option has the wrong type (bool is not a number
            here), or is not one of `SessionOptions`.
        InvalidRequestError: When a number is negative, not finite, or too large
            for the wire.
    """
    unknown = set(options) - set(SessionOptions.__annotations__)
    if unknown:
        raise TypeError(f"session() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    keep_processes = options.get("keep_processes", False)
    if not isinstance(keep_processes, bool):
        raise TypeError(f"keep_processes must be a bool, got {keep_processes!r}")
    return pb.CreateSessionRequest(
        idle_ttl_s=_check_float_bound(options.get("idle_ttl_s"), "idle_ttl_s"),
        max_lifetime_s=_check_float_bound(options.get("max_lifetime_s"), "max_lifetime_s"),
        memory_bytes=_check_count_bound(options.get("memory_bytes"), "memory_bytes", _UINT64_MAX),
        pids=_check_count_bound(options.get("pids"), "pids", _UINT32_MAX),
        cpus=_check_float_bound(options.get("cpus"), "cpus"),
        workspace_bytes=_check_count_bound(
            options.get("workspace_bytes"), "workspace_bytes", _UINT64_MAX
        ),
        keep_processes=keep_processes,
        egress=check_names(options.get("egress"), "egress"),
        secrets=check_names(options.get("secrets"), "secrets"),
    )


def list_sessions_request(all_clients: bool) -> pb.ListSessionsRequest:
    """The `ListSessionsRequest` for `list_sessions`.

    Raises:
        TypeError: When `all_clients` is not a bool.
    """
    if not isinstance(all_clients, bool):
        raise TypeError(f"all_clients must be a bool, got {all_clients!r}")
    return pb.ListSessionsRequest(all_clients=all_clients)


def close_session_request(session_id: str) -> pb.CloseSessionRequest:
    """The `CloseSessionRequest` for `close_session`. Raises as `check_session_id`."""
    return pb.CloseSessionRequest(session_id=check_session_id(session_id))


def decode_session_info(m: pb.SessionInfo) -> SessionInfo:
    """A session's description from the daemon's answer.

    Raises:
        TransportError: When the message cannot be read (no session id, an
            unknown state).
    """
    try:
        if not m.session_id:
            raise ValueError("a SessionInfo without a session id")
        return session_info_from_proto(m)
    except ValueError as e:
        raise TransportError(f"the daemon sent a message this SDK cannot read: {e}") from e


def session_closed_with_daemon(session_id: str, error: TooljailError) -> SessionInfo:
    """What closing a session answers when its daemon lost it: closed, reason
    "daemon_lost" (closing an ended session is not an error).

    Raises:
        TooljailError: `error` itself, when it is not a loss with the daemon.
    """
    if getattr(error, "reason", "") != "daemon_lost":
        raise error
    return SessionInfo(session_id=session_id, state=SessionState.CLOSED, end_reason="daemon_lost")


def decode_sessions(resp: pb.ListSessionsResponse) -> list[SessionInfo]:
    """The sessions of a `ListSessions` answer. Raises as `decode_session_info`."""
    return [decode_session_info(m) for m in resp.sessions]


def decode_file_info(m: pb.FileInfo) -> int:
    """The size in bytes of the file an upload wrote."""
    return int(m.size_bytes)


class _SessionBase:
    """What `Session` and `AsyncSession` share: the session's id and description.

    Args:
        client: The client whose methods the session's fill in with its id.
        info: The session as the daemon described it when it opened.
    """

    def __init__(self, client: Any, info: SessionInfo) -> None:
        self._client = client
        self._info = info
        # Kept apart from `info`: a close answered by the SDK (its daemon lost)
        # names no daemon, and the session still belonged to this one.
        self._daemon_id = info.daemon_id

    @property
    def id(self) -> str:
        """The session's id: name it in `call(..., session_id=...)` from any client."""
        return self._info.session_id

    @property
    def daemon_id(self) -> str:
        """The daemon that holds the session: every call, upload, download and
        close goes there; "" only from an old daemon that does not say."""
        return self._info.daemon_id or self._daemon_id

    @property
    def info(self) -> SessionInfo:
        """The session as the daemon last described it: at creation (its bounds in
        force), or at `close()` (why it ended). `list_sessions()` has fresh counts."""
        return self._info

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self._info.state.value!r})"

    @contextlib.contextmanager
    def _closing_after(self, exc: BaseException | None) -> Iterator[None]:
        """Around the close at the end of a `with` block that `exc` left (None: none).

        When the close fails too, the exception that left the block is what the
        caller must see (its type is what their `except` expects), so it goes
        on, with a note of the close's error; the session ends anyway at its
        idle TTL. Without `exc`, the close's error is raised.
        """
        try:
            yield
        except TooljailError as error:
            if exc is None:
                raise
            exc.add_note(
                f"closing session {self.id} failed too: {type(error).__name__}: {error} "
                "(it ends at its idle TTL)"
            )
