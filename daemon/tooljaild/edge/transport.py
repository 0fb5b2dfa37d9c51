"""What the daemon's listener needs from `[auth]`, `[tls]` and the socket keys.

`listener_security(settings)` is read once, before anything is bound: a tokens
file or a certificate that cannot be used stops the daemon with a sentence,
instead of a listener that refuses everyone. A reload (SIGHUP) re-reads the
tokens file into its authenticator, and compares `tls_digest` with the files
on disk to say that replaced certificates need a restart (the server's
credentials are built once, with the listener).
"""

from __future__ import annotations

import grp
import hashlib
import pwd
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from tooljail.errors import TooljailError
from tooljaild.auth.policy import PolicyError
from tooljaild.auth.secret_files import ExposedSecretError, read_secret
from tooljaild.edge.authenticator import KEY_FILE, Authenticator, server_credentials
from tooljaild.settings.auth import TlsSettings

if TYPE_CHECKING:
    from tooljaild.settings.config import Settings

__all__ = [
    "ListenerSecurity",
    "SecurityConfigError",
    "SocketPermissions",
    "listener_security",
    "socket_permissions",
    "tls_digest",
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
        tls_digest: `tls_digest` of the `[tls]` files the credentials were
            made from; None: no TLS.
    """

    authenticator: Authenticator
    credentials: grpc.ServerCredentials | None
    socket: SocketPermissions
    tls_digest: str | None = None


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
            used, the tokens file or key is not private to the daemon
            (tooljaild.auth.secret_files), or a socket key is wrong; the
            message names it.
    """
    try:
        authenticator = Authenticator.from_settings(settings.auth, settings.tls)
    except PolicyError as exc:
        raise SecurityConfigError(str(exc)) from None
    credentials, digest = None, None
    if settings.tls.enabled:
        try:
            # The digest first: a file replaced between the two reads makes a
            # reload say "restart" once too often, never once too few.
            digest = tls_digest(settings.tls)
            credentials = server_credentials(settings.tls)
        except ExposedSecretError as exc:
            raise SecurityConfigError(str(exc)) from None
        except OSError as exc:
            raise SecurityConfigError(
                f"[tls]: cannot read {exc.filename}: {exc.strerror or exc}"
            ) from None
    socket = socket_permissions(settings.socket_owner, settings.socket_group, settings.socket_mode)
    return ListenerSecurity(authenticator, credentials, socket, digest)


def tls_digest(tls: TlsSettings) -> str | None:
    """One SHA-256 over the contents of the `[tls]` files; None without TLS.

    Raises:
        OSError: A file cannot be read.
        ExposedSecretError: Others could read or change the key: it is not read.
    """
    if not tls.enabled:
        return None
    digest = hashlib.sha256()
    for path in (tls.cert_file, tls.key_file, tls.client_ca_file):
        # The length first: no two different sets of files hash alike by shifting bytes.
        if path is None:
            data = b""
        elif path == tls.key_file:
            data = read_secret(path, KEY_FILE)
        else:
            data = path.read_bytes()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()
