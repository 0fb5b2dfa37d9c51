"""Who is calling: a bearer token, or the subject of a verified client certificate.

`Authenticator.identify(context)` answers for one RPC:

- `authorization: Bearer <token>` metadata: the identity of the tokens file
  whose `token_sha256` is the token's hash. A token that matches none is
  refused even when a client certificate would name an identity: a caller that
  sends a wrong token made a mistake worth hearing about.
- else, on a TLS connection whose client certificate gRPC verified against
  `[tls] client_ca_file`: the identity its subject's common name names (with
  a tokens file, one of its identities; without one, an identity of that name
  with no policy: every tool, the daemon's bounds). A subject with more
  than one CN names nobody: refused with `AMBIGUOUS_CERTIFICATE_MESSAGE`.
- else, when neither a tokens file nor client certificates are configured:
  on the Unix socket, the caller's uid as the kernel tells it (relayed by
  `tooljaild.app.relay`, read by `tooljaild.auth.peer`): an operator's (root, the
  daemon's own uid, `[auth] operator_uids`) is None, nobody in particular,
  who may reach everything; any other uid is the identity "uid:N" with the
  default policy, which owns its calls, sessions and artifacts. On TCP (loopback
  only, without tokens): None (the address's reach is the boundary).

Anything else is `UnauthenticatedError` with one fixed message: it says
neither whether the token or certificate was close, nor which identities,
tools or state the daemon has.

The identities are the tokens file's as last read: a reload (SIGHUP) puts a
new reading in place with `replace_identities`, and every request identified
from then on sees it. Calls already admitted keep the identity they were
admitted with: it was read once, at their admission.

`AuthGate` applies it to every method of the tool service (and reflection,
which would describe the daemon) before the method runs; gRPC health checks
stay open, for probes. Methods that need the identity (fairness, ownership,
the allow-list, approvals) ask `identify(context)` again: hashing one token is
cheaper than any way of carrying the answer on a grpc.aio context.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from tooljail.errors import UnauthenticatedError
from tooljaild.auth.peer import operator_uids, peer_uid, uid_identity
from tooljaild.auth.policy import (
    NAME,
    Identities,
    Identity,
    IdentityChanges,
    changes,
    load_identities,
)
from tooljaild.auth.secret_files import read_secret
from tooljaild.edge.errors import abort_with
from tooljaild.settings.auth import AuthSettings, TlsSettings

log = logging.getLogger(__name__)

__all__ = [
    "AMBIGUOUS_CERTIFICATE_MESSAGE",
    "UNAUTHENTICATED_MESSAGE",
    "AuthGate",
    "Authenticator",
    "common_names",
    "server_credentials",
]

UNAUTHENTICATED_MESSAGE = (
    "this request needs a valid token (authorization: Bearer <token>; the SDK's token= "
    "or TOOLJAIL_TOKEN) or a valid client certificate"
)
"""The one answer to every unauthenticated request: it names what to send, nothing else."""

AMBIGUOUS_CERTIFICATE_MESSAGE = (
    "this client certificate's subject has more than one common name (CN): a certificate "
    "must name exactly one identity"
)
"""The answer to a verified certificate that names more than one identity."""

OPEN_SERVICES = ("grpc.health.v1.Health",)
"""Services answered without authentication: probes must not need a token."""


class Authenticator:
    """Finds the identity of each request (see the module doc).

    Args:
        identities: The tokens file's identities; None: no tokens file.
        client_certificates: Client certificates are required and verified by
            gRPC (`[tls] client_ca_file`): their subject CN names the identity.
        operators: Without tokens or certificates, the uids (on the Unix socket)
            that may reach every client's work; None: `peer.operator_uids()`,
            root and the daemon's own.
    """

    def __init__(
        self,
        identities: Identities | None,
        *,
        client_certificates: bool,
        operators: frozenset[int] | None = None,
    ) -> None:
        self._identities = identities
        self._client_certificates = client_certificates
        self._operators = operator_uids() if operators is None else operators

    @classmethod
    def from_settings(cls, auth: AuthSettings, tls: TlsSettings) -> Authenticator:
        """The authenticator the daemon's `[auth]` and `[tls]` tables describe.

        Raises:
            PolicyError: The tokens file cannot be used (the message says why).
        """
        identities = None if auth.tokens_file is None else load_identities(auth.tokens_file)
        return cls(
            identities,
            client_certificates=tls.client_ca_file is not None,
            operators=operator_uids(tuple(auth.operator_uids)),
        )

    @property
    def required(self) -> bool:
        """Whether requests must authenticate at all."""
        return self._identities is not None or self._client_certificates

    @property
    def identities(self) -> Identities | None:
        return self._identities

    def replace_identities(self, identities: Identities) -> IdentityChanges:
        """Identify every request from now on against `identities` (a reload's
        new reading of the tokens file).

        One attribute is rebound on the event loop's thread, so a request is
        identified against the old reading or the new one, never a mix.

        Returns:
            Which identities were added, removed or altered, by name.

        Raises:
            ValueError: This authenticator was built without a tokens file:
                turning tokens on needs a restart (the gate is built at start).
        """
        if self._identities is None:
            raise ValueError("no tokens file was configured at start: a restart turns tokens on")
        changed = changes(self._identities, identities)
        self._identities = identities
        return changed

    def identify(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The identity of the request on `context`.

        Returns:
            The caller's identity; None when authentication is not configured
            and the caller is an operator, or not on the Unix socket (see the
            module doc).

        Raises:
            UnauthenticatedError: It is configured and the request does not
                carry a valid token or client certificate.
        """
        if not self.required:
            uid = peer_uid(context.peer() or "")
            return None if uid is None or uid in self._operators else uid_identity(uid)
        token = bearer_token(context.invocation_metadata() or ())
        if token is not None:
            found = None if self._identities is None else self._identities.by_token(token)
            if found is None:
                raise UnauthenticatedError(UNAUTHENTICATED_MESSAGE)
            return found
        name = certificate_name(context) if self._client_certificates else None
        if name is not None:
            if self._identities is None:
                return Identity(name=name)
            found = self._identities.by_name.get(name)
            if found is not None:
                return found
        raise UnauthenticatedError(UNAUTHENTICATED_MESSAGE)


def bearer_token(metadata: Any) -> str | None:
    """The token of an `authorization: Bearer <token>` entry, else None."""
    for key, value in metadata:
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def certificate_name(context: grpc.aio.ServicerContext) -> str | None:
    """The common name of the client certificate gRPC verified, if it is a valid
    identity name; None without one.

    gRPC fills `x509_common_name` only for a certificate that chained to the
    server's client CAs (`require_client_auth`): an unverified one never gets here.
    It holds the subject's first CN only; `x509_subject` holds the whole subject.

    Raises:
        UnauthenticatedError: The subject has more than one CN
            (`AMBIGUOUS_CERTIFICATE_MESSAGE`): which one names the caller would be
            a guess, and a CA that signs such a subject may have been fooled into
            adding a name.
    """
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    subjects = auth.get("x509_subject") or []
    if len(names) > 1 or any(common_names(_text(subject)) > 1 for subject in subjects):
        raise UnauthenticatedError(AMBIGUOUS_CERTIFICATE_MESSAGE)
    if len(names) != 1:
        return None
    name = _text(names[0])
    return name if NAME.match(name) else None


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def common_names(subject: str) -> int:
    """How many CN attributes an RFC 2253 subject string (as gRPC's `x509_subject`)
    holds: its attributes are split at each unescaped ',' or '+'."""
    count, attribute, escaped = 0, [], False
    for char in subject + ",":
        if escaped:
            escaped = False
            attribute.append(char)
        elif char == "\\":
            escaped = True
            attribute.append(char)
        elif char in ",+":
            kind = "".join(attribute).split("=", 1)[0].strip().upper()
            count += kind in ("CN", "2.5.4.3", "OID.2.5.4.3")
            attribute = []
        else:
            attribute.append(char)
    return count


KEY_FILE = "the TLS private key ([tls] key_file)"
"""How messages name `[tls] key_file`."""


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """The TLS credentials `[tls]` describes (with client certificates required
    when `client_ca_file` is set).

    Raises:
        OSError: A file cannot be read.
        ExposedSecretError: Others could read or change the key (`read_secret`).
    """
    assert tls.cert_file is not None and tls.key_file is not None  # tls.enabled
    ca = tls.client_ca_file.read_bytes() if tls.client_ca_file is not None else None
    return grpc.ssl_server_credentials(
        [(read_secret(tls.key_file, KEY_FILE), tls.cert_file.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


_Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


class AuthGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every request of a guarded service that does not authenticate,
    before its method runs (see the module doc).

    Args:
        authenticator: Decides who is calling.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not self._auth.required or _open(method):
            return handler
        wrapped: Any = handler
        if handler.unary_unary is not None:
            wrapped = handler._replace(unary_unary=self._unary(handler.unary_unary))
        elif handler.stream_unary is not None:
            wrapped = handler._replace(stream_unary=self._unary(handler.stream_unary))
        elif handler.unary_stream is not None:
            wrapped = handler._replace(unary_stream=self._stream(handler.unary_stream))
        elif handler.stream_stream is not None:
            wrapped = handler._replace(stream_stream=self._stream(handler.stream_stream))
        return wrapped

    async def _check(self, context: grpc.aio.ServicerContext) -> None:
        try:
            self._auth.identify(context)
        except UnauthenticatedError as exc:
            log.info("refused an unauthenticated request from %s", context.peer())
            await abort_with(context, exc)

    def _unary(self, behaviour: _Behaviour) -> _Behaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._check(context)
            return await behaviour(request, context)

        return guarded

    def _stream(self, behaviour: _Behaviour) -> _Behaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await self._check(context)
            async for response in behaviour(request, context):
                yield response

        return guarded


def _open(method: str) -> bool:
    service = method.lstrip("/").split("/", 1)[0]
    return service in OPEN_SERVICES
