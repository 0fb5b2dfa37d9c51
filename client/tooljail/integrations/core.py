"""What every framework adapter shares: the tools' specs, one call, and its text.

An adapter turns a `ToolSpec` into its framework's tool object and an `Outcome`
into its framework's success or failure form; everything else is here, once:

- `tool_specs(target, names)` lists the daemon's tools (or the named ones, in
  that order) with their JSON schemas, each given an optional `timeout_s`
  argument: models ask for a timeout, and the daemon bounds it by the tool's
  `max_timeout_s` (the schema says so too).
- `run` / `arun` call one tool and never raise for what a model can act on: a
  tool's failure, a timeout (with the call id and whether it is still running,
  so the agent can check later), a cancellation, a lost call, a refusal by the
  daemon (bad arguments, overload, an ended session, no daemon) all become an
  `Outcome` with `ok=False` and a text that says what happened and what to do.
- `stream` / `astream` yield the output text as it arrives, then the `Outcome`.

A target is a `Client`, `AsyncClient`, `Session` or `AsyncSession`; with a
session every call runs in its interpreter and workspace.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import importlib.util
import json
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from tooljail._async_session import AsyncSession
from tooljail._client import AsyncClient, Client
from tooljail._session import Session
from tooljail._types import (
    ArtifactRef,
    CallStatus,
    Effect,
    Output,
    StreamKind,
    ToolInfo,
    ToolResult,
)
from tooljail.errors import (
    DaemonUnavailableError,
    OverloadedError,
    SessionEndedError,
    TooljailError,
    ToolNotFoundError,
    TransportError,
)

__all__ = [
    "TIMEOUT_ARG",
    "AsyncTarget",
    "Outcome",
    "OutcomeKind",
    "SyncTarget",
    "Target",
    "ToolSpec",
    "arun",
    "astream",
    "atool_specs",
    "chunk_text",
    "is_async",
    "outcome_of",
    "outcome_of_error",
    "require",
    "run",
    "specs_of",
    "split_arguments",
    "stream",
    "tool_specs",
]

SyncTarget = Client | Session
AsyncTarget = AsyncClient | AsyncSession
Target = SyncTarget | AsyncTarget

TIMEOUT_ARG = "timeout_s"
"""The argument every adapted tool takes besides its own: the call's timeout in seconds."""

MAX_TEXT_CHARS = 20_000
"""A model reads at most this much of one stream of a result; the rest is named, not sent.

The whole output is kept by the daemon as an artifact when it is larger than
the result holds (`read_artifact` pages through it)."""


def require(module: str, extra: str, *, entry: str | None = None) -> ModuleType:
    """Imports a framework's module, or says which package to install, or why it failed.

    Args:
        module: The module to import.
        extra: The extra of `tooljail` that installs the framework.
        entry: The framework's public entry, imported first as its users do
            (some frameworks' inner modules only import in that order).

    Raises:
        ImportError: When the framework is not installed, naming the extra to
            install; when it is installed but does not import, with the real
            error (never "not installed" then).
    """
    top = module.split(".")[0]
    try:
        if entry is not None:
            importlib.import_module(entry)
        return importlib.import_module(module)
    except ImportError as e:
        if not _installed(top):
            raise ImportError(
                f"this integration needs {top!r}, which is not installed: "
                f"pip install 'tooljail[{extra}]'"
            ) from e
        raise ImportError(
            f"{top!r} {_version(top)}is installed, but importing {module!r} failed: "
            f"{type(e).__name__}: {e}"
        ) from e


def _installed(top: str) -> bool:
    """Whether the package `top` is there to import (not: whether it imports)."""
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):  # a broken parent, a __spec__ of None
        return False


def _version(top: str) -> str:
    """`top`'s installed version and a space, if its metadata says (its distribution
    may have another name: then nothing)."""
    try:
        return importlib.metadata.version(top) + " "
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""


def is_async(target: Target) -> bool:
    """Whether calls through `target` are awaited (an AsyncClient or AsyncSession)."""
    return isinstance(target, AsyncClient | AsyncSession)


# --- the tools --------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """One daemon tool as an adapter registers it.

    Attributes:
        info: The tool as the daemon serves it.
        name: The name the framework registers; the daemon's name unless an
            adapter renamed it (LightAgent refuses some names).
        description: What the model reads: the daemon's description.
        parameters: The JSON schema of the arguments, with `timeout_s` added.
    """

    info: ToolInfo
    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def tool(self) -> str:
        """The daemon's name for the tool: the one a call sends."""
        return self.info.name

    @property
    def idempotent(self) -> bool:
        return self.info.idempotent

    @property
    def streaming(self) -> bool:
        return self.info.streaming


def _with_timeout_arg(info: ToolInfo) -> dict[str, Any]:
    schema = dict(info.input_schema or {"type": "object", "properties": {}})
    properties = dict(schema.get("properties") or {})
    if TIMEOUT_ARG in properties:
        # The tool has its own argument of that name: it stays the tool's.
        return schema
    properties[TIMEOUT_ARG] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": info.max_timeout_s,
        "description": (
            f"Optional: stop the call after this many seconds (default {info.timeout_s:g}, "
            f"at most {info.max_timeout_s:g}). A call that times out may still take effect."
        ),
    }
    schema["properties"] = properties
    schema.setdefault("type", "object")
    return schema


def specs_of(
    tools: Iterable[ToolInfo],
    names: Iterable[str] | None = None,
    *,
    renames: Mapping[str, str] | None = None,
) -> list[ToolSpec]:
    """The specs of `tools`, or of those named, in the order named.

    Args:
        tools: What the daemon serves (`Client.list_tools()`).
        names: The tools to keep; None keeps all.
        renames: The daemon's name -> the name to register, for frameworks that
            refuse some names.

    Raises:
        ToolNotFoundError: When a name is not served, naming those that are.
    """
    served = {t.name: t for t in tools}
    wanted = list(served) if names is None else list(dict.fromkeys(names))
    missing = [n for n in wanted if n not in served]
    if missing:
        raise ToolNotFoundError(
            f"the daemon serves no tool named {', '.join(map(repr, missing))}; "
            f"it serves: {', '.join(sorted(served)) or 'nothing'}"
        )
    renames = renames or {}
    return [
        ToolSpec(
            info=served[n],
            name=renames.get(n, n),
            description=served[n].description,
            parameters=_with_timeout_arg(served[n]),
        )
        for n in wanted
    ]


def _client_of(target: Target) -> tuple[Client | AsyncClient, str | None]:
    if isinstance(target, Session | AsyncSession):
        # A session knows its client only as a host of its methods; one made by
        # Client.session() or AsyncClient.session() has the client itself.
        client = target._client
        if isinstance(client, Client | AsyncClient):
            return client, target.id
        raise TypeError(f"a session of a {type(client).__name__}, not of a tooljail client")
    if isinstance(target, Client | AsyncClient):
        return target, None
    raise TypeError(
        "expected a tooljail Client, AsyncClient, Session or AsyncSession, "
        f"got {type(target).__name__}"
    )


def tool_specs(
    target: SyncTarget,
    names: Iterable[str] | None = None,
    *,
    renames: Mapping[str, str] | None = None,
) -> list[ToolSpec]:
    """The daemon's tools (or the named ones) as specs; see `specs_of`.

    Raises:
        ToolNotFoundError: When a name is not served.
        TransportError: When the daemon cannot be reached.
    """
    client, _ = _client_of(target)
    if not isinstance(client, Client):
        raise TypeError("tool_specs needs a Client or Session; use atool_specs with an AsyncClient")
    return specs_of(client.list_tools(), names, renames=renames)


async def atool_specs(
    target: AsyncTarget,
    names: Iterable[str] | None = None,
    *,
    renames: Mapping[str, str] | None = None,
) -> list[ToolSpec]:
    """As `tool_specs`, for an AsyncClient or AsyncSession."""
    client, _ = _client_of(target)
    if not isinstance(client, AsyncClient):
        raise TypeError("atool_specs needs an AsyncClient or AsyncSession; use tool_specs")
    return specs_of(await client.list_tools(), names, renames=renames)


# --- one call's outcome ---------------------------------------------------------


class OutcomeKind(enum.StrEnum):
    """How a call ended, in the terms an adapter maps to its framework's."""

    SUCCESS = "success"
    ERROR = "error"
    """The tool ran and failed (an exception, a non-zero exit, a limit)."""
    PARTIAL = "partial"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"
    REFUSED = "refused"
    """The daemon refused the call: it did not run (bad arguments, overload...)."""
    UNAVAILABLE = "unavailable"
    """The daemon could not be reached, or the connection broke."""


@dataclass(frozen=True)
class Outcome:
    """One call's ending, as a model reads it.

    Attributes:
        ok: The call succeeded.
        kind: How it ended.
        text: What the model reads: the output on success; on failure what
            happened, whether it may have taken effect, and what to do.
        tool: The daemon's name of the tool.
        call_id: The call's id (to check a timed-out call later: the `call_status`
            tool, or `Client.get_call`).
        still_running: The call timed out and the daemon still runs it.
        result: The daemon's result; None when the call was refused or failed in transit.
        error: The refusal or transport error; None when a result came back.
    """

    ok: bool
    kind: OutcomeKind
    text: str
    tool: str
    call_id: str
    still_running: bool = False
    result: ToolResult | None = None
    error: TooljailError | None = None
    artifacts: tuple[ArtifactRef, ...] = field(default=())

    @property
    def data(self) -> Any:
        """The tool's value on success (None otherwise)."""
        return self.result.data if self.result is not None and self.ok else None

    def as_dict(self) -> dict[str, Any]:
        """The outcome as plain JSON-ready data (for frameworks that want a dict)."""
        out: dict[str, Any] = {
            "ok": self.ok,
            "status": self.kind.value,
            "tool": self.tool,
            "call_id": self.call_id,
            "text": self.text,
        }
        if self.kind is OutcomeKind.TIMEOUT:
            out["still_running"] = self.still_running
        if self.result is not None:
            out["effect"] = self.result.effect.value
        if self.artifacts:
            out["artifacts"] = [a.model_dump() for a in self.artifacts]
        return out


def _clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def _data_text(data: Any) -> str:
    """A tool's value as text: a Python run's streams, a string as is, else JSON."""
    if data is None:
        return ""
    if isinstance(data, str):
        return _clip(data)
    if isinstance(data, dict) and {"stdout", "stderr"} <= data.keys():
        parts = []
        stdout, stderr = str(data.get("stdout") or ""), str(data.get("stderr") or "")
        if stdout:
            parts.append(_clip(stdout.rstrip("\n")))
        if stderr:
            parts.append("stderr:\n" + _clip(stderr.rstrip("\n")))
        code = data.get("exit_code")
        if code not in (None, 0):
            parts.append(f"exit code: {code}")
        return "\n".join(parts)
    return _clip(json.dumps(data, ensure_ascii=False, default=str))


def _artifacts_text(artifacts: Iterable[ArtifactRef]) -> str:
    lines = [
        f"- {a.name or '(unnamed)'} ({a.mime_type}, {a.size_bytes} bytes): "
        f"artifact_id {a.artifact_id}"
        for a in artifacts
    ]
    if not lines:
        return ""
    return "Artifacts (read them with read_artifact, or Client.get_artifact):\n" + "\n".join(lines)


_EFFECT_TEXT = {
    Effect.NONE: "It did not take effect.",
    Effect.APPLIED: "",
    Effect.UNKNOWN: "It may have taken effect: check before calling it again.",
}


def outcome_of(result: ToolResult) -> Outcome:
    """The outcome of a result the daemon gave."""
    kind = OutcomeKind(result.status.value)
    parts: list[str] = []
    if result.session_reset:
        parts.append(
            "Note: the session's interpreter was restarted: its variables and imports "
            "are gone; its files are kept."
        )
    data_text = _data_text(result.data)
    if result.status is CallStatus.SUCCESS:
        if result.message:
            parts.append(result.message)
        parts.append(data_text or "(no output)")
    else:
        head = result.message
        if not head and result.error is not None:
            head = f"{result.error.type}: {result.error.message}".rstrip(": ")
        parts.append(head or f"The call ended: {result.status.value}.")
        traceback = result.error.traceback.rstrip("\n") if result.error is not None else ""
        if traceback and traceback not in data_text:
            parts.append(_clip(traceback, 4000))
        if data_text:
            parts.append("Output:\n" + data_text)
        if result.status is CallStatus.TIMEOUT:
            parts.append(
                f"Call id: {result.call_id}. "
                + (
                    "It is still running on the daemon: call_status with this id says how it ends."
                    if result.still_running
                    else "It was stopped."
                )
            )
        else:
            effect = _EFFECT_TEXT.get(result.effect, "")
            # Said once: the daemon's message often says it already, in its own words.
            if effect and "taken effect" not in " ".join(parts):
                parts.append(effect)
    artifacts = _artifacts_text(result.artifacts)
    if artifacts:
        parts.append(artifacts)
    return Outcome(
        ok=result.status is CallStatus.SUCCESS,
        kind=kind,
        text="\n".join(p for p in parts if p),
        tool=result.tool,
        call_id=result.call_id,
        still_running=result.still_running,
        result=result,
        artifacts=result.artifacts,
    )


def outcome_of_error(tool: str, call_id: str, error: TooljailError) -> Outcome:
    """The outcome of a call the daemon refused, or that failed in transit."""
    if isinstance(error, TransportError):
        kind = OutcomeKind.UNAVAILABLE
        what = (
            "The tool service is not reachable"
            if isinstance(error, DaemonUnavailableError)
            else "The connection to the tool service failed"
        )
        text = (
            f"{what}: {error.message}. The call's effect is unknown; "
            f"call id {call_id} can be checked (call_status) once it is back."
        )
    else:
        kind = OutcomeKind.REFUSED
        text = f"The call was refused ({error.code}): {error.message}. The tool did not run."
        if isinstance(error, OverloadedError):
            text += f" Try again in {error.retry_after_s:g}s."
        if isinstance(error, SessionEndedError):
            text += " The session's variables and files are gone; a new session starts empty."
    return Outcome(ok=False, kind=kind, text=text, tool=tool, call_id=call_id, error=error)


def _bad_timeout(tool: str, call_id: str, message: str) -> Outcome:
    return Outcome(
        ok=False,
        kind=OutcomeKind.REFUSED,
        text=f"The call was refused (bad_timeout): {message}. The tool did not run.",
        tool=tool,
        call_id=call_id,
    )


def split_arguments(
    spec: ToolSpec, arguments: Mapping[str, Any] | None
) -> tuple[dict[str, Any], float | None]:
    """The tool's own arguments and the call's timeout (None: the tool's default).

    Raises:
        ValueError: When `timeout_s` is not a positive number.
    """
    args = dict(arguments or {})
    if TIMEOUT_ARG in (spec.info.input_schema.get("properties") or {}):
        return args, None
    raw = args.pop(TIMEOUT_ARG, None)
    if raw is None:
        return args, None
    try:
        timeout = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"timeout_s must be a number of seconds, got {raw!r}") from None
    if not timeout > 0:
        raise ValueError(f"timeout_s must be more than 0, got {raw!r}")
    return args, timeout


_C = TypeVar("_C", Client, AsyncClient)


def _prepare(
    target: Target,
    spec: ToolSpec,
    arguments: Mapping[str, Any] | None,
    call_id: str | None,
    kind: type[_C],
    wrong_kind: str,
) -> tuple[_C, dict[str, Any], dict[str, Any]] | Outcome:
    """The client, the tool's arguments and the call's options; or the refusal of a bad timeout.

    Raises:
        TypeError: `wrong_kind`, when the target's client is not a `kind`.
    """
    client, session_id = _client_of(target)
    if not isinstance(client, kind):
        raise TypeError(wrong_kind)
    call_id = call_id or uuid.uuid4().hex
    try:
        args, timeout = split_arguments(spec, arguments)
    except ValueError as e:
        return _bad_timeout(spec.tool, call_id, str(e))
    return client, args, {"tool_timeout_s": timeout, "call_id": call_id, "session_id": session_id}


def run(
    target: SyncTarget,
    spec: ToolSpec,
    arguments: Mapping[str, Any] | None = None,
    *,
    call_id: str | None = None,
) -> Outcome:
    """Calls one tool and waits for its outcome; never raises for what a model can act on.

    Args:
        target: The client, or the session to run in.
        spec: The tool.
        arguments: The tool's arguments, with an optional `timeout_s`.
        call_id: The call's id (an idempotency key: the same id and arguments
            give the stored outcome); None makes one. A caller that may cancel
            the call (`Client.cancel`) passes its own.
    """
    prepared = _prepare(
        target, spec, arguments, call_id, Client, "run needs a Client or Session; use arun"
    )
    if isinstance(prepared, Outcome):
        return prepared
    client, args, options = prepared
    try:
        return outcome_of(client.call(spec.tool, args, **options))
    except TooljailError as e:
        return outcome_of_error(spec.tool, options["call_id"], e)


async def arun(
    target: AsyncTarget,
    spec: ToolSpec,
    arguments: Mapping[str, Any] | None = None,
    *,
    call_id: str | None = None,
) -> Outcome:
    """As `run`, awaited, for an AsyncClient or AsyncSession."""
    prepared = _prepare(
        target, spec, arguments, call_id, AsyncClient, "arun needs an AsyncClient; use run"
    )
    if isinstance(prepared, Outcome):
        return prepared
    client, args, options = prepared
    try:
        return outcome_of(await client.call(spec.tool, args, **options))
    except TooljailError as e:
        return outcome_of_error(spec.tool, options["call_id"], e)


def chunk_text(chunk: Output) -> str:
    """One output chunk as the text to stream (stderr and notices marked)."""
    if chunk.stream is StreamKind.STDERR:
        return f"[stderr] {chunk.data}"
    if chunk.stream is StreamKind.NOTICE:
        return f"[tooljail] {chunk.data}\n"
    return chunk.data


def stream(
    target: SyncTarget,
    spec: ToolSpec,
    arguments: Mapping[str, Any] | None = None,
    *,
    call_id: str | None = None,
) -> Iterator[str | Outcome]:
    """Calls one tool, yielding its output text as it arrives, then its `Outcome`.

    Args:
        target: The client, or the session to run in.
        spec: The tool.
        arguments: The tool's arguments, with an optional `timeout_s`.
        call_id: The call's id, as for `run`; None makes one.

    Yields:
        Each output chunk's text (`chunk_text`), then the call's `Outcome` (a
        refusal or a failed RPC too is an `Outcome`, never an exception).
    """
    prepared = _prepare(
        target, spec, arguments, call_id, Client, "stream needs a Client or Session; use astream"
    )
    if isinstance(prepared, Outcome):
        yield prepared
        return
    client, args, options = prepared
    try:
        for item in client.stream(spec.tool, args, **options):
            yield outcome_of(item) if isinstance(item, ToolResult) else chunk_text(item)
    except TooljailError as e:
        yield outcome_of_error(spec.tool, options["call_id"], e)


async def astream(
    target: AsyncTarget,
    spec: ToolSpec,
    arguments: Mapping[str, Any] | None = None,
    *,
    call_id: str | None = None,
) -> AsyncIterator[str | Outcome]:
    """As `stream`, for an AsyncClient or AsyncSession."""
    prepared = _prepare(
        target, spec, arguments, call_id, AsyncClient, "astream needs an AsyncClient; use stream"
    )
    if isinstance(prepared, Outcome):
        yield prepared
        return
    client, args, options = prepared
    try:
        async for item in client.stream(spec.tool, args, **options):
            yield outcome_of(item) if isinstance(item, ToolResult) else chunk_text(item)
    except TooljailError as e:
        yield outcome_of_error(spec.tool, options["call_id"], e)
