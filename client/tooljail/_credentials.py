"""How a client proves who it is: a bearer token, TLS, a client certificate.

Each comes from the client's argument, else from the environment
(`TOOLJAIL_TOKEN`, `TOOLJAIL_TLS_CA`, `TOOLJAIL_TLS_CERT`, `TOOLJAIL_TLS_KEY`),
so one agent host's settings reach every SDK and CLI use without code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from tooljail.errors import InvalidRequestError

__all__ = ["TLS_CA_ENV", "TLS_CERT_ENV", "TLS_KEY_ENV", "TOKEN_ENV", "Credentials"]

TOKEN_ENV = "TOOLJAIL_TOKEN"
"""Environment variable holding the bearer token, when `token` is not given."""
TLS_CA_ENV = "TOOLJAIL_TLS_CA"
"""Environment variable naming the CA file (PEM) the daemon's certificate must chain to."""
TLS_CERT_ENV = "TOOLJAIL_TLS_CERT"
"""Environment variable naming this client's certificate file (PEM), for mTLS."""
TLS_KEY_ENV = "TOOLJAIL_TLS_KEY"
"""Environment variable naming this client's private key file (PEM), for mTLS."""


@dataclass(frozen=True)
class Credentials:
    """A client's token and TLS material, read once.

    Attributes:
        token: Sent as `authorization: Bearer <token>`; None: no token.
        ca: The CA certificates (PEM) that verify the daemon; None with `cert`
            None too: plaintext (a Unix socket, or loopback TCP).
        cert: The client certificate chain (PEM); None: none is presented.
        key: Its private key (PEM).
    """

    token: str | None = None
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def resolve(
        cls,
        token: str | None,
        tls_ca_file: str | os.PathLike[str] | None,
        tls_cert_file: str | os.PathLike[str] | None,
        tls_key_file: str | os.PathLike[str] | None,
    ) -> Credentials:
        """The credentials given, each else from its environment variable.

        Raises:
            TypeError: A token that is not a str.
            InvalidRequestError: An empty or non-ASCII token, a certificate
                without its key (or the reverse), or a file that cannot be read.
        """
        if token is None:
            token = os.environ.get(TOKEN_ENV, "").strip() or None
        elif not isinstance(token, str):
            raise TypeError(f"token must be a str, got {type(token).__name__}")
        elif not token.strip():
            raise InvalidRequestError("token is empty")
        if token is not None and not (token.isascii() and token.isprintable()):
            # It travels as gRPC metadata, which carries printable ASCII only.
            raise InvalidRequestError("the token must be printable ASCII")
        ca = _read(tls_ca_file, TLS_CA_ENV, "tls_ca_file")
        cert = _read(tls_cert_file, TLS_CERT_ENV, "tls_cert_file")
        key = _read(tls_key_file, TLS_KEY_ENV, "tls_key_file")
        if (cert is None) != (key is None):
            raise InvalidRequestError(
                "a client certificate needs its key: give both tls_cert_file and tls_key_file "
                f"(or ${TLS_CERT_ENV} and ${TLS_KEY_ENV})"
            )
        return cls(token=None if token is None else token.strip(), ca=ca, cert=cert, key=key)

    @property
    def tls(self) -> bool:
        """Whether the channel is TLS (a CA or a client certificate was given)."""
        return self.ca is not None or self.cert is not None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every request carries for these credentials."""
        return () if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS channel credentials; None: a plaintext channel."""
        if not self.tls:
            return None
        # No CA given (only a client certificate): the system's roots verify the daemon.
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def _read(given: str | os.PathLike[str] | None, env: str, what: str) -> bytes | None:
    where = what
    if given is None:
        given = os.environ.get(env, "").strip() or None
        where = f"${env}"
    if given is None:
        return None
    try:
        return Path(given).expanduser().read_bytes()
    except OSError as exc:
        raise InvalidRequestError(f"{where}: cannot read {given}: {exc.strerror or exc}") from None
