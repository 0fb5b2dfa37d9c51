"""How the daemon runs a built-in tool: its `BuiltinRun`, which its `Tool` carries.

Decided once, when the catalog builds the tool (`tools.builtin.catalog`), and
read from the tool on every step of a call (the argument check, the sandbox's
request, the result), never looked up again by name. A user tool carries none:
the runner imports its module and calls its function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tooljail.errors import SessionRequiredError, TooljailError
from tooljaild.settings.config import Settings
from tooljaild.tools.in_daemon import Handler

__all__ = ["BuiltinRun", "RunKind", "session_required"]

RunKind = Literal["code", "file", "workspace", "command", "daemon"]


@dataclass(frozen=True)
class BuiltinRun:
    """How the daemon runs one built-in tool."""

    kind: RunKind
    """The request kind the sandbox's runner gets (see `sandbox.runner_channel`);
    "daemon": no sandbox, `in_daemon` runs it (`tooljaild.tools.in_daemon`)."""
    payload: Callable[[Mapping[str, Any]], dict[str, Any]]
    """The request's payload, from the call's checked arguments."""
    prepare: Callable[[dict[str, Any], Settings], dict[str, Any]] | None = None
    """Checks the arguments beyond the schema at admission, before anything is
    recorded or run, and returns them as the call keeps them. Raises
    `InvalidArgumentsError`."""
    output_is_data: bool = True
    """The result's data is the program's `{stdout, stderr, exit_code}`; False:
    it is the value the run returned (the workspace tools' op results)."""
    in_daemon: Handler | None = None
    """For kind "daemon": the handler the daemon awaits instead of a sandbox."""
    needs_session: bool = False
    """It works on a session (install_packages): a call without one is refused
    at admission, before anything is recorded."""
    command_of: Callable[[Mapping[str, Any]], tuple[str | None, Sequence[str] | None]] | None = None
    """It runs a command (run_command): (command line, argv) of its checked
    arguments, which the allow-list of commands checks at admission
    (`tooljaild.settings.commands.check_command`). None: it runs none."""
    at_once: bool = False
    """It answers at once from what the daemon holds (call_status): it waits for
    no slot and no share or bound of calls refuses it, so that a client whose
    share is full of the very calls it asks about can still ask. (It is still
    journaled, and the daemon's drain still refuses it.)"""


def session_required(tool: str) -> TooljailError:
    """What a call of a `BuiltinRun.needs_session` tool without a session is refused with."""
    egress = ", with egress allowing the package index" if tool == "install_packages" else ""
    return SessionRequiredError(
        f"{tool} works on a session and this call names none: call it with the "
        f"session_id of an open session (create one with CreateSession{egress})"
    )
