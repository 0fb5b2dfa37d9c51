"""Model-written code tries to read, list and write outside its workspace, and to
plant privileges in it. Each test shows the effect did not happen on the host."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.security.conftest import (
    BackgroundCall,
    SecurityDaemon,
    find_on_host,
    output_of,
    report,
    run_code,
)

pytestmark = pytest.mark.isolation


def test_reading_etc_shadow_is_denied(daemon: SecurityDaemon) -> None:
    """Attack: read the host's password hashes from /etc/shadow (open() and `cat`)."""
    code = """
import json, subprocess
out = {}
try:
    with open('/etc/shadow') as f:
        data = f.read()
    out['open'] = 'read %d bytes, root entry: %s' % (len(data), 'root:' in data)
except OSError as e:
    out['open'] = 'denied errno %d' % e.errno
p = subprocess.run(['cat', '/etc/shadow'], capture_output=True, text=True)
out['cat'] = 'exit %d, %d bytes' % (p.returncode, len(p.stdout))
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["open"].startswith("denied"), f"/etc/shadow was readable: {got}"
    assert got["cat"].endswith(", 0 bytes") and not got["cat"].startswith("exit 0"), got
    assert "root:" not in output_of(result)
    daemon.assert_serving()


def test_another_calls_workspace_cannot_be_found_or_read(daemon: SecurityDaemon) -> None:
    """Attack: a second call looks for a first, still running call's secret file via
    ../, the absolute path the first call reported, the host path of its workspace,
    and a glob/walk of the daemon's state directory."""
    secret = "workspace-secret-" + os.urandom(8).hex()
    name = f"secret-{os.urandom(4).hex()}.txt"
    first = BackgroundCall(
        daemon,
        f"import os, time\nopen({name!r}, 'w').write({secret!r})\n"
        "print('CWD', os.getcwd(), flush=True)\ntime.sleep(6)\nprint('first done')\n",
        timeout=30,
    )
    stdout = first.wait_for("\n", timeout=20)
    cwd = stdout.split("CWD ", 1)[1].split("\n", 1)[0].strip()
    # Under namespaces the workspace is a tmpfs inside the first sandbox: it has no
    # host path at all. Without them, aim at its host path too.
    host_copies = find_on_host(daemon.state_dir, name)
    host_path = str(host_copies[0]) if host_copies else os.path.join(cwd, name)
    code = f"""
import glob, json, os
secret, name = {secret!r}, {name!r}
tries = {{}}
candidates = [
    os.path.join('..', os.path.basename({cwd!r}), name),
    os.path.join({cwd!r}, name),
    {host_path!r},
    os.path.join('..', '..', 'workspaces', os.path.basename(os.path.dirname({host_path!r})), name),
]
candidates += glob.glob(os.path.join({str(daemon.state_dir)!r}, '**', name), recursive=True)
candidates += glob.glob('../*/' + name) + glob.glob('../../*/*/' + name)
for top in ('..', '../..', {str(daemon.state_dir)!r}, '/var/lib/tooljail', '/tmp'):
    for dirpath, dirs, files in os.walk(top):
        if name in files:
            candidates.append(os.path.join(dirpath, name))
for path in candidates:
    try:
        with open(path) as f:
            tries[path] = f.read()
    except OSError as e:
        tries[path] = 'error %d' % e.errno
print('REPORT ' + json.dumps(tries))
"""
    try:
        second = run_code(daemon, code, timeout=30)
    finally:
        first_result = first.join(30)
    assert second.ok, second
    got = report(second)
    leaked = [path for path, text in got.items() if secret in text]
    assert not leaked, f"another call's secret was read through {leaked}"
    assert secret not in output_of(second)
    assert first_result.ok, first_result
    daemon.assert_serving()


@pytest.mark.parametrize("directory", ["/root", "/home"])
def test_listing_root_and_home_shows_nothing_of_the_host(
    daemon: SecurityDaemon, directory: str
) -> None:
    """Attack: list /root and /home to look for keys, histories and other users' files."""
    marker = f".tooljail-sec-{os.urandom(6).hex()}"
    planted = Path(directory) / marker
    try:
        try:
            planted.write_text("host file")
        except OSError:
            planted = Path(directory) / "nonexistent"  # not ours to plant: use what is there
        host_names = set(os.listdir(directory)) if os.access(directory, os.R_OK) else set()
        code = f"""
import json, os
try:
    names = os.listdir({directory!r})
    for n in list(names):
        p = os.path.join({directory!r}, n)
        if os.path.isdir(p):
            try:
                names += [n + '/' + m for m in os.listdir(p)]
            except OSError:
                pass
    out = {{'listed': names}}
except OSError as e:
    out = {{'denied': e.errno}}
print('REPORT ' + json.dumps(out))
"""
        result = run_code(daemon, code, timeout=30)
    finally:
        with contextlib.suppress(OSError):
            planted.unlink()
    assert result.ok, result
    got = report(result)
    seen = {name.split("/")[0] for name in got.get("listed", [])}
    assert marker not in seen, f"the host's {directory} is visible: {sorted(seen)[:20]}"
    common = sorted(seen & host_names)
    assert not common, f"host entries of {directory} visible: {common}"
    daemon.assert_serving()


def test_writing_to_usr_and_etc_fails_and_leaves_nothing_on_the_host(
    daemon: SecurityDaemon,
) -> None:
    """Attack: drop files into /usr, /usr/local/bin and /etc (e.g. a trojan or a cron job)."""
    marker = f"tooljail-sec-{os.urandom(6).hex()}"
    targets = [f"/usr/{marker}", f"/usr/local/bin/{marker}", f"/etc/{marker}"]
    code = f"""
import json, os
out = {{}}
for path in {targets!r}:
    try:
        with open(path, 'w') as f:
            f.write('#!/bin/sh\\necho owned\\n')
        os.chmod(path, 0o755)
        out[path] = 'written'
    except OSError as e:
        out[path] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    try:
        result = run_code(daemon, code, timeout=30)
        on_host = [path for path in targets if os.path.lexists(path)]
    finally:
        for path in targets:
            with contextlib.suppress(OSError):
                os.unlink(path)
    assert result.ok, result
    assert on_host == [], f"the sandbox wrote onto the host: {on_host}"
    got = report(result)
    written = [path for path, outcome in got.items() if outcome == "written"]
    assert written == [], f"the system is writable inside the sandbox: {written}"
    daemon.assert_serving()


def test_a_write_to_tmp_stays_in_the_sandboxs_private_tmp(daemon: SecurityDaemon) -> None:
    """Attack: leave a file in /tmp for a later call or a host process to pick up."""
    marker = f"tooljail-sec-{os.urandom(6).hex()}"
    host_file = Path("/tmp") / marker
    code = f"""
import json, time
try:
    open('/tmp/{marker}', 'w').write('planted')
    out = 'written'
except OSError as e:
    out = 'errno %d' % e.errno
print('REPORT ' + json.dumps({{'write': out}}), flush=True)
time.sleep(1.5)
"""
    call = BackgroundCall(daemon, code, timeout=30)
    try:
        call.wait_for("REPORT ")
        during = host_file.exists()
        result = call.join(30)
        after = host_file.exists()
    finally:
        with contextlib.suppress(OSError):
            host_file.unlink()
    assert result.ok, result
    assert not during, "the sandbox's /tmp is the host's /tmp"
    assert not after, "the sandbox's /tmp file was left in the host's /tmp"
    # ...and it is not handed on to the next call either.
    follow = run_code(daemon, f"import os\nprint(os.path.exists('/tmp/{marker}'))")
    assert follow.ok and follow.data["stdout"] == "False\n", follow
    daemon.assert_serving()


def test_a_setuid_copy_of_sh_is_useless_because_the_workspace_is_nosuid_nodev(
    daemon: SecurityDaemon,
) -> None:
    """Attack: copy /bin/sh into the workspace and make it setuid (chmod 4755), to get
    a root shell later; the workspace mount must be nosuid and nodev."""
    code = """
import json, os, shutil, stat
shutil.copy('/bin/sh', 'sh')
os.chmod('sh', 0o4755)
out = {'mode': oct(stat.S_IMODE(os.stat('sh').st_mode))}
cwd = os.path.realpath(os.getcwd())
flags = os.statvfs(cwd).f_flag
out['statvfs_nosuid'] = bool(flags & os.ST_NOSUID)
out['statvfs_nodev'] = bool(flags & os.ST_NODEV)
best = None
for line in open('/proc/self/mountinfo'):
    fields = line.split()
    point = fields[4].replace('\\\\040', ' ')
    if cwd == point or cwd.startswith(point.rstrip('/') + '/') or point == '/':
        if best is None or len(point) >= len(best[0]):
            best = (point, fields[5].split(','))
out['mount_point'], out['mount_options'] = best
print('REPORT ' + json.dumps(out))
"""
    result = run_code(daemon, code, timeout=30)
    assert result.ok, result
    got = report(result)
    assert got["statvfs_nosuid"], f"the workspace is not mounted nosuid: {got}"
    assert got["statvfs_nodev"], f"the workspace is not mounted nodev: {got}"
    assert "nosuid" in got["mount_options"], got
    assert "nodev" in got["mount_options"], got
    assert got["mount_point"] != "/", f"the workspace is not a mount of its own: {got}"
    daemon.assert_serving()


def test_writing_through_a_symlink_to_a_system_file_fails(daemon: SecurityDaemon) -> None:
    """Attack: symlink workspace/passwd -> /etc/passwd and write through it; and the
    same through a link to a root-owned host file outside the workspace.

    /etc/passwd is only opened for writing (never written) so the test cannot
    harm a host that is not contained; the real write goes to a file the test owns.
    """
    target = Path("/etc") / f"tooljail-sec-{os.urandom(6).hex()}"
    target.write_text("original\n")
    target.chmod(0o644)
    before_passwd = Path("/etc/passwd").stat()
    code = f"""
import json, os
os.symlink('/etc/passwd', 'passwd')
os.symlink({str(target)!r}, 'config')
out = {{}}
try:
    fd = os.open('passwd', os.O_WRONLY | os.O_APPEND)
    os.close(fd)
    out['passwd'] = 'opened for writing'
except OSError as e:
    out['passwd'] = 'errno %d' % e.errno
try:
    with open('config', 'w') as f:
        f.write('owned\\n')
    out['config'] = 'written'
except OSError as e:
    out['config'] = 'errno %d' % e.errno
print('REPORT ' + json.dumps(out))
"""
    try:
        result = run_code(daemon, code, timeout=30)
        content = target.read_text()
    finally:
        target.unlink()
    assert result.ok, result
    got = report(result)
    assert content == "original\n", f"a host file was written through a symlink: {got}"
    assert got["passwd"].startswith("errno"), f"/etc/passwd is writable from the sandbox: {got}"
    after_passwd = Path("/etc/passwd").stat()
    assert (after_passwd.st_mtime_ns, after_passwd.st_size) == (
        before_passwd.st_mtime_ns,
        before_passwd.st_size,
    )
    daemon.assert_serving()
