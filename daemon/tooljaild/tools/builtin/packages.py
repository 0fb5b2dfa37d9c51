"""`install_packages`: install packages from the package index into a session.

``{"packages": ["pandas==2.2.3", "requests"]}`` -> ``{"installed": [{"name",
"version"}, ...], "from_cache": bool}``. The packages land in the session's
site directory (``/workspace/.packages``, runner/_packages.py): importable in
its next calls (and in this one's subprocesses), counted in its workspace
quota, gone with it; never in the interpreter the daemon's sandboxes share.

It needs a session (the call manager refuses a call without one at admission,
`BuiltinRun.needs_session`) whose egress allows the index: pip runs in the
session's interpreter, as tool code, through the egress proxy; a session
without egress, or whose egress refuses the index, gets the proxy's own
refusal (host, port, rule) as the result's error.

Here in the daemon, around that run (an in-daemon handler, like upload_file's,
that sends the session one request of kind "packages" in its turn):

- before, what earlier installs of the same requirements from the same indexes
  by the same identity resolved (`PackageCache.recall`), per interpreter tag,
  goes with the request: the sandbox then fetches those wheels by hash from
  the daemon's cache through the proxy, checks them, and unpacks them without
  pip (runner/_packages.py);
- after, what pip installed is remembered (`PackageCache.remember`) once every
  file of it is in the cache under its URL and hash, for the next install.

A timeout or a cancel stops the run as a session call's is stopped: an
interrupt, then a reset of the interpreter (workspace kept), then the session
is given up if even that gets no answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tooljail.errors import InvalidArgumentsError
from tooljaild.egress.package_cache import CachedWheel, PackageCache, resolution_key
from tooljaild.sandbox.base import RunRequest, SandboxError, Termination
from tooljaild.settings.config import Settings
from tooljaild.tools.in_daemon import DaemonCall, ToolFailure
from tooljaild.tools.registry import Tool

if TYPE_CHECKING:
    from tooljaild.sessions.manager import SessionManager
    from tooljaild.sessions.session import Session

__all__ = [
    "INSTALL_PACKAGES_TOOL",
    "MAX_REQUIREMENTS",
    "check_install_arguments",
    "install_packages",
]

MAX_REQUIREMENTS = 50
"""The most requirements one call may name."""
MAX_REQUIREMENT_CHARS = 200
"""The longest requirement string."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9.*+!_-]+"
_SPEC = rf"(?:===|==|!=|~=|<=|>=|<|>)\s*{_VERSION}"
_MARKER = r"""[A-Za-z0-9_.'"<>=!~ ()\t-]+"""
_REQUIREMENT = re.compile(
    rf"\s*(?P<name>{_NAME})\s*"
    rf"(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?\s*"
    rf"(?:\(?\s*{_SPEC}(?:\s*,\s*{_SPEC})*\s*\)?)?\s*"
    rf"(?:;{_MARKER})?"
)
"""A PEP 508 requirement without a URL: name, extras, version specifiers, markers."""

INSTALL_PACKAGES_TOOL = Tool(
    name="install_packages",
    description=(
        "Install Python packages from the package index into the current session, e.g. "
        '{"packages": ["pandas==2.2.3", "requests"]}: each a requirement as pip takes it '
        "(a name, optional [extras] and version specifiers; no URLs, paths or options), "
        f"at most {MAX_REQUIREMENTS}. Dependencies come too. Returns {{installed: [{{name, "
        "version}}], from_cache}}. Installed packages are importable in the session's "
        "next calls (and by subprocesses) and kept until the session ends; they count in "
        "its workspace quota. Needs a session whose egress allows the package index. "
        "Repeating an install another session of yours made is fast (from the daemon's "
        "cache)."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "packages": {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_REQUIREMENT_CHARS},
                "minItems": 1,
                "maxItems": MAX_REQUIREMENTS,
                "description": 'Requirements, e.g. ["pandas==2.2.3", "httpx>=0.27"].',
            }
        },
        "required": ["packages"],
        "additionalProperties": False,
    },
    source="builtin",
    builtin="install_packages",
)


def check_install_arguments(arguments: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`install_packages`'s arguments, each requirement checked: 1 to
    `MAX_REQUIREMENTS` PEP 508 requirements, none a URL, a path or an option.

    Raises:
        InvalidArgumentsError: Naming the requirement and what is wrong with it.
    """
    packages = arguments.get("packages")
    expected = f"1 to {MAX_REQUIREMENTS} requirements such as 'pandas==2.2.3'"
    if not isinstance(packages, list) or not 1 <= len(packages) <= MAX_REQUIREMENTS:
        raise InvalidArgumentsError(
            f"packages must list 1 to {MAX_REQUIREMENTS} requirements",
            parameter="packages",
            expected=expected,
            actual=f"{len(packages) if isinstance(packages, list) else type(packages).__name__}",
        )
    for requirement in packages:
        problem = _problem(requirement)
        if problem is not None:
            raise InvalidArgumentsError(
                f"packages: {str(requirement)[:MAX_REQUIREMENT_CHARS]!r} {problem}",
                parameter="packages",
                expected=expected,
                actual=str(requirement)[:MAX_REQUIREMENT_CHARS],
            )
    return {"packages": [str(p).strip() for p in packages]}


def _problem(requirement: object) -> str | None:
    """What is wrong with one requirement; None: nothing."""
    if not isinstance(requirement, str) or not requirement.strip():
        return "is not a requirement (an empty or non-string value)"
    text = requirement.strip()
    if len(text) > MAX_REQUIREMENT_CHARS:
        return f"is longer than {MAX_REQUIREMENT_CHARS} characters"
    if text.startswith("-"):
        return "is an option: only requirements are taken (pip's options are the daemon's)"
    if "@" in text or "://" in text or "/" in text or "\\" in text or text.startswith("."):
        return "names a URL or a path: only requirements from the package index are taken"
    if "\n" in text or "\r" in text or not _REQUIREMENT.fullmatch(text):
        return "is not a PEP 508 requirement (a name, optional [extras], version specifiers)"
    return None


async def install_packages(call: DaemonCall) -> dict[str, Any]:
    """The `install_packages` handler: one "packages" request in the call's session.

    Raises:
        ToolFailure: No session (admission refuses that first), or the install
            failed in the sandbox (its type and message: no egress, the
            proxy's refusal, pip's own error).
    """
    session, sessions = call.session, call.services.sessions
    if session is None or sessions is None:
        raise ToolFailure(
            "SessionRequired",
            "install_packages installs into a session: call it with a session_id",
        )
    settings = call.services.settings
    cache = call.services.packages
    requirements = [str(p) for p in call.arguments["packages"]]
    key = resolution_key(requirements, settings.packages.urls(), call.client)
    loop = asyncio.get_running_loop()
    # Hashing cached files is disk work: off the loop.
    known = await loop.run_in_executor(None, cache.recall, key) if cache is not None else {}
    payload = {
        "requirements": requirements,
        "known": {tag: [asdict(w) for w in wheels] for tag, wheels in known.items()},
    }
    value = await _run(session, sessions, RunRequest("packages", payload, session.terms.limits))
    if cache is not None and not value.get("from_cache"):
        await loop.run_in_executor(None, _remember, cache, key, value)
    installed = value.get("installed")
    return {
        "installed": installed if isinstance(installed, list) else [],
        "from_cache": bool(value.get("from_cache")),
    }


def _remember(cache: PackageCache, key: str, value: dict[str, Any]) -> None:
    """Keep what pip resolved for the next install (`PackageCache.remember`
    checks each wheel against the cache: the sandbox's word alone is not kept)."""
    tag, resolved = value.get("tag"), value.get("resolved")
    if not isinstance(tag, str) or not isinstance(resolved, list):
        return
    try:
        wheels = [
            CachedWheel(str(w["name"]), str(w["version"]), str(w["url"]), str(w["sha256"]))
            for w in resolved
        ]
    except (KeyError, TypeError):
        return
    if wheels and all(w.url.split("#", 1)[0].endswith(".whl") for w in wheels):
        cache.remember(key, tag, wheels)


async def _run(session: Session, sessions: SessionManager, request: RunRequest) -> dict[str, Any]:
    """Run `request` in the session's interpreter, in its turn; its value.

    Cancelled (the call's timeout, a cancel): the run is stopped as a session
    call's is (interrupt, then reset), then the cancel goes on.
    """
    async with session.turn():
        try:
            waiter = session.channel.begin(request, _drop)
        except SandboxError as exc:
            raise ToolFailure(
                "SessionEnded", f"the session's sandbox has ended ({exc}); open a new session"
            ) from exc
        session.calls += 1
        running = asyncio.ensure_future(waiter)
        try:
            end = await asyncio.shield(running)
        except asyncio.CancelledError:
            await _stop(session, sessions, running)
            raise
    outcome = end.outcome
    if outcome.termination is Termination.RETURNED and isinstance(outcome.value, dict):
        return outcome.value
    if session.channel.ended.done():
        await sessions.end(session, session.end_reason or "sandbox_died")
    error = outcome.error
    if error is not None:
        raise ToolFailure(error.type, error.message)
    raise ToolFailure(
        "InstallFailed",
        f"the install ended without a result ({outcome.termination.value}); "
        "the session's interpreter was restarted if it died",
    )


async def _stop(session: Session, sessions: SessionManager, running: asyncio.Future[Any]) -> None:
    """Stop a running install: interrupt, then reset, then give the session up."""
    settings = sessions.settings
    session.channel.interrupt()
    await asyncio.wait({running}, timeout=settings.interrupt_grace_s)
    still = not running.done() and session.open
    if still and not await session.channel.reset(settings.reset_timeout_s):
        await sessions.end(session, "sandbox_died")
    if not running.done():
        running.cancel()
    with contextlib.suppress(BaseException):
        await running


def _drop(stream: Any, data: bytes) -> None:
    """pip's output is the runner's to read (it quotes it in an error)."""
