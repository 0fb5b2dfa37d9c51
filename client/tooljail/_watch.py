"""`session.watch()`: a session's workspace changes, as they happen.

The events come from the session's sandbox (its supervisor's inotify, which
tool code cannot forge) over one server stream, `WatchWorkspace`. The daemon
reads the next event only once the previous one was sent, so a reader that
stops stops the sandbox reading; the kernel then drops events, and the
reader gets one `WorkspaceEvent` with `dropped=True` when it reads again.
`Watch` (blocking) and `AsyncWatch` share `watch_request` and `decode_event`.

Both open at once: `session.watch()` returns (or the `await` ends) once the
daemon says the watch is in place (its first message, kind WATCHING), so a
change made right after is reported, and a bad path raises there.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Generator, Iterator
from types import TracebackType
from typing import Any, Self

from tooljail._types import WorkspaceEvent, WorkspaceEventKind
from tooljail.errors import InternalError, TooljailError
from tooljail.v1 import tooljail_pb2 as pb

__all__ = ["AsyncWatch", "Watch", "check_opened", "decode_event", "watch_request"]

_KIND = {
    pb.WORKSPACE_EVENT_KIND_CREATED: WorkspaceEventKind.CREATED,
    pb.WORKSPACE_EVENT_KIND_MODIFIED: WorkspaceEventKind.MODIFIED,
    pb.WORKSPACE_EVENT_KIND_DELETED: WorkspaceEventKind.DELETED,
    pb.WORKSPACE_EVENT_KIND_MOVED: WorkspaceEventKind.MOVED,
    pb.WORKSPACE_EVENT_KIND_DROPPED: WorkspaceEventKind.DROPPED,
}


def watch_request(session_id: str, path: str, recursive: bool) -> pb.WatchWorkspaceRequest:
    """The request of `session.watch`.

    Raises:
        TypeError: `path` is no str.
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be a str relative to the workspace, not {type(path).__name__}")
    return pb.WatchWorkspaceRequest(session_id=session_id, path=path, recursive=bool(recursive))


def decode_event(message: pb.WorkspaceEvent) -> WorkspaceEvent:
    """A `WorkspaceEvent` from the wire; an unknown kind from a newer daemon is read
    as `dropped` (what it meant is lost to this SDK)."""
    kind = _KIND.get(message.kind)
    if kind is None:
        return WorkspaceEvent(
            kind=WorkspaceEventKind.DROPPED,
            dropped=True,
            dropped_hint=f"an event of a kind this SDK does not know ({message.kind})",
        )
    return WorkspaceEvent(
        kind=kind,
        path=message.path,
        is_dir=message.is_dir,
        old_path=message.old_path,
        dropped=message.dropped or kind is WorkspaceEventKind.DROPPED,
        dropped_hint=message.dropped_hint,
    )


def check_opened(message: pb.WorkspaceEvent | None) -> None:
    """The stream's first message must say the watch is in place."""
    if message is None or message.kind != pb.WORKSPACE_EVENT_KIND_WATCHING:
        raise InternalError("the daemon did not confirm the watch (its stream ended at once)")


class Watch:
    """The changes of a workspace directory, in order (`Session.watch`).

    An iterator of `WorkspaceEvent`, and a context manager whose exit stops
    the watch (the RPC ends, the sandbox closes its watch). Iteration ends when
    the session ends or the watched directory goes.

    Example:
        with s.watch("src") as events:
            for event in events:
                print(event.kind, event.path)
    """

    def __init__(
        self, messages: Generator[pb.WorkspaceEvent, None, None], cancel: Callable[[], object]
    ) -> None:
        self._messages = messages
        self._cancel = cancel
        self._closed = False
        try:
            check_opened(next(messages, None))
        except BaseException:
            messages.close()
            raise

    def __iter__(self) -> Iterator[WorkspaceEvent]:
        return self

    def __next__(self) -> WorkspaceEvent:
        try:
            return decode_event(next(self._messages))
        except TooljailError:
            if self._closed:  # closed from another thread: the end, not an error
                raise StopIteration from None
            raise

    def close(self) -> None:
        """Stop watching; idempotent. From another thread too: an iteration
        blocked there ends."""
        self._closed = True
        self._cancel()
        with contextlib.suppress(ValueError):  # being iterated in another thread
            self._messages.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncWatch:
    """`Watch` for an `AsyncSession`: an async iterator and async context manager."""

    def __init__(
        self, messages: AsyncGenerator[pb.WorkspaceEvent, None], cancel: Callable[[], object]
    ) -> None:
        self._messages = messages
        self._cancel = cancel
        self._closed = False

    @classmethod
    async def open(
        cls,
        opening: Coroutine[
            Any, Any, tuple[AsyncGenerator[pb.WorkspaceEvent, None], Callable[[], object]]
        ],
    ) -> AsyncWatch:
        """The watch, once the daemon says it is in place."""
        messages, cancel = await opening
        try:
            check_opened(await anext(messages, None))
        except BaseException:
            await messages.aclose()
            raise
        return cls(messages, cancel)

    def __aiter__(self) -> AsyncIterator[WorkspaceEvent]:
        return self

    async def __anext__(self) -> WorkspaceEvent:
        try:
            return decode_event(await anext(self._messages))
        except TooljailError:
            if self._closed:  # closed from another task: the end, not an error
                raise StopAsyncIteration from None
            raise

    async def close(self) -> None:
        """Stop watching; idempotent. From another task too: its iteration ends."""
        self._closed = True
        self._cancel()
        with contextlib.suppress(RuntimeError):  # being iterated in another task
            await self._messages.aclose()

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
