"""The secrets file: values the proxy sends to their own hosts, never into a sandbox.

    # /etc/tooljail/secrets.toml (mode 0600, owned by the daemon's user)
    [NEWS_API_KEY]
    value = "..."
    hosts = ["api.example.com"]        # egress rules: where the value may be sent

A secret's name is the environment variable that holds its placeholder in the
sandbox. Read with the same checks as the tokens file (`auth.secret_files`:
a private regular file). A value is never put in an exception's message, a
repr or a log line: messages name the file and the secret only.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from tooljaild.auth.secret_files import ExposedSecretError, read_secret
from tooljaild.egress.rules import Rule, parse_rules
from tooljaild.settings.config import ConfigError
from tooljaild.settings.egress_rules import SECRET_NAME, check_secret_name

__all__ = ["MIN_VALUE_CHARS", "SECRET_NAME", "SecretEntry", "check_secret_name", "load_secrets"]

MIN_VALUE_CHARS = 8
"""The shortest value: the proxy replaces a value with its placeholder in what
comes back, and a shorter one would turn up there by chance."""
MAX_VALUE_CHARS = 64 * 1024


@dataclass(frozen=True, repr=False)
class SecretEntry:
    """One secret of the secrets file.

    Attributes:
        name: Its name (the environment variable holding its placeholder).
        value: The secret: never shown (repr hides it).
        hosts: The rules of the hosts it may be sent to (at least one).
    """

    name: str
    value: str
    hosts: tuple[Rule, ...]

    def __repr__(self) -> str:
        hosts = ", ".join(r.text for r in self.hosts)
        return f"SecretEntry(name={self.name!r}, hosts=[{hosts}], value=<hidden>)"


def _entry(path: Path, name: str, raw: object) -> SecretEntry:
    where = f"the secrets file {path}: secret {name}"
    problem = check_secret_name(name)
    if problem is not None:
        raise ConfigError(f"the secrets file {path}: {problem}")
    if not isinstance(raw, dict):
        raise ConfigError(f'{where} must be a table: [{name}] value = "..." hosts = [...]')
    unknown = sorted(set(raw) - {"value", "hosts"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: value, hosts)")
    value = raw.get("value")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: value must be a string")
    if not MIN_VALUE_CHARS <= len(value) <= MAX_VALUE_CHARS:
        raise ConfigError(
            f"{where}: value must have {MIN_VALUE_CHARS} to {MAX_VALUE_CHARS} characters "
            f"(has {len(value)})"
        )
    if any(c in value for c in "\r\n\0"):
        # It goes into header lines: a line break would let it add headers of its own.
        raise ConfigError(f"{where}: value holds a line break or NUL")
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(f"{where}: hosts must list at least one egress rule")
    try:
        rules = parse_rules(hosts, f"{where}: hosts")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return SecretEntry(name=name, value=value, hosts=rules)


def load_secrets(path: Path) -> dict[str, SecretEntry]:
    """The secrets of a secrets file, by name.

    Raises:
        ConfigError: When it cannot be read, others could read or change it, or an
            entry is bad: the message names the file and the secret, never a value.
    """
    try:
        data = read_secret(path, "the secrets file")
    except ExposedSecretError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise ConfigError(f"cannot read the secrets file {path}: {e.strerror or e}") from None
    try:
        raw = tomllib.loads(data.decode())
    except UnicodeDecodeError as e:  # its text quotes the bytes: only say where
        raise ConfigError(f"the secrets file {path} is not UTF-8 (byte {e.start} is not)") from None
    except tomllib.TOMLDecodeError as e:  # says where (line, column), never what
        raise ConfigError(f"the secrets file {path} is not valid TOML: {e}") from None
    return {name: _entry(path, name, entry) for name, entry in raw.items()}
