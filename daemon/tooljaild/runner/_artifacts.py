"""Artifacts made by a call, on the sandbox's side: sent to the daemon as frames.

Three sources, in the order a call makes them (see the daemon's
runner_channel.py for the frame and what the daemon accepts of it):

- "figure": matplotlib figures the code shows (``plt.show()``, through the
  backend in _tooljail_mpl.py) or leaves open, as PNG: figure-1.png, ...;
- "display": objects given to ``display(obj)`` (IPython's name, a builtin in
  code calls) that can render themselves as an image: display-1.png, ...;
- "outputs": the regular files under ``outputs/`` of the call's workspace
  (``/workspace/outputs`` under namespaces; else ``outputs/`` beside the
  workspace's other files), sent when the call ends, in name order (a
  directory's files where its name falls), named ``outputs/<path below it>``;
  symlinks are not followed, directories deeper than 32 levels not walked.
  In a session, only those written or changed during the call (mtime or size
  differ from the snapshot taken at its start).

Each artifact goes out as frames ``{"t": "artifact", "name", "mime_type",
"source", "data_b64", "part", "last"}`` of at most 4 MiB of data each, its
parts consecutive, all before the call's result frame. Bounds (the request's
"artifact_limits": {"max_count", "max_bytes"}; else 64 and 1 GiB): past them
an artifact is skipped, and each skip is said once on stderr.

Symlinks under outputs/ are never followed (under bubblewrap they would lead
to the sandbox's own files; elsewhere to the host's): they, and files that
are not regular (FIFOs, sockets, devices), are skipped.

stdlib only, as _runner.py: it runs in whatever interpreter the sandbox has.
"""

from __future__ import annotations

# binascii, not base64: base64 also loads struct, ~2x the start-up cost here.
import binascii
import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from typing import Any

PART_BYTES = 4 * 1024 * 1024
"""Data per artifact frame: base64 makes it ~5.6 MB, under the 16 MiB line bound."""
DEFAULT_MAX_COUNT = 64
DEFAULT_MAX_BYTES = 1 << 30
OUTPUTS = "outputs"
"""The outputs directory, relative to the workspace (the call's cwd at its start)."""

Snapshot = dict[str, tuple[int, int]]
"""Relative path under outputs/ -> (mtime in ns, size)."""


def limits_of(*requests: dict[str, Any]) -> tuple[int, int]:
    """(max_count, max_bytes) from the first request that carries "artifact_limits"."""
    for request in requests:
        limits = request.get("artifact_limits")
        if isinstance(limits, dict):
            count = limits.get("max_count", DEFAULT_MAX_COUNT)
            size = limits.get("max_bytes", DEFAULT_MAX_BYTES)
            return int(count), int(size)
    return DEFAULT_MAX_COUNT, DEFAULT_MAX_BYTES


def say(message: str) -> None:
    """Tell the call's stderr why something is not kept."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"tooljail: {message}\n")
        sys.stderr.flush()


class Sender:
    """Sends one call's artifacts as frames, within the call's bounds.

    Args:
        write_frame: Writes one frame (a dict) to the daemon (or, in a
            session's interpreter, to its supervisor).
        max_count: Artifacts the call may make, all sources together.
        max_bytes: The largest artifact sent.
        sent: Artifacts the call has made already (a session's supervisor
            counts the interpreter's).
    """

    def __init__(
        self,
        write_frame: Callable[[dict[str, Any]], None],
        max_count: int = DEFAULT_MAX_COUNT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        sent: int = 0,
    ) -> None:
        self.write_frame = write_frame
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.sent = sent
        self.numbers: dict[str, int] = {}

    def next_name(self, source: str, extension: str) -> str:
        """figure-1.png, figure-2.png, display-1.svg...: numbered per source."""
        n = self.numbers.get(source, 0) + 1
        self.numbers[source] = n
        return f"{source}-{n}{extension}"

    def admit(self, name: str, size: int) -> bool:
        """Whether an artifact of `size` bytes fits the bounds; says why not."""
        if self.sent >= self.max_count:
            say(f"{name} is not kept: a call makes at most {self.max_count} artifacts")
            return False
        if size > self.max_bytes:
            say(f"{name} is not kept: {size} bytes, more than {self.max_bytes}")
            return False
        return True

    def send(self, name: str, mime_type: str, source: str, data: bytes) -> bool:
        """Send an artifact held in memory; False when the bounds skip it."""
        if not self.admit(name, len(data)):
            return False
        self._frames(name, mime_type, source, _slices(data))
        return True

    def send_file(self, name: str, mime_type: str, fd: int, size: int) -> bool:
        """Send an open regular file's content (read from its start, at most
        `size` bytes, its size when opened: a file that grows meanwhile is cut)."""
        if not self.admit(name, size):
            return False
        self._frames(name, mime_type, OUTPUTS, _read_parts(fd, size))
        return True

    def _frames(self, name: str, mime_type: str, source: str, parts: Iterator[bytes]) -> None:
        self.sent += 1
        part = 0
        current = next(parts, b"")
        while True:
            following = next(parts, None)  # one ahead: the last part says it is last
            self.write_frame(
                {
                    "t": "artifact",
                    "name": name,
                    "mime_type": mime_type,
                    "source": source,
                    "data_b64": binascii.b2a_base64(current, newline=False).decode("ascii"),
                    "part": part,
                    "last": following is None,
                }
            )
            if following is None:
                return
            current, part = following, part + 1


def _slices(data: bytes) -> Iterator[bytes]:
    for start in range(0, len(data), PART_BYTES):
        yield data[start : start + PART_BYTES]


def _read_parts(fd: int, size: int) -> Iterator[bytes]:
    left = size
    while left > 0:
        chunk = os.read(fd, min(PART_BYTES, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


# --------------------------------------------------------------------------- outputs/

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the walk looked must not block the open.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


MAX_DEPTH = 32
"""Directories below outputs/ walked; deeper ones are skipped (and said)."""


def _walk(
    dir_fd: int, prefix: str, found: Snapshot, say: Callable[[str], None], depth: int = 0
) -> None:
    """Regular files below `dir_fd` into `found` (path relative to outputs/ ->
    (mtime_ns, size)), in their paths' order; what is skipped is said.

    Every step is relative to its directory's descriptor and never follows a
    symlink, so one swapped in while the walk runs is not followed either.
    """
    with os.scandir(dir_fd) as entries:
        named = sorted((entry.name, entry) for entry in entries)
    for name, entry in named:
        path = prefix + name
        try:
            if entry.is_symlink():
                say(f"{OUTPUTS}/{path} is a symlink: not followed, not kept")
            elif entry.is_dir(follow_symlinks=False):
                if depth >= MAX_DEPTH:
                    say(f"{OUTPUTS}/{path} is more than {MAX_DEPTH} directories deep: not kept")
                    continue
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    _walk(sub, path + "/", found, say, depth + 1)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                found[path] = (st.st_mtime_ns, st.st_size)
            else:
                say(f"{OUTPUTS}/{path} is not a regular file: not kept")
        except OSError as exc:
            say(f"{OUTPUTS}/{path} cannot be read ({exc.strerror}): not kept")


def _open_below(root: int, path: str) -> int:
    """Open the regular file `path` (relative to the directory `root`) without
    following a symlink at any step (O_NOFOLLOW alone guards only the last)."""
    parts = path.split("/")
    fd = root
    try:
        for part in parts[:-1]:
            below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != root:
                os.close(fd)
            fd = below
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        if fd != root:
            os.close(fd)


def _open_outputs(workspace: str) -> int:
    """outputs/ of `workspace`, opened without following a symlink; -1 if none."""
    try:
        return os.open(os.path.join(workspace, OUTPUTS), _DIR_FLAGS)
    except OSError:
        return -1  # none (or a symlink, or a file): nothing to send


def _stat_all(workspace: str, say: Callable[[str], None]) -> tuple[int, Snapshot]:
    """(outputs/'s descriptor, its regular files' (mtime_ns, size)); (-1, {}) if none."""
    root = _open_outputs(workspace)
    if root < 0:
        return -1, {}
    found: Snapshot = {}
    try:
        _walk(root, "", found, say)
    except Exception:
        os.close(root)
        raise
    return root, found


def snapshot(workspace: str) -> Snapshot:
    """What outputs/ of `workspace` holds now (a session's call compares with it).

    Says nothing on stderr: what is skipped is said when the call ends.
    """
    try:
        root, held = _stat_all(workspace, say=_silent)
    except Exception:  # unreadable: then every file there counts as the call's
        return {}
    if root >= 0:
        os.close(root)
    return held


def _silent(message: str) -> None:
    """Where the snapshot's skips go: nowhere."""


def send_outputs(sender: Sender, workspace: str, before: Snapshot | None = None) -> None:
    """Send the files of outputs/ of `workspace` as artifacts, in their paths' order.

    Args:
        sender: The call's sender (its bounds and its count so far).
        workspace: The workspace directory (the call's cwd at its start).
        before: A session call's snapshot from its start: only files new or
            changed since are sent. None: every file.
    """
    root, now = _stat_all(workspace, say=say)
    if root < 0:
        return
    try:
        import mimetypes

        for path, (mtime_ns, size) in now.items():
            if before is not None and before.get(path) == (mtime_ns, size):
                continue
            name = f"{OUTPUTS}/{path}"
            try:
                fd = _open_below(root, path)
            except OSError as exc:
                say(f"{name} cannot be read ({exc.strerror}): not kept")
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    say(f"{name} is not a regular file: not kept")
                    continue
                mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
                sender.send_file(name, mime, fd, st.st_size)
            finally:
                os.close(fd)
    finally:
        os.close(root)


# --------------------------------------------------------------------------- rich outputs

_sender: Sender | None = None
"""The running call's sender in the tool's process (figures and displays)."""


def begin_rich(sender: Sender) -> None:
    """Make figures and display() of the call that starts go to `sender`.

    The runner calls it before a code call runs: matplotlib, when the code
    imports it, gets our backend (_tooljail_mpl) unless MPLBACKEND names one,
    and ``display`` becomes a builtin.
    """
    global _sender
    _sender = sender
    import builtins

    builtins.display = display  # type: ignore[attr-defined]
    sys.modules.setdefault("_artifacts", sys.modules[__name__])
    if not any(isinstance(finder, _MatplotlibHook) for finder in sys.meta_path):
        import importlib.util  # noqa: F401  # now, not inside the hook's first lookup

        sys.meta_path.insert(0, _MatplotlibHook())


def end_rich() -> None:
    """Send the figures the call left open (then closed), and stop sending."""
    global _sender
    pyplot = sys.modules.get("matplotlib.pyplot")
    try:
        if pyplot is not None and _sender is not None:
            send_open_figures(pyplot)
    except Exception as exc:  # a broken figure must not lose the call's result
        say(f"the open figures could not be sent: {type(exc).__name__}: {exc}")
    finally:
        _sender = None
        import builtins

        # A session's next call may run a file or a user tool: no display() there.
        if getattr(builtins, "display", None) is display:
            del builtins.display  # type: ignore[attr-defined]


def send_open_figures(pyplot: Any) -> None:
    """Render every open figure to PNG, send it (source "figure"), close it."""
    for number in list(pyplot.get_fignums()):
        figure = pyplot.figure(number)
        try:
            _send_image(figure_png(figure), "image/png", "figure", ".png")
        finally:
            pyplot.close(figure)


def figure_png(figure: Any) -> bytes:
    """A matplotlib Figure as PNG bytes, drawn by the Agg canvas."""
    import io

    from matplotlib.backends.backend_agg import (  # type: ignore[import-not-found,unused-ignore]
        FigureCanvasAgg,
    )

    canvas = FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return buffer.getvalue()


def _send_image(data: bytes | str, mime_type: str, source: str, extension: str) -> None:
    if _sender is None:
        return
    if isinstance(data, str):
        data = data.encode("utf-8")
    _sender.send(_sender.next_name(source, extension), mime_type, source, data)


_REPRS = (
    ("_repr_png_", "image/png", ".png"),
    ("_repr_svg_", "image/svg+xml", ".svg"),
    ("_repr_jpeg_", "image/jpeg", ".jpg"),
)


def display(*objs: Any, **kwargs: Any) -> None:
    """Show objects as IPython's ``display`` does, as artifacts (source "display").

    A matplotlib Figure becomes a PNG; an object with ``_repr_png_``,
    ``_repr_svg_`` or ``_repr_jpeg_`` (PIL images have ``_repr_png_``) the
    first of those that answers; any other object is printed (its repr).
    Keyword arguments of IPython's (``include``, ``metadata``...) are ignored.
    """
    for obj in objs:
        if type(obj).__name__ == "Figure" and type(obj).__module__.startswith("matplotlib"):
            _send_image(figure_png(obj), "image/png", "display", ".png")
            continue
        for method, mime_type, extension in _REPRS:
            render = getattr(obj, method, None)
            data = render() if callable(render) else None
            if isinstance(data, tuple):  # (data, metadata), as IPython allows
                data = data[0]
            if isinstance(data, (bytes, str)) and data:
                if mime_type != "image/svg+xml" and isinstance(data, str):
                    data = binascii.a2b_base64(data)  # IPython's reprs may be base64 text
                _send_image(data, mime_type, "display", extension)
                break
        else:
            print(repr(obj))


class _MatplotlibHook:
    """Gives matplotlib our backend when tool code imports it, and finds that backend.

    MPLBACKEND is set only while matplotlib itself is imported (it reads the
    variable then), not for the call's whole life: a program the code starts
    would inherit it, and its matplotlib could not import our module.
    """

    armed = True
    """False while it looks for the real matplotlib itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        # Every import of the call asks here first: only two names are ours.
        if name not in ("_tooljail_mpl", "matplotlib"):
            return None
        import importlib.util  # (loaded by begin_rich: this import asks no finder)

        if name == "_tooljail_mpl":  # our backend, beside this file (not on sys.path)
            here = os.path.dirname(os.path.abspath(__file__))
            return importlib.util.spec_from_file_location(name, f"{here}/_tooljail_mpl.py")
        if name != "matplotlib" or not self.armed:
            return None
        self.armed = False  # find the real one below, without coming back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.armed = True
        if spec is None or spec.loader is None or os.environ.get("MPLBACKEND"):
            return spec
        # (Duck-typed: importlib.abc, for the base class, is one more module to load.)
        spec.loader = _WithBackend(spec.loader)  # type: ignore[assignment]
        return spec


class _WithBackend:
    """matplotlib's own loader, run with MPLBACKEND naming our backend."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        os.environ["MPLBACKEND"] = "module://_tooljail_mpl"
        try:
            self.loader.exec_module(module)
        finally:
            os.environ.pop("MPLBACKEND", None)
