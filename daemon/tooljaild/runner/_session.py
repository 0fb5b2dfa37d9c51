"""A session inside a sandbox: its supervisor, which keeps an interpreter alive.

Loaded by _runner.py on a "session" request (the zygote loads it at start, so
its sandboxes find it already imported). The worker that read that request
becomes the session's *supervisor*; it forks the *interpreter* (_interpreter.py),
which holds one persistent ``__main__`` namespace and runs the session's calls
one at a time.
What the daemon and the supervisor say to each other is described once, in
the daemon's tooljaild/sandbox/session_channel.py.

    daemon --request pipe (fd 0)--> supervisor --private socket--> interpreter
    daemon <--frame pipe----------- supervisor <--private pipe---- interpreter
    daemon <--stdout, stderr (1, 2)- supervisor <--a call's pipes-- interpreter

Why two processes. The supervisor runs no tool code, so it can do what tool
code must not be able to undo: it alone holds the daemon's request and frame
pipes (the interpreter closes them right after the fork: tool code in a
session can write no frame at all), it runs the workspace operations (tool
code cannot tamper with them), it kills every process a call started before it
reports the call's end, and it restarts the interpreter when it dies or the
daemon asks (a reset). It is a child subreaper (whatever the tool orphans is
re-parented to it, where the sweep finds it) and not dumpable (tool code of the
same uid can neither ptrace it nor open its descriptors through /proc).

What the interpreter sends the supervisor ({"t": "yield", "v"} and {"t":
"result", "seq", ...}, the runner's own frames) is read as the tool's words:
bounded per line, parsed, and only what carries the running call's nonce is
taken (a nonce the supervisor makes per call and sends with its request:
code of an earlier call, a thread that outlived it, has never seen it; see
_turn.py for what the interpreter does with it, and its limits). The
interpreter's output goes through the supervisor too (_relay.py): each call
gets pipes of its own, passed on to the daemon only while the call runs. The
supervisor measures what each call used (_usage.py) and ends what it left
running (_procs.py).

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import types
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._session
    from . import (
        _artifacts,
        _deadline,
        _frames,
        _interpreter,
        _messages,
        _procs,
        _relay,
        _streams,
        _usage,
        _workspace,
    )
except ImportError:  # a sandbox: top-level modules beside _runner.py, on the path it set
    import _artifacts  # type: ignore[import-not-found, no-redef]
    import _deadline  # type: ignore[import-not-found, no-redef]
    import _frames  # type: ignore[import-not-found, no-redef]
    import _interpreter  # type: ignore[import-not-found, no-redef]
    import _messages  # type: ignore[import-not-found, no-redef]
    import _procs  # type: ignore[import-not-found, no-redef]
    import _relay  # type: ignore[import-not-found, no-redef]
    import _streams  # type: ignore[import-not-found, no-redef]
    import _usage  # type: ignore[import-not-found, no-redef]
    import _workspace  # type: ignore[import-not-found, no-redef]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024 + 4096
"""The longest line the interpreter may send (the runner's own bound on a frame)."""
_CHUNK = 1 << 20


def serve(request: dict[str, Any], runner: types.ModuleType) -> None:
    """Be the session's supervisor until the daemon closes the request pipe. Never returns.

    Args:
        request: The "session" request line (limits, cwd, env, keep_processes,
            quota_bytes, tooldef).
        runner: The _runner module (it runs as ``__main__`` or as ``_runner``):
            its limits and prctl are used as they are.
    """
    # Tool code (same uid) must not be able to ptrace this process or open its
    # descriptors: the frame pipe is here.
    if not runner._prctl(runner.PR_SET_DUMPABLE, 0):
        os.write(2, b"tooljail session: prctl(PR_SET_DUMPABLE, 0) failed\n")
        os._exit(111)
    if os.getpid() != 1:
        runner._prctl(runner.PR_SET_CHILD_SUBREAPER, 1)
    supervisor = _Supervisor(request, runner)
    supervisor.start_interpreter()
    _frames.write_frame({"t": "session", "interpreter": supervisor.interpreter})
    supervisor.serve()
    supervisor.streams.write = _streams.quiet  # the daemon is gone: nobody reads frames
    supervisor.sweep(everything=True)
    os._exit(0)


class _Supervisor:
    """The session's supervisor: the loop over the daemon's requests, the
    interpreter's messages and the deaths of its children."""

    def __init__(self, request: dict[str, Any], runner: types.ModuleType) -> None:
        self.runner = runner
        self.request = request
        self.keep = bool(request.get("keep_processes"))
        self.quota = int(request.get("quota_bytes") or 0)
        self.root = str(request.get("cwd") or os.getcwd())
        self.me = os.getpid()
        self.interpreter = 0
        self.view = _usage.ProcView(0)
        """The interpreter's /proc files, for the usage of its calls."""
        self.status: int | None = None
        """The interpreter's wait status once it is reaped (it died)."""
        self.running: int | None = None
        """The seq of the call the interpreter runs, None while it is idle."""
        self.resets = 0
        self.reset_pending = False
        """The interpreter was restarted while idle: the next call's end says so."""
        self.sender: Any = None
        """The running call's artifact sender (_artifacts.Sender), None while idle."""
        self.usage: _usage.CallUsage | None = None
        """What the running call has used, counted from its start; None while idle."""
        self.reaped: tuple[int, Any] | None = None
        """(pid, rusage from wait4) of the last interpreter reaped (it died)."""
        self.dropping = False
        """The interpreter's artifact being forwarded is past the call's count: dropped."""
        self.outputs_before: dict[str, tuple[int, int]] = {}
        """outputs/ as the running call found it: only what it changes is sent."""
        self.tag: tuple[int, str] = (0, "")
        """(seq, tag) of the last call the daemon sent: its frames carry the tag."""
        self.nonce = ""
        """The running call's nonce: the interpreter's messages for it carry it."""
        self.told: dict[str, int] = {}
        self.threads_at_start = 0
        """What the interpreter said the running call left (see _turn.Turn.close)."""
        self.to_interp = -1
        self.from_interp = -1
        self.outgoing = b""  # what is still to be written to the interpreter
        self.writing = False  # `to_interp` is watched for room to write the rest
        self.requests = _frames.Lines(MAX_MESSAGE_BYTES * 4)
        self.messages = _frames.Lines(MAX_MESSAGE_BYTES)
        self.poll = select.poll()
        # Children's deaths wake the loop through this pipe; no thread, no polling.
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, _ignore)
        # The tool can reach this process with signals (same uid): none of the
        # polite ones may raise in the supervisor's code.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.poll.register(0, select.POLLIN)
        self.poll.register(self.wake_r, select.POLLIN)
        self.relay = _relay.Relay(self.poll, int(request.get("idle_output_bytes_per_s") or 0))
        self.to_sock: socket.socket | None = None
        """The interpreter's request socket (its pipes come over it, with each call)."""
        self.children = _procs.children_reader(self.me)
        self.streams = _streams.Streams(self.poll, self.root, request, runner)  # (no tool's)
        with contextlib.suppress(OSError):
            os.chdir(self.root)

    # ------------------------------------------------------------ interpreter

    def start_interpreter(self) -> None:
        """Fork a fresh interpreter (its limits, cwd and env are the session's)."""
        # A socket, not a pipe: each call's output pipes go over it (SCM_RIGHTS).
        to_sock, their_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        to_w, to_r = to_sock.fileno(), their_sock.detach()
        from_r, from_w = os.pipe()
        relay = [os.pipe(), os.pipe()]  # the interpreter's stdout and stderr
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        pid = os.fork()
        if pid == 0:
            to_sock.detach()  # (the interpreter closes it; its object must not, later)
            try:
                os.dup2(relay[0][1], 1)
                os.dup2(relay[1][1], 2)
                _interpreter.run(self.runner, self.request, self.me, to_r, from_w)
            finally:
                os._exit(70)
        os.close(to_r)
        os.close(from_w)
        for _, w in relay:
            os.close(w)
        self.relay.start(relay[0][0], relay[1][0])
        self.to_sock = to_sock
        os.set_blocking(to_w, False)
        os.set_blocking(from_r, False)
        self.interpreter, self.status = pid, None
        self.view = _usage.ProcView(pid)
        self.to_interp, self.from_interp = to_w, from_r
        self.outgoing = b""
        self.messages = _frames.Lines(MAX_MESSAGE_BYTES)
        self.writing = False
        self.poll.register(from_r, select.POLLIN)

    def _stop_interpreter(self) -> None:
        """Kill the interpreter and every other process of the session; reap it."""
        if self.status is None:  # (once reaped, its pid may be anyone's)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.interpreter, signal.SIGKILL)
        self.sweep(everything=True)
        if self.status is None:
            with contextlib.suppress(ChildProcessError):
                _, self.status, rusage = os.wait4(self.interpreter, 0)
                self.reaped = (self.interpreter, rusage)
        # What it wrote before it died is still the running call's.
        self.relay.drain(forward=self.running is not None)
        self.relay.close()
        for fd in (self.to_interp, self.from_interp):
            with contextlib.suppress(KeyError, ValueError):
                self.poll.unregister(fd)
        os.close(self.from_interp)
        if self.to_sock is not None:
            self.to_sock.close()
        self.view.close()

    def restart(self, *, asked: bool) -> None:
        """Replace the interpreter (dead, or killed now); end the call it ran.

        Args:
            asked: The daemon asked for the reset: the running call ends as
                killed. Else the interpreter died by itself, and the call ends
                with how it died.
        """
        self._take_messages()  # a result written just before the end still counts
        self._stop_interpreter()
        status = self.status
        self.start_interpreter()
        self.resets += 1
        if self.running is None:
            self.reset_pending = True
            return
        if asked or status is None:
            lost = {"code": None, "signal": int(signal.SIGKILL)}
        elif os.WIFSIGNALED(status):
            lost = {"code": None, "signal": os.WTERMSIG(status)}
        else:
            lost = {"code": os.WEXITSTATUS(status), "signal": None}
        self._write(self.running, {"t": "result", "lost": lost, "asked": asked}, reset=True)

    # ------------------------------------------------------------ the loop

    def serve(self) -> None:
        """Serve until the daemon closes the request pipe (or it breaks)."""
        while True:
            for fd, event in self.poll.poll(self.relay.paused_ms()):
                if self.streams.owns(fd):
                    self.streams.on_event(fd, event)
                elif fd in self.relay.fds:
                    self.relay.read(fd, running=self.running is not None)
                elif fd == self.wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 4096)
                    self._reap()
                elif fd == 0:
                    try:
                        data = os.read(0, _CHUNK)
                    except InterruptedError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        return
                    for line in self.requests.feed(data):
                        self._on_request(line)
                elif fd == self.from_interp:
                    self._take_messages()
                elif fd == self.to_interp:
                    self._send(b"")
            self.relay.resume_if_due()
            if self.status is not None:
                self.restart(asked=False)

    def _reap(self) -> None:
        # wait4, not the runner's waitpid: a dead interpreter's rusage is its
        # call's usage (`_usage.CallUsage`).
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.interpreter:
                self.status, self.reaped = status, (pid, rusage)
            self.streams.reaped(pid, status)  # (a pid not of its processes: nothing)

    def _on_request(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            if message["op"] in _streams.OPS:
                return self.streams.on_op(message["op"], message)
            op, seq = message["op"], int(message["seq"])
        except (ValueError, KeyError, TypeError, RecursionError):
            return  # the daemon writes none such
        if op == "call":
            self.tag = (seq, str(message.get("tag") or ""))
            self._call(seq, message.get("request") or {}, line)
        elif op == "interrupt":
            # The call's deadline: its processes die now; only an interpreter
            # that can take the KeyboardInterrupt gets a grace (_deadline.py).
            if (
                self.running == seq
                and self.status is None
                and not _deadline.deadline(self.interpreter, self.children)
            ):
                self.restart(asked=True)
        elif op == "reset":
            self.restart(asked=True)
            _frames.write_frame({"t": "reset", "seq": seq, "resets": self.resets})

    def _call(self, seq: int, request: dict[str, Any], line: bytes) -> None:
        kind = request.get("kind")
        if kind == "workspace":
            before = _usage.own_usage()
            frame = self._workspace(request)
            after = _usage.own_usage()
            # The supervisor ran it: its CPU for the operation, and its own peak
            # (it runs no tool code: small, and never a tool's figure).
            frame["usage"] = {
                "cpu_s": _usage.cpu_s(after) - _usage.cpu_s(before),
                "memory_peak_bytes": after.ru_maxrss * 1024,
            }
            self._write(seq, frame, reset=False)
        elif kind in ("code", "file", "user", "packages", "command"):
            self.running = seq
            self.usage = _usage.CallUsage(self.view)
            # outputs/ is read here, not by the interpreter: tool code cannot
            # make the supervisor send what the call did not write.
            self.outputs_before = _artifacts.snapshot(self.root)
            tag = self.tag[1]
            self.sender = _artifacts.Sender(
                lambda frame: _frames.write_frame({**frame, "seq": seq, "tag": tag}),
                *_artifacts.limits_of(request, self.request),
            )
            # A nonce of this call's own, which no code of an earlier call has
            # seen: the interpreter's messages for the call must carry it.
            self.nonce, self.told = os.urandom(16).hex(), {}
            # The kernel's count, which no code in the interpreter can change:
            # other threads alive as the call starts (earlier calls', or a
            # library's own workers, which the kernel does not tell apart).
            tasks = _procs.read_dir(f"/proc/{self.interpreter}/task")
            self.threads_at_start = max(len(tasks) - 1, 0)
            # Pipes of the call's own, for its output (and its processes'), from now on.
            assert self.to_sock is not None
            self.relay.next_call(self.to_sock, bool(self.outgoing))
            tagged = b'{"n": "' + self.nonce.encode() + b'", ' + line.lstrip()[1:]
            self._send(tagged if tagged.endswith(b"\n") else tagged + b"\n")
        else:
            error = {"type": "InvalidRequest", "message": f"no {kind!r} calls in a session"}
            self._write(seq, _messages.failed(error), reset=False)

    def _workspace(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run a workspace operation here, where no tool code runs."""
        quota = int(request.get("quota_bytes") or self.quota)
        op: Any = request.get("op")  # whatever the daemon sent: run() refuses an unknown op
        try:
            value = _workspace.run(op, request.get("args") or {}, self.root, quota)
        except _workspace.WorkspaceError as exc:
            type_, message = _workspace.error_of(exc)
            return _messages.failed({"type": type_, "message": message})
        except Exception as exc:
            return {"t": "result", "ok": False, "exit_code": 1, "error": _frames.error(exc)}
        return {"t": "result", "ok": True, "kind": "json", "value": value, "exit_code": 0}

    def _send(self, data: bytes) -> None:
        """Write to the interpreter without ever blocking (it may be busy or stuck)."""
        self.outgoing += data
        try:
            written = os.write(self.to_interp, self.outgoing)
        except (BlockingIOError, InterruptedError):
            written = 0
        except OSError:
            written = len(self.outgoing)  # it is dead: its end is handled as it comes
        self.outgoing = self.outgoing[written:]
        if bool(self.outgoing) != self.writing:
            self.writing = bool(self.outgoing)
            if self.writing:
                self.poll.register(self.to_interp, select.POLLOUT)
            else:
                self.poll.unregister(self.to_interp)

    def _take_messages(self) -> None:
        while True:
            try:
                data = os.read(self.from_interp, _CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(KeyError, ValueError):
                    self.poll.unregister(self.from_interp)
                return
            for line in self.messages.feed(data):
                self._on_message(line)

    def _on_message(self, line: bytes) -> None:
        """One line from the interpreter: tool code can write there too."""
        if self.running is None:
            return
        message = _messages.parse(line, self.nonce)  # None: not the running call's
        if message is None:
            return
        if message.get("t") == "artifact":
            self._forward_artifact(message)
        elif message.get("t") == "yield" and "v" in message:
            frame = {"t": "yield", "seq": self.running, "tag": self.tag[1], "v": message["v"]}
            _frames.write_frame(frame)
        elif message.get("t") == "result" and message.get("seq") == self.running:
            frame, self.told = _messages.result(message)
            self._write(self.running, frame, reset=False)

    def _forward_artifact(self, message: dict[str, Any]) -> None:
        """A part of a figure or a display from the interpreter, checked, to the daemon.

        The count of the call's artifacts is kept here (the interpreter's own
        is tool code's to change); the daemon checks the rest (the sizes).
        """
        fields = _messages.artifact_fields(message)
        if fields is None or self.sender is None:
            return
        if fields["part"] == 0:
            if self.sender.sent >= self.sender.max_count:
                self.dropping = True
                return
            self.sender.sent += 1
            self.dropping = False
        if not self.dropping:
            self.sender.write_frame({"t": "artifact", **fields})  # (the sender tags it)

    def _write(self, seq: int, frame: dict[str, Any], *, reset: bool) -> None:
        """End call `seq` with `frame`: after every process it started is gone,
        and after the files it wrote to outputs/ are sent."""
        ours = self.running == seq
        if ours:  # what the call leaves running, told before the sweep ends it
            left = self._left()
        if not self.keep:
            self.sweep(everything=False)
        # Everything the call printed is in the relay pipes now (the interpreter
        # flushed before its result; the sweep ended the call's processes).
        self.relay.drain(forward=ours)
        if ours:
            frame["left"] = left
        if self.running == seq and self.sender is not None:
            try:
                _artifacts.send_outputs(self.sender, self.root, self.outputs_before)
            except Exception as exc:  # the call's result must still be told
                _artifacts.say(f"outputs/ could not be sent: {type(exc).__name__}: {exc}")
            self.sender = None
        if self.running == seq and self.usage is not None:
            # Measured last: after the sweep, whose orphans count as this call's.
            frame["usage"] = self.usage.end(self.interpreter, self.status, self.reaped)
            self.usage = None
        frame["seq"] = seq
        if self.tag[0] == seq:
            frame["tag"] = self.tag[1]
        frame["reset"] = reset or self.reset_pending
        frame["resets"] = self.resets
        self.reset_pending = False
        if self.running == seq:
            self.running = None
        _frames.write_frame(frame)

    def _left(self) -> dict[str, Any]:
        """What the running call leaves behind: its processes (read here), the
        threads the interpreter counted (its word: see _turn.py), and the output
        dropped since the call before (the relay's count, and the interpreter's)."""
        told = self.told
        below = _procs.below(self.me, self.interpreter, self.children, self.streams.sessions())
        processes = sum(1 for pid in below if _procs.alive(pid))
        return {
            "processes": processes,
            "kept": self.keep,
            "threads": told.get("threads", 0),
            "earlier_threads": told.get("earlier_threads", 0),
            "dropped_bytes": self.relay.take_dropped() + told.get("dropped_bytes", 0),
            "dropped_frames": told.get("dropped_frames", 0),
            "os_threads_at_start": self.threads_at_start,
        }

    def sweep(self, *, everything: bool) -> None:
        """End every process below the supervisor (unless `everything`, not the
        interpreter nor the background processes: _streams.Streams.sweep)."""
        self.streams.sweep(self.me, self.interpreter, self.children, self._reap, everything)


def _ignore(signum: int, frame: types.FrameType | None) -> None:
    """SIGCHLD's handler: its wakeup byte is all that matters."""
