"""Who may reach `tooljail mcp --listen`: a bearer token, TLS off loopback, Host/Origin checks.

Anyone who reaches the HTTP bridge acts as the bridge's identity on the
daemon, so the listener admits only requests that carry the bridge's bearer
token (`Authorization: Bearer <token>`), compared in constant time; any other
request is answered 401 with a `WWW-Authenticate: Bearer` challenge before mcp
sees it. The token comes from a file (`--token-file`) or the environment
(`TOOLJAIL_MCP_TOKEN`), never from the command line, where every local user
reads it in the process list.

A token sent in clear text is anyone's on the path, so a listener off
loopback needs TLS (`--tls-cert-file`/`--tls-key-file`, served by uvicorn);
without it the bridge refuses to start and says how to front it instead.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import ssl
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MIN_TOKEN_CHARS",
    "TOKEN_ENV",
    "BearerGate",
    "HttpSecurity",
    "is_loopback",
    "load_token",
    "security_for",
]

TOKEN_ENV = "TOOLJAIL_MCP_TOKEN"
"""The environment variable holding the HTTP bridge's bearer token (if no `--token-file`)."""

MIN_TOKEN_CHARS = 16
"""A shorter token is refused: it could be guessed by trying."""

REALM = "tooljail-mcp"
"""The realm a 401's `WWW-Authenticate` challenge names."""

_HOW_TO_MAKE = (
    "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))' > mcp.token "
    "&& chmod 600 mcp.token"
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpSecurity:
    """What the HTTP listener requires: its token, and its TLS files (None: plain HTTP)."""

    token: str
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"the MCP bridge's token ({where}) must be at least {MIN_TOKEN_CHARS} characters, "
            f"got {len(token)}: {_HOW_TO_MAKE}"
        )
    # It travels in an HTTP header: one line of visible ASCII.
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise ValueError(
            f"the MCP bridge's token ({where}) must be one line of printable ASCII without "
            f"spaces: {_HOW_TO_MAKE}"
        )
    return token


def _private_file(path: Path, what: str) -> None:
    """Refuses a file other local users can read (a secret there is theirs too).

    Raises:
        ValueError: When it is not a regular file, or is readable by group or others.
    """
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} {str(path)!r} is not a regular file")
    if mode & 0o077:
        raise ValueError(
            f"{what} {str(path)!r} is readable by other users (mode "
            f"{stat.S_IMODE(mode):04o}): chmod 600 {path}"
        )


def load_token(token_file: str | os.PathLike[str] | None) -> str:
    """The bearer token: from `token_file` if given, else `$TOOLJAIL_MCP_TOKEN`.

    Raises:
        ValueError: When there is none, or it is short, or the file is readable
            by other users; the message says how to make one.
    """
    if token_file is not None:
        path = Path(token_file)
        _private_file(path, "--token-file")
        try:
            return _checked(path.read_text(encoding="utf-8"), f"--token-file {path}")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--token-file {str(path)!r} cannot be read: {e}") from None
    token = os.environ.get(TOKEN_ENV, "")
    if not token.strip():
        raise ValueError(
            "--listen serves the daemon's tools to whoever reaches it, so it requires a bearer "
            f"token: give --token-file PATH (a file only you can read) or set {TOKEN_ENV}; "
            f"{_HOW_TO_MAKE}. Clients send it as 'Authorization: Bearer <token>'."
        )
    return _checked(token, TOKEN_ENV)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address, or `localhost`) is this machine's loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def security_for(
    host: str,
    token_file: str | os.PathLike[str] | None,
    tls_cert_file: str | os.PathLike[str] | None,
    tls_key_file: str | os.PathLike[str] | None,
) -> HttpSecurity:
    """What a listener on `host` requires, checked now, before anything is bound.

    Raises:
        ValueError: No token; only one of the TLS files; a key other users can
            read; a cert and key that do not load; a host off loopback without TLS.
    """
    token = load_token(token_file)
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if tls_cert_file is None or tls_key_file is None:
        if not is_loopback(host):
            raise ValueError(
                f"--listen {host} is not a loopback address, and the bridge would serve its "
                "token and every call in clear text there: give --tls-cert-file and "
                "--tls-key-file, or listen on 127.0.0.1 and put a TLS-terminating proxy "
                "(nginx, caddy, an SSH tunnel) in front of it"
            )
        return HttpSecurity(token)
    _private_file(Path(tls_key_file), "--tls-key-file")
    try:  # fail at the start, saying which file, rather than at uvicorn's start
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            tls_cert_file, tls_key_file
        )
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"--tls-cert-file {str(tls_cert_file)!r} and --tls-key-file "
            f"{str(tls_key_file)!r} do not load as a certificate and its key: {e}"
        ) from None
    return HttpSecurity(token, str(tls_cert_file), str(tls_key_file))


def _digest(value: bytes) -> bytes:
    # Compared as digests: equal lengths, so the comparison's time tells nothing,
    # not even the token's length.
    return hashlib.sha256(value).digest()


class BearerGate:
    """An ASGI wrapper that lets through only requests bearing the token.

    Args:
        app: The app behind it (mcp's Starlette app); its lifespan passes through.
        token: The token a request must bear.
    """

    def __init__(self, app: App, token: str) -> None:
        self._app = app
        self._digest = _digest(token.encode("ascii"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is None:
            await self._app(scope, receive, send)
        elif scope["type"] == "http":
            await _unauthorized(send, *problem)
        # Any other kind of connection (a websocket) without the token: dropped unanswered.

    def _problem(self, scope: Scope) -> tuple[str, str] | None:
        """None if the request bears the token, else the RFC 6750 error and its description."""
        given = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if not given:
            return "", "This MCP server requires 'Authorization: Bearer <token>'."
        scheme, _, credentials = given[0].partition(b" ")
        if len(given) != 1 or scheme.lower() != b"bearer" or not credentials.strip():
            return "invalid_request", "Send exactly one 'Authorization: Bearer <token>' header."
        if not hmac.compare_digest(_digest(credentials.strip()), self._digest):
            return "invalid_token", "The bearer token is not this server's."
        return None


async def _unauthorized(send: Send, error: str, description: str) -> None:
    challenge = f'Bearer realm="{REALM}"'
    if error:
        challenge += f', error="{error}", error_description="{description}"'
    body = json.dumps({"error": error or "unauthorized", "error_description": description})
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", challenge.encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body.encode("ascii")})
