"""egress/tls.py: the interception CA, its leaves, upstream trust, SNI parsing."""

from __future__ import annotations

import contextlib
import datetime
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509

from tooljaild.egress.tls import (
    InterceptCA,
    NeedMore,
    client_hello_sni,
    upstream_context,
    write_bundle,
)


def test_ca_is_made_once_private_and_kept(tmp_path: Path) -> None:
    directory = tmp_path / "egress"
    ca = InterceptCA.load_or_create(directory)
    key = directory / "ca.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((directory / "ca.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    cert = x509.load_pem_x509_certificate(ca.cert_pem)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime > datetime.timedelta(days=3649)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca
    # A second start loads the same CA, and tightens a key mode someone widened.
    key.chmod(0o644)
    again = InterceptCA.load_or_create(directory)
    assert again.cert_pem == ca.cert_pem
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_broken_ca_files_are_replaced(tmp_path: Path) -> None:
    ca = InterceptCA.load_or_create(tmp_path)
    (tmp_path / "ca.key").write_bytes(b"garbage")
    assert InterceptCA.load_or_create(tmp_path).cert_pem != ca.cert_pem


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str | None) -> ssl.SSLObject:
    """A TLS handshake in memory; returns the client's side."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    c.do_handshake()
    return c


@pytest.mark.parametrize(
    "host", ["api.example.com", "127.0.0.1", "::1", "a" * 40 + "." + "b" * 40 + ".example"]
)
def test_leaf_is_trusted_through_the_ca(tmp_path: Path, host: str) -> None:
    ca = InterceptCA.load_or_create(tmp_path)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    side = _handshake(ca.server_context(host), client, host)
    assert side.selected_alpn_protocol() is None
    peer = side.getpeercert()
    assert peer
    not_after = ssl.cert_time_to_seconds(str(peer["notAfter"]))
    not_before = ssl.cert_time_to_seconds(str(peer["notBefore"]))
    assert not_after - not_before <= 86400 + 600


def test_leaf_for_one_host_does_not_pass_for_another(tmp_path: Path) -> None:
    ca = InterceptCA.load_or_create(tmp_path)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca.server_context("api.example.com"), client, "evil.example.com")


def test_server_contexts_are_cached_lru(tmp_path: Path) -> None:
    key_dir = tmp_path / "ca"
    loaded = InterceptCA.load_or_create(key_dir)
    ca = InterceptCA(loaded._key, loaded._cert, cache=2)
    a = ca.server_context("a.test")
    assert ca.server_context("a.test") is a
    ca.server_context("b.test")
    ca.server_context("a.test")  # a is now the most recent
    ca.server_context("c.test")  # b goes
    assert ca.server_context("a.test") is a
    assert len(ca._cache) == 2
    assert "b.test" not in ca._cache


def test_server_context_is_thread_safe(tmp_path: Path) -> None:
    ca = InterceptCA.load_or_create(tmp_path)
    errors: list[BaseException] = []

    def mint(i: int) -> None:
        try:
            for j in range(20):
                ca.server_context(f"h{(i * 20 + j) % 30}.test")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=mint, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_bundle_holds_system_roots_and_our_ca(tmp_path: Path) -> None:
    ca = InterceptCA.load_or_create(tmp_path / "ca")
    bundle = tmp_path / "ca-bundle.pem"
    write_bundle(ca, bundle)
    data = bundle.read_bytes()
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o644
    assert data.endswith(ca.cert_pem)
    if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        assert data.count(b"BEGIN CERTIFICATE") > 10
    ssl.create_default_context(cafile=str(bundle))


def test_upstream_context_trusts_ca_file_not_our_ca(tmp_path: Path) -> None:
    ca = InterceptCA.load_or_create(tmp_path / "ours")
    other = InterceptCA.load_or_create(tmp_path / "theirs")
    (tmp_path / "extra.pem").write_bytes(other.cert_pem)
    with_file = upstream_context(tmp_path / "extra.pem")
    assert with_file.check_hostname
    _handshake(other.server_context("up.test"), with_file, "up.test")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca.server_context("up.test"), upstream_context(None), "up.test")


def _client_hello(name: str | None) -> bytes:
    """A real ClientHello from the ssl module, for `name` (None: no SNI)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    side = context.wrap_bio(incoming, outgoing, server_hostname=name)
    if name is None:
        context.check_hostname = False
    with pytest.raises(ssl.SSLWantReadError):
        side.do_handshake()
    return outgoing.read()


def _refragment(hello: bytes, size: int) -> bytes:
    """The same handshake bytes, re-cut into records of at most `size` bytes."""
    body = hello[5:]
    out = b""
    for at in range(0, len(body), size):
        piece = body[at : at + size]
        out += b"\x16\x03\x01" + len(piece).to_bytes(2, "big") + piece
    return out


def test_sni_of_a_real_hello() -> None:
    hello = _client_hello("API.Example.com")
    assert client_hello_sni(hello) == "api.example.com"
    assert client_hello_sni(hello + b"more bytes after") == "api.example.com"


def test_sni_absent() -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    side = context.wrap_bio(incoming, outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        side.do_handshake()
    assert client_hello_sni(outgoing.read()) is None


def test_sni_across_fragmented_records_and_partial_data() -> None:
    hello = _refragment(_client_hello("a.example.com"), 7)
    assert client_hello_sni(hello) == "a.example.com"
    for cut in (0, 1, 4, 5, 11, len(hello) // 2, len(hello) - 1):
        with pytest.raises(NeedMore):
            client_hello_sni(hello[:cut])


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x00\x00",
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # a ServerHello
        b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",  # a hello of 16 MiB
        b"\x16\x03\x01\x00\x04\x01\x00\x00\x00",  # a hello of nothing
        b"\x16\x03\x01\x00\x01\x01" + b"\x17\x03\x03\x00\x01\x00",  # then not handshake
    ],
)
def test_not_a_hello_is_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        client_hello_sni(data)
