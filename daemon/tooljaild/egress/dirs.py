"""The per-sandbox egress directory: where a sandbox's proxy socket and CA bundle live.

Each sandbox with egress gets a directory of its own below
``<state_dir>/egress/sandboxes`` (the root, mode 0711: anyone may pass through,
nobody but its owner may list it), named by 128 random bits: the name is the
secret (a sandbox learns only its own, as /run/tooljail). Inside it the daemon's
gate listens on ``proxy.sock`` (egress/gate.py), and ``ca.pem`` is the CA bundle
the sandbox trusts (a hard link of, or a copy of, ``<state_dir>/egress/ca-bundle.pem``
when the daemon made one).

The directory itself is 0755: a container's user (another uid) must traverse it
and reach the socket (0666) and the bundle (0644).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path

__all__ = ["CA_BUNDLE_NAME", "ROOT_MODE", "SANDBOX_DIR_MODE", "EgressDirs", "egress_root"]

ROOT_MODE = 0o711
"""The root of the sandboxes' directories: passed through, listed by nobody else."""
SANDBOX_DIR_MODE = 0o755
"""A sandbox's own directory (its name is the secret)."""
CA_BUNDLE_NAME = "ca.pem"
"""The CA bundle's name in a sandbox's directory (and in /run/tooljail)."""
_SHARED_BUNDLE = "ca-bundle.pem"
"""The bundle the daemon writes at start, in ``<state_dir>/egress``."""


def egress_root(state_dir: Path) -> Path:
    """Where the sandboxes' egress directories of a daemon on `state_dir` live."""
    return state_dir / "egress" / "sandboxes"


class EgressDirs:
    """Makes and removes the per-sandbox egress directories below `root`.

    Args:
        root: ``<state_dir>/egress/sandboxes`` (see `egress_root`); made by
            `prepare` (or the first `new`).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self) -> None:
        """Make the root (mode 0711, whatever the umask), and its parent. Idempotent.

        Raises:
            OSError: It cannot be made.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root.parent, ROOT_MODE)
        os.chmod(self.root, ROOT_MODE)

    def sweep(self) -> int:
        """Remove every sandbox directory below the root (what an earlier run on
        this state directory left: a crash). At start, before any sandbox.

        Returns:
            How many were removed.
        """
        removed = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed += 1
        return removed

    def new(self) -> Path:
        """A fresh directory for one sandbox, with the CA bundle in it if there is one.

        Returns:
            Its absolute path (``<root>/<32 hex digits>``).

        Raises:
            OSError: It cannot be made (the root is gone and cannot be made again).
        """
        if not self.root.is_dir():
            self.prepare()
        path = self.root / secrets.token_hex(16)
        path.mkdir(mode=SANDBOX_DIR_MODE)
        os.chmod(path, SANDBOX_DIR_MODE)  # whatever the daemon's umask
        bundle = self.root.parent / _SHARED_BUNDLE
        if bundle.is_file():
            target = path / CA_BUNDLE_NAME
            try:
                # A hard link costs one inode update; a sandbox can only read it
                # (mounted read-only), so sharing the inode shares nothing writable.
                os.link(bundle, target)
            except OSError:
                with contextlib.suppress(OSError):
                    shutil.copyfile(bundle, target)
                    os.chmod(target, 0o644)
        return path

    def remove(self, path: Path) -> None:
        """Remove a sandbox's directory and what is in it. Never raises."""
        if path.parent != self.root:
            return  # not one of ours: never remove anything else
        shutil.rmtree(path, ignore_errors=True)
