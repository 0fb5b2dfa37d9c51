"""Artifacts made by calls, on the sandbox's side: the frames the runner writes.

The daemon's side that accepts "artifact" frames is tested on its own (with
hand-made frames); here a real runner process (``python -I -B _runner.py``,
as the process backend starts it, without namespaces) gets a request on its
pipe, and the frames it writes are read raw from the frame pipe: the files of
outputs/, matplotlib's figures (a fake matplotlib, and the real one in a
virtualenv built once per run) and display(), in order, within their bounds,
in fresh sandboxes and in sessions.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_process_sandbox import NAMESPACES, build, run
from tooljail import StreamKind
from tooljaild.sandbox.frames import CallFrames
from tooljaild.sandbox.isolation import install_runner

Frame = dict[str, Any]

FAKE_MATPLOTLIB = {
    "__init__.py": """
        import os
        # As the real one: the backend named in the environment when it is imported.
        backend = os.environ.get("MPLBACKEND", "agg")
        def get_backend():
            return backend
    """,
    "backends/__init__.py": "",
    "backends/backend_agg.py": """
        class FigureCanvasAgg:
            def __init__(self, figure):
                self.figure = figure
            def print_png(self, out):
                out.write(b"\\x89PNG fake " + self.figure.label.encode())
    """,
    "pyplot.py": """
        import importlib
        import matplotlib

        class Figure:
            def __init__(self, label):
                self.label = label

        _open = {}

        def figure(num=None, label=""):
            if num in _open:
                return _open[num]
            num = max(_open, default=0) + 1
            _open[num] = Figure(label or f"fig{num}")
            return _open[num]

        def get_fignums():
            return sorted(_open)

        def close(fig):
            for num, held in list(_open.items()):
                if held is fig:
                    del _open[num]

        def show():
            name = matplotlib.get_backend()
            if name.startswith("module://"):
                importlib.import_module(name[len("module://"):]).show()
    """,
}


class Runner:
    """A runner process without namespaces, its pipes held by the test."""

    def __init__(self, runner_dir: Path, workspace: Path, python: str) -> None:
        self.workspace = workspace
        request_r, self.request_w = os.pipe()
        self.frames_r, frames_w = os.pipe()
        self.proc = subprocess.Popen(
            [python, "-I", "-B", str(runner_dir / "_runner.py"), "--frames-fd", str(frames_w)],
            stdin=request_r,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(frames_w,),
        )
        os.close(request_r)
        os.close(frames_w)
        self.held = b""
        self.out: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.readers = [
            threading.Thread(target=self._drain, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for reader in self.readers:
            reader.start()

    def _drain(self, name: str, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            self.out[name] += chunk

    def send(self, line: Frame) -> None:
        os.write(self.request_w, (json.dumps(line) + "\n").encode())

    def frame(self, timeout_s: float = 30) -> Frame | None:
        """The next frame; None at the end of the pipe."""
        while b"\n" not in self.held.lstrip(b"\n"):
            ready, _, _ = select.select([self.frames_r], [], [], timeout_s)
            assert ready, "the runner wrote no frame in time"
            data = os.read(self.frames_r, 1 << 20)
            if not data:
                return None
            self.held += data
        line, _, self.held = self.held.lstrip(b"\n").partition(b"\n")
        frame: Frame = json.loads(line)
        return frame

    def until(self, stop: str, seq: int | None = None) -> list[Frame]:
        """Frames up to and with the first of type `stop` (of call `seq`, if given)."""
        frames = []
        while (frame := self.frame()) is not None:
            frames.append(frame)
            if frame["t"] == stop and (seq is None or frame.get("seq") == seq):
                return frames
        raise AssertionError(f"the frames ended before a {stop!r}: {frames}")

    def close(self) -> str:
        """End the runner (once); its stderr."""
        if self.proc.stdout is None or self.proc.stdout.closed:
            return self.out["stderr"].decode()
        os.close(self.request_w)
        try:
            self.proc.wait(30)
        finally:
            self.proc.kill()
            for reader in self.readers:
                reader.join(10)
            os.close(self.frames_r)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream is not None:
                    stream.close()
        return self.out["stderr"].decode()


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        state.mkdir()
        self.runner_dir = install_runner(state)
        self.workspace = tmp_path / "ws"
        self.workspace.mkdir()
        self.python = sys.executable
        self.runners: list[Runner] = []

    def start(self) -> Runner:
        runner = Runner(self.runner_dir, self.workspace, self.python)
        self.runners.append(runner)
        assert runner.frame() is not None  # "ready"
        return runner

    def request(self, code: str, **more: Any) -> Frame:
        return {
            "kind": "code",
            "code": textwrap.dedent(code),
            "cwd": str(self.workspace),
            "env": {"PATH": "/usr/bin:/bin"},
            "limits": {},
            **more,
        }

    def call(self, code: str, **more: Any) -> tuple[list[Frame], str]:
        """A code call in a fresh sandbox: its frames (ready and exit left out), stderr."""
        runner = self.start()
        runner.send(self.request(code, **more))
        frames = runner.until("exit")
        return frames[:-1], runner.close()

    def session(self) -> Session:
        runner = self.start()
        runner.send(
            {
                "kind": "session",
                "cwd": str(self.workspace),
                "env": {"PATH": "/usr/bin:/bin"},
                "limits": {},
                "keep_processes": False,
                "quota_bytes": 0,
                "tooldef": str(self.runner_dir / "_tooldef.py"),
            }
        )
        assert runner.until("session")
        return Session(self, runner)

    def fake_matplotlib(self) -> str:
        """A fake matplotlib package in the workspace; code to put it on sys.path."""
        for name, text in FAKE_MATPLOTLIB.items():
            path = self.workspace / "fake" / "matplotlib" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        return f"import sys; sys.path.insert(0, {str(self.workspace / 'fake')!r})\n"


class Session:
    def __init__(self, harness: Harness, runner: Runner) -> None:
        self.harness, self.runner, self.seq = harness, runner, 0

    def call(self, code: str, **more: Any) -> list[Frame]:
        self.seq += 1
        request = self.harness.request(code, **more)
        self.runner.send({"op": "call", "seq": self.seq, "request": request})
        return self.runner.until("result", self.seq)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = Harness(tmp_path)
    yield made
    for runner in made.runners:
        runner.close()


def artifacts(frames: list[Frame]) -> list[tuple[str, str, str, bytes]]:
    """(name, mime_type, source, data) of each artifact, its parts joined; checks
    that parts come in order, consecutive, and that all come before the result."""
    made: list[tuple[str, str, str, bytes]] = []
    open_one: Frame | None = None
    data = b""
    kinds = [frame["t"] for frame in frames]
    if "result" in kinds:
        assert "artifact" not in kinds[kinds.index("result") :]
    for frame in frames:
        if frame["t"] != "artifact":
            assert open_one is None, "another frame came between the parts of an artifact"
            continue
        if open_one is None:
            assert frame["part"] == 0
            open_one, data = frame, b""
        else:
            assert frame["name"] == open_one["name"]
            assert frame["part"] == open_one["part"] + 1
            open_one = frame
        data += base64.b64decode(frame["data_b64"])
        if frame["last"]:
            made.append((frame["name"], frame["mime_type"], frame["source"], data))
            open_one = None
    assert open_one is None
    return made


def result(frames: list[Frame]) -> Frame:
    found = [frame for frame in frames if frame["t"] == "result"]
    assert len(found) == 1, frames
    return found[0]


# --------------------------------------------------------------------------- outputs/


def test_outputs_files_become_artifacts_in_order(harness: Harness) -> None:
    frames, _ = harness.call(
        """
        import os
        os.makedirs("outputs/sub")
        open("outputs/b.txt", "w").write("bee")
        open("outputs/a.csv", "w").write("x,y\\n1,2\\n")
        open("outputs/sub/c.json", "w").write("{}")
        open("outputs/big.bin", "wb").write(bytes(range(256)) * (9 * 4096 + 7))
        os.chdir("/")  # outputs/ is the workspace's, wherever the code goes
        """
    )
    assert result(frames)["ok"]
    made = artifacts(frames)
    assert [(name, mime, source) for name, mime, source, _ in made] == [
        ("outputs/a.csv", "text/csv", "outputs"),
        ("outputs/b.txt", "text/plain", "outputs"),
        ("outputs/big.bin", "application/octet-stream", "outputs"),
        ("outputs/sub/c.json", "application/json", "outputs"),
    ]
    assert made[0][3] == b"x,y\n1,2\n"
    assert made[2][3] == bytes(range(256)) * (9 * 4096 + 7)
    # 9 MiB and a bit: three parts of at most 4 MiB each.
    parts = [frame for frame in frames if frame.get("name") == "outputs/big.bin"]
    assert [frame["part"] for frame in parts] == [0, 1, 2]
    assert all(len(base64.b64decode(frame["data_b64"])) <= 4 << 20 for frame in parts)


def test_no_outputs_directory_no_artifacts_and_empty_files_are_sent(harness: Harness) -> None:
    frames, _ = harness.call("print('nothing')")
    assert artifacts(frames) == []
    frames, _ = harness.call("import os; os.mkdir('outputs'); open('outputs/empty', 'w')")
    assert artifacts(frames) == [("outputs/empty", "application/octet-stream", "outputs", b"")]


def test_outputs_are_sent_after_a_failing_call_too(harness: Harness) -> None:
    frames, _ = harness.call(
        "import os; os.mkdir('outputs'); open('outputs/log.txt', 'w').write('so far'); 1/0"
    )
    assert not result(frames)["ok"]
    assert [name for name, *_ in artifacts(frames)] == ["outputs/log.txt"]


def test_bounds_of_count_and_size_each_skip_said_once(harness: Harness) -> None:
    frames, stderr = harness.call(
        """
        import os
        os.mkdir("outputs")
        for name, size in (("a", 5), ("b", 100), ("c", 5), ("d", 5), ("e", 5)):
            open(f"outputs/{name}", "wb").write(b"x" * size)
        """,
        artifact_limits={"max_count": 2, "max_bytes": 10},
    )
    assert [name for name, *_ in artifacts(frames)] == ["outputs/a", "outputs/c"]
    assert stderr.count("outputs/b is not kept: 100 bytes") == 1
    assert stderr.count("outputs/d is not kept: a call makes at most 2") == 1
    assert stderr.count("outputs/e is not kept") == 1
    assert "outputs/a" not in stderr and "outputs/c" not in stderr


def test_symlinks_are_not_followed_and_special_files_are_skipped(harness: Harness) -> None:
    frames, stderr = harness.call(
        """
        import os
        os.mkdir("outputs")
        os.symlink("/etc/passwd", "outputs/passwd")
        os.symlink("/etc", "outputs/etc")
        os.mkfifo("outputs/fifo")
        open("outputs/real.txt", "w").write("mine")
        """
    )
    assert artifacts(frames) == [("outputs/real.txt", "text/plain", "outputs", b"mine")]
    assert stderr.count("outputs/passwd is a symlink") == 1
    assert stderr.count("outputs/etc is a symlink") == 1
    assert stderr.count("outputs/fifo is not a regular file") == 1


def test_directories_past_the_depth_bound_are_skipped_and_said(harness: Harness) -> None:
    frames, stderr = harness.call(
        """
        import os
        os.makedirs("outputs/" + "/".join("d" * 40))
        open("outputs/" + "/".join("d" * 40) + "/deep.txt", "w").write("deep")
        open("outputs/top.txt", "w").write("top")
        """
    )
    assert [name for name, *_ in artifacts(frames)] == ["outputs/top.txt"]
    assert stderr.count("directories deep") == 1


def test_an_outputs_directory_that_is_a_symlink_is_not_followed(harness: Harness) -> None:
    frames, _ = harness.call("import os; os.symlink('/etc', 'outputs')")
    assert result(frames)["ok"]
    assert artifacts(frames) == []


# --------------------------------------------------------------------------- sessions


def test_a_session_call_sends_only_the_files_it_wrote_or_changed(harness: Harness) -> None:
    session = harness.session()
    first = session.call(
        "import os; os.mkdir('outputs'); open('outputs/a', 'w').write('1');"
        " open('outputs/b', 'w').write('1')"
    )
    assert [name for name, *_ in artifacts(first)] == ["outputs/a", "outputs/b"]
    assert all(frame["seq"] == 1 for frame in first)
    second = session.call("open('outputs/b', 'w').write('22'); open('outputs/c', 'w').write('3')")
    assert [(name, data) for name, _, _, data in artifacts(second)] == [
        ("outputs/b", b"22"),
        ("outputs/c", b"3"),
    ]
    assert all(frame["seq"] == 2 for frame in second)
    third = session.call("x = 1")
    assert artifacts(third) == []
    # A workspace operation is no call of tool code: it sends nothing.
    session.runner.send(
        {
            "op": "call",
            "seq": 4,
            "request": {"kind": "workspace", "op": "list", "args": {"path": "."}},
        }
    )
    assert artifacts(session.runner.until("result", 4)) == []
    session.runner.close()


def test_the_supervisor_sends_outputs_not_the_interpreter(harness: Harness) -> None:
    """Tool code can write to the interpreter's pipe to the supervisor: what it
    says there is checked, counted, and never taken as a file of outputs/."""
    session = harness.session()
    frames = session.call(
        """
        import base64, fcntl, json, os
        # The interpreter's pipe to the supervisor: its one write-only descriptor above 2.
        def write_only(fd):
            try:
                return fd > 2 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            except OSError:  # the descriptor listdir itself used
                return False
        pipe = next(fd for fd in map(int, os.listdir("/proc/self/fd")) if write_only(fd))
        # Its own call's nonce, as its own code can find it (the interpreter's
        # memory is its own): without it, no message counts at all.
        import gc, _turn
        nonce = next(o.nonce for o in gc.get_objects() if isinstance(o, _turn.Turn) and o.open)
        def artifact(name, source, n=nonce):
            frame = {"t": "artifact", "name": name, "mime_type": "text/plain",
                "source": source, "data_b64": base64.b64encode(b"x").decode(),
                "part": 0, "last": True, "n": n}
            os.write(pipe, (json.dumps(frame) + "\\n").encode())
        artifact("unsigned", "display", n="0" * 32)
        artifact("outputs/forged", "outputs")
        artifact("bad", "nonsense")
        for i in range(5):
            artifact(f"display-{i}", "display")
        """,
        artifact_limits={"max_count": 3, "max_bytes": 100},
    )
    assert result(frames)["ok"], frames
    assert [(name, source) for name, _, source, _ in artifacts(frames)] == [
        ("display-0", "display"),
        ("display-1", "display"),
        ("display-2", "display"),
    ]
    session.runner.close()


# --------------------------------------------------------------------------- figures, display()


FIGURES = """
import os
import matplotlib.pyplot as plt
# Only while matplotlib was imported: programs the code starts do not inherit it.
assert "MPLBACKEND" not in os.environ
plt.figure(label="shown")
plt.show()
plt.figure(label="left-open-1")
plt.figure(label="left-open-2")
"""


def test_figures_shown_and_left_open_come_back_in_order(harness: Harness) -> None:
    frames, _ = harness.call(harness.fake_matplotlib() + FIGURES)
    assert result(frames)["ok"], frames
    assert artifacts(frames) == [
        ("figure-1.png", "image/png", "figure", b"\x89PNG fake shown"),
        ("figure-2.png", "image/png", "figure", b"\x89PNG fake left-open-1"),
        ("figure-3.png", "image/png", "figure", b"\x89PNG fake left-open-2"),
    ]


def test_figures_in_a_session_come_back_once_numbered_per_call(harness: Harness) -> None:
    session = harness.session()
    first = session.call(harness.fake_matplotlib() + FIGURES)
    assert [name for name, *_ in artifacts(first)] == [
        "figure-1.png",
        "figure-2.png",
        "figure-3.png",
    ]
    second = session.call("plt.figure(label='again'); plt.show()")
    assert artifacts(second) == [("figure-1.png", "image/png", "figure", b"\x89PNG fake again")]
    assert artifacts(session.call("x = 1")) == []
    session.runner.close()


def test_a_backend_the_code_names_is_left_alone(harness: Harness) -> None:
    frames, _ = harness.call(
        "import os; os.environ['MPLBACKEND'] = 'agg'\n"
        + harness.fake_matplotlib()
        + "import matplotlib, matplotlib.pyplot as plt\n"
        "assert matplotlib.get_backend() == 'agg'\n"
        "plt.figure(label='open'); plt.show()\n"
    )
    assert result(frames)["ok"], frames
    # show() did nothing (agg), and the figure still open at the end is sent.
    assert artifacts(frames) == [("figure-1.png", "image/png", "figure", b"\x89PNG fake open")]


DISPLAY = """
class Png:
    def _repr_png_(self):
        return b"\\x89PNG display"
class Svg:
    def _repr_svg_(self):
        return "<svg/>"
class Jpeg:
    def _repr_jpeg_(self):
        return b"\\xff\\xd8jpeg", {"width": 1}
display(Png(), "just text")
display(Svg())
display(Jpeg())
"""


@pytest.mark.parametrize("where", ["fresh", "session"])
def test_display_sends_images_in_order_and_prints_the_rest(harness: Harness, where: str) -> None:
    if where == "fresh":
        frames, _ = harness.call(DISPLAY)
        stdout = harness.runners[-1].out["stdout"]
    else:
        session = harness.session()
        frames = session.call(DISPLAY)
        session.runner.close()
        stdout = session.runner.out["stdout"]
    assert result(frames)["ok"], frames
    assert artifacts(frames) == [
        ("display-1.png", "image/png", "display", b"\x89PNG display"),
        ("display-2.svg", "image/svg+xml", "display", b"<svg/>"),
        ("display-3.jpg", "image/jpeg", "display", b"\xff\xd8jpeg"),
    ]
    assert b"'just text'" in stdout


def test_display_is_a_builtin_of_code_calls_only(harness: Harness) -> None:
    session = harness.session()
    assert result(session.call("display"))["ok"]
    script = harness.workspace / "script.py"
    script.write_text("display\n")
    session.seq += 1
    request = {**harness.request(""), "kind": "file", "path": str(script)}
    session.runner.send({"op": "call", "seq": session.seq, "request": request})
    frames = session.runner.until("result", session.seq)
    session.runner.close()
    assert result(frames)["error"]["type"] == "NameError"


def test_files_and_user_tools_get_no_figures_but_their_outputs(harness: Harness) -> None:
    script = harness.workspace / "script.py"
    script.write_text(
        harness.fake_matplotlib()
        + "import os, matplotlib.pyplot as plt\n"
        + "plt.figure(); os.makedirs('outputs', exist_ok=True)\n"
        + "open('outputs/f.txt', 'w').write('f')\n"
    )
    runner = harness.start()
    runner.send({**harness.request(""), "kind": "file", "path": str(script)})
    frames = runner.until("exit")
    runner.close()
    assert [name for name, *_ in artifacts(frames)] == ["outputs/f.txt"]


# --------------------------------------------------------------------------- real matplotlib


# The first to run builds the virtualenv (pip, ~1 min; longer on a loaded machine).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_matplotlib_show_sends_a_png_that_opens_as_a_plot(
    harness: Harness, plotting_python: str
) -> None:
    harness.python = plotting_python
    frames, stderr = harness.call(
        """
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3])
        plt.show()
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.bar([1, 2], [3, 4])
        display(fig)
        """
    )
    assert result(frames)["ok"], (frames, stderr)
    made = artifacts(frames)
    # display(fig) sent it, and it stays open (as in Jupyter): it is sent again at the end.
    assert [(name, mime, source) for name, mime, source, _ in made] == [
        ("figure-1.png", "image/png", "figure"),
        ("display-1.png", "image/png", "display"),
        ("figure-2.png", "image/png", "figure"),
    ]
    for _, _, _, data in made:
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    # figsize (2, 1) at the default 100 dpi: the PNG's header says 200 x 100.
    width, height = (
        int.from_bytes(made[1][3][16:20], "big"),
        int.from_bytes(made[1][3][20:24], "big"),
    )
    assert (width, height) == (200, 100)


# --------------------------------------------------------------------------- under bubblewrap


BUBBLEWRAPPED = """
import os
os.mkdir("/workspace/outputs")
open("/workspace/outputs/r.txt", "w").write("r")
os.symlink("/etc/passwd", "/workspace/outputs/passwd")
class Png:
    def _repr_png_(self):
        return b"png"
display(Png())
"""


async def test_under_bubblewrap_outputs_is_slash_workspace_slash_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the process backend's own pipes, in namespaces; the artifact
    frames are taken off before the daemon's side (another part's) sees them."""
    if not NAMESPACES.namespaces:
        pytest.skip("bubblewrap cannot make namespaces here")
    captured: list[Frame] = []
    on_frame = CallFrames.on_frame

    def taking_artifacts(self: CallFrames, item: Any) -> None:
        if isinstance(item, dict) and item.get("t") == "artifact":
            captured.append(item)
        else:
            on_frame(self, item)

    monkeypatch.setattr(CallFrames, "on_frame", taking_artifacts)
    box = build(tmp_path, NAMESPACES)
    await box.start()
    try:
        outcome, out = await run(box, BUBBLEWRAPPED)
    finally:
        await box.close()
    assert outcome.error is None, (outcome, out)
    assert artifacts(captured) == [
        ("display-1.png", "image/png", "display", b"png"),
        ("outputs/r.txt", "text/plain", "outputs", b"r"),
    ]
    assert out[StreamKind.STDERR].count(b"outputs/passwd is a symlink") == 1


# The first to run builds the virtualenv (pip, ~1 min; longer on a loaded machine).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_matplotlib_in_a_session_sends_each_figure_once(
    harness: Harness, plotting_python: str
) -> None:
    harness.python = plotting_python
    session = harness.session()
    first = session.call("import matplotlib.pyplot as plt\nplt.plot([1, 2])")
    second = session.call("plt.plot([3, 1]); plt.show()")
    third = session.call("x = 1")
    session.runner.close()
    for frames in (first, second):
        made = artifacts(frames)
        assert [(name, mime) for name, mime, _, _ in made] == [("figure-1.png", "image/png")]
        assert made[0][3].startswith(b"\x89PNG\r\n\x1a\n")
    assert artifacts(third) == []
