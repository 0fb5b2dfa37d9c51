"""A call's egress: its policy at admission, its gate while it runs, its net use in its result.

The policy is worked out once, at admission (`policy_for`), before anything is
journaled as run: a refusal there is PERMISSION_DENIED (a level asks for more
than the one above), INVALID_ARGUMENT (a rule that does not parse) or
FAILED_PRECONDITION (egress asked of a daemon without `[egress]`). A call
whose policy is empty (`NO_EGRESS`, the common case) costs nothing more: no
gate, no environment, no work at its end.

A call in a fresh sandbox opens a gate of its own just before its request
goes in (`open_fresh`) and closes it at its end; a call in a session uses its
session's gate, narrowed for the call when it asks for less (`enter_session`,
`leave_session`). Either way what the gate saw between the call's start and
its end goes into the result (`with_net`).
"""

from __future__ import annotations

import dataclasses
import logging

from tooljail.types import EgressDenial, ToolResult, Usage
from tooljaild.auth.policy import Identity
from tooljaild.calls.call import Call
from tooljaild.egress.policy import NO_EGRESS, EgressPolicy
from tooljaild.egress.rules import EgressNotAllowed
from tooljaild.egress.service import EgressService, parse_asked, require_egress
from tooljaild.sandbox.base import RunRequest, Sandbox
from tooljaild.sessions.session import Session
from tooljaild.tools.registry import Tool

__all__ = ["enter_session", "leave_session", "open_fresh", "policy_for", "with_net"]

log = logging.getLogger("tooljaild.egress")


def _tool_rules(tool: Tool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The egress rules and secret names `tool` declares (its profile and options)."""
    return tuple(tool.options.sandbox.egress or ()), tuple(tool.options.secrets)


def policy_for(
    service: EgressService | None,
    identity: Identity | None,
    tool: Tool,
    *,
    egress: tuple[str, ...],
    secrets: tuple[str, ...],
    session: Session | None,
) -> EgressPolicy:
    """The egress policy of a call of `tool` that asks for `egress` and `secrets`.

    In a session, the session's policy, narrowed to the call's rules when it
    asks for some, is what the call gets; the secrets it names must be the
    session's (their placeholders are in the session's environment).

    Raises:
        EgressUnavailableError: Egress or secrets asked of a daemon without `[egress]`.
        InvalidRequestError: A rule of the call does not parse.
        EgressNotAllowed: A level asks for more than the one above (PERMISSION_DENIED).
    """
    options = tool.options
    if service is None and not (egress or secrets or options.sandbox.egress or options.secrets):
        return NO_EGRESS  # at no cost: nothing asks for any, and none is served
    tool_rules, tool_secrets = _tool_rules(tool)
    asked = bool(egress or secrets or tool_rules or tool_secrets)
    if session is not None:
        return _in_session(service, identity, tool, session, egress, secrets)
    live = require_egress(service, asked=asked, what=f"the call of {tool.name!r}")
    if live is None:
        return NO_EGRESS
    call_rules = parse_asked(egress, "the call's egress")
    return live.policy(
        identity,
        # The tool's rules were checked when it was loaded.
        tool=tool.options.sandbox.egress_rules,
        call=call_rules,
        secrets=tool_secrets + secrets,
        what=f"the call of {tool.name!r}",
    )


def _in_session(
    service: EgressService | None,
    identity: Identity | None,
    tool: Tool,
    session: Session,
    egress: tuple[str, ...],
    secrets: tuple[str, ...],
) -> EgressPolicy:
    base = session.egress_policy
    if not (egress or secrets):
        return base
    live = require_egress(service, asked=True, what=f"the call of {tool.name!r}")
    assert live is not None
    held = {s.name for s in base.secrets}
    for name in secrets:
        if name not in held:
            raise EgressNotAllowed(
                f"the call of {tool.name!r} asks for secret {name}, which session "
                f"{session.id} does not hold (it holds: {', '.join(sorted(held)) or 'none'}); "
                "a session's secrets are named when it is created",
                rule=name,
            )
    if not egress:
        return base
    call_rules = parse_asked(egress, "the call's egress")
    session_rules = base.allow
    if not session_rules:
        raise EgressNotAllowed(
            f"the call of {tool.name!r} asks for egress to {egress[0]}, but session "
            f"{session.id} has none: set the session's with set_egress",
            rule=egress[0],
        )
    checked = live.policy(
        identity, session=session_rules, call=call_rules, what=f"the call of {tool.name!r}"
    )
    return live.narrowed(base, checked)


def open_fresh(
    service: EgressService | None, call: Call, sandbox: Sandbox, request: RunRequest
) -> RunRequest:
    """`request`, with the call's gate opened in `sandbox` and its environment,
    when the call has egress; else `request` itself (nothing is done).

    The gate is the call's (`call.gate`) until `close_fresh`.
    """
    policy = call.egress
    if policy.empty or service is None:
        return request
    directory = sandbox.egress_dir
    if directory is None:
        # A backend that gives no egress directory: the call runs, without network.
        log.warning(
            "call %s asks for egress, but its sandbox (%s) has no egress directory: "
            "it runs without network",
            call.call_id,
            sandbox.id,
        )
        return request
    gate = service.open_gate(directory, policy, label=call.call_id)
    call.gate, call.gate_mark = gate, gate.mark()
    env = {**request.env, **service.env(policy)}
    return dataclasses.replace(request, env=env, egress=True)


def close_fresh(call: Call) -> None:
    """Close the gate `open_fresh` opened for the call (none: nothing)."""
    gate = call.gate
    if gate is not None:
        gate.close()


def enter_session(call: Call, session: Session) -> None:
    """At the call's start in `session` (its turn held): mark the session's gate,
    and narrow it for the call when the call asked for less than the session."""
    gate = session.egress_gate
    if gate is None:
        return
    call.gate, call.gate_mark = gate, gate.mark()
    if call.egress is not session.egress_policy:
        gate.set_policy(call.egress)


def leave_session(call: Call, session: Session) -> None:
    """At the call's end in `session`: its gate decides by the session's policy again."""
    gate = call.gate
    if gate is not None and call.egress is not session.egress_policy:
        gate.set_policy(session.egress_policy)


def with_net(call: Call, result: ToolResult) -> ToolResult:
    """`result`, with what the call's gate saw since the call's start: its
    network usage and the connections refused. Without a gate, `result` itself."""
    gate, mark = call.gate, call.gate_mark
    if gate is None or mark is None:
        return result
    usage, denials = gate.since(mark)
    update: dict[str, object] = {
        "egress_denied": tuple(
            EgressDenial(host=d.host, port=d.port, reason=d.reason, rule=d.rule, count=d.count)
            for d in denials
        )
    }
    if result.usage is not None or usage.connections or usage.bytes_out or usage.bytes_in:
        base = result.usage or Usage()
        update["usage"] = base.model_copy(
            update={
                "net_connections": usage.connections,
                "net_bytes_out": usage.bytes_out,
                "net_bytes_in": usage.bytes_in,
            }
        )
    return result.model_copy(update=update)
