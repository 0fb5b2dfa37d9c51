"""Model-written code tries to outlive its call, exhaust processes, threads and
file descriptors, and signal or trace the daemon and other sandboxes."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.security.conftest import (
    HOST_PID_NS,
    BackgroundCall,
    SecurityDaemon,
    assert_nothing_left,
    host_process_count,
    live_processes_mentioning,
    output_of,
    report,
    run_code,
    wait_until,
)
from tooljail import CallStatus

pytestmark = pytest.mark.isolation

SETTLE_SLACK = 16
"""Processes the host may gain meanwhile for reasons of its own (the pool refilling)."""


def test_no_process_outlives_its_call(daemon: SecurityDaemon, token: str) -> None:
    """Attack: double fork, setsid, a classic daemon() with redirected stdio,
    Popen(start_new_session=True), `nohup`, and a child that writes a marker 3 s later.
    Every process carries the token in its environment (and most in argv)."""
    delay = 3.0
    marker_name = f"{token}-marker"
    code = f"""
import os, subprocess, sys, time
os.environ['ESCAPE_TOKEN'] = {token!r}
markers = [os.path.join(os.getcwd(), {marker_name!r}), '/tmp/{marker_name}']
sleeper = [sys.executable, '-c', 'import time; time.sleep(60)', {token!r}]

def later(tag):
    time.sleep({delay})
    for m in markers:
        try:
            open(m + '-' + tag, 'w').write('still alive')
        except OSError:
            pass

# 1. double fork
if os.fork() == 0:
    if os.fork() == 0:
        later('double-fork')
        os._exit(0)
    os._exit(0)

# 2. setsid in a child
if os.fork() == 0:
    os.setsid()
    later('setsid')
    os._exit(0)

# 3. the classic daemon(): fork, setsid, fork, chdir /, umask, stdio to /dev/null
if os.fork() == 0:
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    os.chdir('/')
    os.umask(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    later('daemon')
    os._exit(0)

# 4. a new session through subprocess
subprocess.Popen(sleeper, start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# 5. nohup, in the background through a shell
subprocess.Popen('nohup ' + ' '.join(repr(a) for a in sleeper) + ' >/dev/null 2>&1 &', shell=True)
# 6. a child that writes a marker later
subprocess.Popen([sys.executable, '-c',
                  'import time, sys; time.sleep({delay}); '
                  '[open(m + "-child", "w").write("x") for m in sys.argv[1:-1]]',
                  *markers, {token!r}], start_new_session=True)
time.sleep(0.5)
print('REPORT {{"spawned": 6}}', flush=True)
"""
    start = time.monotonic()
    call = BackgroundCall(daemon, code, timeout=30)
    call.wait_for("REPORT ")
    result = call.join(30)
    assert result.status is CallStatus.SUCCESS, result
    assert time.monotonic() - start < delay, "the call waited for its escapees"
    assert_nothing_left(token, timeout=5)
    time.sleep(max(0.0, start + delay + 1.5 - time.monotonic()))
    assert live_processes_mentioning(token) == [], "an escapee came back"
    on_host = list(Path("/tmp").glob(f"{marker_name}*"))
    on_host += list(daemon.state_dir.rglob(f"{marker_name}*"))
    for p in on_host:
        with contextlib.suppress(OSError):
            p.unlink()
    assert on_host == [], f"a process outlived its call and wrote {on_host}"
    daemon.assert_serving()


def test_a_fork_bomb_is_bounded_and_cleaned_up(daemon: SecurityDaemon, token: str) -> None:
    """Attack: a (bounded) fork bomb: 2000 forks in a loop, every child sleeping."""
    baseline = host_process_count()
    code = f"""
import json, os, time
os.environ['ESCAPE_TOKEN'] = {token!r}
children = 0
error = None
for i in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        error = '%s: %s' % (type(e).__name__, e)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children += 1
print('REPORT ' + json.dumps({{'children': children, 'error': error}}), flush=True)
"""
    start = time.monotonic()
    result = run_code(daemon, code, timeout=40)
    elapsed = time.monotonic() - start
    assert elapsed < 45, elapsed
    assert result.status in (CallStatus.SUCCESS, CallStatus.ERROR), result
    assert_nothing_left(token, timeout=10)
    assert wait_until(lambda: host_process_count() <= baseline + SETTLE_SLACK, 10), (
        f"host has {host_process_count()} processes, {baseline} before"
    )
    daemon.assert_serving()
    got = report(result)
    assert got["error"] is not None and got["children"] < 2000, (
        f"nothing bounded the sandbox's processes: {got}"
    )


def test_a_thread_bomb_is_bounded_and_cleaned_up(daemon: SecurityDaemon, token: str) -> None:
    """Attack: start 10,000 threads."""
    baseline = host_process_count()
    code = f"""
import json, os, threading, time
os.environ['ESCAPE_TOKEN'] = {token!r}
threads = []
error = None
try:
    for i in range(10000):
        t = threading.Thread(target=time.sleep, args=(30,), daemon=True)
        t.start()
        threads.append(t)
except Exception as e:
    error = '%s: %s' % (type(e).__name__, e)
print('REPORT ' + json.dumps({{'threads': len(threads), 'error': error}}), flush=True)
os._exit(0)
"""
    start = time.monotonic()
    result = run_code(daemon, code, timeout=40)
    assert time.monotonic() - start < 45
    assert result.status in (CallStatus.SUCCESS, CallStatus.ERROR), result
    assert_nothing_left(token, timeout=10)
    assert wait_until(lambda: host_process_count() <= baseline + SETTLE_SLACK, 10)
    daemon.assert_serving()
    got = report(result)
    assert got["threads"] < 10000 and got["error"], f"nothing bounded the threads: {got}"


def test_file_descriptor_exhaustion_stops_at_emfile_without_harming_the_daemon(
    daemon: SecurityDaemon,
) -> None:
    """Attack: open files, pipes and sockets until nothing more can be opened."""
    daemon_fds = psutil.Process(daemon.pid).num_fds()
    code = """
import errno, json, os, socket
held = []
error = None
try:
    while True:
        held.append(open('/dev/null'))
        r, w = os.pipe()
        held += [r, w]
        held.append(socket.socket())
except OSError as e:
    error = e.errno
print('REPORT ' + json.dumps({'held': len(held), 'errno': error}), flush=True)
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["errno"] == 24, f"not stopped by EMFILE: {got}"  # EMFILE
    assert got["held"] < 100_000
    daemon.assert_serving()
    # The daemon's own descriptors are back where they were (give or take a
    # connection) once the pool has refilled: a sandbox being started holds more.
    # Judged on the poll's own reading: a refill starting right after it holds a
    # few more for a moment, which a second reading would count as a leak.
    seen: list[int] = []

    def settled() -> bool:
        seen.append(psutil.Process(daemon.pid).num_fds())
        return seen[-1] <= daemon_fds + 8

    assert wait_until(settled, timeout=10), f"descriptors {daemon_fds} -> {seen[-5:]}"


def test_the_sandbox_cannot_kill_the_daemon_by_pid(fresh_daemon: SecurityDaemon) -> None:
    """Attack: os.kill(<daemon pid>, SIGKILL), the pid given to the code as a literal
    (a model finds it with `ps` or in /proc)."""
    daemon = fresh_daemon
    code = f"""
import json, os, signal, time
out = {{}}
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill({daemon.pid}, sig)
        out[sig.name] = 'sent'
    except OSError as e:
        out[sig.name] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out), flush=True)
time.sleep(0.5)
"""
    outcome: object
    try:
        outcome = run_code(daemon, code, timeout=30)
    except Exception as e:
        outcome = e
    time.sleep(0.5)
    status = psutil.Process(daemon.pid).status() if daemon.process.poll() is None else "dead"
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGCONT)
    assert daemon.process.poll() is None, f"the sandbox killed the daemon: {outcome!r}"
    assert status != psutil.STATUS_STOPPED, f"the sandbox stopped the daemon: {outcome!r}"
    daemon.assert_serving()
    got = report(outcome)  # type: ignore[arg-type]
    assert "sent" not in got.values(), f"signals reached the daemon: {got}"


def test_kill_minus_one_hits_nothing_outside_the_sandbox(
    fresh_daemon: SecurityDaemon, token: str
) -> None:
    """Attack: os.kill(-1, SIGKILL): every process the caller may signal.

    Run as host root outside a pid namespace this would kill every process on the
    machine, the test run included, so the code refuses to fire when it shares
    the host's pid namespace as root or as the test's own user: the test then
    fails, saying so. Another sandbox's call, running meanwhile, must complete.
    """
    daemon = fresh_daemon
    bystander = BackgroundCall(
        daemon,
        f"import os, time\nos.environ['T'] = {token!r}\nprint('up', flush=True)\n"
        "time.sleep(4)\nprint('bystander done')\n",
        timeout=30,
    )
    bystander.wait_for("up")
    code = f"""
import json, os, signal, sys
shared = os.readlink('/proc/self/ns/pid') == {HOST_PID_NS!r}
if shared and os.geteuid() in (0, {os.geteuid()}):
    why = 'shares the host pid namespace as uid %d' % os.geteuid()
    print('REPORT ' + json.dumps({{'refused': why}}), flush=True)
    sys.exit(0)
print('REPORT ' + json.dumps({{'refused': None}}), flush=True)
os.kill(-1, signal.SIGKILL)
"""
    outcome: object
    try:
        outcome = run_code(daemon, code, timeout=30)
    except Exception as e:
        outcome = e
    assert daemon.process.poll() is None, f"kill(-1) killed the daemon: {outcome!r}"
    daemon.assert_serving()
    survivor = bystander.join(30)
    assert survivor.ok and survivor.data["stdout"] == "up\nbystander done\n", survivor
    got = report(outcome)  # type: ignore[arg-type]
    assert got["refused"] is None, (
        f"not run: the attack would have killed the whole host ({got['refused']})"
    )


def test_the_daemon_cannot_be_traced_or_its_memory_read(fresh_daemon: SecurityDaemon) -> None:
    """Attack: ptrace(PTRACE_ATTACH, <daemon pid>) via ctypes, and read the daemon's
    memory through /proc/<daemon pid>/mem at an address taken from its maps.
    (If an attach succeeds the code detaches and continues the daemon at once.)"""
    daemon = fresh_daemon
    pid = daemon.pid
    code = f"""
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
out = {{}}
r = libc.ptrace(16, {pid}, None, None)  # PTRACE_ATTACH
if r == 0:
    out['ptrace'] = 'attached'
    try:
        os.waitpid({pid}, 0x40000000)  # __WALL
    except OSError:
        pass
    libc.ptrace(17, {pid}, None, None)  # PTRACE_DETACH
    os.kill({pid}, signal.SIGCONT)
else:
    out['ptrace'] = 'errno %d' % ctypes.get_errno()
try:
    start = None
    for line in open('/proc/{pid}/maps'):
        addr, perms = line.split()[:2]
        if perms.startswith('r'):
            start = int(addr.split('-')[0], 16)
            break
    with open('/proc/{pid}/mem', 'rb') as mem:
        mem.seek(start)
        out['mem'] = 'read %d bytes' % len(mem.read(4096))
except (OSError, TypeError, ValueError) as e:
    out['mem'] = 'failed: %s' % e
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    status = psutil.Process(pid).status()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    assert daemon.process.poll() is None
    assert status != psutil.STATUS_STOPPED, "the sandbox left the daemon stopped"
    daemon.assert_serving()
    assert result.ok, result
    got = report(result)
    assert got["ptrace"] != "attached", f"the sandbox attached to the daemon: {got}"
    assert not got["mem"].startswith("read"), f"the sandbox read the daemon's memory: {got}"


def test_a_sandbox_cannot_signal_another_sandboxs_process(
    daemon: SecurityDaemon, token: str
) -> None:
    """Attack: one call prints its pid (and its child's); a second call, given those
    pids and the child's host pid, tries to SIGKILL them."""
    first = BackgroundCall(
        daemon,
        f"import os, subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)', {token!r}])\n"
        "print('PIDS', os.getpid(), p.pid, flush=True)\n"
        "print('child exit', p.wait())\n",
        timeout=30,
    )
    stdout = first.wait_for("\n")
    inner = [int(x) for x in stdout.split("PIDS", 1)[1].split()[:2]]
    assert wait_until(lambda: bool(live_processes_mentioning(token)), 5)
    host = [p.pid for p in live_processes_mentioning(token)]
    host += [psutil.Process(p).ppid() for p in host]
    code = f"""
import json, os, signal
out = {{}}
for pid in {host + inner!r}:
    if pid == os.getpid():
        continue
    try:
        os.kill(pid, signal.SIGKILL)
        out[str(pid)] = 'sent'
    except OSError as e:
        out[str(pid)] = 'errno %d' % e.errno
    print('REPORT ' + json.dumps(out), flush=True)
"""
    try:
        second = run_code(daemon, code, timeout=30)
    finally:
        result = first.join(30)
    assert result.ok, f"the other sandbox's call was disturbed: {result!r}"
    assert result.data["stdout"].endswith("child exit 0\n"), output_of(result)
    daemon.assert_serving()
    # For the record: which signals the kernel accepted (inside its own pid
    # namespace a small pid may name one of the second call's own processes).
    if second.status is CallStatus.SUCCESS:
        got = report(second)
        reached_host = [pid for pid in map(str, host) if got.get(pid) == "sent"]
        assert reached_host == [], f"signals were delivered to host pids {reached_host}"


def test_signals_to_pid_1_end_no_other_sandbox(fresh_daemon: SecurityDaemon, token: str) -> None:
    """Attack: send every signal there is to pid 1 (in a zygote sandbox, a clone
    of the process that makes every sandbox) and to the worker's parent, hoping
    to take down the sandboxes of other calls. Another call, running meanwhile,
    must complete, and later calls must be served by the same zygote."""
    daemon = fresh_daemon
    bystander = BackgroundCall(
        daemon,
        f"import os, time\nos.environ['T'] = {token!r}\nprint('up', flush=True)\n"
        "time.sleep(3)\nprint('bystander done')\n",
        timeout=30,
    )
    bystander.wait_for("up")
    code = """
import json, os, signal
sent = {}
for target in sorted({1, os.getppid()} - {0, os.getpid()}):
    for sig in sorted(signal.valid_signals()):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            os.kill(target, sig)
            sent['%d %d' % (target, sig)] = 'sent'
        except OSError as e:
            sent['%d %d' % (target, sig)] = 'errno %d' % e.errno
print('REPORT ' + json.dumps({'sent': len(sent)}), flush=True)
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    assert report(result)["sent"] > 30
    survivor = bystander.join(30)
    assert survivor.ok and survivor.data["stdout"] == "up\nbystander done\n", survivor
    for i in range(3):
        after = run_code(daemon, f"print({i})", timeout=30)
        assert after.ok and after.data["stdout"] == f"{i}\n", after
    assert "restarting the zygote" not in daemon.log()
    daemon.assert_serving()
