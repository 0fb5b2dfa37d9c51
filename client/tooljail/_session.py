"""`Session`: a sandbox kept for a sequence of calls, through a blocking `Client`.

Every method is the client's own with the session's id filled in
(`Client.call(..., session_id=...)`, `Client.upload_file`, ...), so a session
behaves exactly as its id does in any other client, even in another process.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from tooljail._forward import Forward
from tooljail._processes import Processes
from tooljail._session_base import _SessionBase
from tooljail._session_host import SessionHost
from tooljail._terminal import Terminal
from tooljail._types import Output, SessionInfo, SessionState, ToolResult
from tooljail._watch import Watch, watch_request

__all__ = ["Session"]


class Session(_SessionBase):
    """A session: a live Python interpreter and a workspace directory kept across calls.

    Variables, imports and open objects survive between `execute_python_code`
    calls, as in a notebook; files in the workspace survive too. Calls run one
    at a time, in order. Made by `Client.session()`, which opens it at once.

    Example:
        with client.session(idle_ttl_s=300) as s:
            s.call("execute_python_code", {"code": "x = 41"})
            result = s.call("execute_python_code", {"code": "print(x + 1)"})
            print(result.data["stdout"])  # 42
            s.upload("data.csv", b"a,b\\n1,2\\n")
            report = s.download("report.txt")

    A call that passes its timeout is interrupted: every process it started
    is killed at once, and its code gets a KeyboardInterrupt and
    `interrupt_grace_s` (2 s) to stop; within that grace only the interpreter
    runs (an ``except KeyboardInterrupt`` or ``finally`` of the call may still
    act). Code that ignores or blocks SIGINT gets no grace, and code that does
    not stop within it none more: the interpreter is restarted (files kept)
    and the result says so: `result.session_reset`. The session ends at `close()` (or the end of the
    `with` block), after its idle TTL, or at its maximum lifetime; calls
    after that raise `SessionEndedError`, whose `reason` says why.
    """

    _client: SessionHost

    @property
    def processes(self) -> Processes:
        """Its background processes: start, list, read, follow, write, signal, stop, wait."""
        return Processes(self._client, self.id)

    def watch(self, path: str = "", recursive: bool = True) -> Watch:
        """The changes of a workspace directory, as they happen: an iterator of
        `WorkspaceEvent` (created, modified, deleted, moved; in order), and a
        context manager that stops the watch.

        It returns once the watch is in place: a change made after is reported.

        Raises (besides TypeError): `InvalidPathError` (absolute, outside the
        workspace, no directory), `OverloadedError` (the session's bound of
        watches or of watched directories), `SessionNotFoundError` /
        `SessionEndedError`. Iteration ends when the
        session ends or the directory goes. An event with `dropped=True` says
        events were lost (the reader fell behind): list the directory again.

        Args:
            path: A directory of the workspace, relative to it; "" is the workspace.
            recursive: Watch every directory below too (and those made later).

        Raises:
            TypeError: `path` is no str.
        """
        request = watch_request(self.id, path, recursive)
        return Watch(*self._client._watch_events(request))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._closing_after(exc):
            self.close()

    def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> ToolResult:
        """Runs a tool in this session and waits for its result.

        As `Client.call` with this session's id: the same arguments (`timeout`
        is the deprecated name of `tool_timeout_s`), retries and errors
        (`SessionEndedError` once the session has ended).
        """
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return self._client.call(tool, args, session_id=self.id, timeout=timeout, **options)

    def stream(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        tool_timeout_s: float | None = None,
        call_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> Generator[Output | ToolResult, None, None]:
        """Runs a tool in this session, yielding its output, then its result.

        As `Client.stream` with this session's id.
        """
        options: dict[str, Any] = {"tool_timeout_s": tool_timeout_s, "call_id": call_id}
        options.update(egress=egress, secrets=secrets)
        return self._client.stream(tool, args, session_id=self.id, timeout=timeout, **options)

    def set_egress(self, rules: Sequence[str]) -> SessionInfo:
        """Replaces this session's egress rules, live.

        As `Client.set_session_egress`: connections opened from the answer on
        are decided by `rules` (open ones are kept); [] cuts the session off the
        network. Each rule must lie within this identity's allowance.

        Returns:
            The session as it is now (also `self.info`).
        """
        self._info = self._client.set_session_egress(self.id, rules)
        return self._info

    def upload(self, path: str, data: bytes | bytearray | memoryview) -> int:
        """Writes `data` to `path` in the workspace. As `Client.upload_file`.

        Returns:
            The size in bytes of the file written.
        """
        return self._client.upload_file(self.id, path, data)

    def download(self, path: str) -> bytes:
        """The content of `path` in the workspace. As `Client.download_file`."""
        return self._client.download_file(self.id, path)

    # --- a terminal and forwarded ports (issue 24) ---

    def terminal(
        self,
        rows: int | None = None,
        cols: int | None = None,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Terminal:
        """Opens a shell on a PTY in this session. As `Client.terminal`.

        Example:
            with session.terminal() as term:
                term.write(b"ls\n")
                print(term.read(timeout=5))
        """
        return self._client.terminal(self.id, rows=rows, cols=cols, argv=argv, env=env)

    def forward(self, port: int, *, local_port: int = 0) -> Forward:
        """Tunnels a local port to `port` on this session's loopback. As `Client.forward`.

        Example:
            with session.forward(8000) as fwd:
                urllib.request.urlopen(f"http://{fwd.address}/")
        """
        return self._client.forward(self.id, port, local_port=local_port)

    def close(self) -> SessionInfo:
        """Ends the session: its sandbox, interpreter and workspace are destroyed.

        Calling it again sends nothing and answers the same. See
        `Client.close_session`.

        Returns:
            The session as it ended (also `self.info` from now on).
        """
        if self._info.state is not SessionState.CLOSED:
            self._info = self._client.close_session(self.id)
        return self._info
