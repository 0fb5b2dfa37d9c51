"""The kinds of sandbox backend: the keys of `sandbox.backends.BACKENDS`.

Apart from the table so that the command line can offer them (`serve
--backend`) without importing every backend (a test keeps the two equal).
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["KINDS", "BackendKind"]

BackendKind = Literal["process", "docker"]
"""The sandbox backends a tool can run in."""

KINDS: tuple[str, ...] = get_args(BackendKind)
