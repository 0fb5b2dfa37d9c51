"""TLS for the egress proxy: the daemon's interception CA, upstream trust, SNI.

`InterceptCA` is the authority a sandbox that holds secrets trusts (through the
bundle `write_bundle` makes): the proxy terminates that sandbox's TLS with a
leaf minted per host, so that it can swap placeholders for values on the way to
their own hosts and see a placeholder sent anywhere else. The CA's key never
leaves the daemon's state directory (0600); leaves live one day and only in
memory (an LRU of their `SSLContext`s).

`upstream_context` is what the proxy trusts on the other side: the system's
roots plus the operator's `ca_file`, never the interception CA.

`client_hello_sni` reads the server name from a ClientHello (pass-through mode
checks it against the CONNECT host; interception checks it before handshaking).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tooljail.errors import TooljailError

CA_VALIDITY = datetime.timedelta(days=3650)
"""How long the interception CA is valid (it is re-made when it has expired)."""
LEAF_VALIDITY = datetime.timedelta(days=1)
"""How long a minted leaf is valid; a context older than this is minted again."""
LEAF_CACHE = 256
"""How many hosts' server contexts are kept (least recently used dropped first)."""
_BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start a little in the past: a sandbox's clock may lag the host's."""
_SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_MAX_HELLO = 64 * 1024
"""A ClientHello bigger than this is not one a client sends; refused unread."""


class NeedMore(TooljailError):
    """The bytes so far are the start of a TLS ClientHello, but not all of it."""

    def __init__(self, message: str = "the ClientHello is not whole yet: read more") -> None:
        super().__init__(message)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to `path` atomically, created with `mode` (never wider first)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class InterceptCA:
    """The daemon's interception authority and the leaves it mints per host.

    Thread-safe: `server_context` may be called from any thread (the proxy's
    loop runs in its own thread).
    """

    def __init__(
        self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, *, cache: int = LEAF_CACHE
    ) -> None:
        self._key = key
        self._cert = cert
        self.cert_pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
        """The CA certificate (PEM), what a sandbox trusts."""
        # One key for every leaf: minting is then a signature, not a key
        # generation. It lives only in this process's memory, as the leaves do.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self._ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        self._cache: OrderedDict[str, tuple[datetime.datetime, ssl.SSLContext]] = OrderedDict()
        self._cache_size = cache
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(cls, directory: Path) -> InterceptCA:
        """The CA kept in `directory` (`ca.key` 0600, `ca.pem` 0644), made if missing.

        A CA that has expired, or whose files do not match, is made anew (the
        sandboxes get the new one in the bundle of their next start). The
        directory is created 0700 when missing.

        Raises:
            OSError: the directory or files cannot be read or written.
        """
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        key_path, cert_path = directory / "ca.key", directory / "ca.pem"
        loaded = cls._load(key_path, cert_path)
        if loaded is not None:
            return loaded
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tooljail"),
                x509.NameAttribute(NameOID.COMMON_NAME, "tooljail egress interception CA"),
            ]
        )
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # The key first: a crash between the two leaves a key without a
        # certificate, which the next start replaces; never a certificate
        # whose key is lost.
        _write_private(key_path, key_pem, 0o600)
        _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        return cls(key, cert)

    @classmethod
    def _load(cls, key_path: Path, cert_path: Path) -> InterceptCA | None:
        try:
            key_pem = key_path.read_bytes()
            cert_pem = cert_path.read_bytes()
        except FileNotFoundError:
            return None
        # The key must stay the daemon's alone: tighten a mode someone widened.
        if key_path.stat().st_mode & 0o077:
            key_path.chmod(0o600)
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
            cert = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            return None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            return None
        if cert.public_key() != key.public_key() or cert.not_valid_after_utc <= _now():
            return None
        return cls(key, cert)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for `host` (a name or IP literal).

        Cached per host (LRU of `LEAF_CACHE`); minted again once the leaf is
        older than half its validity. Minting costs a signature and a context
        (about a millisecond: see docs/decisions.md). The context offers only
        HTTP/1.1 by ALPN: the proxy reads HTTP/1.1.
        """
        now = _now()
        with self._lock:
            cached = self._cache.get(host)
            if cached is not None and cached[0] > now:
                self._cache.move_to_end(host)
                return cached[1]
        context = self._mint(host, now)
        with self._lock:
            self._cache[host] = (now + LEAF_VALIDITY / 2, context)
            self._cache.move_to_end(host)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return context

    def _mint(self, host: str, now: datetime.datetime) -> ssl.SSLContext:
        # A common name may hold at most 64 characters; the SAN is what counts.
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, host)] if len(host) <= 64 else []
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([_san(host)]), critical=not subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._ski), False
            )
            .sign(self._key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self._leaf_key_pem
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        # One TLS 1.3 session ticket, sent right after the client's Finished:
        # it carries the ACK of that Finished. With none, nothing goes back,
        # and a client that leaves Nagle on (http.client, so urllib) holds its
        # request until the delayed ACK fires, 40 ms later. The ticket key is
        # this context's own, and contexts are per host: a ticket cannot
        # resume a session toward another host.
        context.num_tickets = 1
        _load_chain(context, chain)
        return context


def _load_chain(context: ssl.SSLContext, chain: bytes) -> None:
    """Load a PEM certificate + key into `context` without touching a disk.

    `SSLContext.load_cert_chain` reads only files: an anonymous memory file
    (memfd) stands in for one, so the leaf's key is never written anywhere.
    """
    fd = os.memfd_create("tooljail-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def upstream_context(ca_file: Path | None) -> ssl.SSLContext:
    """What the proxy trusts upstream: the system's roots, plus `ca_file` if given.

    Hostname checking is on (the default context's). Offers HTTP/1.1 only.

    Raises:
        OSError, ssl.SSLError: `ca_file` cannot be read or holds no certificate.
    """
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    context.set_alpn_protocols(["http/1.1"])
    return context


def _system_bundle() -> bytes:
    cafile = ssl.get_default_verify_paths().cafile
    for candidate in (Path(cafile) if cafile else None, _SYSTEM_BUNDLE):
        if candidate is not None and candidate.is_file():
            return candidate.read_bytes()
    return b""


def write_bundle(ca: InterceptCA, path: Path) -> None:
    """Write the sandbox's trust bundle to `path` (0644, atomically): the
    system's roots (so a sandbox that holds no secret still verifies real
    servers through a pass-through tunnel) followed by the interception CA.
    """
    system = _system_bundle()
    if system and not system.endswith(b"\n"):
        system += b"\n"
    _write_private(path, system + ca.cert_pem, 0o644)


def _u16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 2], "big")


def _handshake_bytes(data: bytes) -> bytes:
    """The handshake layer's bytes of the first ClientHello, across records.

    Raises:
        NeedMore: the hello is not complete yet.
        ValueError: not a TLS handshake, or not a ClientHello.
    """
    if not data:
        raise NeedMore()
    if data[0] != 0x16:
        raise ValueError("not a TLS handshake")
    payload = bytearray()
    at = 0
    needed: int | None = None
    while True:
        if len(data) - at < 5:
            raise NeedMore()
        if data[at] != 0x16 or data[at + 1] != 0x03:
            raise ValueError("not a TLS handshake record")
        length = _u16(data, at + 3)
        if length == 0 or length > 16384 + 2048:
            raise ValueError("a TLS record of a bad length")
        if len(data) - at - 5 < length:
            raise NeedMore()
        payload += data[at + 5 : at + 5 + length]
        at += 5 + length
        if needed is None and len(payload) >= 4:
            if payload[0] != 0x01:
                raise ValueError("not a ClientHello")
            needed = 4 + int.from_bytes(payload[1:4], "big")
            if needed > _MAX_HELLO:
                raise ValueError("a ClientHello too big")
        if needed is not None and len(payload) >= needed:
            return bytes(payload[4:needed])


def client_hello_sni(data: bytes) -> str | None:
    """The server name (SNI) of the ClientHello at the start of `data`.

    Tolerates a hello split over several records and `data` cut anywhere.

    Returns:
        The host name, lowercased, one trailing dot stripped; None when the
        hello has no server_name extension (as for an IP literal).

    Raises:
        NeedMore: `data` is a prefix of a hello; read more and call again.
        ValueError: `data` is not a TLS ClientHello, or one malformed.
    """
    hello = _handshake_bytes(data)
    try:
        at = 2 + 32  # client_version, random
        at += 1 + hello[at]  # session_id
        at += 2 + _u16(hello, at)  # cipher_suites
        at += 1 + hello[at]  # compression_methods
        if at == len(hello):
            return None
        end = at + 2 + _u16(hello, at)
        at += 2
        if end > len(hello):
            raise ValueError("ClientHello extensions overrun the message")
        while at + 4 <= end:
            kind, size = _u16(hello, at), _u16(hello, at + 2)
            at += 4
            if at + size > end:
                raise ValueError("a ClientHello extension overruns the message")
            if kind == 0:  # server_name
                return _server_name(hello[at : at + size])
            at += size
    except IndexError as exc:
        raise ValueError("a truncated ClientHello") from exc
    return None


def _server_name(ext: bytes) -> str | None:
    end = 2 + _u16(ext, 0)
    at = 2
    if end > len(ext):
        raise ValueError("a malformed server_name extension")
    while at + 3 <= end:
        kind, size = ext[at], _u16(ext, at + 1)
        at += 3
        if at + size > end:
            raise ValueError("a malformed server_name extension")
        if kind == 0:
            name = ext[at : at + size]
            if not name or not name.isascii():
                raise ValueError("a server name that is not ASCII")
            text = name.decode("ascii").lower()
            return text[:-1] if text.endswith(".") else text
        at += size
    return None
