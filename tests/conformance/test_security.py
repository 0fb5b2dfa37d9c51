"""A representative subset of tests/security/, on every backend: the attack code is
the same, and each test checks from the host that the effect did not happen."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.conftest import Backend, assert_gone
from tests.security.conftest import (
    SecurityDaemon,
    host_process_count,
    output_of,
    report,
    run_code,
    wait_until,
)
from tests.security.test_network import accepted, host_ipv4_addresses
from tooljail import CallStatus

pytestmark = [pytest.mark.timeout(120), pytest.mark.isolation]


@pytest.fixture
def host_secret(daemon: SecurityDaemon) -> Iterator[tuple[Path, str]]:
    """A world-readable file next to the daemon's state directory, not shared with tools."""
    secret = "host-secret-" + time.strftime("%H%M%S") + str(time.monotonic_ns())
    path = daemon.state_dir.parent / f"secret-{time.monotonic_ns()}.txt"
    path.write_text(secret)
    path.chmod(0o644)
    yield path, secret
    path.unlink()


def test_files_outside_the_workspace_cannot_be_read(
    daemon: SecurityDaemon, host_secret: tuple[Path, str]
) -> None:
    """Attack: /etc/shadow, a host file by its absolute path and through /proc/1/root,
    and the daemon's state directory."""
    path, secret = host_secret
    code = f"""
import json, os
out = {{}}
for p in ('/etc/shadow', {str(path)!r}, '/proc/1/root' + {str(path)!r}):
    try:
        out[p] = open(p).read()
    except OSError as e:
        out[p] = 'denied errno %d' % e.errno
try:
    out['state'] = os.listdir({str(daemon.state_dir)!r})
except OSError as e:
    out['state'] = 'denied errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert secret not in output_of(result), got
    assert str(got["/etc/shadow"]).startswith("denied"), got
    assert isinstance(got["state"], str) or got["state"] == [], got
    daemon.assert_serving()


def test_the_network_is_off(daemon: SecurityDaemon) -> None:
    """Attack: connect to a listener on every host address; resolve a name."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""
import json, socket
out = {{}}
for host in {host_ipv4_addresses()!r}:
    try:
        socket.create_connection((host, {port}), timeout=3).close()
        out[host] = 'connected'
    except OSError as e:
        out[host] = 'failed: %s' % e
try:
    out['dns'] = socket.getaddrinfo('example.com', 443)[0][4][0]
except OSError as e:
    out['dns'] = 'failed: %s' % e
print('REPORT ' + json.dumps(out))
"""
    try:
        result = run_code(daemon, code, timeout=60)
        peers = accepted(listener, 0.5)
    finally:
        listener.close()
    assert peers == [], f"the host's listener accepted connections from the sandbox: {peers}"
    assert result.ok, result
    got = report(result)
    assert all(str(v).startswith("failed") for v in got.values()), got


def test_no_process_outlives_its_call(daemon: SecurityDaemon, backend: Backend, token: str) -> None:
    """Attack: a double fork, setsid, a Popen in a new session; the call returns."""
    code = f"""
import os, subprocess, sys, time
sleeper = [sys.executable, '-c', 'import time; time.sleep(60)', {token!r}]
if os.fork() == 0:
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, sleeper)
subprocess.Popen(sleeper, start_new_session=True)
time.sleep(0.5)
print('REPORT {{"spawned": 3}}', flush=True)
"""
    result = run_code(daemon, code, timeout=30)
    assert result.status is CallStatus.SUCCESS, result
    assert report(result) == {"spawned": 3}
    assert_gone(backend, token, set(), timeout=5)
    daemon.assert_serving()


def test_a_fork_bomb_is_bounded_and_cleaned_up(
    daemon: SecurityDaemon, backend: Backend, token: str
) -> None:
    baseline = host_process_count()
    code = f"""
import json, os, sys, time
children, error = 0, None
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as e:
        error = '%s: %s' % (type(e).__name__, e)
        break
    if pid == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', {token!r}])
    children += 1
print('REPORT ' + json.dumps({{'children': children, 'error': error}}), flush=True)
"""
    result = run_code(daemon, code, timeout=60)
    assert result.status in (CallStatus.SUCCESS, CallStatus.ERROR), result
    got = report(result)
    assert got["error"] and got["children"] < 2000, f"nothing bounded the processes: {got}"
    assert_gone(backend, token, set(), timeout=10)
    assert wait_until(lambda: host_process_count() <= baseline + 16, 10)
    daemon.assert_serving()


def test_no_privileges_and_never_root(daemon: SecurityDaemon) -> None:
    code = """
import json, os
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
out = {k: status[k].strip() for k in ('NoNewPrivs', 'Seccomp', 'CapEff', 'Uid')}
for name, call in (('setgid', os.setgid), ('setuid', os.setuid)):
    try:
        call(0)
        out[name] = 'ok'
    except OSError as e:
        out[name] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["NoNewPrivs"] == "1", got
    assert got["Seccomp"] == "2", got
    assert int(got["CapEff"], 16) == 0, got
    assert "0" not in got["Uid"].split(), got
    assert got["setuid"] != "ok" and got["setgid"] != "ok", got


def test_the_daemons_environment_is_not_visible(daemon: SecurityDaemon) -> None:
    """Attack: os.environ, and every /proc/<pid>/environ that can be read."""
    code = f"""
import json, os
found = [k for k, v in os.environ.items() if {daemon.canary!r} in v or 'CANARY' in k]
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + [{daemon.pid!r}]:
    try:
        if {daemon.canary!r}.encode() in open('/proc/%s/environ' % pid, 'rb').read():
            found.append(pid)
    except OSError:
        pass
print('REPORT ' + json.dumps({{'found': found}}))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    assert report(result) == {"found": []}
    assert daemon.canary not in json.dumps(result.data)


def test_the_sandboxs_keeper_is_out_of_reach(daemon: SecurityDaemon) -> None:
    """Attack: take over the process that outlives the tool, its keeper (the
    worker's parent, and pid 1 where the sandbox has its own pid namespace), to
    escape the end of the call: open its memory for writing and for reading,
    read its environment, open its descriptors (the frame pipe among them) and
    go through its root. Listing the descriptors' numbers is allowed."""
    code = """
import json, os
out = {}
for pid in sorted({1, os.getppid()}):
    for what, path, mode in (('mem+w', 'mem', 'r+b'), ('mem', 'mem', 'rb'),
                             ('environ', 'environ', 'rb')):
        try:
            with open('/proc/%d/%s' % (pid, path), mode, buffering=0):
                pass
            out['%d %s' % (pid, what)] = 'opened'
        except OSError as e:
            out['%d %s' % (pid, what)] = 'errno %d' % e.errno
    try:
        os.listdir('/proc/%d/root' % pid)
        out['%d root' % pid] = 'opened'
    except OSError as e:
        out['%d root' % pid] = 'errno %d' % e.errno
    try:
        fds = os.listdir('/proc/%d/fd' % pid)
    except OSError:
        fds = []
    for fd in fds:
        try:
            os.close(os.open('/proc/%d/fd/%s' % (pid, fd), os.O_RDONLY))
            out['%d fd %s' % (pid, fd)] = 'opened'
        except OSError as e:
            out['%d fd %s' % (pid, fd)] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert len(got) >= 4, got  # mem twice, environ, root (and each descriptor listed)
    opened = sorted(key for key, outcome in got.items() if outcome == "opened")
    assert opened == [], f"the tool reached into its keeper: {opened} ({got})"
    daemon.assert_serving()
