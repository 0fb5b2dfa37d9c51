"""Model-written code tries to read the daemon's secrets (a canary in its
environment) and to gain privileges: root, setuid, mount, new namespaces,
other processes' memory; and crashes the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import time

import psutil
import pytest

from tests.security.conftest import (
    BackgroundCall,
    SecurityDaemon,
    find_on_host,
    live_processes_mentioning,
    output_of,
    report,
    run_code,
    wait_until,
)
from tooljail import CallStatus

pytestmark = pytest.mark.isolation


def test_the_canary_is_not_in_the_tools_environment(daemon: SecurityDaemon) -> None:
    """Attack: dump os.environ looking for keys and tokens."""
    result = run_code(daemon, "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    assert result.ok, result
    env = json.loads(result.data["stdout"])
    assert "TOOLJAIL_TEST_CANARY" not in env
    assert not any(daemon.canary in v for v in env.values())
    daemon.assert_serving()


def test_the_canary_cannot_be_read_through_proc(daemon: SecurityDaemon) -> None:
    """Attack: read /proc/<daemon pid>/environ (pid given as a literal), /proc/1/environ,
    /proc/self/environ, every ancestor's environ (following PPid), and every
    /proc/<pid>/environ there is."""
    code = f"""
import json, os
canary = {daemon.canary!r}
paths = ['/proc/{daemon.pid}/environ', '/proc/1/environ', '/proc/self/environ']
pid = os.getpid()
while pid > 1:
    try:
        status = open('/proc/%d/status' % pid).read()
        pid = int(status.split('PPid:')[1].split()[0])
    except (OSError, IndexError, ValueError):
        break
    paths.append('/proc/%d/environ' % pid)
paths += ['/proc/%s/environ' % p for p in os.listdir('/proc') if p.isdigit()]
found = []
for path in paths:
    try:
        if canary.encode() in open(path, 'rb').read():
            found.append(path)
    except OSError:
        pass
print('REPORT ' + json.dumps({{'found_in': sorted(set(found))}}))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["found_in"] == [], f"the daemon's secret was read from {got['found_in']}"
    daemon.assert_serving()


def test_tool_code_never_runs_as_host_root(daemon: SecurityDaemon, token: str) -> None:
    """Attack: os.setuid(0)/os.setgid(0), then act "as root": the host must see the
    tool's processes and the files it creates owned by an unprivileged uid
    (inside a user namespace the code may see a mapped id; the host's view counts)."""
    filename = f"{token}-owned"
    code = f"""
import json, os, subprocess, sys, time
out = {{}}
for name, call in (('setgid', os.setgid), ('setuid', os.setuid)):
    try:
        call(0)
        out[name] = 'ok'
    except OSError as e:
        out[name] = 'errno %d' % e.errno
out['uid_inside'] = os.getuid()
open({filename!r}, 'w').write('mine')
probe = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(4)', {token!r}])
print('REPORT ' + json.dumps(out), flush=True)
probe.wait()
"""
    call = BackgroundCall(daemon, code, timeout=30)
    call.wait_for("REPORT ")
    assert wait_until(lambda: bool(live_processes_mentioning(token)), 5), "probe not found"
    probes = live_processes_mentioning(token)
    procs = probes + [p.parent() for p in probes if p.parent() is not None]
    host_uids = {p.pid: tuple(p.uids()) for p in procs}
    files = find_on_host(daemon.state_dir, filename)
    owners = {str(f): f.stat().st_uid for f in files}
    result = call.join(30)
    assert result.ok, result
    root_procs = {pid: uids for pid, uids in host_uids.items() if 0 in uids}
    assert root_procs == {}, f"tool processes run as host root: {root_procs} ({report(result)})"
    # Under namespaces the workspace is a tmpfs of the sandbox's own (not on the
    # host): the processes' host uids above are then the evidence.
    assert 0 not in owners.values(), f"the tool's files are owned by host root: {owners}"
    daemon.assert_serving()


def test_mounting_a_tmpfs_is_denied(daemon: SecurityDaemon, token: str) -> None:
    """Attack: mount(2) a tmpfs through ctypes (to hide files or shadow a path).
    If a mount happens anyway the code unmounts it at once."""
    code = f"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
os.mkdir({token!r})
target = os.path.abspath({token!r}).encode()
r = libc.mount(b'tmpfs', target, b'tmpfs', 0, b'size=1m')
err = ctypes.get_errno()
mounted = any({token!r} in line for line in open('/proc/self/mountinfo'))
if r == 0 or mounted:
    libc.umount2(target, 2)  # MNT_DETACH
print('REPORT ' + json.dumps({{'ret': r, 'errno': err, 'mounted': mounted}}))
"""
    try:
        result = run_code(daemon, code, timeout=30)
    finally:
        with open("/proc/self/mountinfo") as f:
            left = [line.split()[4] for line in f if token in line]
        for point in left:
            subprocess.run(["umount", "-l", point], check=False)
    assert result.ok, result
    got = report(result)
    assert left == [], f"a mount from the sandbox stayed on the host: {left}"
    assert got["ret"] == -1 and not got["mounted"], f"the sandbox mounted a tmpfs: {got}"
    assert got["errno"] == 1, f"mount failed, but not with EPERM: {got}"  # EPERM
    daemon.assert_serving()


def test_a_new_user_namespace_cannot_be_created(daemon: SecurityDaemon) -> None:
    """Attack: unshare(CLONE_NEWUSER) through ctypes (the first step of most container
    escapes: become "root" in a namespace of one's own). Tried in a fresh
    single-threaded child, so a refusal is the filter's and not EINVAL."""
    code = """
import ctypes, json, os
CLONE_NEWUSER = 0x10000000
pid = os.fork()
if pid == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.unshare(CLONE_NEWUSER)
    os._exit(0 if r == 0 else min(ctypes.get_errno(), 255))
_, status = os.waitpid(pid, 0)
print('REPORT ' + json.dumps({'errno': os.waitstatus_to_exitcode(status)}))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["errno"] != 0, "the sandbox created a new user namespace"
    assert got["errno"] != 22, f"refused only as EINVAL, not by policy: {got}"
    daemon.assert_serving()


def test_proc_mem_of_itself_works_but_not_of_other_processes(daemon: SecurityDaemon) -> None:
    """Attack: open /proc/<pid>/mem for writing on processes outside the sandbox (the
    daemon, the test run) to patch their code. Writing to its own /proc/self/mem
    is harmless and allowed. Nothing is ever written to another process."""
    code = f"""
import ctypes, json, os
out = {{}}
buf = ctypes.create_string_buffer(b'before', 16)
with open('/proc/self/mem', 'r+b', buffering=0) as mem:
    mem.seek(ctypes.addressof(buf))
    mem.write(b'after!')
out['self'] = buf.value.decode()
for pid in ({daemon.pid}, {os.getpid()}):
    try:
        with open('/proc/%d/mem' % pid, 'r+b', buffering=0):
            out[str(pid)] = 'opened for writing'
    except OSError as e:
        out[str(pid)] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["self"] == "after!", got
    opened = [pid for pid, outcome in got.items() if outcome == "opened for writing"]
    assert opened == [], f"the sandbox could write other processes' memory: {opened}"
    daemon.assert_serving()


def test_no_new_privileges_no_capabilities_and_a_syscall_filter(daemon: SecurityDaemon) -> None:
    """Attack (reconnaissance): what can this process still gain? /proc/self/status
    must show NoNewPrivs 1, a seccomp filter (mode 2) and no effective capabilities."""
    code = """
import json
fields = {}
for line in open('/proc/self/status'):
    key, _, value = line.partition(':')
    fields[key] = value.strip()
keys = ('NoNewPrivs', 'Seccomp', 'CapEff', 'CapBnd')
print('REPORT ' + json.dumps({k: fields.get(k) for k in keys}))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["NoNewPrivs"] == "1", got
    assert got["Seccomp"] == "2", got
    assert int(got["CapEff"], 16) == 0, got
    daemon.assert_serving()


def test_a_segfault_crashes_only_the_call(daemon: SecurityDaemon) -> None:
    """Attack: ctypes.string_at(0): crash the interpreter."""
    start = time.monotonic()
    result = run_code(daemon, "import ctypes\nprint('go', flush=True)\nctypes.string_at(0)\n")
    assert time.monotonic() - start < 30
    assert result.status is CallStatus.ERROR, result
    assert result.error is not None
    assert result.error.type == "Signal", result.error
    assert "SIGSEGV" in result.message, result.message
    assert output_of(result).startswith("go\n")
    assert psutil.pid_exists(daemon.pid)
    daemon.assert_serving()
