"""The artifact store's files: `<root>/<id[:2]>/<id>`, each private to the daemon.

An artifact is written under a temporary name (`<id>.part`) and renamed when
complete: a crash never leaves half an artifact under its name. Directories
are made `DIR_MODE` and files `FILE_MODE` as such, not by the umask of the
process the daemon runs in (`tooljail serve` sets a private one, a daemon
embedded with `tooljaild.testing` keeps its host's): they hold every client's
outputs.

Names are the sandbox's words: `safe_name` keeps a relative path without
"." or ".." parts and without control characters, so no name leads out of
`outputs/` when a client saves it, nor drives a terminal that lists it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import unicodedata
from collections.abc import Generator
from pathlib import Path
from typing import BinaryIO

__all__ = ["CHUNK_BYTES", "DIR_MODE", "FILE_MODE", "MAX_NAME_CHARS", "ArtifactFiles", "safe_name"]

DIR_MODE = 0o700
"""The store's directories' mode (the sandboxes never see them)."""
FILE_MODE = 0o600
"""An artifact file's mode."""
CHUNK_BYTES = 1024 * 1024
"""Bytes per chunk when an artifact is read back (`chunks`)."""
MAX_NAME_CHARS = 255
"""Characters of an artifact's name kept (the end of a longer one is cut)."""


class ArtifactFiles:
    """The files under `root`. Build it with `make`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def make(cls, root: Path) -> ArtifactFiles:
        """The store's directory at `root`, made if missing, `DIR_MODE` in any case.

        Raises:
            OSError: It cannot be made, or its mode set.
        """
        root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        root.chmod(DIR_MODE)
        return cls(root)

    def path(self, artifact_id: str) -> Path:
        return self.root / artifact_id[:2] / artifact_id

    def create(self, artifact_id: str) -> tuple[Path, BinaryIO]:
        """A new, empty `<id>.part` file to write the artifact in (`FILE_MODE`).

        Returns:
            Its path (for `finish`) and the file, open for writing.

        Raises:
            OSError: It cannot be made.
        """
        final = self.path(artifact_id)
        with contextlib.suppress(FileExistsError):
            final.parent.mkdir(mode=DIR_MODE)
            final.parent.chmod(DIR_MODE)  # mkdir's mode is narrowed by the umask, not widened
        tmp = final.with_name(final.name + ".part")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        return tmp, os.fdopen(os.open(tmp, flags, FILE_MODE), "wb")

    def finish(self, tmp: Path, artifact_id: str) -> None:
        """Give a complete `.part` file its artifact's name."""
        os.replace(tmp, self.path(artifact_id))

    def remove(self, path: Path) -> None:
        """Remove a file of the store, gone already or not."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

    def chunks(self, artifact_id: str, offset: int = 0) -> Generator[bytes, None, None]:
        """The artifact's bytes from `offset`, in chunks of `CHUNK_BYTES`.

        Raises:
            FileNotFoundError: It has no file (at once, not at the first chunk).
        """
        return _read(self.path(artifact_id).open("rb"), offset)

    def remove_strays(self, keep: set[str]) -> None:
        """Remove every artifact file whose id is not in `keep` (a `.part` left by a
        crash, a file of an artifact gone while the daemon died), and make what is
        kept private (an older tooljail's embedded daemon left the umask's modes)."""
        for sub in self.root.iterdir():
            if not sub.is_dir() or sub.is_symlink():
                continue
            _narrow(sub, DIR_MODE)
            for f in sub.iterdir():
                if f.name not in keep:
                    with contextlib.suppress(OSError):
                        f.unlink()
                else:
                    _narrow(f, FILE_MODE)


def _narrow(path: Path, mode: int) -> None:
    """Take from `path` any bit `mode` lacks (a symbolic link is left as it is)."""
    with contextlib.suppress(OSError):
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & ~mode:
            path.chmod(mode)


def _read(f: BinaryIO, offset: int) -> Generator[bytes, None, None]:
    with f:
        if offset:
            f.seek(offset)
        while chunk := f.read(CHUNK_BYTES):
            yield chunk


def safe_name(name: str) -> str:
    """`name` as the store keeps it: a relative path, "/"-separated, without empty,
    "." or ".." parts, and with every control character (C0, C1, DEL, and the
    Unicode format characters that reorder text) written as an escape, at most
    `MAX_NAME_CHARS`. "../../../../tmp/x" is kept as "tmp/x"; "" as "artifact".
    """
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    kept = "".join(_escape(c) for c in "/".join(parts))[:MAX_NAME_CHARS]
    return kept or "artifact"


def _escape(char: str) -> str:
    """`char`, or its escape when a terminal or a text viewer would act on it."""
    if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
        return char.encode("unicode_escape").decode("ascii")
    return char
