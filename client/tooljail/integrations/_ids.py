"""The model's tool-call id as the daemon's call id: a replayed conversation runs nothing twice.

A framework gives each tool call the model asks for an id of its own (OpenAI's
`tool_call.id`, a Responses item's `call_id`, Anthropic's `tool_use.id`,
LangChain's `ToolCall["id"]`, PyAgenity's injected `tool_call_id`, ...). An
adapter passes it here, and the call runs under `call_id_for(target, id)`:
`<client name>:<framework id>`, so that two hosts (client names) cannot collide.
A host that restarts and replays the same conversation (the same ids, the same
arguments) then gets the journaled answer of a call that already ran: the
daemon answers an id it knows with the same arguments from its record, and the
tool does not run twice. The client's name must then be the same across the
restart: set `client_name=` (or $TOOLJAIL_CLIENT); the default, "<host>/<pid>",
is this process's alone.

Call ids are 1 to 128 characters of `A-Za-z0-9._:-`: an id that is not (a
client name with "/", a long or unusual framework id) is mapped
deterministically: its other characters become "_", it is cut to leave room,
and a hash of the whole unmapped id follows ("-" and 16 hex digits), so two
ids that map alike still differ.

The same id with other arguments: the daemon refuses it (ALREADY_EXISTS). That
is not a replay but another call under a reused id (some servers number their
tool calls per turn: "call_0" again and again), so the adapter runs it under a
fresh random id, as it did before it passed the framework's id. Where a
framework gives no id, the call gets a fresh random id, as before.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from tooljail.errors import CallIdConflictError
from tooljail.integrations import core
from tooljail.integrations.core import AsyncTarget, Outcome, SyncTarget, Target, ToolSpec

__all__ = ["arun", "astream", "call_id_for", "namespaced", "run", "stream"]

MAX_CALL_ID = 128
_CALL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_OTHER = re.compile(r"[^A-Za-z0-9._:-]")
_HASH_HEX = 16


def namespaced(client_name: str, framework_id: str) -> str:
    """`<client name>:<framework id>` as a call id (mapped as the module says)."""
    raw = f"{client_name}:{framework_id}"
    if _CALL_ID.fullmatch(raw):
        return raw
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    kept = _OTHER.sub("_", raw)[: MAX_CALL_ID - _HASH_HEX - 1]
    return f"{kept}-{digest}"


def call_id_for(target: Target, framework_id: object) -> str | None:
    """The call id of the framework's tool call `framework_id` through `target`'s
    client; None (a fresh random id) when the framework gave none."""
    if framework_id is None or not str(framework_id).strip():
        return None
    client, _ = core._client_of(target)
    return namespaced(client.client_name, str(framework_id).strip())


def _conflict(outcome: Outcome) -> bool:
    return isinstance(outcome.error, CallIdConflictError)


def run(
    target: SyncTarget, spec: ToolSpec, arguments: Mapping[str, Any] | None, framework_id: object
) -> Outcome:
    """`core.run` under the framework's id (see the module: a conflict runs anew)."""
    call_id = call_id_for(target, framework_id)
    outcome = core.run(target, spec, arguments, call_id=call_id)
    if call_id is not None and _conflict(outcome):
        outcome = core.run(target, spec, arguments)
    return outcome


async def arun(
    target: AsyncTarget, spec: ToolSpec, arguments: Mapping[str, Any] | None, framework_id: object
) -> Outcome:
    """As `run`, awaited."""
    call_id = call_id_for(target, framework_id)
    outcome = await core.arun(target, spec, arguments, call_id=call_id)
    if call_id is not None and _conflict(outcome):
        outcome = await core.arun(target, spec, arguments)
    return outcome


def stream(
    target: SyncTarget, spec: ToolSpec, arguments: Mapping[str, Any] | None, framework_id: object
) -> Iterator[str | Outcome]:
    """`core.stream` under the framework's id. A conflict is refused at admission,
    before any output, so the run anew is the whole stream."""
    call_id = call_id_for(target, framework_id)
    for item in core.stream(target, spec, arguments, call_id=call_id):
        if call_id is not None and isinstance(item, Outcome) and _conflict(item):
            yield from core.stream(target, spec, arguments)
            return
        yield item


async def astream(
    target: AsyncTarget, spec: ToolSpec, arguments: Mapping[str, Any] | None, framework_id: object
) -> AsyncIterator[str | Outcome]:
    """As `stream`, for an async target."""
    call_id = call_id_for(target, framework_id)
    async for item in core.astream(target, spec, arguments, call_id=call_id):
        if call_id is not None and isinstance(item, Outcome) and _conflict(item):
            async for again in core.astream(target, spec, arguments):
                yield again
            return
        yield item
