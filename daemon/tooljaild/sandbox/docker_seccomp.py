"""The docker backend's seccomp profile: the process backend's filter, in Docker's JSON.

The rules come from `tooljaild.sandbox.seccomp` (one list, two backends), so a
container denies exactly what a process sandbox denies, with the same errors:

- every call in ``DENIED_SYSCALLS`` fails with ``EPERM`` (Python raises
  ``PermissionError``);
- ``clone`` with any ``CLONE_NEW*`` flag fails with ``EPERM``; ordinary forks
  and threads keep working;
- ``clone3`` fails with ``ENOSYS``, so that libc falls back to ``clone``;
- ``personality`` may only query the persona or set PER_LINUX32 and UNAME26.

Everything else is allowed (``defaultAction: SCMP_ACT_ALLOW``), as in the
process backend. Only the native architecture is listed: the engine's runtime
(runc, through libseccomp) then refuses system calls of any other ABI (i386
``int 0x80``, x32) with its bad-architecture action, which kills the caller.

Docker takes the profile's JSON text itself in ``security_opt``
(``seccomp=<json>``), not a path, so nothing is written to disk. Names the
engine's libseccomp does not know (calls newer than it) are skipped by runc,
the same limit the process backend's deny list has.
"""

from __future__ import annotations

import functools
import json
import platform
from typing import Any

from tooljaild.sandbox.seccomp import (
    CLONE3_ERRNO,
    CLONE_NAMESPACE_FLAGS,
    DENIED_ERRNO,
    DENIED_SYSCALLS,
    _personality_denials,
)

__all__ = ["profile", "profile_json"]

_ARCHITECTURES = {
    "x86_64": "SCMP_ARCH_X86_64",
    "amd64": "SCMP_ARCH_X86_64",
    "aarch64": "SCMP_ARCH_AARCH64",
    "arm64": "SCMP_ARCH_AARCH64",
    "ppc64le": "SCMP_ARCH_PPC64LE",
    "s390x": "SCMP_ARCH_S390X",
    "riscv64": "SCMP_ARCH_RISCV64",
}


def _deny(name: str, errno_ret: int = DENIED_ERRNO, **arg: int | str) -> dict[str, Any]:
    rule: dict[str, Any] = {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno_ret}
    if arg:
        rule["args"] = [arg]
    return rule


def profile(machine: str | None = None) -> dict[str, Any]:
    """The profile as a JSON-ready dict.

    Args:
        machine: The engine host's machine name as `uname -m` says it; None: this
            host's (the backend bind-mounts local directories, so the engine is local).

    Returns:
        A Docker seccomp profile: default allow, the denials as ``SCMP_ACT_ERRNO``
        rules with ``errnoRet``, and a masked-equality argument rule for each
        ``clone`` namespace flag and each denied ``personality`` bit pattern
        (Docker's ``value`` is the mask, ``valueTwo`` the value).
    """
    machine = (machine or platform.machine()).lower()
    rules = [
        {
            "names": list(DENIED_SYSCALLS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": DENIED_ERRNO,
        }
    ]
    # s390 swaps clone's first two arguments: the flags come second.
    flags_index = 1 if machine.startswith("s390") else 0
    for flag in CLONE_NAMESPACE_FLAGS.values():
        rules.append(
            _deny("clone", index=flags_index, value=flag, valueTwo=flag, op="SCMP_CMP_MASKED_EQ")
        )
    rules.append(_deny("clone3", CLONE3_ERRNO))
    for mask, value in _personality_denials():
        rules.append(
            _deny("personality", index=0, value=mask, valueTwo=value, op="SCMP_CMP_MASKED_EQ")
        )
    result: dict[str, Any] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}
    arch = _ARCHITECTURES.get(machine)
    if arch is not None:
        result["architectures"] = [arch]
    return result


@functools.cache
def profile_json() -> str:
    """The profile for this host as compact JSON, for ``security_opt=["seccomp=..."]``."""
    return json.dumps(profile(), separators=(",", ":"))
