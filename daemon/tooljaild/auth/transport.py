"""What the daemon's listener needs from `[auth]`, `[tls]` and the socket keys.

`listener_security(settings)` is read once, before anything is bound: a tokens
file or a certificate that cannot be used stops the daemon with a sentence,
instead of a listener that refuses everyone.
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from tooljail.errors import TooljailError
from tooljaild.auth.authenticator import Authenticator, server_credentials
from tooljaild.auth.policy import PolicyError

if TYPE_CHECKING:
    from tooljaild.config import Settings

__all__ = [
    "ListenerSecurity",
    "SecurityConfigError",
    "SocketPermissions",
    "listener_security",
    "socket_permissions",
]


class SecurityConfigError(TooljailError, ValueError):
    """A security setting cannot be used; the message says which and why."""


@dataclass(frozen=True)
class SocketPermissions:
    """The Unix socket's owner, group and mode; -1: leave the owner or group as made."""

    mode: int = 0o660
    uid: int = -1
    gid: int = -1


@dataclass(frozen=True)
class ListenerSecurity:
    """Who may connect, and how.

    Attributes:
        authenticator: Decides each request's identity.
        credentials: The server's TLS credentials; None: plaintext.
        socket: The Unix socket's owner, group and mode (unused on TCP).
    """

    authenticator: Authenticator
    credentials: grpc.ServerCredentials | None
    socket: SocketPermissions


def socket_permissions(owner: str | None, group: str | None, mode: str) -> SocketPermissions:
    """`socket_owner`, `socket_group` (names or numbers) and `socket_mode` (octal) resolved.

    Raises:
        SecurityConfigError: No such user or group, or a mode that is not octal
            permission bits.
    """
    try:
        bits = int(mode, 8)
    except ValueError:
        raise SecurityConfigError(
            f"socket_mode {mode!r} is not an octal mode such as 0660"
        ) from None
    if not 0 <= bits <= 0o777:
        raise SecurityConfigError(f"socket_mode {mode!r}: only permission bits (at most 0777)")
    return SocketPermissions(mode=bits, uid=_resolve(owner, "user"), gid=_resolve(group, "group"))


def _resolve(name: str | None, kind: str) -> int:
    if name is None:
        return -1
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid if kind == "user" else grp.getgrnam(name).gr_gid
    except KeyError:
        key = "socket_owner" if kind == "user" else "socket_group"
        raise SecurityConfigError(f"{key}: there is no {kind} named {name!r}") from None


def listener_security(settings: Settings) -> ListenerSecurity:
    """The authenticator, TLS credentials and socket permissions the settings ask for.

    Raises:
        SecurityConfigError: A tokens file, certificate or key cannot be read or
            used, or a socket key is wrong; the message names it.
    """
    try:
        authenticator = Authenticator.from_settings(settings.auth, settings.tls)
    except PolicyError as exc:
        raise SecurityConfigError(str(exc)) from None
    credentials = None
    if settings.tls.enabled:
        try:
            credentials = server_credentials(settings.tls)
        except OSError as exc:
            raise SecurityConfigError(
                f"[tls]: cannot read {exc.filename}: {exc.strerror or exc}"
            ) from None
    socket = socket_permissions(settings.socket_owner, settings.socket_group, settings.socket_mode)
    return ListenerSecurity(authenticator, credentials, socket)
