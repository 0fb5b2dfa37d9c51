"""Per-sandbox cgroups: real limits on this host's cgroups, and the v2 logic on a fake tree.

The `isolation` tests create real cgroups and run processes in them; they need
root (or a delegated tree) and skip otherwise. They go through the public API
only, so they run on v1 and v2 hosts alike. The fake-tree tests check the files
the v2 code writes, in a directory laid out like a delegated cgroup v2 subtree:
there, writes are plain files and nothing enforces anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tooljaild.sandbox import cgroups
from tooljaild.sandbox.cgroups import CgroupLimits, CgroupTracker, SandboxCgroup

MiB = 1 << 20
Maker = Callable[..., SandboxCgroup]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# Joins every cgroup through the inherited descriptors before doing anything
# else, as the runner does.
PRELUDE = (
    "import os\n"
    "for _fd in map(int, os.environ['CG_FDS'].split()):\n"
    "    os.write(_fd, b'0')\n"
    "    os.close(_fd)\n"
)


# --- real cgroups on this host ----------------------------------------------


@pytest.fixture(scope="module")
def tracker() -> Iterator[CgroupTracker]:
    # A name of its own, so sweeping it cannot touch a daemon's sandboxes.
    found = CgroupTracker.detect(name=f"tooljail-test-{os.getpid()}")
    if found is None:
        pytest.skip("no writable cgroup tree on this host (needs root or a delegated subtree)")
    yield found
    found.sweep_stale()
    for base in found.bases:
        with contextlib.suppress(OSError):
            base.rmdir()


@pytest.fixture
def make_cgroup(tracker: CgroupTracker) -> Iterator[Maker]:
    made: list[SandboxCgroup] = []

    def make(sandbox_id: str, limits: CgroupLimits, *needs: str) -> SandboxCgroup:
        missing = set(needs) - tracker.controllers
        if missing:
            pytest.skip(f"this host lets no limit be set with {sorted(missing)}")
        cg = tracker.create(sandbox_id, limits)
        made.append(cg)
        return cg

    yield make
    for cg in made:
        cg.kill_and_remove()


def spawn(cg: SandboxCgroup, code: str) -> subprocess.Popen[str]:
    fds = cg.open_procs()
    try:
        return subprocess.Popen(
            [PYTHON, "-I", "-c", PRELUDE + code],
            pass_fds=fds,
            env={"CG_FDS": " ".join(map(str, fds)), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        for fd in fds:
            os.close(fd)


def run(cg: SandboxCgroup, code: str, timeout: float = 60) -> tuple[int, str, str]:
    with spawn(cg, code) as proc:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err


def is_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


@pytest.mark.isolation
def test_joins_every_cgroup_through_the_descriptors(make_cgroup: Maker) -> None:
    cg = make_cgroup("join", CgroupLimits())
    code, out, err = run(cg, "print(open('/proc/self/cgroup').read())")
    assert code == 0, err
    # One line per hierarchy joined (v1), or the single v2 line.
    joined = [line for line in out.splitlines() if line.endswith("/join")]
    assert len(joined) == len(cg.paths)


@pytest.mark.isolation
def test_memory_limit_oom_kills_the_sandbox(make_cgroup: Maker) -> None:
    cg = make_cgroup("oom", CgroupLimits(memory_bytes=64 * MiB, pids=32), "memory")
    # bytes * n writes every page, so the memory is charged, not merely reserved.
    code, out, _ = run(cg, "b = b'x' * (200 << 20)\nprint('survived')")
    assert code == -signal.SIGKILL
    assert "survived" not in out
    assert cg.oom_killed()
    peak = cg.memory_peak()
    assert peak is not None and peak <= 64 * MiB


@pytest.mark.isolation
def test_a_released_cgroup_is_reused_empty_and_reports_only_its_new_users_oom(
    make_cgroup: Maker, tracker: CgroupTracker
) -> None:
    limits = CgroupLimits(memory_bytes=64 * MiB, pids=32)
    cg = make_cgroup("reuse", limits, "memory")
    assert tracker.take_spare(limits) is None  # nothing given back yet
    # The first user is OOM-killed and leaves a sleeping child behind.
    with spawn(
        cg, "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nb = b'x' * (200 << 20)"
    ) as proc:
        proc.wait(30)
    assert cg.oom_killed()
    left = cg.procs()
    assert left, "the child should still sleep in the cgroup"
    cg.release()
    assert all(is_gone(pid) for pid in left)
    assert cg.kill_all() and cg.kill_and_remove()  # given back: no longer this sandbox's
    assert all(path.exists() for path in cg.paths)

    again = tracker.take_spare(limits)
    assert again is not None and again.paths == cg.paths
    assert tracker.take_spare(limits) is None  # handed out once
    assert again.procs() == []
    assert not again.oom_killed()  # the first user's OOM kill is not this one's
    code, out, _ = run(again, "print(open('/proc/self/cgroup').read())")
    assert code == 0 and "/reuse" in out
    # Other limits get another cgroup.
    assert tracker.take_spare(CgroupLimits(memory_bytes=128 * MiB, pids=32)) is None
    again.release()
    tracker.remove_spares()
    assert not any(path.exists() for path in cg.paths)


@pytest.mark.isolation
def test_release_if_empty_gives_back_only_an_empty_cgroup(
    make_cgroup: Maker, tracker: CgroupTracker
) -> None:
    limits = CgroupLimits(pids=16)
    cg = make_cgroup("quick", limits, "pids")
    with spawn(cg, "import time\ntime.sleep(60)") as proc:
        deadline = time.monotonic() + 10
        while not cg.procs() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not cg.release_if_empty()  # someone is still in there
        proc.kill()
        proc.wait(10)
    assert cg.release_if_empty()
    assert cg.release_if_empty()  # done already: nothing more to do
    again = tracker.take_spare(limits)
    assert again is not None and again.paths == cg.paths
    again.kill_and_remove()


@pytest.mark.isolation
def test_pids_limit_stops_a_fork_bomb_and_kill_removes_everything(make_cgroup: Maker) -> None:
    cg = make_cgroup("forkbomb", CgroupLimits(memory_bytes=256 * MiB, pids=32), "pids")
    bomb = (
        "import os, time\n"
        "n, err = 0, None\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        err = e\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n, type(err).__name__, flush=True)\n"
        "time.sleep(60)\n"
    )
    with spawn(cg, bomb) as proc:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the fork bomb never reported"
        forked, error = proc.stdout.readline().split()
        assert error == "BlockingIOError"  # EAGAIN from the pids controller
        assert 0 < int(forked) < 32
        inside = cg.procs()
        assert proc.pid in inside
        assert len(inside) == int(forked) + 1

        # The bomb's parent is our child: reap it as it dies, as the daemon does.
        reaper = threading.Thread(target=proc.wait)
        reaper.start()
        assert cg.kill_and_remove(timeout_s=10)
        reaper.join(10)
        assert proc.returncode == -signal.SIGKILL
    assert all(is_gone(pid) for pid in inside)
    assert not any(path.exists() for path in cg.paths)


@pytest.mark.isolation
def test_memory_limit_bounds_the_tree_not_each_process(make_cgroup: Maker) -> None:
    cg = make_cgroup("tree", CgroupLimits(memory_bytes=64 * MiB, pids=32), "memory")
    # Six children of 20 MB each: each is far below the limit, together above.
    tree = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        b = b'x' * (20 << 20)\n"
        "        time.sleep(2)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "ok = 0\n"
        "for pid in kids:\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    ok += os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0\n"
        "print(ok, flush=True)\n"
    )
    code, out, err = run(cg, tree)
    # The OOM killer picks the biggest process, a child; should it pick the
    # parent, its death says the same.
    if code == 0:
        assert int(out) < 6, out
    else:
        assert code == -signal.SIGKILL, err
    assert cg.oom_killed()


@pytest.mark.isolation
@pytest.mark.slow
def test_cpu_limit_slows_a_busy_loop(make_cgroup: Maker) -> None:
    cg = make_cgroup("cpu", CgroupLimits(cpu_cores=0.2), "cpu")
    busy = (
        "import time\n"
        "start = time.monotonic()\n"
        "while time.process_time() < 1.0:\n"
        "    pass\n"
        "print(time.monotonic() - start)\n"
    )
    code, out, err = run(cg, busy)
    assert code == 0, err
    # One CPU-second at a fifth of a core takes about five seconds.
    assert float(out) >= 3.0, out


# --- cgroup v2 logic on a fake tree ---------------------------------------------

OWN = "system.slice/tooljaild.service"


def fake_v2(
    tmp_path: Path,
    *,
    own: str = OWN,
    controllers: str = "cpu memory pids",
    subtree: str = "",
    procs: str = "4242\n4250\n",
    real_root: bool = False,
) -> tuple[Path, Path]:
    """A delegated v2 subtree as the kernel shows it; returns (root, /proc/self/cgroup)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    own_dir = root / own if own else root
    own_dir.mkdir(parents=True, exist_ok=True)
    (own_dir / "cgroup.controllers").write_text(controllers + "\n")
    (own_dir / "cgroup.subtree_control").write_text(subtree + "\n")
    (own_dir / "cgroup.procs").write_text(procs)
    if not real_root:
        (own_dir / "cgroup.type").write_text("domain\n")
    proc_self = tmp_path / "proc_self_cgroup"
    proc_self.write_text(f"0::/{own}\n")
    return root, proc_self


@pytest.fixture
def fake_rmdir(monkeypatch: pytest.MonkeyPatch) -> dict[Path, dict[str, str]]:
    """Make rmdir work as on cgroupfs (interface files go with the directory).

    Returns what each removed directory held, so tests can check what was written.
    """
    removed: dict[Path, dict[str, str]] = {}

    def rmdir(path: Path) -> None:
        if any(p.is_dir() for p in path.iterdir()):
            raise OSError(16, "Device or resource busy", str(path))
        removed[path] = {p.name: p.read_text() for p in path.iterdir()}
        shutil.rmtree(path)

    monkeypatch.setattr(cgroups._fs, "rmdir", rmdir)
    return removed


def test_v2_detect_moves_the_daemon_to_a_leaf_and_enables_controllers(tmp_path: Path) -> None:
    root, proc_self = fake_v2(tmp_path)
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    own = root / OWN
    assert tracker.version == 2
    assert tracker.controllers == {"memory", "pids", "cpu"}
    assert tracker.bases == (own / "tooljail",)
    # Each pid in its own write, in the order the kernel listed them.
    assert (own / "daemon" / "cgroup.procs").read_text() == "4242\n4250\n"
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (own / "tooljail" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    # The probe is gone.
    assert [p.name for p in (own / "tooljail").iterdir()] == ["cgroup.subtree_control"]


def test_v2_detect_leaves_processes_alone_when_controllers_are_enabled(tmp_path: Path) -> None:
    root, proc_self = fake_v2(tmp_path, subtree="cpu memory pids", procs="")
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    assert tracker.controllers == {"memory", "pids", "cpu"}
    assert not (root / OWN / "daemon").exists()
    assert (root / OWN / "cgroup.subtree_control").read_text() == "cpu memory pids\n"
    assert (root / OWN / "tooljail" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_v2_detect_enables_only_the_controllers_delegated(tmp_path: Path) -> None:
    root, proc_self = fake_v2(tmp_path, controllers="io memory pids")
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    assert tracker.controllers == {"memory", "pids"}
    assert (root / OWN / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_v2_the_real_root_keeps_its_processes(tmp_path: Path) -> None:
    # The root cgroup (no cgroup.type) is exempt from "no internal processes".
    root, proc_self = fake_v2(tmp_path, own="", real_root=True)
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    assert tracker.controllers == {"memory", "pids", "cpu"}
    assert not (root / "daemon").exists()
    assert tracker.bases == (root / "tooljail",)


def test_v2_a_second_detect_does_not_nest_inside_the_daemon_leaf(tmp_path: Path) -> None:
    root, proc_self = fake_v2(tmp_path)
    first = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert first is not None
    # The kernel now shows this process in the leaf.
    proc_self.write_text(f"0::/{OWN}/daemon\n")
    (root / OWN / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (root / OWN / "cgroup.procs").write_text("")
    second = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert second is not None
    assert second.bases == first.bases


def test_v2_falls_back_to_tracking_when_controllers_cannot_be_enabled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, proc_self = fake_v2(tmp_path)
    control = root / OWN / "cgroup.subtree_control"
    control.unlink()
    control.mkdir()  # Every write to it fails, as a refused one would.
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    assert tracker.version == 2
    assert tracker.controllers == frozenset()
    assert tracker.bases == (root / OWN / "tooljail",)
    assert "no cgroup limits" in caplog.text


def test_v2_detect_returns_none_when_nothing_is_writable(tmp_path: Path) -> None:
    root, proc_self = fake_v2(tmp_path)
    (root / OWN / "tooljail").write_text("")  # A file where the base must go.
    assert CgroupTracker.detect(root=root, proc_self_cgroup=proc_self) is None


def test_detect_returns_none_without_cgroup_membership(tmp_path: Path) -> None:
    root, _ = fake_v2(tmp_path)
    assert CgroupTracker.detect(root=root, proc_self_cgroup=tmp_path / "missing") is None


@pytest.fixture
def v2(tmp_path: Path) -> CgroupTracker:
    root, proc_self = fake_v2(tmp_path)
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    return tracker


def test_v2_create_writes_the_limits(v2: CgroupTracker) -> None:
    # The kernel makes memory.swap.max where swap is accounted; fake that here.
    sandbox_dir = v2.bases[0] / "sbx-1"
    sandbox_dir.mkdir()
    (sandbox_dir / "memory.swap.max").write_text("max\n")
    cg = v2.create("sbx-1", CgroupLimits(memory_bytes=64 * MiB, pids=32, cpu_cores=0.5))
    assert cg.paths == (sandbox_dir,)
    assert (sandbox_dir / "memory.max").read_text() == str(64 * MiB)
    assert (sandbox_dir / "memory.swap.max").read_text() == "0"
    assert (sandbox_dir / "pids.max").read_text() == "32"
    assert (sandbox_dir / "cpu.max").read_text() == "50000 100000"


def test_v2_create_without_swap_accounting_or_limits(v2: CgroupTracker) -> None:
    cg = v2.create("sbx-2", CgroupLimits(memory_bytes=MiB, cpu_cores=0.0001))
    (path,) = cg.paths
    assert not (path / "memory.swap.max").exists()
    assert not (path / "pids.max").exists()
    assert (path / "cpu.max").read_text() == "1000 100000"  # The kernel's minimum quota.
    assert list(v2.create("sbx-3").paths[0].iterdir()) == []


def test_create_skips_limits_the_host_does_not_allow(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, proc_self = fake_v2(tmp_path, controllers="pids")
    tracker = CgroupTracker.detect(root=root, proc_self_cgroup=proc_self)
    assert tracker is not None
    with caplog.at_level(logging.WARNING, logger=cgroups.__name__):
        cg = tracker.create("sbx-1", CgroupLimits(memory_bytes=MiB, pids=8, cpu_cores=1))
    assert sorted(p.name for p in cg.paths[0].iterdir()) == ["pids.max"]
    assert "memory, cpu" in caplog.text


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "x" * 65, "sp ace", "é"])
def test_names_from_outside_are_checked(v2: CgroupTracker, bad: str) -> None:
    with pytest.raises(ValueError):
        v2.create(bad)
    with pytest.raises(ValueError):
        CgroupTracker.detect(name=bad)


def test_daemon_is_no_tracker_name() -> None:
    with pytest.raises(ValueError):
        CgroupTracker.detect(name="daemon")


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        CgroupLimits(memory_bytes=0)
    with pytest.raises(ValueError):
        CgroupLimits(cpu_cores=-1.0)


def test_v2_oom_killed_and_memory_peak(v2: CgroupTracker) -> None:
    cg = v2.create("sbx-1")
    (path,) = cg.paths
    assert not cg.oom_killed()
    assert cg.memory_peak() is None
    events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill {}\noom_group_kill 0\n"
    (path / "memory.events").write_text(events.format(0))
    assert not cg.oom_killed()
    (path / "memory.events").write_text(events.format(2))
    assert cg.oom_killed()
    (path / "memory.peak").write_text("67108864\n")
    assert cg.memory_peak() == 64 * MiB


def test_v2_open_procs(v2: CgroupTracker) -> None:
    cg = v2.create("sbx-1")
    (cg.paths[0] / "cgroup.procs").write_text("")
    fds = cg.open_procs()
    try:
        assert len(fds) == 1
        assert not os.get_inheritable(fds[0])
        os.write(fds[0], b"0")
    finally:
        for fd in fds:
            os.close(fd)
    assert (cg.paths[0] / "cgroup.procs").read_text() == "0"
    (cg.paths[0] / "cgroup.procs").unlink()
    with pytest.raises(OSError):
        cg.open_procs()


def sleeper() -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """A real process to list in a fake cgroup, reaped as soon as it dies."""
    proc = subprocess.Popen(["sleep", "60"])
    reaper = threading.Thread(target=proc.wait)
    reaper.start()
    return proc, reaper


def test_v2_kill_and_remove_uses_cgroup_kill(
    v2: CgroupTracker, fake_rmdir: dict[Path, dict[str, str]]
) -> None:
    cg = v2.create("sbx-1")
    (path,) = cg.paths
    proc, reaper = sleeper()
    (path / "cgroup.procs").write_text(f"{proc.pid}\n")
    (path / "cgroup.kill").write_text("")
    assert cg.kill_and_remove(timeout_s=10)
    reaper.join(10)
    assert proc.returncode == -signal.SIGKILL
    assert not path.exists()
    assert fake_rmdir[path]["cgroup.kill"] == "1"


def test_v2_kill_and_remove_freezes_without_cgroup_kill(
    v2: CgroupTracker, fake_rmdir: dict[Path, dict[str, str]]
) -> None:
    cg = v2.create("sbx-1")
    (path,) = cg.paths
    proc, reaper = sleeper()
    (path / "cgroup.procs").write_text(f"{proc.pid}\n")
    (path / "cgroup.freeze").write_text("0\n")
    (path / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert cg.kill_and_remove(timeout_s=10)
    reaper.join(10)
    assert proc.returncode == -signal.SIGKILL
    # Frozen to kill, thawed so the killed can die.
    assert fake_rmdir[path]["cgroup.freeze"] == "0"


def test_v2_sweep_stale(v2: CgroupTracker, fake_rmdir: dict[Path, dict[str, str]]) -> None:
    base = v2.bases[0]
    for name in ("sbx-a", "sbx-b", "sbx-keep"):
        v2.create(name)
    (base / "not ours").mkdir()
    proc, reaper = sleeper()
    (base / "sbx-a" / "cgroup.procs").write_text(f"{proc.pid}\n")
    assert v2.sweep_stale(keep={"sbx-keep"}) == 2
    reaper.join(10)
    assert proc.returncode == -signal.SIGKILL
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["not ours", "sbx-keep"]
    assert v2.sweep_stale(keep={"sbx-keep"}) == 0


def test_v2_spares_are_bounded_and_the_rest_removed(
    v2: CgroupTracker, fake_rmdir: dict[Path, dict[str, str]]
) -> None:
    v2.max_spares = 2
    limits = CgroupLimits(pids=8)
    made = [v2.create(f"sbx-{i}", limits) for i in range(3)]
    for cg in made:
        cg.release()  # an empty fake cgroup.procs: nothing left to kill
    kept = [cg for cg in made if cg.paths[0].exists()]
    assert len(kept) == 2
    assert list(fake_rmdir) == [made[2].paths[0]]
    taken = [v2.take_spare(limits) for _ in range(2)]
    assert {cg.paths for cg in taken if cg is not None} == {cg.paths for cg in kept}
    assert v2.take_spare(limits) is None
    assert v2.take_spare(None) is None  # no limits is another kind of cgroup


@pytest.mark.isolation
def test_close_removes_the_spares_and_the_directories_that_held_them() -> None:
    """A daemon's clean stop leaves nothing in the cgroup trees, spares included."""
    tracker = CgroupTracker.detect(name=f"tooljail-test-close-{os.getpid()}")
    if tracker is None:
        pytest.skip("no writable cgroup tree on this host (needs root or a delegated subtree)")
    cg = tracker.create("closing", CgroupLimits(pids=16))
    assert run(cg, "print('in')")[0] == 0
    cg.release()  # empty: kept as a spare
    assert all(path.exists() for path in cg.paths)
    tracker.close()
    assert not any(path.exists() for path in cg.paths)
    assert not any(base.exists() for base in tracker.bases)
