"""The interpreter sandboxes run, and what of the host it needs: a plain install or a virtualenv.

A virtualenv is a `pyvenv.cfg` beside (or one level above) a `bin/python` that
is usually a symlink to its base interpreter's binary. Python finds the venv
from the path it was started by, not from the binary's real path: a venv's
python is therefore exec'd as it is, never resolved through its symlink
(resolved, it is the base interpreter, without the venv's packages). Any other
interpreter is exec'd as its real binary, so that a shim (pyenv's, ~180 ms per
start) never runs in a sandbox.

Under bubblewrap, the directories an interpreter needs outside `/usr` (which
is bound anyway) are bound read-only at the same paths: the venv's own
directory, and its base interpreter's prefix (a pyenv or /opt install).
Without namespaces the sandbox uid reads them on the host. Either way that
uid must be able to walk down to them and read them: `unreachable` says which
path component stops it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tooljail.errors import TooljailError

VENV_CONFIG = "pyvenv.cfg"
SYSTEM_PREFIX = "/usr"
"""Bound into every sandbox whole: interpreters under it need no bind of their own."""
NOTABLE_PACKAGES = ("numpy", "pandas", "matplotlib", "scipy", "pillow", "ipython")
"""What `tooljail doctor` looks for in the sandbox's interpreter (distribution names)."""
PROBE_TIMEOUT_S = 20.0


class InterpreterError(TooljailError):
    """The configured interpreter cannot serve sandboxes; the message names the path and why."""


@dataclass(frozen=True)
class Interpreter:
    """An interpreter as sandboxes run it: what is exec'd and what it reads."""

    path: str
    """What is exec'd: a venv's python as configured (absolute), else the real binary."""
    binary: str
    """The real binary that runs (a venv's base interpreter, symlinks resolved)."""
    venv: str | None = None
    """The virtualenv's directory (the one holding pyvenv.cfg), when it is one."""
    base_prefix: str | None = None
    """A venv's base interpreter prefix (from pyvenv.cfg's `home`), when it is one."""
    venv_version: str | None = None
    """The base interpreter's version, as pyvenv.cfg says it."""

    @property
    def prefix(self) -> str:
        """The real binary's install prefix (the directory above its bin/)."""
        return os.path.dirname(os.path.dirname(self.binary))

    def bind_dirs(self) -> list[str]:
        """Directories to bind read-only at the same path inside a sandbox, outermost first.

        The venv and the base prefix, leaving out what lies under `/usr` or
        inside another of them (one bind covers it).
        """
        wanted = [d for d in (self.venv, self.prefix, self.base_prefix) if d is not None]
        outside = [d for d in dict.fromkeys(wanted) if not _under(d, SYSTEM_PREFIX)]
        return [d for d in outside if not any(o != d and _under(d, o) for o in outside)]

    def needs(self) -> list[tuple[str, int]]:
        """(path, access) pairs the sandbox uid must have for this interpreter to start.

        Access is a mix of os.R_OK and os.X_OK: search (and so read) of every
        directory leading to each, as `unreachable` checks it.
        """
        pairs = [(self.binary, os.R_OK | os.X_OK)]
        if self.venv is not None:
            pairs.append((self.path, os.X_OK))
            pairs.append((os.path.join(self.venv, VENV_CONFIG), os.R_OK))
            pairs += [(str(p), os.R_OK | os.X_OK) for p in site_packages(self.venv)]
        return pairs

    def describe(self) -> str:
        """In words: the path, and for a venv its base."""
        if self.venv is None:
            return self.path
        version = f" {self.venv_version}" if self.venv_version else ""
        return f"{self.path} (virtualenv {self.venv} on Python{version} at {self.binary})"


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def venv_of(python: str) -> str | None:
    """The virtualenv `python` belongs to, found as Python finds it: a pyvenv.cfg
    beside the path it is started by, or in the directory above; else None."""
    bin_dir = os.path.dirname(os.path.abspath(python))
    for directory in (bin_dir, os.path.dirname(bin_dir)):
        if os.path.isfile(os.path.join(directory, VENV_CONFIG)):
            return directory
    return None


def _read_venv_config(venv: str) -> dict[str, str]:
    """pyvenv.cfg's `key = value` lines (unreadable: empty; the access check says why)."""
    try:
        text = Path(venv, VENV_CONFIG).read_text(errors="replace")
    except OSError:
        return {}
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip().lower()] = value.strip()
    return config


def site_packages(venv: str) -> list[Path]:
    """The venv's site-packages directories (lib/pythonX.Y/site-packages, lib64 too)."""
    found = []
    for lib in ("lib", "lib64"):
        found += sorted(Path(venv, lib).glob("python3*/site-packages"))
    # lib64 is usually a symlink to lib: count each directory once.
    return list({p.resolve(): p for p in found}.values())


@functools.lru_cache(maxsize=16)
def inspect(python: str) -> Interpreter:
    """What `python` is: a virtualenv's interpreter, or a plain one.

    Cached: each sandbox start asks (a few stats and one small read the first time).

    Raises:
        InterpreterError: No such file, a directory, or a venv whose base is gone.
    """
    path = os.path.abspath(python)
    if os.path.isdir(path):
        hint = (
            f": a virtualenv; give its interpreter, {path.rstrip('/')}/bin/python"
            if os.path.isfile(os.path.join(path, VENV_CONFIG))
            else ""
        )
        raise InterpreterError(f"sandbox.python = {python} is a directory{hint}")
    if not os.path.exists(path):
        dangling = " (a symlink to a path that does not exist)" if os.path.islink(path) else ""
        raise InterpreterError(
            f"sandbox.python = {python}: no such file{dangling}; set it to an interpreter "
            "that exists, e.g. /usr/bin/python3 or a virtualenv's bin/python"
        )
    venv = venv_of(path)
    binary = os.path.realpath(path)
    if venv is None:
        return Interpreter(path=binary, binary=binary)
    config = _read_venv_config(venv)
    home = config.get("home")
    base_prefix = os.path.dirname(os.path.realpath(home)) if home else None
    if home and not os.path.isdir(home):
        raise InterpreterError(
            f"sandbox.python = {python}: its virtualenv {venv} was made from an interpreter "
            f"in {home}, which is gone: recreate the venv"
        )
    return Interpreter(
        path=path,
        binary=binary,
        venv=venv,
        base_prefix=base_prefix,
        venv_version=config.get("version") or config.get("version_info"),
    )


def unreachable(path: str, access: int, uid: int, gids: frozenset[int]) -> str | None:
    """Why `uid` (with groups `gids`) cannot reach `path`, or None when it can.

    Checks the search bit of every directory on the way, both as written and
    with symlinks resolved (the kernel walks both), and `access` (os.R_OK,
    os.X_OK or both) of the file or directory itself.

    Returns:
        None when it can; else the first component that stops it, its mode and
        owner, and what it lacks, in words an operator can act on.
    """
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    seen: set[Path] = set()
    for walked in (given, real):
        for directory in reversed(walked.parents):
            if directory in seen:
                continue
            seen.add(directory)
            why = _lacks(directory, os.X_OK, uid, gids, "search (x)")
            if why is not None:
                return why
    words = {os.R_OK: "read (r)", os.X_OK: "execute (x)"}.get(access, "read and search (r, x)")
    return _lacks(real, access, uid, gids, words)


def _lacks(path: Path, access: int, uid: int, gids: frozenset[int], words: str) -> str | None:
    """What `path`'s mode denies `uid` of `access`, or None (the owner's, group's or
    others' bits, as the kernel picks them; ACLs are not read)."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
    wanted = ((4 if access & os.R_OK else 0) | (1 if access & os.X_OK else 0)) << shift
    if st.st_mode & wanted == wanted:
        return None
    who = "its owner" if shift == 6 else "its group" if shift == 3 else "others"
    owner = f"{_name(st.st_uid, user=True)}:{_name(st.st_gid, user=False)}"
    return f"{path} ({stat.filemode(st.st_mode)} {owner}) lacks {words} for {who}"


def _name(ident: int, *, user: bool) -> str:
    import grp
    import pwd

    try:
        return pwd.getpwuid(ident).pw_name if user else grp.getgrgid(ident).gr_name
    except KeyError:
        return str(ident)


def check_reachable(interp: Interpreter, uid: int, gids: frozenset[int], who: str) -> None:
    """Every path the interpreter needs is reachable by the sandbox uid.

    Args:
        uid: The uid sandboxes run as (root: nothing to check).
        gids: Its groups (a sandbox has only its primary group).
        who: The sandbox user in words ("nobody (uid 65534)"), for the message.

    Raises:
        InterpreterError: One is not; the message names it and the component
            that stops the uid, and how to fix it.
    """
    if uid == 0:
        return
    for path, access in interp.needs():
        why = unreachable(path, access, uid, gids)
        if why is not None:
            raise InterpreterError(
                f"sandbox.python = {interp.path}: the sandbox user {who} cannot "
                f"{'run' if access == os.X_OK else 'read'} {path}: {why}. Put the interpreter "
                "(and a venv) where every user can read it, e.g. under /opt with 0755 "
                "directories (chmod -R o+rX), not under /root or a home directory"
            )


def probe(interp: Interpreter, uid: int | None, gid: int | None) -> dict[str, Any]:
    """Start the interpreter as the sandbox uid and ask it what it is. Blocks (one process).

    Returns:
        {"version", "prefix", "base_prefix", "packages": {name: version}} for
        the notable packages it finds.

    Raises:
        InterpreterError: It did not start, or did not answer.
    """
    code = (
        "import json, sys\n"
        "from importlib import metadata\n"
        "found = {}\n"
        f"for name in {list(NOTABLE_PACKAGES)!r}:\n"
        "    try:\n"
        "        found[name] = metadata.version(name)\n"
        "    except Exception:\n"
        "        pass\n"
        "print(json.dumps({'version': sys.version.split()[0], 'prefix': sys.prefix,\n"
        "    'base_prefix': sys.base_prefix, 'packages': found}))\n"
    )
    argv = [interp.path, "-I", "-B", "-c", code]
    if uid is not None and uid != os.geteuid():
        setpriv = shutil.which("setpriv") or "setpriv"
        group = gid if gid is not None else uid
        argv = [setpriv, f"--reuid={uid}", f"--regid={group}", "--clear-groups", "--", *argv]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env={}, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InterpreterError(f"{interp.path} could not run: {exc}") from exc
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InterpreterError(f"{interp.path} failed (exit {proc.returncode}): {said}")
    try:
        answer: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise InterpreterError(f"{interp.path} answered {proc.stdout[:200]!r}") from exc
    return answer
