"""The tokens file: identities, their token hashes and their policy.

    # /etc/tooljail/tokens.toml (mode 0600, owned by the daemon's user)
    [identities.agent-a]
    token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    tools = ["execute_python_code", "read_file"]   # absent: every tool
    approval = ["upload_file"]                     # these wait for an approver
    max_concurrent_calls = 8                       # absent: the daemon's own bounds
    max_sessions = 2
    egress = ["api.example.com"]                   # absent: the daemon's [egress] allow
    secrets = ["NEWS_API_KEY"]                     # absent: no secret
    commands = ["git", "pytest"]                   # absent: the daemon's [commands] allow

    [identities.ops]
    token_sha256 = "..."
    approver = true

    [identities.build-bot]                          # no token: a client certificate
                                                    # whose subject CN is "build-bot"

A token is never stored: only its SHA-256 (hex), compared in constant time.
An identity's name replaces the caller's self-declared client name for
fairness and owns its calls, sessions and artifacts.

The file is read at start and again on each reload (SIGHUP): `changes` says
which identities a new reading adds, removes or alters, by name only.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tooljail.errors import TooljailError
from tooljaild.auth.secret_files import ExposedSecretError, read_secret
from tooljaild.settings.commands import check_rules
from tooljaild.settings.egress_rules import Rule, check_secret_name, parse_rules

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""An identity's name: what logs, metrics and ownership carry."""


class _IdentityEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_sha256: str | None = None
    tools: list[str] | None = None
    approval: list[str] = Field(default_factory=list)
    approver: bool = False
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    max_sessions: int | None = Field(default=None, ge=0)
    egress: list[str] | None = None
    secrets: list[str] | None = None
    commands: list[str] | None = None

    @field_validator("commands")
    @classmethod
    def _commands(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            check_rules(v, "commands")  # ValueError naming the rule: refused by name
        return v

    @field_validator("egress")
    @classmethod
    def _rules(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            parse_rules(v, "egress")  # ValueError naming the rule: refused by name
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str] | None) -> list[str] | None:
        for name in v or ():
            problem = check_secret_name(name)
            if problem is not None:
                raise ValueError(problem)
        return v

    @field_validator("token_sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("token_sha256 must be 64 hex digits (sha256sum of the token)")
        return None if v is None else v.lower()


class _TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    identities: dict[str, _IdentityEntry] = Field(default_factory=dict)


ALWAYS_ALLOWED = frozenset({"call_status"})
"""Tools every identity may list and call, without an approver, whatever its
`tools` and `approval` say: `call_status` tells a caller of its own calls only,
what GetCall (never refused) tells it already, and the timeout message sends a
model to it; refusing it would leave a model no way to learn whether a call
that timed out took effect."""


@dataclass(frozen=True)
class Identity:
    """One caller the daemon knows, and what it may do.

    Attributes:
        name: The identity's name (the `[identities.NAME]` key).
        token_sha256: Its token's SHA-256 in hex; None: it authenticates by
            client certificate only.
        tools: The tools it may list and call; None: every tool.
        approval: The tools whose calls wait for an approver's decision.
        approver: It may approve or deny others' calls.
        max_concurrent_calls: Its running and queued calls at most; None: the
            daemon's per-client bound.
        max_sessions: Its open sessions at most; None: the daemon's bound.
        egress: The egress rules it may reach at most (within the daemon's
            `[egress] allow`); None: the daemon's ceiling.
        secrets: The secrets it may ask for; None: every one (an identity not
            from a tokens file: without tokens, every secret is allowed). The
            tokens file gives none to an identity that lists none.
        commands: The programs its commands may start (run_command,
            start_process; see tooljaild.settings.commands), within the
            daemon's `[commands] allow`; None: the daemon's list (or none).
    """

    name: str
    token_sha256: str | None = None
    tools: frozenset[str] | None = None
    approval: frozenset[str] = frozenset()
    approver: bool = False
    max_concurrent_calls: int | None = None
    max_sessions: int | None = None
    egress: tuple[Rule, ...] | None = None
    secrets: frozenset[str] | None = None
    commands: frozenset[str] | None = None

    def may_use(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools or tool in ALWAYS_ALLOWED

    def needs_approval(self, tool: str) -> bool:
        return tool in self.approval and tool not in ALWAYS_ALLOWED


class PolicyError(TooljailError, ValueError):
    """The tokens file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Identities:
    """The identities of one tokens file, found by token or by name."""

    by_name: dict[str, Identity]

    def by_token(self, token: str) -> Identity | None:
        """The identity whose token this is, else None (compared in constant time)."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        found = None
        for identity in self.by_name.values():
            # Every hash is compared, so the time says nothing of which matched.
            if identity.token_sha256 is not None and hmac.compare_digest(
                identity.token_sha256, digest
            ):
                found = identity
        return found


@dataclass(frozen=True)
class IdentityChanges:
    """Which identities a new reading of the tokens file adds, removes or alters.

    Only names: a token hash is never logged (a changed token shows as `changed`).
    """

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


def changes(old: Identities, new: Identities) -> IdentityChanges:
    """What differs from `old` to `new`, by identity name (each sorted)."""
    before, after = old.by_name, new.by_name
    return IdentityChanges(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        changed=tuple(sorted(n for n in before.keys() & after.keys() if before[n] != after[n])),
    )


TOKENS_FILE = "the tokens file"
"""How messages name `[auth] tokens_file`."""


def load_identities(path: Path) -> Identities:
    """Reads a tokens file.

    Raises:
        PolicyError: When it cannot be read, others could read or change it
            (tooljaild.auth.secret_files), or it is not a valid tokens file: the
            message names the file and the entry at fault, and never holds a
            token or a hash (it goes to the log on a reload).
    """
    try:
        # Refused unless private: others must neither change nor read it (secret_files).
        raw = tomllib.loads(read_secret(path, TOKENS_FILE).decode())
    except ExposedSecretError as e:
        raise PolicyError(str(e)) from None
    except OSError as e:
        raise PolicyError(f"cannot read the tokens file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:  # its text quotes the bytes: only where they are
        raise PolicyError(
            f"the tokens file {path} is not UTF-8 text (byte {e.start} is not)"
        ) from None
    except tomllib.TOMLDecodeError as e:  # its text says where, never what
        raise PolicyError(f"the tokens file {path} is not valid TOML: {e}") from None
    try:
        parsed = _TokensFile.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PolicyError(f"the tokens file {path}: {where}: {first['msg']}") from None
    identities: dict[str, Identity] = {}
    hashes: dict[str, str] = {}
    for name, entry in parsed.identities.items():
        if not NAME.match(name):
            raise PolicyError(
                f"the tokens file {path}: identity name {name!r} must be letters, digits, "
                "'.', '_' or '-' (at most 128)"
            )
        if entry.token_sha256 is not None:
            if entry.token_sha256 in hashes:
                raise PolicyError(
                    f"the tokens file {path}: identities {hashes[entry.token_sha256]!r} and "
                    f"{name!r} have the same token"
                )
            hashes[entry.token_sha256] = name
        identities[name] = Identity(
            name=name,
            token_sha256=entry.token_sha256,
            tools=None if entry.tools is None else frozenset(entry.tools),
            approval=frozenset(entry.approval),
            approver=entry.approver,
            max_concurrent_calls=entry.max_concurrent_calls,
            max_sessions=entry.max_sessions,
            egress=None if entry.egress is None else parse_rules(entry.egress, "egress"),
            secrets=frozenset(entry.secrets or ()),
            commands=None if entry.commands is None else frozenset(entry.commands),
        )
    return Identities(by_name=identities)
