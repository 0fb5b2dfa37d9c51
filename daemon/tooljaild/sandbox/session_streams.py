"""A session's background processes, terminals and port connections: the daemon's side.

A session's supervisor (runner/_session.py, runner/_streams.py) forks
processes and PTYs and opens TCP connections to its own loopback itself, and
moves their bytes over the session's existing pipes: no new socket, mount or
descriptor into the sandbox, so every backend does it the same way. This
module is the daemon's end: `SandboxProcess`, `PortStream`, and `StreamMux`,
which a `SessionSandbox` owns and feeds the frames below (routed before any
call's: they belong to no call).

The daemon's ops (request pipe), one JSON line each, every one with the
stream's "id" (an int the daemon picks, unique per session):

    {"op": "spawn", "id", "argv": [...], "cwd": "", "env": {}, "terminal": [rows, cols]|null,
     "stdin": bool}
    {"op": "connect", "id", "port": 1..65535, "d": base64}
                                                "d" (optional, at most `CHUNK` raw bytes): the
                                                first input, written once connected (as a
                                                "write" right after it, within the credit)
    {"op": "stats", "id", "pids": [pid, ...]}
    {"op": "write", "id", "d": base64}          at most `CHUNK` raw bytes, within the credit
    {"op": "eof", "id"}                         stdin's end; a socket's shutdown(SHUT_WR)
    {"op": "credit", "id", "n"}                 the reader consumed n more bytes
    {"op": "signal", "id", "sig", "fg": bool}   killpg; fg: the terminal's foreground group
    {"op": "resize", "id", "rows", "cols"}      TIOCSWINSZ (the kernel sends SIGWINCH)
    {"op": "close", "id"}                       a connection (or a watch): closed, forgotten
    {"op": "watch", "id", "path", "recursive": bool, "max_dirs", "max_watches"}
                                                a workspace watch (runner/_watch.py)

The supervisor's frames (frame pipe):

    {"t": "spawned", "id", "pid"} | {"t": "spawn_failed", "id", "message", "limit": bool}
    {"t": "connected", "id"} | {"t": "connect_failed", "id", "message"}
    {"t": "out", "id", "s": "stdout"|"stderr"|"pty"|"sock", "d": base64}
    {"t": "eof", "id", "s"}                     that output stream is at its end
    {"t": "room", "id", "n"}                    n more input bytes were written
    {"t": "in_closed", "id"}                    its input is gone (EPIPE): writes fail
    {"t": "exited", "id", "code", "signal", "killed": bool}
    {"t": "stats", "id", "v": {"pid": [cpu_s, rss_bytes]}}
    {"t": "watching", "id", "dirs"} | {"t": "watch_failed", "id", "message", "limit": bool}

A watch's events come as "out" frames of stream "watch" (JSON lines, one per
event, runner/_watch.py's docstring), under the same credit; its "eof" ends it.

Flow control, per stream, both ways (`WINDOW`): the supervisor sends output
only within the credit the daemon granted, and the daemon grants it as
`output()`/`read()` consume, so the bytes held here per stream stay under
`WINDOW` + `CHUNK` whatever the sandbox writes (more is dropped, counted in
`overrun`); `write()` sends at most `WINDOW` bytes the supervisor has not
said it wrote, and waits for room.

Why no per-call frame budget counts these frames: `CallFrames` bounds a
call's frames; these are bounded by the credit instead (the frame channel
leaves them out of the call's budget, `FrameChannel.unbudgeted`).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Collection
from typing import Any

from tooljaild.sandbox.base import SandboxError
from tooljaild.sandbox.session_watch import SandboxWatch, WatchError, WatchEvent
from tooljaild.sandbox.stream_flow import (
    CHUNK,
    WINDOW,
    Inbound,
    Outbound,
    check_signal,
    figures_of,
    is_int,
    payload_of,
)
from tooljaild.sandbox.stream_specs import (
    BadPortError,
    PortError,
    ProcessExit,
    ProcessGoneError,
    Spawn,
    SpawnError,
)

__all__ = [
    "CHUNK",
    "STREAM_FRAMES",
    "WINDOW",
    "BadPortError",
    "PortError",
    "PortStream",
    "ProcessExit",
    "ProcessGoneError",
    "SandboxProcess",
    "SandboxWatch",
    "Spawn",
    "SpawnError",
    "StreamMux",
    "WatchError",
    "WatchEvent",
]

STREAM_FRAMES = frozenset(
    {"spawned", "spawn_failed", "connected", "connect_failed", "out", "eof", "room"}
    | {"in_closed", "exited", "stats", "watching", "watch_failed"}
)
"""The supervisor's frames about streams: they belong to no call."""
_OUTPUTS = frozenset({"stdout", "stderr", "pty", "sock", "watch"})


_KILLED = ProcessExit(None, None, True)


class SandboxProcess:
    """A process the session's supervisor started (`SessionSandbox.spawn`)."""

    def __init__(self, mux: StreamMux, sid: int, pid: int, spec: Spawn) -> None:
        self.pid = pid
        """Its pid inside the sandbox (also its process group and session id)."""
        self.exited: asyncio.Future[ProcessExit] = asyncio.get_running_loop().create_future()
        """Resolves once it is reaped (never raises)."""
        self.terminal = spec.terminal is not None
        self._mux = mux
        self._sid = sid
        self._in = Inbound(mux.send, sid, ("pty",) if self.terminal else ("stdout", "stderr"))
        self._out = Outbound(mux.send, sid, spec.stdin or self.terminal)

    @property
    def buffered(self) -> int:
        """Output bytes held in the daemon, not yet read (at most `WINDOW` + `CHUNK`)."""
        return self._in.buffered

    async def output(self) -> tuple[str, bytes] | None:
        """The next chunk in arrival order: ("stdout" | "stderr" | "pty", data).

        None once every output stream is at its end (after it ended, or its
        stdout and stderr were closed). One reader only. Reading grants the
        supervisor credit: a reader that stops stops the supervisor reading
        (a PTY then blocks its writer, as a real one does).
        """
        return await self._in.next()

    async def write(self, data: bytes) -> None:
        """Write to its stdin (or its terminal); waits while the supervisor has no room.

        Raises:
            ProcessGoneError: It has ended, or its stdin is closed (or was
                never open: `Spawn.stdin` False).
        """
        if self.exited.done():
            raise ProcessGoneError(f"process {self.pid} has ended")
        if not await self._out.write(bytes(data)):
            raise ProcessGoneError(f"process {self.pid} takes no more input")

    def close_stdin(self) -> None:
        """End-of-file to its stdin, once what was written is in (a terminal: no-op)."""
        if self.terminal or self._out.closed:
            return
        self._out.close()
        self._mux.send({"op": "eof", "id": self._sid})

    def signal(self, signum: int, *, foreground: bool = False) -> None:
        """Send `signum` to its process group; with `foreground` and a terminal,
        to the terminal's foreground process group. A no-op once it has ended.

        Raises:
            ValueError: `signum` is no signal number (1..64).
        """
        check_signal(signum)
        if not self.exited.done():
            self._mux.send({"op": "signal", "id": self._sid, "sig": signum, "fg": foreground})

    def resize(self, rows: int, cols: int) -> None:
        """Set its terminal's size (the foreground group gets SIGWINCH).

        Raises:
            ValueError: It has no terminal, or a size is outside 1..65535.
        """
        if not self.terminal:
            raise ValueError("the process has no terminal to resize")
        if not all(is_int(v) and 0 < v <= 65535 for v in (rows, cols)):
            raise ValueError(f"a terminal of {rows}x{cols} cannot be: each is 1..65535")
        if not self.exited.done():
            self._mux.send({"op": "resize", "id": self._sid, "rows": rows, "cols": cols})

    def _on_exit(self, end: ProcessExit) -> None:
        if not self.exited.done():
            self.exited.set_result(end)
        self._out.close()

    def _gone(self) -> None:
        """The sandbox ended: killed, if it had not ended; no more output."""
        self._on_exit(_KILLED)
        self._in.end()


class PortStream:
    """One TCP connection to 127.0.0.1:port inside the session (`SessionSandbox.connect_port`)."""

    def __init__(self, mux: StreamMux, sid: int, port: int) -> None:
        self.port = port
        self._mux = mux
        self._sid = sid
        self._in = Inbound(mux.send, sid, ("sock",))
        self._out = Outbound(mux.send, sid, True)
        self._closed = False

    @property
    def buffered(self) -> int:
        """Bytes held in the daemon, not yet read."""
        return self._in.buffered

    async def read(self) -> bytes:
        """The next bytes from the connection; b"" at its end (or once closed)."""
        if self._closed:
            return b""
        chunk = await self._in.next()
        return b"" if chunk is None else chunk[1]

    async def write(self, data: bytes) -> None:
        """Send `data`; waits while the supervisor has no room.

        Raises:
            ProcessGoneError: The connection is closed, or its writing side is.
        """
        if not await self._out.write(bytes(data)):
            raise ProcessGoneError(f"the connection to port {self.port} takes no more input")

    def write_eof(self) -> None:
        """shutdown(SHUT_WR) in the sandbox, once what was written is sent."""
        if self._out.closed:
            return
        self._out.close()
        self._mux.send({"op": "eof", "id": self._sid})

    def close(self) -> None:
        """Close both ways at once; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._out.close()
        self._in.end()
        self._mux.forget(self._sid)
        self._mux.send({"op": "close", "id": self._sid})

    def _gone(self) -> None:
        self._out.close()
        self._in.end()


class StreamMux:
    """A session's streams on the daemon's side: ops out, frames in.

    Args:
        send: Writes one op line to the supervisor's request pipe.
    """

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._next = 0
        self._ended = False
        self._processes: dict[int, SandboxProcess] = {}
        self._ports: dict[int, PortStream] = {}
        self._watches: dict[int, SandboxWatch] = {}
        self._waiting: dict[int, tuple[asyncio.Future[Any], Any]] = {}
        """Answers awaited (spawn, connect, stats), by id, with what they are for."""
        self.bad_frames = 0
        """Stream frames that made no sense (dropped)."""

    @property
    def buffered(self) -> int:
        """Bytes held in the daemon for every stream, not yet read."""
        streams: list[SandboxProcess | PortStream | SandboxWatch] = [*self._processes.values()]
        streams += self._ports.values()
        streams += self._watches.values()
        return sum(s.buffered for s in streams)

    def send(self, op: dict[str, Any]) -> None:
        if not self._ended:
            self._send(json.dumps(op).encode() + b"\n")

    def forget(self, sid: int) -> None:
        self._ports.pop(sid, None)
        self._watches.pop(sid, None)

    def _ask(self, op: dict[str, Any], about: Any) -> asyncio.Future[Any]:
        if self._ended:
            raise SandboxError("the session's sandbox has ended")
        self._next += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = (future, about)
        self.send({**op, "id": self._next})
        return future

    # ------------------------------------------------------------ the API

    async def spawn(self, spec: Spawn) -> SandboxProcess:
        """See `SessionSandbox.spawn`."""
        argv = tuple(spec.argv)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
            raise SpawnError("argv must be a program and its arguments (strings without NUL)")
        if spec.terminal is not None:
            rows, cols = spec.terminal
            if not all(is_int(v) and 0 < v <= 65535 for v in (rows, cols)):
                raise SpawnError(f"a terminal of {rows}x{cols} cannot be: each is 1..65535")
        op = {
            "op": "spawn",
            "argv": list(argv),
            "cwd": spec.cwd,
            "env": dict(spec.env),
            "terminal": list(spec.terminal) if spec.terminal is not None else None,
            "stdin": spec.stdin,
        }
        process: SandboxProcess = await self._ask(op, spec)
        return process

    async def stats(self, pids: Collection[int]) -> dict[int, tuple[float, int]]:
        """See `SessionSandbox.stats`."""
        wanted = [pid for pid in pids if is_int(pid) and pid > 0]
        if not wanted:
            return {}
        figures: dict[int, tuple[float, int]] = await self._ask(
            {"op": "stats", "pids": wanted}, None
        )
        return figures

    async def connect_port(
        self, port: int, timeout_s: float = 5.0, *, first: bytes = b""
    ) -> PortStream:
        """See `SessionSandbox.connect_port`."""
        if not is_int(port) or not 1 <= port <= 65535:
            raise BadPortError(f"{port!r} is not a port: a port is 1-65535")
        if len(first) > CHUNK:
            raise ValueError(f"at most {CHUNK} bytes go with a connect, not {len(first)}")
        op: dict[str, Any] = {"op": "connect", "port": port}
        if first:
            op["d"] = base64.b64encode(first).decode("ascii")
        future = self._ask(op, (port, len(first)))
        sid = self._next
        try:
            stream: PortStream = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._waiting.pop(sid, None)
            self.send({"op": "close", "id": sid})
            raise PortError(
                f"port {port} in the session did not answer within {timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:
            self._waiting.pop(sid, None)
            self.send({"op": "close", "id": sid})
            raise
        return stream

    async def watch(
        self, path: str, *, recursive: bool, max_dirs: int, max_watches: int
    ) -> SandboxWatch:
        """See `SessionSandbox.watch`."""
        if not isinstance(path, str) or "\0" in path:
            raise WatchError(f"{path!r} is no path of the workspace", bad_path=True)
        future = self._ask(
            {"op": "watch", "path": path, "recursive": bool(recursive), "max_dirs": max_dirs,
             "max_watches": max_watches},
            "watch",
        )  # fmt: skip
        sid = self._next
        try:
            watch: SandboxWatch = await future
        except asyncio.CancelledError:
            self._waiting.pop(sid, None)
            self.send({"op": "close", "id": sid})
            raise
        return watch

    # ------------------------------------------------------------ frames

    def on_frame(self, frame: dict[str, Any]) -> None:
        """One of `STREAM_FRAMES`; anything that makes no sense is dropped, counted."""
        sid = frame.get("id")
        if not is_int(sid) or not self._on_frame(frame["t"], sid, frame):
            self.bad_frames += 1

    def _on_frame(self, kind: str, sid: int, frame: dict[str, Any]) -> bool:
        if kind in _ANSWERS:
            return self._answer(kind, sid, frame)
        target: SandboxProcess | PortStream | SandboxWatch | None = (
            self._processes.get(sid) or self._ports.get(sid) or self._watches.get(sid)
        )
        if target is None:
            return kind in ("out", "eof", "room", "in_closed")  # a closed connection's late ones
        name = frame.get("s")
        if kind == "out":
            data = payload_of(frame.get("d"))
            if data is None or name not in target._in.open:
                return False
            target._in.add(name, data)
        elif kind == "eof":
            if name not in _OUTPUTS:
                return False
            target._in.eof(name)
        elif isinstance(target, SandboxWatch):
            return False
        elif kind == "room":
            n = frame.get("n")
            if not is_int(n) or n <= 0:
                return False
            target._out.add_room(n)
        elif kind == "in_closed":
            target._out.close()
        elif kind == "exited" and isinstance(target, SandboxProcess):
            code, sig = frame.get("code"), frame.get("signal")
            if not (code is None or is_int(code)) or not (sig is None or is_int(sig)):
                return False
            target._on_exit(ProcessExit(code, sig, frame.get("killed") is True))
        else:
            return False
        if isinstance(target, SandboxProcess) and target.exited.done() and not target._in.open:
            self._processes.pop(sid, None)  # nothing more can come for it
        return True

    def _answer(self, kind: str, sid: int, frame: dict[str, Any]) -> bool:
        waiting = self._waiting.pop(sid, None)
        if waiting is None:
            if kind in ("connected", "watching"):  # after its asker went: close it there
                self.send({"op": "close", "id": sid})
            return kind in ("connected", "connect_failed", "watching", "watch_failed")
        future, about = waiting
        if future.done():
            return True
        message = str(frame.get("message") or "no reason given")[:2000]
        if kind == "spawned" and isinstance(about, Spawn):
            pid = frame.get("pid")
            if not is_int(pid) or pid <= 0:
                future.set_exception(SpawnError("the supervisor named no pid"))
                return False
            process = SandboxProcess(self, sid, pid, about)
            self._processes[sid] = process
            future.set_result(process)
        elif kind == "spawn_failed":
            future.set_exception(SpawnError(message, limit=frame.get("limit") is True))
        elif kind == "connected" and isinstance(about, tuple):
            port, carried = about
            stream = PortStream(self, sid, port)
            stream._out.credit -= carried  # the bytes that went with the connect
            self._ports[sid] = stream
            future.set_result(stream)
        elif kind == "connect_failed":
            future.set_exception(PortError(message))
        elif kind == "watching" and about == "watch":
            dirs = frame.get("dirs")
            watch = SandboxWatch(self, sid, dirs if is_int(dirs) else 0)
            self._watches[sid] = watch
            future.set_result(watch)
        elif kind == "watch_failed":
            limit = frame.get("limit") is True
            future.set_exception(WatchError(message, limit=limit, bad_path=not limit))
        elif kind == "stats":
            future.set_result(figures_of(frame.get("v")))
        else:
            future.set_exception(SandboxError(f"the supervisor answered {kind!r}"))
            return False
        return True

    def end(self) -> None:
        """The sandbox has ended: every process ends as killed, every wait fails."""
        self._ended = True
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(SandboxError("the session's sandbox has ended"))
        self._waiting.clear()
        for process in self._processes.values():
            process._gone()
        for port in self._ports.values():
            port._gone()
        for watch in self._watches.values():
            watch._gone()
        self._watches.clear()
        self._processes.clear()
        self._ports.clear()


_ANSWERS = frozenset(
    {"spawned", "spawn_failed", "connected", "connect_failed", "stats", "watching", "watch_failed"}
)
