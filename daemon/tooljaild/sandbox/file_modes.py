"""Who may read what the daemon writes: its umask, the sandboxes', and directories it makes.

Every file and directory the daemon writes is its own (0600, 0700): the
journal holds every client's code and arguments, the artifact store their
outputs. `tooljail serve` runs with `DAEMON_UMASK`, so whatever is written
without a mode given (SQLite's files, artifacts, spools, a library's
temporary files) is private from the start, never narrowed afterwards.

The exceptions are few, and each is made with an explicit mode where it is
made, never by a looser umask:

- the state directory and `workspaces/` (0711, `make_dirs`): a sandbox's uid
  passes through them, by name, to the runner and to its own workspace, and
  lists nothing (`tooljaild.app.daemon`);
- the runner (`runner/`, 0755 and 0644, `tooljaild.sandbox.isolation`):
  every sandbox reads it, bound read-only or by path;
- a docker sandbox's handover socket directory
  (`tooljaild.sandbox.docker_handover`): the container's uid connects to it;
- the socket's directory (0755) and the socket (`socket_mode`)
  (`tooljaild.app.listen`): clients connect.

A session's workspace on the host (`isolation = "none"`) is the sandbox
uid's own (0700, made by the daemon and given to that uid); what the tool
writes in it is the tool's.

Sandboxes get `SANDBOX_UMASK`, the usual one, as in a container: the
daemon's own umask is no concern of the code it runs.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DAEMON_UMASK", "SANDBOX_UMASK", "make_dirs"]

DAEMON_UMASK = 0o077
"""`tooljail serve`'s umask: what it writes is its own unless it says otherwise."""
SANDBOX_UMASK = 0o022
"""A sandbox's processes' umask (the daemon's is not theirs to inherit)."""


def make_dirs(path: Path, mode: int) -> None:
    """Make `path` and any missing parent, each made with exactly `mode` (not the umask's).

    A directory that already exists keeps its mode: one of the operator's
    (`/var/lib`, a mount) is none of the daemon's business. Give `path`
    its mode yourself where it must be exact even when it exists.

    Raises:
        OSError: A directory cannot be made.
    """
    missing: list[Path] = []
    for directory in (path, *path.parents):
        if directory.exists():
            break
        missing.append(directory)
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # made meanwhile by another: its maker chose its mode
        # mkdir's mode is narrowed by the umask: the mode asked for is set as such.
        directory.chmod(mode)
