"""The kinds of request a sandbox's worker runs, each to its result frame.

- "code" and "file": a script as ``__main__``, as ``python -c`` / ``python
  FILE`` would run it (`run_script`; a session's interpreter runs code in its
  one namespace);
- "user": a function of a user tool module, its return value or what it
  yields (`run_user_tool`);
- "describe": the tools a user tool module declares (`describe`; the daemon's
  loader asks it, so that no user module is imported in the daemon);
- "workspace": a workspace file operation (`run_workspace`, see _workspace.py);
- "command": a command line under ``bash -lc`` (``sh -c`` where the sandbox
  has no bash) or a plain argv (`run_command`), its output straight to the
  call's own stdout and stderr.

The calls that run tool code (`CALL_KINDS`) send what they make as artifacts
(`artifact_sender`, `end_artifacts`, see _artifacts.py). A session's
interpreter runs "code", "file" and "user" through these same functions,
with a frame writer of the call's own.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import sys
import types
from collections.abc import Callable
from typing import Any

try:  # the daemon's view (mypy): tooljaild.runner._kinds
    from . import _frames
except ImportError:  # a sandbox: a top-level module; _runner.py imported _frames first
    import _frames  # type: ignore[import-not-found, no-redef]

# importlib.util, inspect and asyncio are imported where they are needed:
# every sandbox in the pool pays for what is imported at start-up, and most
# calls never load a module or run a coroutine.

_frames.OWN_FILES.add(__file__)

WriteFrame = Callable[[dict[str, Any]], None]

CALL_KINDS = ("code", "file", "user", "command")
"""The request kinds that run tool code: their calls make artifacts."""

_HERE = os.path.dirname(os.path.abspath(__file__))
"""This file's directory, where the other runner modules are installed beside it."""


def run(request: dict[str, Any], write_frame: WriteFrame) -> dict[str, Any]:
    """Run a worker's request of any kind; its result frame.

    Args:
        request: The request line, read.
        write_frame: Where a user tool's yields go.

    Raises:
        ValueError: The request is of no kind known here.
        BaseException: Whatever the tool raised outside a script (a script's
            own exceptions are in its result frame).
    """
    kind = request.get("kind")
    if kind in ("code", "file"):
        return run_script(request)
    if kind == "user":
        return run_user_tool(request, write_frame)
    if kind == "describe":
        return describe(request)
    if kind == "workspace":
        return run_workspace(request)
    if kind == "command":
        return run_command(request, os.getcwd())
    raise ValueError(f"unknown request kind {kind!r}")


def run_script(request: dict[str, Any], main: types.ModuleType | None = None) -> dict[str, Any]:
    """Run code or a file as __main__, like `python -c` / `python FILE` would.

    Args:
        main: The namespace to run in (a session's, kept across calls); None: a fresh one.
    """
    kind = request["kind"]
    if main is None:
        main = types.ModuleType("__main__")
        # The builtins module, as `python -c` gives __main__ (not its dict).
        main.__dict__["__builtins__"] = builtins
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
        exit_code = _frames.exit_code_of(exc)
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
        err = _frames.error(exc)
        sys.stderr.write(err["traceback"])
        return {"t": "result", "ok": False, "exit_code": 1, "error": err}
    return {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}


def run_user_tool(request: dict[str, Any], write_frame: WriteFrame) -> dict[str, Any]:
    """Call a user tool's function with the request's arguments; its result frame.

    Args:
        request: The "user" request (tooldef, module_path, function, args).
        write_frame: Where what a generator tool yields goes, frame by frame.
    """
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
                write_frame({"t": "yield", "v": _frames.jsonable(item)})

        asyncio.run(drain())
        value = None
    elif inspect.isgeneratorfunction(func):
        for item in func(**args):
            write_frame({"t": "yield", "v": _frames.jsonable(item)})
        value = None
    elif inspect.iscoroutinefunction(func):
        import asyncio

        value = asyncio.run(func(**args))
    else:
        value = func(**args)
    return {"t": "result", "ok": True, "exit_code": 0, **_frames.encode_value(value)}


def describe(request: dict[str, Any]) -> dict[str, Any]:
    """The tools each of the request's files declares, and their problems."""
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
            entry["error"] = _frames.error(exc)
        described.append(entry)
    return {"t": "result", "ok": True, "exit_code": 0, "kind": "json", "value": described}


def run_workspace(request: dict[str, Any]) -> dict[str, Any]:
    """A workspace file op (see _workspace.py) on the workspace, the request's cwd."""
    # Imported here: most sandboxes never run one. Under -I the script's own
    # directory is not on sys.path; the zygote's import of the runner put it there.
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


SHELLS = ("/bin/bash", "/usr/bin/bash")
"""Where bash is looked for; without it a command line runs under /bin/sh."""

_DEFAULT_SIGNALS = ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGQUIT", "SIGTERM", "SIGHUP")
"""Signals a command starts with at their default action, whatever the runner
(Python ignores SIGPIPE) or the tool code before it did with them."""


def shell() -> str:
    """The shell a command line runs under: bash where the sandbox has it, else sh."""
    for path in SHELLS:
        if os.access(path, os.X_OK):
            return path
    return "/bin/sh"


def run_command(request: dict[str, Any], root: str) -> dict[str, Any]:
    """Run a command (kind "command"); its result frame, its exit code the program's.

    The program writes straight to descriptors 1 and 2, the call's output pipes:
    nothing is copied here. It is waited for; a KeyboardInterrupt (a session's
    timeout) kills it first (the supervisor has killed the call's processes by
    then; this is for one that outran it).

    Args:
        request: "command" (a command line, run as ``bash -lc COMMAND``) or
            "argv" (a plain argv, no shell); "dir" (its working directory,
            relative to `root`; "": `root`); "vars" (environment variables
            added); "stdin" (text on its stdin; absent: /dev/null).
        root: The sandbox's working directory (a session's workspace).
    """
    argv = request.get("argv")
    if not argv:
        sh = shell()
        argv = [sh, "-lc" if sh.endswith("bash") else "-c", str(request.get("command") or "")]
    argv = [str(arg) for arg in argv]
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (request.get("vars") or {}).items()})
    directory = os.path.join(root, str(request.get("dir") or ""))
    stdin = request.get("stdin")
    actions: list[tuple[Any, ...]] = []
    write_end = -1
    if stdin is None:
        actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
    else:
        read_end, write_end = os.pipe()  # close-on-exec, both: dup2 clears it on 0
        actions += [(os.POSIX_SPAWN_DUP2, read_end, 0)]
    import signal

    defaults = [getattr(signal, name) for name in _DEFAULT_SIGNALS]
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # posix_spawn has no chdir (3.11): the spawner moves there for the spawn.
        try:
            os.chdir(directory)
        except OSError as exc:
            if write_end >= 0:
                os.close(read_end)
                os.close(write_end)
            return _not_run(
                "NotADirectory", f"cannot run in {request.get('dir')!r}: {exc.strerror}"
            )
        try:
            pid = os.posix_spawnp(
                argv[0], argv, env, file_actions=actions, setsigdef=defaults, setsigmask=()
            )
        except OSError as exc:
            type_ = "CommandNotFound" if exc.errno == errno.ENOENT else "SpawnError"
            return _not_run(type_, f"cannot run {argv[0]!r}: {exc.strerror}")
        finally:
            if write_end >= 0:
                os.close(read_end)
    finally:
        os.fchdir(here)
        os.close(here)
    try:
        if write_end >= 0:
            _feed(write_end, str(stdin).encode("utf-8"))
        _, status = os.waitpid(pid, 0)
    except BaseException:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
        raise
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return {"t": "result", "ok": True, "kind": "none", "value": None, "exit_code": 0}
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else ""
        message = f"the command was killed by signal {-code} {name}".rstrip()
        return {
            "t": "result",
            "ok": False,
            "exit_code": 128 - code,
            # "ExitCode": the daemon reads it as a program that ended by itself.
            "error": {"type": "ExitCode", "message": message, "traceback": ""},
        }
    error = {"type": "ExitCode", "message": f"the command exited with code {code}", "traceback": ""}
    return {"t": "result", "ok": False, "exit_code": code, "error": error}


def _not_run(type_: str, message: str) -> dict[str, Any]:
    """The result of a command that could not start, said on stderr too (as a
    shell would say it: a model reads stderr first)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"run_command: {message}\n")
        sys.stderr.flush()
    error = {"type": type_, "message": message, "traceback": ""}
    return {"t": "result", "ok": False, "exit_code": 127, "error": error}


def _feed(fd: int, data: bytes) -> None:
    """Write `data` to the command's stdin and close it; a command that exits
    without reading it all just does not get the rest."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


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


# --------------------------------------------------------------------------- artifacts


def import_beside(name: str) -> types.ModuleType:
    """A runner module beside this file (under ``-I`` its directory is not on
    sys.path: it is put there for the import only; the zygote preloads them)."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, _HERE)
    try:
        return __import__(name)  # a top-level name: the module itself
    finally:
        sys.path.remove(_HERE)


def artifact_sender(request: dict[str, Any], write_frame: WriteFrame, *more: dict[str, Any]) -> Any:
    """The call's artifact sender (see _artifacts.py), with figures and
    ``display`` on for code calls.

    Args:
        request: The call's request (its "artifact_limits", its kind).
        write_frame: Where the artifact frames go.
        more: Requests to take the limits from when the call's has none (a session's).
    """
    artifacts = import_beside("_artifacts")
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
