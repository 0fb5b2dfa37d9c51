"""The runner: the stdlib-only program that waits inside every sandbox.

It is started ahead of demand by the daemon's pool, as
``python -I -B _runner.py --frames-fd N [--cgroup-fds A,B]`` (under bubblewrap
when the host allows), with these file descriptors:

    0  request pipe   the daemon writes one JSON line: what to run, and how
    1  stdout pipe    the tool's stdout, raw bytes
    2  stderr pipe    the tool's stderr, raw bytes
    N  frame pipe     JSON lines from the runner to the daemon (the protocol: below)
    A, B              the sandbox's cgroup.procs files, opened by the daemon

Two processes make one sandbox. The *keeper* (the process the daemon started)
marks itself a child subreaper, forks the *worker* and then only waits: every
process the tool leaves behind — daemonized, double-forked, setsid'd — is
re-parented to the keeper, which kills the whole tree once the worker is gone
or when the daemon sends it SIGTERM. The worker reads the request, applies the
limits and runs the tool in-process, so the call path starts no interpreter.

The zygote's sandboxes (see _zygote.py) have no keeper: the zygote forks the
worker itself (`run_worker`), reaps it, and sweeps the sandbox by killing its
pid 1, which takes every process in the sandbox's pid namespace with it.

The request, the frames and what the daemon accepts of them (it treats the
sandbox as hostile: tool code can write into the frame pipe too) are described
once, in the daemon's tooljaild/sandbox/runner_channel.py.

This file must stay importable and runnable with nothing but the standard
library of Python 3.11+: it runs in whatever interpreter the sandbox has. It is
one file of ~850 lines on purpose: it runs as a script under ``-I`` (no sibling
module is importable without changing sys.path), install_runner copies it into
every sandbox's view, and each module more is one more file found and read at
every sandbox start outside the zygote. (A session's supervisor and interpreter
are in _session.py, imported only when a session starts: `_serve_session`;
what calls send as artifacts is in _artifacts.py, loaded before the call.)
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import io
import json
import os
import resource
import signal
import sys
import time
import types
from collections.abc import Callable
from typing import Any

# traceback, importlib.util, inspect and asyncio are imported where they are
# needed: every sandbox in the pool pays for what is imported at start-up, and
# most calls never raise, load a module or run a coroutine.

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The largest frame written; the daemon refuses longer lines (runner_channel)."""
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4

_frame_fd = -1
_streams_made = False
# Made once here, in the zygote: valid_signals() builds an enum per signal (0.2 ms).
_ALL_SIGNALS = signal.valid_signals()


def _write_frame(frame: dict[str, Any]) -> None:
    # The leading newline ends any partial line that tool code wrote into the pipe.
    data = ("\n" + json.dumps(frame, default=str, ensure_ascii=False) + "\n").encode(
        "utf-8", "replace"
    )
    if len(data) > MAX_FRAME_BYTES:
        data = (
            json.dumps(
                {
                    "t": "result",
                    "ok": False,
                    "exit_code": 1,
                    "error": {
                        "type": "ResultTooLarge",
                        "message": f"the tool's value is {len(data)} bytes of JSON; "
                        f"at most {MAX_FRAME_BYTES} are accepted",
                        "traceback": "",
                    },
                    # Whose result it is (a session's call, its nonce), as the frame said.
                    **{key: frame[key] for key in ("seq", "n", "tag") if key in frame},
                }
            )
            + "\n"
        ).encode()
    view = memoryview(data)
    while view:
        try:
            n = os.write(_frame_fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # the daemon is gone or the tool closed the pipe: nobody to tell
        view = view[n:]


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


# Loaded once, at start-up (in the zygote, before any fork): not per sandbox.
_libc = _load_libc()


def _prctl(option: int, value: int) -> bool:
    if _libc is None:
        return False
    try:
        return int(_libc.prctl(option, value, 0, 0, 0)) == 0
    except AttributeError:
        return False


# --------------------------------------------------------------------------- keeper


def _descendants(root: int) -> list[int]:
    """Every live process below `root`, found by walking /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            found.append(pid)
            stack.append(pid)
    return found


def _kill_tree(me: int) -> None:
    """SIGKILL everything below the keeper until nothing is left.

    Stopping first keeps a fork loop from outrunning the sweep; because the
    keeper is a subreaper, whatever a killed process leaves re-parents here and
    is found by the next pass.
    """
    for _ in range(1000):
        pids = _descendants(me)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        _reap_all()
    _reap_all()


def _reap_all() -> list[tuple[int, int]]:
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


def _keeper(worker: int) -> None:
    me = os.getpid()
    # The keeper holds no pipe the tool writes through, so EOF on stdout and
    # stderr means the whole tree is gone.
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)

    stopping = False

    def on_term(signum: int, frame: types.FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status: int | None = None
    while status is None:
        try:
            pid, st = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            break
        if pid == worker:
            status = st
    # Sweep first, then report: when the caller hears how the call ended,
    # nothing the tool started is still running.
    _kill_tree(me)
    if status is None:
        _write_frame({"t": "exit", "code": None, "signal": int(signal.SIGKILL)})
    elif os.WIFSIGNALED(status):
        _write_frame({"t": "exit", "code": None, "signal": os.WTERMSIG(status)})
    else:
        _write_frame({"t": "exit", "code": os.WEXITSTATUS(status), "signal": None})
    os._exit(0)


# --------------------------------------------------------------------------- worker

_LIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "fsize_bytes": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
}


def _apply_limits(limits: dict[str, int]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in _LIMITS.items():
        value = limits.get(key)
        if not value:
            continue
        soft, hard = int(value), int(value)
        if which == resource.RLIMIT_CPU:
            hard = soft + 1  # SIGXCPU at the soft limit, SIGKILL one second later
        _, cur_hard = resource.getrlimit(which)
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(which, (soft, hard))


def _read_request() -> dict[str, Any]:
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    if not chunks:
        # The daemon closed the pipe without a request: the sandbox is discarded.
        os._exit(0)
    request: dict[str, Any] = json.loads(b"".join(chunks))
    return request


def _error(exc: BaseException) -> dict[str, Any]:
    """The exception as the tool's author should see it: without the runner's frames."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"type": type(exc).__name__, "message": str(exc), "traceback": text}


def _install_tooljail_shim(tooldef_path: str) -> None:
    """Let user tool modules `from tooljail import tool` without the real SDK.

    The SDK needs grpc and pydantic, which the sandbox interpreter may not
    have; the decorator itself is stdlib-only and is loaded from its file.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("tooljail._tooldef", tooldef_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {tooldef_path}")
    tooldef = importlib.util.module_from_spec(spec)
    sys.modules["tooljail._tooldef"] = tooldef
    spec.loader.exec_module(tooldef)
    shim = types.ModuleType("tooljail", "tooljail's tool decorator, as seen inside a sandbox")
    shim.tool = tooldef.tool  # type: ignore[attr-defined]
    shim._tooldef = tooldef  # type: ignore[attr-defined]
    shim.__path__ = []  # a package, so that `tooljail._tooldef` resolves
    sys.modules["tooljail"] = shim


def _load_module(path: str, name: str) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # Tool files may import helper modules that sit beside them.
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec.loader.exec_module(module)
    return module


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_script(request: dict[str, Any], main: types.ModuleType | None = None) -> dict[str, Any]:
    """Run code or a file as __main__, like `python -c` / `python FILE` would.

    Args:
        main: The namespace to run in (a session's, kept across calls); None: a fresh one.
    """
    kind = request["kind"]
    if main is None:
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        if kind == "code":
            sys.argv = ["-c"]
            code = compile(request["code"], "<code>", "exec")
            exec(code, main.__dict__)
        else:
            path = request["path"]
            sys.argv = [path, *request.get("args", [])]
            sys.path.insert(0, os.path.dirname(path))
            main.__dict__["__file__"] = path
            with open(path, "rb") as f:
                source = f.read()
            exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit as exc:
        exit_code = _exit_code_of(exc)
        if exit_code == 0:
            return {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
        return {
            "t": "result",
            "ok": False,
            "exit_code": exit_code,
            "error": {
                "type": "ExitCode",
                "message": f"the program exited with code {exit_code}",
                "traceback": "",
            },
        }
    except BaseException as exc:
        # Print the traceback as `python` would, so stderr reads the same.
        err = _error(exc)
        sys.stderr.write(err["traceback"])
        return {"t": "result", "ok": False, "exit_code": 1, "error": err}
    return {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}


def _jsonable(value: Any, depth: int = 0) -> Any:
    """The value as strict JSON data: what JSON cannot carry becomes text.

    NaN and the infinities become "NaN", "Infinity", "-Infinity" (strict JSON,
    which the wire uses, has no such numbers); tuples and sets become lists;
    other objects their str().
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if depth > 100:
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value]
    return str(value)


def _encode_value(value: Any) -> dict[str, Any]:
    """A user tool's return value for its result frame.

    None is "none" (the daemon says the tool had no output); JSON's own values
    (dicts, lists, tuples, numbers, bools) are "json" and reach the caller as
    that JSON; anything else is "text", its str().
    """
    if value is None:
        return {"kind": "none", "value": None}
    if isinstance(value, (dict, list, tuple, bool, int, float)):
        return {"kind": "json", "value": _jsonable(value)}
    return {"kind": "text", "value": str(value)}


def _run_user_tool(request: dict[str, Any]) -> dict[str, Any]:
    import inspect

    _install_tooljail_shim(request["tooldef"])
    module = _load_module(request["module_path"], "tooljail_user_tool")
    func = getattr(module, request["function"])
    args = request.get("args", {})
    sys.argv = [request["module_path"]]
    if inspect.isasyncgenfunction(func):
        import asyncio

        async def drain() -> None:
            async for item in func(**args):
                _write_frame({"t": "yield", "v": _jsonable(item)})

        asyncio.run(drain())
        value = None
    elif inspect.isgeneratorfunction(func):
        for item in func(**args):
            _write_frame({"t": "yield", "v": _jsonable(item)})
        value = None
    elif inspect.iscoroutinefunction(func):
        import asyncio

        value = asyncio.run(func(**args))
    else:
        value = func(**args)
    return {"t": "result", "ok": True, "exit_code": 0, **_encode_value(value)}


def _describe(request: dict[str, Any]) -> dict[str, Any]:
    _install_tooljail_shim(request["tooldef"])
    tooldef = sys.modules["tooljail._tooldef"]
    described = []
    for i, path in enumerate(request["files"]):
        entry: dict[str, Any] = {"file": path, "specs": [], "problems": [], "error": None}
        try:
            module = _load_module(path, f"tooljail_user_{i}")
            specs, problems = tooldef.collect_tools(module)
            entry["specs"], entry["problems"] = specs, problems
        except BaseException as exc:
            entry["error"] = _error(exc)
        described.append(entry)
    return {"t": "result", "ok": True, "exit_code": 0, "kind": "json", "value": described}


_HERE = os.path.dirname(os.path.abspath(__file__))
"""This file's directory, where _workspace.py is installed beside it."""


def _run_workspace(request: dict[str, Any]) -> dict[str, Any]:
    """A workspace file op (see _workspace.py) on the workspace, the request's cwd."""
    # Imported here: most sandboxes never run one. Under -I the script's own
    # directory is not on sys.path; the zygote's import of this file put it there.
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import _workspace  # type: ignore[import-not-found]  # beside this file

    try:
        value = _workspace.run(
            request["op"], request["args"], request["cwd"], request.get("quota_bytes", 0)
        )
    except _workspace.WorkspaceError as exc:
        error = {"type": exc.type, "message": exc.message, "traceback": ""}
        return {"t": "result", "ok": False, "exit_code": 1, "error": error}
    return {"t": "result", "ok": True, "kind": "json", "value": value, "exit_code": 0}


def _worker() -> None:
    os.setsid()
    global _frame_fd
    # Keep the frame pipe away from the low descriptors tool code is likely to
    # reuse, and out of programs it execs.
    inherited = _frame_fd
    _frame_fd = _fcntl_dup_high(inherited)
    os.close(inherited)
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    # The handlers tool code starts with, as under `python -c`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _warm()
    # Loaded now (a no-op in the zygote's workers), not on the call's path.
    _import_beside("_artifacts")
    _write_frame({"t": "ready", "worker": os.getpid(), "keeper": os.getppid()})

    request = _read_request()
    if request.get("kind") == "session":
        _serve_session(request)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    _apply_limits(request.get("limits", {}))
    workdir = request.get("cwd")
    if workdir:
        os.chdir(workdir)
    workspace = os.getcwd()  # outputs/ is where the call starts, wherever it goes
    os.environ.clear()
    os.environ.update(request.get("env", {}))

    kind = request.get("kind")
    sender = artifact_sender(request, _write_frame) if kind in CALL_KINDS else None
    try:
        if kind in ("code", "file"):
            frame = _run_script(request)
        elif kind == "user":
            frame = _run_user_tool(request)
        elif kind == "describe":
            frame = _describe(request)
        elif kind == "workspace":
            frame = _run_workspace(request)
        else:
            raise ValueError(f"unknown request kind {kind!r}")
    except SystemExit as exc:
        frame = _system_exit_frame(exc)
    except BaseException as exc:
        frame = {"t": "result", "ok": False, "exit_code": 1, "error": _error(exc)}
    if sender is not None:
        end_artifacts(sender, workspace, rich=kind == "code")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if request.get("seal") and _seal():
        frame["sealed"] = True
    frame["usage"] = _usage()
    _write_frame(frame)
    os._exit(int(frame.get("exit_code", 0)) & 0xFF)


def _usage() -> dict[str, float]:
    """What the worker and the children it waited for used, by rusage.

    The daemon prefers the sandbox's cgroup where it has one (it also counts
    processes nobody waited for); this is what a sandbox without one reports.
    A worker is a fresh fork, so its counters start at the call.
    """
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime
    # ru_maxrss is in KiB on Linux: the largest single process, not their sum.
    return {"cpu_s": cpu, "memory_peak_bytes": max(me.ru_maxrss, children.ru_maxrss) * 1024}


CALL_KINDS = ("code", "file", "user")
"""The request kinds that run tool code: their calls make artifacts."""


def _import_beside(name: str) -> types.ModuleType:
    """A runner module beside this file (under ``-I`` its directory is not on
    sys.path: it is put there for the import only; the zygote preloads them)."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, _HERE)
    try:
        return __import__(name)  # a top-level name: the module itself
    finally:
        sys.path.remove(_HERE)


def artifact_sender(
    request: dict[str, Any], write_frame: Callable[[dict[str, Any]], None], *more: dict[str, Any]
) -> Any:
    """The call's artifact sender (see _artifacts.py), with figures and
    ``display`` on for code calls.

    Args:
        request: The call's request (its "artifact_limits", its kind).
        write_frame: Where the artifact frames go.
        more: Requests to take the limits from when the call's has none (a session's).
    """
    artifacts = _import_beside("_artifacts")
    sender = artifacts.Sender(write_frame, *artifacts.limits_of(request, *more))
    if request.get("kind") == "code":
        artifacts.begin_rich(sender)
    return sender


def end_artifacts(sender: Any, workspace: str | None, *, rich: bool) -> None:
    """Send what the call made that is not sent yet: the figures it left open
    (when `rich`), then the files of outputs/ (when `workspace` is given).

    An error here is said on stderr; it never costs the call its result.
    """
    artifacts = sys.modules["_artifacts"]
    try:
        if rich:
            artifacts.end_rich()
        if workspace is not None:
            artifacts.send_outputs(sender, workspace)
    except Exception as exc:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"tooljail: artifacts were lost: {type(exc).__name__}: {exc}\n")


def _system_exit_frame(exc: SystemExit) -> dict[str, Any]:
    """The result of a tool (not a script) that called sys.exit()."""
    return {
        "t": "result",
        "ok": False,
        "exit_code": _exit_code_of(exc),
        "error": {
            "type": "SystemExit",
            "message": f"the tool called sys.exit({exc.code!r})",
            "traceback": "",
        },
    }


def _serve_session(request: dict[str, Any]) -> None:
    """Become a session's supervisor (see _session.py). Never returns.

    _session.py sits beside this file; under ``-I`` its directory is not on
    sys.path, so it is put there for the import only (the zygote imports
    _session at start: then this finds it loaded).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import _session  # type: ignore[import-not-found]  # beside this file
    finally:
        sys.path.remove(here)
    _session.serve(request, sys.modules[__name__])


def _seal() -> bool:
    """End the rest of the sandbox now, so that the result can be the last word.

    Without this, the daemon learns that a call is over from the keeper, after
    the worker has exited and the keeper has swept the tree: about a millisecond
    later. Here the worker does it itself, before it tells the result:

    - it blocks every signal (no handler of the tool's can run after this) and
      makes sure it is the only thread left (else: False, the keeper's way);
    - it closes every descriptor but the frame pipe, so the daemon's stdout and
      stderr pipes reach end-of-file once the others are dead;
    - it SIGKILLs every other process in the sandbox and waits until each is
      dead (a zombie for the keeper to reap).

    This needs a pid namespace of the sandbox's own, whose init is not this
    worker: the keeper as pid 1 (containers), or the zygote's sleeping pid 1
    with the worker's parent outside the namespace (where getppid() is 0).
    There, kill(-1) reaches exactly the tool's processes, and never pid 1 or
    anything outside. Elsewhere, False.

    Returns:
        True when nothing but this worker (about to exit) and pid 1 is alive.
    """
    if os.getpid() == 1 or os.getppid() not in (0, 1):
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, _ALL_SIGNALS)
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
        _, max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)
    except OSError:
        return False
    top = min(max_fds, 1 << 20) if max_fds != resource.RLIM_INFINITY else 1 << 20
    os.closerange(0, _frame_fd)
    os.closerange(_frame_fd + 1, top)
    for _ in range(2000):  # ~2 s at most; a process stuck in the kernel loses this race
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return True  # no other process at all
        except OSError:
            return False
        if not _others_alive():
            return True
        time.sleep(0.001)
    return False


def _others_alive() -> bool:
    """Whether a process other than pid 1 and this one is alive (zombies are not)."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in ("1", me):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone already
        if stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X"):
            return True
    return False


def _warm() -> None:
    """Walk the call's path once, on a dummy request, before the call comes.

    The worker is a fork: every memory page it writes to is copied then, at a
    page fault each (expensive on small VMs). Touching the objects the call path
    uses now moves those copies from the call to the pool's refill.
    """
    request = json.loads(_WARM_REQUEST)
    for which in _LIMITS.values():
        resource.getrlimit(which)
    # The environment is replaced by the request's anyway: clear it now.
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.clear()
    main = types.ModuleType("__main__")
    exec(compile(request["code"], "<code>", "exec"), main.__dict__)
    text = json.dumps(
        {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0},
        default=str,
        ensure_ascii=False,
    )
    ("\n" + text + "\n").encode("utf-8", "replace")


_WARM_REQUEST = json.dumps(
    {
        "kind": "code",
        "code": "x = [1]\nx.append(len(x))",
        "limits": {"cpu_s": 1},
        "cwd": "/",
        "env": {"PATH": "/usr/bin", "LANG": "C.UTF-8"},
        "seal": True,
    }
)


def _fcntl_dup_high(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64)


def run_sandbox(
    frames_fd: int,
    cgroup_fds: list[int],
    *,
    keeper_setup: Callable[[], None] | None = None,
) -> None:
    """Become a sandbox's keeper, with a worker waiting for its request. Never returns.

    Args:
        frames_fd: Where frames go (stdin, stdout and stderr are already the pipes).
        cgroup_fds: The sandbox's cgroup.procs files, opened by the daemon.
        keeper_setup: Run by the keeper once the worker is forked.
    """
    global _frame_fd
    _frame_fd = frames_fd
    # Join the sandbox's cgroups before forking, so the worker and all it starts
    # are counted. The daemon opened their cgroup.procs files; writing "0" moves
    # the writer itself, which works from inside pid and user namespaces too.
    for fd in cgroup_fds:
        os.write(fd, b"0")
        os.close(fd)
    if os.getpid() != 1:  # pid 1 of a pid namespace inherits every orphan anyway
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid = os.fork()
    if pid == 0:
        _be_worker(None)
    if keeper_setup is not None:
        keeper_setup()
    os.close(0)
    _keeper(pid)
    os._exit(0)


def run_worker(frames_fd: int, setup: Callable[[], None]) -> None:
    """Be a sandbox's worker, with no keeper: the zygote's sandboxes. Never returns.

    There the zygote is the worker's parent (it reaps it and sweeps the sandbox
    by killing its pid 1), so nothing needs a keeper process.

    Args:
        frames_fd: Where frames go.
        setup: Run first (descriptors, namespaces, mounts, filters): when it
            raises, the worker reports it on stderr and exits 111.
    """
    global _frame_fd
    _frame_fd = frames_fd
    _be_worker(setup)


def _be_worker(setup: Callable[[], None] | None) -> None:
    """Set up (if asked), then wait for the request and run it. Never returns."""
    if setup is not None:
        try:
            setup()
        except BaseException as exc:  # nothing of a failed setup may run a tool
            os.write(2, f"sandbox setup failed: {exc}\n".encode())
            os._exit(111)
    if not _streams_made:
        _text_streams()
    _worker()
    os._exit(0)


def _text_streams() -> None:
    """Text streams that flush at each newline, so streamed lines arrive as printed.

    They write to descriptors 1 and 2, whatever those are when they write: the
    zygote makes them once, for every worker it forks.
    """
    global _streams_made
    _streams_made = True
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _shield_keeper() -> None:
    """Keep the worker, same uid and no capabilities either, out of the keeper.

    A process that is not dumpable cannot be ptraced, nor its memory,
    environment or descriptors opened through /proc, by one without
    CAP_SYS_PTRACE: tool code cannot take over the process that outlives it.
    (A zygote sandbox has no keeper; its pid 1 keeps capabilities the worker
    lacks, which shields it the same way.)
    """
    if not _prctl(PR_SET_DUMPABLE, 0):
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> None:
    argv = sys.argv[1:]
    options = dict(zip(argv[::2], argv[1::2], strict=False))
    if "--connect" in options:
        connect_sandbox(options["--connect"])
    cgroup_fds = [int(fd) for fd in options.get("--cgroup-fds", "").split(",") if fd]
    run_sandbox(int(options["--frames-fd"]), cgroup_fds, keeper_setup=_shield_keeper)


def connect_sandbox(path: str, timeout_s: float = 60.0) -> None:
    """Fetch the sandbox's pipes from the daemon over a Unix socket, then run_sandbox.

    The start mode for containers (``_runner.py --connect PATH``), which cannot
    inherit descriptors from the daemon: the daemon listens on PATH (a socket in
    a directory bind-mounted into the container) before the container starts,
    and answers the one connection with four descriptors (SCM_RIGHTS), in this
    order: the request pipe's read end, the stdout and stderr pipes' write ends
    and the frame pipe's write end. They become descriptors 0, 1, 2 and the
    frame descriptor, exactly as a runner the daemon spawned would have them;
    from there on nothing differs. Never returns.
    """
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        _, fds, _, _ = socket.recv_fds(sock, 16, 4, socket.MSG_CMSG_CLOEXEC)
    if len(fds) != 4:
        raise SystemExit(f"tooljail runner: expected 4 descriptors from {path}, got {len(fds)}")
    # Above every standard descriptor first, so that no dup2 below overwrites
    # a received one that happens to sit at 0, 1 or 2.
    high = [_fcntl_dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for target, fd in enumerate(high[:3]):
        os.dup2(fd, target)
        os.close(fd)
    run_sandbox(high[3], [], keeper_setup=_shield_keeper)


if __name__ == "__main__":
    main()
