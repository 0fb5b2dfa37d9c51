"""rpc WatchWorkspace: a session's workspace changes, as its supervisor sees them.

The servicer finds the caller's own session (another client's is NOT_FOUND)
and hands it here; an identity whose policy refuses `ls` may not watch (a
watch tells the workspace's names, as `ls` does). The watch runs in the session's supervisor
(`SessionSandbox.watch`, runner/_watch.py): trusted, so no tool code can
forge an event. Backpressure end to end: the next event is read from the
sandbox only once the previous one went to gRPC, so a client that stops
reading stops the supervisor reading inotify; the kernel then drops events,
and the client gets a `dropped` event when it reads again. The stream ends
when the session ends (its sandbox's streams end) or the watched directory
goes; a client that goes away cancels it, which closes the watch in the
sandbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from tooljail.errors import InvalidPathError, OverloadedError
from tooljail.v1 import tooljail_pb2 as pb
from tooljaild.auth.policy import Identity
from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_streams import WatchError, WatchEvent
from tooljaild.sessions.policy import check_file_rpc
from tooljaild.sessions.session import Session, ended_error

__all__ = ["watch_workspace"]

_KIND = {
    "created": pb.WORKSPACE_EVENT_KIND_CREATED,
    "modified": pb.WORKSPACE_EVENT_KIND_MODIFIED,
    "deleted": pb.WORKSPACE_EVENT_KIND_DELETED,
    "moved": pb.WORKSPACE_EVENT_KIND_MOVED,
    "dropped": pb.WORKSPACE_EVENT_KIND_DROPPED,
}


async def watch_workspace(
    session: Session,
    request: pb.WatchWorkspaceRequest,
    identity: Identity | None,
    *,
    max_watches: int,
    max_dirs: int,
) -> AsyncIterator[pb.WorkspaceEvent]:
    """The WatchWorkspace RPC: one message per event until the watch ends.

    Raises:
        InvalidPathError: The path is absolute, leaves the workspace, or is
            no directory of it.
        OverloadedError: The session holds `max_watches` watches, or the
            tree passes `max_dirs` directories (RESOURCE_EXHAUSTED).
        SessionEndedError: The session ended.
        PermissionDeniedError: The identity may not call `ls` (a watch tells
            the workspace's names, as `ls` does: the same policy).
    """
    check_file_rpc(identity, "WatchWorkspace", "ls")
    session.check_open()
    if max_watches <= 0:
        raise OverloadedError("this daemon allows no workspace watches ([sessions] max_watches)")
    try:
        watch = await session.channel.watch(
            request.path,
            recursive=request.recursive,
            max_dirs=max_dirs,
            max_watches=max_watches,
        )
    except WatchError as exc:
        if exc.limit:
            raise OverloadedError(
                f"cannot watch {request.path!r}: {exc}", retry_after_s=5.0
            ) from None
        raise InvalidPathError(f"cannot watch {request.path!r}: {exc}") from None
    except SandboxError:
        session.check_open()
        raise ended_error(session.id, "sandbox_died") from None
    session.touch()
    try:
        # The watch is in place: a client may now make the changes it waits for.
        yield pb.WorkspaceEvent(
            kind=pb.WORKSPACE_EVENT_KIND_WATCHING, path=request.path, is_dir=True
        )
        async for event in watch.events():
            yield _message(event)
    finally:
        watch.close()


def _message(event: WatchEvent) -> pb.WorkspaceEvent:
    dropped = event.kind == "dropped"
    return pb.WorkspaceEvent(
        kind=_KIND[event.kind],
        path=event.path,
        is_dir=event.is_dir,
        old_path=event.old_path,
        dropped=dropped,
        dropped_hint=event.hint if dropped else "",
    )
