"""The grammar of egress rules and host addresses: plain data, parsed once.

It lives on the settings floor because every floor that reads a rule checks it
where it reads it: the config (`[egress]`, `[egress.hosts]`, `[packages]`), a
tool's sandbox profile, the tokens file (auth). `tooljaild.egress.rules`
re-exports `Rule`, `parse_rule` and `parse_rules`, and adds what decides with
them (`narrow`, `EgressNotAllowed`).

A rule is a host and its ports:

    api.example.com             the name, ports 80 and 443
    api.example.com:443         one port
    api.example.com:80,443,8080 several
    api.example.com:*           any port
    *.githubusercontent.com     any name below it (a.x, a.b.x), never the parent itself
    10.0.0.5:8080               an IP literal: matches that address only
    [::1]:443                   an IPv6 literal, bracketed when a port follows

Names are ASCII (an internationalised name is written in punycode, "xn--..."),
lowercased, with one trailing dot stripped. `*` alone is refused: nothing is
allowed without naming it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_PORTS",
    "SECRET_NAME",
    "Rule",
    "check_secret_name",
    "is_ip_literal",
    "normalize_host",
    "parse_address",
    "parse_deny_rules",
    "parse_host_key",
    "parse_rule",
    "parse_rules",
    "valid_host",
]

DEFAULT_PORTS: frozenset[int] = frozenset({80, 443})
"""The ports of a rule that names none."""

# A DNS label: letters, digits, '-' (not at either end); '_' is accepted as real
# names carry it (_acme-challenge, SRV-style records behind mirrors).
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_MAX_NAME = 253
# A whole host name, normalized (see `normalize_host`): what a connection's host
# must be before any rule is asked; one match instead of a loop over labels.
_HOST_NAME = re.compile(
    r"^(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$"
)

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
"""A secret's name: an environment variable's name (its placeholder's variable)."""

# Variables the sandbox's environment needs for itself: a secret of that name would
# replace them with a placeholder (the proxy's and CA settings, the loader, Python).
_RESERVED = frozenset(
    {"PATH", "HOME", "USER", "SHELL", "PWD", "TMPDIR", "LANG", "TERM", "NO_PROXY"}
    | {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"}
    | {"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "NODE_OPTIONS"}
)
_RESERVED_PREFIXES = ("LD_", "PYTHON", "PIP_", "TOOLJAIL_")


def check_secret_name(name: object) -> str | None:
    """Why `name` cannot name a secret; None when it can."""
    if not isinstance(name, str) or not SECRET_NAME.match(name):
        return (
            f"secret name {name!r} must be an environment variable's name "
            "(letters, digits, '_'; not starting with a digit; at most 128)"
        )
    upper = name.upper()
    if upper in _RESERVED or upper.startswith(_RESERVED_PREFIXES):
        return f"secret name {name!r} is a variable the sandbox needs for itself; choose another"
    return None


def _may_be_ip(host: str) -> bool:
    # Cheap first: an address has a ':' (IPv6) or only digits and dots (IPv4);
    # parsing every name with ipaddress (a raised ValueError each) costs ~5 µs.
    return ":" in host or host.replace(".", "").isdigit()


def is_ip_literal(host: str) -> bool:
    """Whether `host` (normalized, without brackets) is an IPv4 or IPv6 address."""
    if not _may_be_ip(host):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def valid_host(host: str) -> bool:
    """Whether `host` (normalized) is a host name or an IP literal a rule could name.

    A host such as "evil.com\\0.x.com" or "a/.x.com" ends like a wildcard's
    domain: it is refused before any rule is asked, never matched.
    """
    if len(host) <= _MAX_NAME and _HOST_NAME.match(host):
        return True
    return is_ip_literal(host)


def normalize_host(host: str) -> str:
    """The form rules compare: lowercased, brackets and one trailing dot stripped,
    an IP literal in its canonical text ("::1", "10.0.0.5").

    It never raises: a host that is no valid name simply matches no rule.
    """
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith("."):
        host = host[:-1]
    if not _may_be_ip(host):
        return host
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _inet_aton_reads(name: str) -> bool:
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def _check_name(name: str, text: str, *, wildcard_ok: bool) -> str:
    """The normalized host of a rule or a hosts-map key; ValueError saying what is wrong."""
    if not name:
        raise ValueError(f"{text!r}: no host")
    if not name.isascii():
        try:
            suggestion = name.encode("idna").decode()
        except UnicodeError:
            suggestion = "its punycode form (xn--...)"
        raise ValueError(f"{text!r}: host names are ASCII; write {suggestion}")
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        if getattr(address, "scope_id", None):
            raise ValueError(f"{text!r}: an IPv6 zone (%...) is not allowed")
        return str(address)
    wildcard = name.startswith("*.")
    body = name[2:] if wildcard else name
    if wildcard and not wildcard_ok:
        raise ValueError(f"{text!r}: a wildcard is not allowed here; name one host")
    if name == "*":
        raise ValueError(
            f"{text!r}: '*' alone would allow every host; name the hosts "
            "(api.example.com) or a domain's subdomains (*.example.com)"
        )
    if "*" in body:
        raise ValueError(f"{text!r}: '*' may only open a rule, as in *.example.com")
    if len(body) > _MAX_NAME:
        raise ValueError(f"{text!r}: a host name has at most {_MAX_NAME} characters")
    labels = body.split(".")
    for label in labels:
        if not _LABEL.match(label):
            raise ValueError(
                f"{text!r}: {label!r} is not a host name label (letters, digits, '-', "
                "'_'; 1..63 characters; no '-' at either end)"
            )
    if labels[-1].isdigit() or _inet_aton_reads(body):
        # "10.0.0", "0x7f000001" or "*.0.0.5" read as an address to some resolvers
        # (inet_aton): an address is written whole, and a wildcard never covers one.
        raise ValueError(f"{text!r}: neither a host name nor a whole IP address")
    return name


def _parse_ports(spec: str, text: str) -> frozenset[int] | None:
    if spec == "*":
        return None
    ports: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 65535:
            raise ValueError(f"{text!r}: port {part!r} is not a number from 1 to 65535 (or '*')")
        ports.add(int(part))
    return frozenset(ports)


def _split_host_port(text: str) -> tuple[str, str | None]:
    """("host", "ports" or None) of "host", "host:p", "[v6]", "[v6]:p", "v6"."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: '[' without ']'")
        host, rest = text[1:end], text[end + 1 :]
        if not host or not is_ip_literal(host) or ":" not in host:
            raise ValueError(f"{text!r}: brackets hold an IPv6 address only")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{text!r}: after ']' comes ':' and the ports")
        return host, rest[1:]
    if text.count(":") > 1:
        # A bare IPv6 literal has no port: with one, it is written "[::1]:443".
        if is_ip_literal(text):
            return text, None
        raise ValueError(f"{text!r}: an IPv6 address with a port is written [::1]:443")
    host, colon, ports = text.partition(":")
    return host, (ports if colon else None)


@dataclass(frozen=True)
class Rule:
    """One egress rule: a host (or a domain's subdomains) and its ports.

    Attributes:
        host: Lowercase: "api.example.com", "*.githubusercontent.com", or an IP
            literal in canonical form ("10.0.0.5", "::1").
        ports: The ports it allows; None: any port.
        text: The rule as written, for messages.
    """

    host: str
    ports: frozenset[int] | None
    text: str

    @property
    def wildcard(self) -> bool:
        """Whether it names a domain's subdomains ("*.x.com")."""
        return self.host.startswith("*.")

    def port_matches(self, port: int) -> bool:
        return self.ports is None or port in self.ports

    def host_matches(self, host: str) -> bool:
        """Whether `host` (normalized: see `normalize_host`) is this rule's host.

        "*.x.com" matches "a.x.com" and "a.b.x.com", never "x.com" itself, nor any
        IP literal: an address is reached only by a rule naming that address.
        """
        if self.wildcard:
            # host[1:] is ".x.com"; the parent "x.com" is shorter, so it never ends so.
            return host.endswith(self.host[1:]) and not is_ip_literal(host)
        return host == self.host

    def matches(self, host: str, port: int) -> bool:
        """Whether a connection to `host`:`port` is this rule's (host normalized here;
        a malformed host or a port outside 1..65535 matches nothing)."""
        name = normalize_host(host)
        return (
            0 < port < 65536
            and self.port_matches(port)
            and valid_host(name)
            and self.host_matches(name)
        )

    def covers(self, other: Rule) -> bool:
        """Whether every host and port `other` allows, this rule allows too."""
        if self.ports is not None and (other.ports is None or not other.ports <= self.ports):
            return False
        if other.wildcard:
            # "*.a.x.com" lies within "*.x.com" (and within itself), never within a name.
            return self.wildcard and other.host[1:].endswith(self.host[1:])
        return self.host_matches(other.host)

    def describe(self) -> str:
        """host:ports in a canonical form ("api.example.com:80,443", "[::1]:*")."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        ports = "*" if self.ports is None else ",".join(str(p) for p in sorted(self.ports))
        return f"{host}:{ports}"

    def __str__(self) -> str:
        return self.text


def parse_rule(text: str) -> Rule:
    """One rule from its text (see the module doc for the syntax).

    Raises:
        ValueError: Naming the text and what is wrong with it.
    """
    if not isinstance(text, str):
        raise ValueError(f"an egress rule is a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise ValueError("an egress rule is empty")
    if len(text) > 1024:
        raise ValueError(f"{text[:40]!r}...: an egress rule has at most 1024 characters")
    if any(c.isspace() for c in text):
        raise ValueError(f"{text!r}: an egress rule holds no whitespace")
    if "/" in text or "@" in text:
        _, sep, rest = text.partition("://")
        example = rest.split("/")[0].split("@")[-1] if sep else "api.example.com"
        raise ValueError(
            f"{text!r}: a rule names a host and ports, not a URL or a path: write {example}"
        )
    host, ports = _split_host_port(text)
    return Rule(
        host=_check_name(host, text, wildcard_ok=True),
        ports=DEFAULT_PORTS if ports is None else _parse_ports(ports, text),
        text=text,
    )


def parse_rules(texts: Iterable[str], where: str) -> tuple[Rule, ...]:
    """Rules from their texts, in order.

    Args:
        texts: The rules as written.
        where: Where they come from, for the message ("[egress] allow").

    Raises:
        ValueError: "{where}: ..." naming the first bad rule.
    """
    if isinstance(texts, str):
        raise ValueError(f"{where}: rules are a list of strings, got one string {texts!r}")
    rules = []
    for text in texts:
        try:
            rules.append(parse_rule(text))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return tuple(rules)


def parse_deny_rules(texts: Iterable[str], where: str) -> tuple[Rule, ...]:
    """Deny rules: as `parse_rules`, but a rule naming no port denies every port.

    "evil.example.com" in a deny list means the host, not only its ports 80
    and 443: an operator who denies a host would not expect port 8443 to pass.

    Raises:
        ValueError: "{where}: ..." naming the first bad rule.
    """
    rules = parse_rules(texts, where)
    return tuple(
        Rule(host=r.host, ports=None, text=r.text) if _split_host_port(r.text)[1] is None else r
        for r in rules
    )


def parse_host_key(key: str) -> tuple[str, int | None]:
    """A `[egress.hosts]` key: "name" (any port) or "name:port" -> (name, port).

    Raises:
        ValueError: Naming the key and what is wrong.
    """
    text = key.strip()
    host, ports = _split_host_port(text) if text else ("", None)
    name = _check_name(host, key, wildcard_ok=False)
    if ports is None:
        return name, None
    if not ports.isdigit() or not 1 <= int(ports) <= 65535:
        raise ValueError(f"{key!r}: the port after the name is a number from 1 to 65535")
    return name, int(ports)


def parse_address(value: str) -> tuple[str, int]:
    """A `[egress.hosts]` value: "address:port" ("10.0.0.5:8080", "[::1]:8443",
    "mirror.lan:3141") -> (address, port).

    Raises:
        ValueError: Naming the value and what is wrong.
    """
    text = value.strip()
    if not text:
        raise ValueError("an address is empty: write address:port")
    host, ports = _split_host_port(text)
    if ports is None:
        raise ValueError(f"{value!r}: give the port too (address:port, [::1]:8443)")
    if not ports.isdigit() or not 1 <= int(ports) <= 65535:
        raise ValueError(f"{value!r}: the port is a number from 1 to 65535")
    return _check_name(host, value, wildcard_ok=False), int(ports)
