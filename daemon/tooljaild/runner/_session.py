"""A session inside a sandbox: the supervisor, and the interpreter it keeps alive.

(Over 500 lines, as _runner.py, for the same reason: it runs inside sandboxes
as a stdlib-only module beside the runner, and each module more is one more file
found and read at every sandbox start outside the zygote.)

Loaded by _runner.py on a "session" request (the zygote loads it at start, so
its sandboxes find it already imported). The worker that read that request
becomes the session's *supervisor*; it forks the *interpreter*, which holds one
persistent ``__main__`` namespace and runs the session's calls one at a time.
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
gets pipes of its own, passed on to the daemon only while the call runs.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
One file of ~800 lines on purpose: both processes share the session's
request, the line splitter and the sweep, and each runner module more is one
more file to find and compile at a session's start outside the zygote.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import signal
import socket
import sys
import time
import types
from typing import Any

import _artifacts  # type: ignore[import-not-found]  # beside this file, on the path _runner set
import _relay  # type: ignore[import-not-found]  # beside this file, on the path _runner set
import _turn  # type: ignore[import-not-found]  # beside this file, on the path _runner set
import _workspace  # type: ignore[import-not-found]  # beside this file, on the path _runner set

MAX_MESSAGE_BYTES = 16 * 1024 * 1024 + 4096
"""The longest line the interpreter may send (the runner's own bound on a frame)."""
_CHUNK = 1 << 20
_SWEEP_ROUNDS = 2000
"""Passes of the end-of-call sweep before it gives up (a process stuck in the
kernel); after the first few it sleeps a millisecond per pass."""


def serve(request: dict[str, Any], runner: types.ModuleType) -> None:
    """Be the session's supervisor until the daemon closes the request pipe. Never returns.

    Args:
        request: The "session" request line (limits, cwd, env, keep_processes,
            quota_bytes, tooldef).
        runner: The _runner module (it runs as ``__main__`` or as ``_runner``):
            its frame writer, limits and tool runners are used as they are.
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
    runner._write_frame({"t": "session", "interpreter": supervisor.interpreter})
    supervisor.serve()
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
        self.view = _ProcView(0)
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
        self.usage: _CallUsage | None = None
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
        self.requests = _Lines(MAX_MESSAGE_BYTES * 4)
        self.messages = _Lines(MAX_MESSAGE_BYTES)
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
        self.children = _children_reader(self.me)
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
                _interpreter(self.runner, self.request, self.me, to_r, from_w)
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
        self.view = _ProcView(pid)
        self.to_interp, self.from_interp = to_w, from_r
        self.outgoing = b""
        self.messages = _Lines(MAX_MESSAGE_BYTES)
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
            for fd, _ in self.poll.poll(self.relay.paused_ms()):
                if fd in self.relay.fds:
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
        # call's usage (`_CallUsage`).
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.interpreter:
                self.status, self.reaped = status, (pid, rusage)

    def _on_request(self, line: bytes) -> None:
        try:
            message = json.loads(line)
            op, seq = message["op"], int(message["seq"])
        except (ValueError, KeyError, TypeError):
            return  # the daemon writes none such
        if op == "call":
            self.tag = (seq, str(message.get("tag") or ""))
            self._call(seq, message.get("request") or {}, line)
        elif op == "interrupt":
            if self.running == seq and self.status is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.interpreter, signal.SIGINT)
        elif op == "reset":
            self.restart(asked=True)
            self.runner._write_frame({"t": "reset", "seq": seq, "resets": self.resets})

    def _call(self, seq: int, request: dict[str, Any], line: bytes) -> None:
        kind = request.get("kind")
        if kind == "workspace":
            before = _own_usage()
            frame = self._workspace(request)
            after = _own_usage()
            # The supervisor ran it: its CPU for the operation, and its own peak
            # (it runs no tool code: small, and never a tool's figure).
            frame["usage"] = {
                "cpu_s": _cpu_s(after) - _cpu_s(before),
                "memory_peak_bytes": after.ru_maxrss * 1024,
            }
            self._write(seq, frame, reset=False)
        elif kind in ("code", "file", "user"):
            self.running = seq
            self.usage = _CallUsage(self.view)
            # outputs/ is read here, not by the interpreter: tool code cannot
            # make the supervisor send what the call did not write.
            self.outputs_before = _artifacts.snapshot(self.root)
            tag = self.tag[1]
            self.sender = _artifacts.Sender(
                lambda frame: self.runner._write_frame({**frame, "seq": seq, "tag": tag}),
                *_artifacts.limits_of(request, self.request),
            )
            # A nonce of this call's own, which no code of an earlier call has
            # seen: the interpreter's messages for the call must carry it.
            self.nonce, self.told = os.urandom(16).hex(), {}
            # The kernel's count, which no code in the interpreter can change:
            # other threads alive as the call starts (earlier calls', or a
            # library's own workers, which the kernel does not tell apart).
            self.threads_at_start = max(len(_read_dir(f"/proc/{self.interpreter}/task")) - 1, 0)
            # Pipes of the call's own, for its output (and its processes'), from now on.
            assert self.to_sock is not None
            self.relay.next_call(self.to_sock, bool(self.outgoing))
            tagged = b'{"n": "' + self.nonce.encode() + b'", ' + line.lstrip()[1:]
            self._send(tagged if tagged.endswith(b"\n") else tagged + b"\n")
        else:
            error = {"type": "InvalidRequest", "message": f"no {kind!r} calls in a session"}
            self._write(seq, _failed(error), reset=False)

    def _workspace(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run a workspace operation here, where no tool code runs."""
        quota = int(request.get("quota_bytes") or self.quota)
        try:
            value = _workspace.run(request.get("op"), request.get("args") or {}, self.root, quota)
        except _workspace.WorkspaceError as exc:
            type_, message = _workspace_error(exc)
            return _failed({"type": type_, "message": message})
        except Exception as exc:
            return {"t": "result", "ok": False, "exit_code": 1, "error": self.runner._error(exc)}
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
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return
        # Only the running call's: a message without its nonce is a forgery of
        # code from an earlier call (or a stale one), and it is dropped.
        if not isinstance(message, dict) or message.get("n") != self.nonce:
            return
        if message.get("t") == "artifact":
            self._forward_artifact(message)
        elif message.get("t") == "yield" and "v" in message:
            frame = {"t": "yield", "seq": self.running, "tag": self.tag[1], "v": message["v"]}
            self.runner._write_frame(frame)
        elif message.get("t") == "result" and message.get("seq") == self.running:
            frame = {key: message[key] for key in _RESULT_KEYS if key in message}
            self.told = {key: _count(message.get(key)) for key in _LEFT_KEYS}
            self._write(self.running, {"t": "result", **frame}, reset=False)

    def _forward_artifact(self, message: dict[str, Any]) -> None:
        """A part of a figure or a display from the interpreter, checked, to the daemon.

        The count of the call's artifacts is kept here (the interpreter's own
        is tool code's to change); the daemon checks the rest (the sizes).
        """
        fields = {key: message.get(key) for key in _ARTIFACT_KEYS}
        if not (
            isinstance(fields["name"], str)
            and isinstance(fields["mime_type"], str)
            and fields["source"] in ("figure", "display")
            and isinstance(fields["data_b64"], str)
            and type(fields["part"]) is int
            and isinstance(fields["last"], bool)
            and self.sender is not None
        ):
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
            frame["usage"] = self.usage.end(self)
            self.usage = None
        frame["seq"] = seq
        if self.tag[0] == seq:
            frame["tag"] = self.tag[1]
        frame["reset"] = reset or self.reset_pending
        frame["resets"] = self.resets
        self.reset_pending = False
        if self.running == seq:
            self.running = None
        self.runner._write_frame(frame)

    def _left(self) -> dict[str, Any]:
        """What the running call leaves behind: its processes (read here), the
        threads the interpreter counted (its word: see _turn.py), and the output
        dropped since the call before (the relay's count, and the interpreter's)."""
        told = self.told
        processes = sum(1 for pid in self._below(False) if _alive(pid))
        return {
            "processes": processes,
            "kept": self.keep,
            "threads": told.get("threads", 0),
            "earlier_threads": told.get("earlier_threads", 0),
            "dropped_bytes": self.relay.take_dropped() + told.get("dropped_bytes", 0),
            "dropped_frames": told.get("dropped_frames", 0),
            "os_threads_at_start": self.threads_at_start,
        }

    # ------------------------------------------------------------ the sweep

    def sweep(self, *, everything: bool) -> None:
        """SIGKILL every process below the supervisor (but the interpreter, unless
        `everything`) until none is left.

        They are found through the kernel's children lists, from here down: an
        orphan is re-parented to this subreaper, so nothing the tool started
        escapes the walk, and no /proc scan of the host is needed (with no pid
        namespace, isolation "none", kill(-1) would reach the host's processes
        of this uid: never used). Stopping before killing keeps a fork loop
        from outrunning the sweep.
        """
        for round_ in range(_SWEEP_ROUNDS):
            pids = [pid for pid in self._below(everything) if _alive(pid)]
            if not pids:
                break
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            self._reap()
            if round_ > 10:
                time.sleep(0.001)
        self._reap()

    def _below(self, everything: bool) -> list[int]:
        found: list[int] = []
        # The supervisor has one thread: its own children list is all of them.
        stack = self.children(self.me, single=True)
        while stack:
            pid = stack.pop()
            if everything or pid != self.interpreter:
                found.append(pid)
            stack += self.children(pid)
        return found


_RESULT_KEYS = ("ok", "kind", "value", "exit_code", "error")
_LEFT_KEYS = ("threads", "earlier_threads", "dropped_bytes", "dropped_frames")
"""What the interpreter's result says the call left (_turn.Turn.close)."""


def _count(value: Any) -> int:
    """A count the interpreter told: a non-negative int, else 0."""
    return min(value, 1 << 62) if type(value) is int and value > 0 else 0


_ARTIFACT_KEYS = ("name", "mime_type", "source", "data_b64", "part", "last")


class _CallUsage:
    """What one call in the interpreter used, from its start to its end: the
    result frame's "usage", as a fresh worker's rusage (`_runner._usage`) is.

    Read by the supervisor, never by the interpreter: tool code can no more
    change these figures than the daemon's cgroup (which, where the sandbox
    has one, the daemon prefers: it also counts processes nobody waited for).

    CPU: the interpreter's and its waited-for children's (/proc/PID/stat's
    utime, stime, cutime, cstime; clock ticks, 10 ms on most kernels), plus
    what the supervisor reaped during the call (orphans the sweep killed; an
    interpreter that died, whose whole life is then counted, less its CPU at
    the call's start). Children the interpreter reaps only at the next call's
    start (those the sweep killed) count there.

    Memory: the interpreter's resident peak (VmHWM) during the call: it is
    reset to the current resident size at the call's start (/proc/PID/clear_refs,
    "5", Linux 4.0+). Where it cannot be, the figure is the peak since the
    interpreter started (the session's start or its last reset). Processes
    the interpreter starts are not in it (only a cgroup sees them all). A dead
    interpreter's is wait4's ru_maxrss: its own peak since the call's start,
    or more when a thread of it or a child it waited for peaked higher before.
    """

    def __init__(self, interpreter: _ProcView) -> None:
        self.interpreter = interpreter
        self.own = interpreter.cpu_s() or 0.0
        self.children = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN))
        interpreter.reset_peak()

    def end(self, supervisor: _Supervisor) -> dict[str, float]:
        """The usage so far; `supervisor` says whether the interpreter still lives."""
        reaped = _cpu_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - self.children
        pid = self.interpreter.pid
        alive = supervisor.interpreter == pid and supervisor.status is None
        own = self.interpreter.cpu_s() if alive else None
        if own is not None:
            cpu, peak = own - self.own + reaped, self.interpreter.peak_rss()
        else:  # reaped: its whole life is in `reaped`, less what it had used before
            cpu = reaped - self.own
            last = supervisor.reaped
            peak = last[1].ru_maxrss * 1024 if last and last[0] == pid else 0
        return {"cpu_s": max(cpu, 0.0), "memory_peak_bytes": peak}


class _ProcView:
    """The interpreter's /proc files that `_CallUsage` reads, each opened once
    (on first use: right after its fork the interpreter is not yet dumpable,
    and its files are not the session uid's) and then read with pread, which
    costs half of an open and a read at every call. A descriptor stays with
    its process: a reused pid never answers for a dead interpreter."""

    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
    """Seconds in one clock tick, the unit of /proc/PID/stat's times."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fds: dict[str, int] = {}

    def cpu_s(self) -> float | None:
        """CPU seconds it and the children it waited for used so far; None when gone."""
        stat = self._read("stat")
        # After the command name (which may hold spaces and parentheses), from
        # field 3 (state) on: utime, stime, cutime and cstime are fields 14-17.
        ticks = stat[stat.rfind(b")") + 2 :].split()[11:15]
        if len(ticks) < 4:
            return None  # gone (nothing read)
        return sum(int(tick) for tick in ticks) * self._TICK_S

    def peak_rss(self) -> int:
        """Its resident peak in bytes (VmHWM); 0 when it is gone."""
        for line in self._read("status").splitlines():
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024  # in kB
        return 0

    def reset_peak(self) -> bool:
        """Start its VmHWM afresh (from its current resident size); False if it cannot be."""
        fd = self._fd("clear_refs", os.O_WRONLY)
        try:
            return fd is not None and os.write(fd, b"5") == 1
        except OSError:
            return False

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _read(self, name: str) -> bytes:
        fd = self._fd(name, os.O_RDONLY)
        try:
            return b"" if fd is None else os.pread(fd, 16384, 0)
        except OSError:
            return b""

    def _fd(self, name: str, flags: int) -> int | None:
        fd = self._fds.get(name)
        if fd is None:
            try:
                fd = os.open(f"/proc/{self.pid}/{name}", flags | os.O_CLOEXEC)
            except OSError:
                return None
            self._fds[name] = fd
        return fd


def _own_usage() -> Any:
    return resource.getrusage(resource.RUSAGE_SELF)


def _cpu_s(usage: Any) -> float:
    """User and system CPU seconds of a getrusage/wait4 result."""
    return float(usage.ru_utime + usage.ru_stime)


def _ignore(signum: int, frame: types.FrameType | None) -> None:
    """SIGCHLD's handler: its wakeup byte is all that matters."""


class _Lines:
    """Splits a byte stream into lines, dropping any longer than `limit`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes]:
        parts = data.split(b"\n")
        rest = parts.pop()
        lines = []
        for i, part in enumerate(parts):
            if i == 0:
                if self._skipping:
                    self._skipping = False
                    continue
                part, self._held = bytes(self._held) + part, bytearray()
            if part.strip() and len(part) <= self._limit:
                lines.append(part)
        if not self._skipping:
            self._held += rest
            if len(self._held) > self._limit:
                self._held, self._skipping = bytearray(), True
        return lines


def _children_reader(me: int) -> Any:
    """How to list a process's children: the kernel's lists where it keeps them
    (/proc/PID/task/TID/children), else one walk of /proc (slower, same answer)."""
    if os.path.exists(f"/proc/{me}/task/{me}/children"):
        return _children
    return _children_by_scan


def _children(pid: int, single: bool = False) -> list[int]:
    """The children of `pid`, from each of its threads' lists (the one thread's
    when `single`). Read with bare system calls: this runs at every call's end."""
    try:
        tasks = [str(pid)] if single else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            found += [int(child) for child in text.split()]
    return found


def _children_by_scan(pid: int, single: bool = False) -> list[int]:
    parent = str(pid).encode()
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and _stat(int(entry))[1:2] == [parent]
    ]


def _read_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> bytes:
    """A small /proc file's content; b"" when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields after the command name: [state, ppid, ...]; [] if gone."""
    stat = _read(f"/proc/{pid}/stat")
    # The command name may hold spaces and parentheses: split after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split() if stat else []


def _alive(pid: int) -> bool:
    """Whether `pid` is a process not yet dead (zombies are)."""
    return _stat(pid)[:1] not in ([], [b"Z"], [b"X"])


def _failed(error: dict[str, str]) -> dict[str, Any]:
    return {"t": "result", "ok": False, "exit_code": 1, "error": {**error, "traceback": ""}}


def _workspace_error(exc: BaseException) -> tuple[str, str]:
    """(type, message) of a `_workspace.WorkspaceError(type_, message)`."""
    args = [str(arg) for arg in exc.args]
    type_ = getattr(exc, "type_", None) or getattr(exc, "type", None)
    message = getattr(exc, "message", None)
    if not isinstance(type_, str):
        type_ = args[0] if len(args) > 1 else "WorkspaceError"
    if not isinstance(message, str):
        message = args[-1] if args else ""
    return type_, message


# --------------------------------------------------------------------------- interpreter

_in_tool = False
"""True while tool code runs: only then does SIGINT raise KeyboardInterrupt."""


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    # A SIGINT that comes late, when the call's code is over, must not break
    # the interpreter's own loop: it is dropped then.
    if _in_tool:
        raise KeyboardInterrupt


def _interpreter(
    runner: types.ModuleType,
    session: dict[str, Any],
    supervisor: int,
    requests: int,
    messages: int,
) -> None:
    """The interpreter, just forked: shed the supervisor's descriptors, then
    run calls one at a time in one namespace. Never returns."""
    # Nothing of the supervisor's may reach tool code: not the daemon's
    # request pipe (fd 0), not the frame pipe, not its wakeup pipe.
    signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    _close_all_but((0, 1, 2, requests, messages))
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, _on_sigint)
    runner._prctl(runner.PR_SET_DUMPABLE, 1)  # the supervisor's shield is not the tool's
    runner._prctl(runner.PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != supervisor:
        os._exit(0)  # the supervisor died before the line above
    # The runner's own frames (yields, the result) go to the supervisor from now on.
    runner.__dict__["_frame_fd"] = messages
    # Taken now, before any tool code runs: what tool code later does to the
    # runner module or to sys does not change how a result is written.
    write_frame = runner._write_frame
    streams = (sys.stdout, sys.stderr)
    flush = [stream.flush for stream in streams]
    limits = dict(session.get("limits") or {})
    cpu_s = int(limits.pop("cpu_s", 0) or 0)
    # RLIMIT_CPU is set per call (below); its hard limit stays as the session started.
    runner._apply_limits(limits)
    if session.get("cwd"):
        os.chdir(session["cwd"])
    os.environ.clear()
    os.environ.update(session.get("env") or {})
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    keep = bool(session.get("keep_processes"))
    lines = _Lines(1 << 62)
    pending: list[tuple[bytes, list[int]]] = []
    carried: list[int] = []  # a call's output pipes, for the next line to come
    sock = socket.socket(fileno=requests)
    turn: Any = None
    while True:
        try:
            while not pending:
                data, fds, _, _ = socket.recv_fds(sock, _CHUNK, 4)
                if not data:
                    os._exit(0)
                # A read ends with the byte that carried pipes: they are for the
                # line that follows it (the supervisor sends them just before it).
                for line in lines.feed(data):
                    pending.append((line, carried))
                    carried = []
                if fds:
                    _close_fds(carried)
                    carried = fds
            line, pipes = pending.pop(0)
            message = json.loads(line)
        except (InterruptedError, KeyboardInterrupt):
            continue  # a stray signal while idle
        if len(pipes) == 2:  # the call's own stdout and stderr, from now on
            for each in flush:
                with contextlib.suppress(Exception):
                    each()
            os.dup2(pipes[0], 1)
            os.dup2(pipes[1], 2)
        _close_fds(pipes)
        turn = _begin_turn(runner, message, turn, streams, write_frame)
        frame = _interpret(
            runner,
            message,
            main,
            keep=keep,
            cpu_s=cpu_s,
            tooldef=session.get("tooldef"),
            session=session,
        )
        # Closed first: what a thread prints from here on is nobody's.
        left = turn.close()
        for each in flush:
            with contextlib.suppress(Exception):
                each()
        frame.update(left, seq=message.get("seq"), n=turn.nonce)
        write_frame(frame)


def _begin_turn(
    runner: types.ModuleType,
    message: dict[str, Any],
    previous: Any,
    streams: tuple[Any, Any],
    write_frame: Any,
) -> Any:
    """Open the call's turn: its own sys.stdout, sys.stderr and frame writer
    (see _turn.py), which no code of an earlier call holds."""
    turn = _turn.Turn(str(message.get("n") or ""))
    if previous is not None:  # what threads wrote between the calls is told now
        turn.dropped_bytes = previous.dropped_bytes - previous.reported
    sys.stdout, sys.stderr = turn.streams(*streams)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]
    runner.__dict__["_write_frame"] = turn.frame_writer(write_frame)
    return turn


def _interpret(
    runner: types.ModuleType, message: dict[str, Any], main: types.ModuleType, **options: Any
) -> dict[str, Any]:
    """Run one call's request; its result frame, whatever the tool does."""
    global _in_tool
    request = {"tooldef": options["tooldef"], **(message.get("request") or {})}
    try:
        if not options["keep"]:
            runner._reap_all()  # zombies of the call before (the sweep killed them)
        limits = request.get("limits")  # the call's own; else the session's
        _cpu_limit(int(limits.get("cpu_s") or 0) if limits else options["cpu_s"])
        rich = request.get("kind") == "code"
        # Figures and display() only: outputs/ is the supervisor's to send.
        if rich:
            runner.artifact_sender(request, runner._write_frame, options["session"])
        _in_tool = True
        try:
            if request.get("kind") == "user":
                return dict(runner._run_user_tool(request))
            # Code runs in the session's one namespace; a file, as `python FILE` would.
            return dict(
                runner._run_script(request, main if request.get("kind") == "code" else None)
            )
        finally:
            _in_tool = False
            sys.modules["__main__"] = main
            if rich:
                runner.end_artifacts(None, None, rich=True)
    except SystemExit as exc:
        return dict(runner._system_exit_frame(exc))
    except BaseException as exc:
        error = runner._error(exc.with_traceback(_without_own_frames(exc.__traceback__)))
        return {"t": "result", "ok": False, "exit_code": 1, "error": error}


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _close_all_but(keep: tuple[int, ...]) -> None:
    """Close every open descriptor not in `keep`."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every possible descriptor, then
        fds = list(range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16)))
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def _cpu_limit(cpu_s: int) -> None:
    """Let this call use `cpu_s` more CPU seconds (0: no limit): the soft
    RLIMIT_CPU moves to what the interpreter has used so far plus that.

    The hard limit can only be lowered, never raised again, so it stays as the
    session started; past the soft limit the kernel sends SIGXCPU (which kills,
    unless the tool handles it: then the call's timeout ends it).
    """
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = hard  # no limit of the call's own: the session's, if any
    if cpu_s > 0:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime) + cpu_s
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
