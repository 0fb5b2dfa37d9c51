"""Real X.509 certificates made in the test: a CA, a server certificate, client ones.

Made with `cryptography` (a dependency of the test extras through grpcio's
tooling), EC P-256 keys so that a whole set takes milliseconds.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A CA that signs server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str) -> None:
        self._dir = directory
        self._name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self._subject = subject
        self.cert = (
            self._builder(subject, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(getattr(self, "_subject", subject))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(
        self,
        common_name: str,
        *,
        server: bool = False,
        also: tuple[str, ...] = (),
        names: tuple[str, ...] = ("localhost",),
    ) -> Pair:
        """A certificate for `common_name`: a server's (for the DNS `names` and
        127.0.0.1) or a client's."""
        key = ec.generate_private_key(ec.SECP256R1())
        # `also`: more common names after the first (a subject no CA should sign).
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in (common_name, *also)]
        )
        builder = self._builder(subject, key.public_key())
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        *(x509.DNSName(n) for n in names),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        stem = f"{self._name}-{common_name}"
        pair = Pair(self._dir / f"{stem}.pem", self._dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pair.key.chmod(0o600)
        return pair
