"""A tool's cache (`@tool(cache_s=...)`): an earlier success given again, not run again.

The cache is the journal: a call of a user tool with `cache_s` > 0 first looks
there (`Journal.cached`, one index lookup) for a success of the same tool, by
the same client (the identity's name), with the same canonical arguments and
nothing else asked (no session, egress or secrets: the same fingerprint), that
ended at most `cache_s` seconds ago. On a hit the call does not run: it is
admitted and journaled as a call of its own (its own id: history shows it, and
a retry of that id answers the same), and ends at once with the earlier result,
marked `cached` and naming the call that ran (`cached_from`).

What comes before a run comes before a cached answer too, checked by the
manager before it asks here: the caller's allow-list, the daemon's and the
client's admission bounds, the egress the tool needs. No cached answer:

- for a built-in (`Tool` refuses `cache_s` on one);
- in a session: a session's interpreter and workspace make a tool's answer
  depend on more than its arguments;
- for a call that asks for egress rules or secrets of its own;
- for a call its identity's policy holds for an approver: an approver decides
  on each call, and a policy changed since the earlier run still holds;
- without a journal.

A cached answer holds no slot and no sandbox: it ends before `admit` returns.
Its result's effect is `none` (this call did nothing) and its usage is zero.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid

from tooljail.common import arguments_sha256
from tooljail.types import Effect, ToolResult, Usage
from tooljaild.calls.book import CallBook
from tooljaild.calls.call import Call
from tooljaild.calls.intake import CheckedRequest
from tooljaild.journal.rows import JournalEntry
from tooljaild.journal.store import Journal, JournalError

__all__ = ["answer"]

log = logging.getLogger(__name__)


def answer(book: CallBook, request: CheckedRequest) -> Call | None:
    """The call `request` asks for, answered from its tool's cache; None: it runs.

    Call it once the request is past every check a run passes (see the module
    docstring), for a call in a fresh sandbox, with no await before the answer.

    Returns:
        A new call, admitted, journaled and ended with the earlier success
        (`cached`, `cached_from`); None on a miss, or when the cache does not apply.

    Raises:
        JournalError: Journaling the cached call's admission failed (as a run's).
    """
    tool = request.tool
    journal = book.journal
    if not _applies(request) or journal is None:
        return None
    sha = arguments_sha256(request.arguments)
    try:
        hit = _original(journal, request, sha, since=time.time() - tool.options.cache_s)
    except JournalError as exc:  # the call runs: a cache is never a reason to fail
        log.warning("cannot look up a cached result of %s: %s", tool.name, exc)
        return None
    if hit is None:
        return None
    original, result = hit
    call = Call(
        request.call_id or uuid.uuid4().hex,
        tool,
        request.arguments,
        request.fingerprint,
        request.timeout_s,
        book.settings,
        book.settings.limits,
        request.client,
    )
    call.arguments_sha256 = sha
    book.admitted(call, request.arguments_json, request.rerun)
    book.calls[call.call_id] = call
    book.end(call, cached_result(call, original, result))
    # What the manager does when a call's task is over: this one has no task.
    call.events.close()
    call.compact()
    book.forget_old(call)
    return call


def _applies(request: CheckedRequest) -> bool:
    """Whether the cache may answer `request` (see the module docstring)."""
    tool = request.tool
    return (
        tool.options.cache_s > 0
        and tool.source == "user"
        and not request.gated
        and not request.egress
        and not request.secrets
    )


def _original(
    journal: Journal, request: CheckedRequest, sha: str, *, since: float
) -> tuple[JournalEntry, ToolResult] | None:
    """The call that really ran whose success answers `request`, and its result;
    None when there is none that ended at or after `since`.

    The latest success found may itself be a cached answer, ended later than
    the run it copies: the run is what must be recent enough, so the cache of
    a tool asked every minute still expires, and `cached_from` names the run.
    """
    entry = journal.cached(
        client=request.client,
        tool=request.tool.name,
        arguments_sha256=sha,
        since=since,
        fingerprint=request.fingerprint,
    )
    result = None if entry is None else entry.result()
    if entry is None or result is None:
        return None
    if result.cached_from and result.cached_from != entry.call_id:
        entry = journal.get(result.cached_from)
        result = None if entry is None else entry.result()
        if entry is None or result is None or entry.status != "success":
            return None
        if entry.ended is None or entry.ended < since:
            return None
    return entry, result


def cached_result(call: Call, original: JournalEntry, result: ToolResult) -> ToolResult:
    """`original`'s result, given again as `call`'s: the same data, message and
    artifacts, marked cached, with a message that says so (for a model: what
    it reads is not fresh). Nothing ran: effect none, no usage, no time."""
    when = datetime.datetime.fromtimestamp(original.ended or original.created, tz=datetime.UTC)
    note = (
        f"Cached result of call {original.call_id}, which ran at "
        f"{when.isoformat(timespec='seconds').replace('+00:00', 'Z')}: the tool did not "
        f"run again (it caches a success for {call.tool.options.cache_s:g}s)."
    )
    return result.model_copy(
        update={
            "call_id": call.call_id,
            "message": f"{note} {result.message}".strip(),
            "effect": Effect.NONE,
            "still_running": False,
            "duration_s": 0.0,
            "usage": Usage(),
            "egress_denied": (),
            "processes_ended": (),
            "session_id": "",
            "session_reset": False,
            "arguments_sha256": call.arguments_sha256,
            "cached": True,
            "cached_from": original.call_id,
        }
    )
