"""A session's interpreter: the process that runs the session's calls, one at a time.

Forked by the supervisor (_session.py), it keeps one ``__main__`` namespace
across calls, as a notebook's kernel does. It sheds every descriptor of the
supervisor's first (tool code in a session can write no frame to the daemon),
then for each call it reads from its socket (the call's request and its own
stdout and stderr pipes) it opens the call's turn (_turn.py), runs the call
through the worker's own kinds (_kinds.py) and writes the result, tagged with
the call's nonce, to the supervisor. A timeout interrupts it (SIGINT, which
raises KeyboardInterrupt only while tool code runs).

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import socket
import sys
import types
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._interpreter
    from . import _frames, _keeper, _kinds, _packages, _turn
except ImportError:  # a sandbox: top-level modules beside _runner.py, on the path it set
    import _frames  # type: ignore[import-not-found, no-redef]
    import _keeper  # type: ignore[import-not-found, no-redef]
    import _kinds  # type: ignore[import-not-found, no-redef]
    import _packages  # type: ignore[import-not-found, no-redef]
    import _turn  # type: ignore[import-not-found, no-redef]

_CHUNK = 1 << 20
"""The most read from the supervisor's socket at once."""

_in_tool = False
"""True while tool code runs: only then does SIGINT raise KeyboardInterrupt."""


def _on_sigint(signum: int, frame: types.FrameType | None) -> None:
    # A SIGINT that comes late, when the call's code is over, must not break
    # the interpreter's own loop: it is dropped then.
    if _in_tool:
        raise KeyboardInterrupt


def run(
    runner: types.ModuleType,
    session: dict[str, Any],
    supervisor: int,
    requests: int,
    messages: int,
) -> None:
    """The interpreter, just forked: shed the supervisor's descriptors, then
    run calls one at a time in one namespace. Never returns.

    Args:
        runner: The _runner module (its limits and prctl are used as they are).
        session: The "session" request line.
        supervisor: The supervisor's pid (the parent: when it is gone, so is this).
        requests: The socket the supervisor sends calls over (with their pipes).
        messages: The pipe the interpreter's frames go to the supervisor through.
    """
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
    _frames.set_fd(messages)
    # Taken now, before any tool code runs: what tool code later does to the
    # runner's modules or to sys does not change how a result is written.
    write_frame = _frames.write_frame
    streams = (sys.stdout, sys.stderr)
    flush = [stream.flush for stream in streams]
    limits = dict(session.get("limits") or {})
    cpu_s = int(limits.pop("cpu_s", 0) or 0)
    egress = bool(session.get("egress"))
    if egress:
        # For the session's life (each call checks it is still there); before
        # the limits, so that its thread does not count against a tight nproc.
        _relay_up()
    # RLIMIT_CPU is set per call (below); its hard limit stays as the session started.
    runner._apply_limits(limits)
    if session.get("cwd"):
        os.chdir(session["cwd"])
    os.environ.clear()
    os.environ.update(session.get("env") or {})
    if egress:
        # Installs go to the workspace's site directory, on sys.path from the
        # start (and again after every reset: this runs in each interpreter).
        _packages.activate(session.get("cwd") or os.getcwd())
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    keep = bool(session.get("keep_processes"))
    lines = _frames.Lines(1 << 62)
    pending: list[tuple[bytes, list[int]]] = []
    carried: list[int] = []  # a call's output pipes, for the next line to come
    sock = socket.socket(fileno=requests)
    turn: _turn.Turn | None = None
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
        if egress:
            _relay_up()
        turn = _begin_turn(message, turn, streams)
        frame = _interpret(
            message,
            main,
            write_frame=turn.frame_writer(write_frame),
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


def _relay_up() -> None:
    """Start the egress relay unless it runs (tool code may have ended it: that
    cut only this session's own access, until now); its thread is the runner's,
    not a call's (_turn.RUNNER_THREADS)."""
    thread = _kinds.import_beside("_egress").ensure_relay()
    if thread is not None and thread.ident is not None:
        _turn.RUNNER_THREADS.add(thread.ident)


def _begin_turn(
    message: dict[str, Any], previous: _turn.Turn | None, streams: tuple[Any, Any]
) -> _turn.Turn:
    """Open the call's turn: its own sys.stdout and sys.stderr (and frame
    writer, `Turn.frame_writer`; see _turn.py), which no code of an earlier
    call holds."""
    turn = _turn.Turn(str(message.get("n") or ""))
    if previous is not None:  # what threads wrote between the calls is told now
        turn.dropped_bytes = previous.dropped_bytes - previous.reported
    sys.stdout, sys.stderr = turn.streams(*streams)
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc, assignment]
    return turn


def _interpret(message: dict[str, Any], main: types.ModuleType, **options: Any) -> dict[str, Any]:
    """Run one call's request; its result frame, whatever the tool does.

    Args:
        options: keep, cpu_s, tooldef and session (the session's request), and
            write_frame: the call's own frame writer (its turn's), for what a
            generator tool yields and the figures the code shows.
    """
    global _in_tool
    request = {"tooldef": options["tooldef"], **(message.get("request") or {})}
    try:
        if not options["keep"]:
            _keeper.reap_all()  # zombies of the call before (the sweep killed them)
        limits = request.get("limits")  # the call's own; else the session's
        _cpu_limit(int(limits.get("cpu_s") or 0) if limits else options["cpu_s"])
        _packages.refresh()  # what the call before installed, importable now
        if request.get("kind") == "packages":  # install_packages: pip is tool code too
            _in_tool = True
            try:
                return _packages.install(request, options["session"].get("cwd") or os.getcwd())
            finally:
                _in_tool = False
        rich = request.get("kind") == "code"
        # Figures and display() only: outputs/ is the supervisor's to send.
        if rich:
            _kinds.artifact_sender(request, options["write_frame"], options["session"])
        _in_tool = True
        try:
            if request.get("kind") == "user":
                return _kinds.run_user_tool(request, options["write_frame"])
            if request.get("kind") == "command":  # relative to the workspace, not the cwd
                return _kinds.run_command(request, options["session"].get("cwd") or "/")
            # Code runs in the session's one namespace; a file, as `python FILE` would.
            return _kinds.run_script(request, main if request.get("kind") == "code" else None)
        finally:
            _in_tool = False
            sys.modules["__main__"] = main
            if rich:
                _kinds.end_artifacts(None, None, rich=True)
    except SystemExit as exc:
        return _frames.system_exit_frame(exc)
    except BaseException as exc:
        error = _frames.error(exc.with_traceback(_without_own_frames(exc.__traceback__)))
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
